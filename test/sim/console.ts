// The SAC console clients of the simulator tests (sac.test.ts, guest-dhcp.test.ts) share this.

/** Index of the n-th (1-based) `SAC>` in `text`, -1 when there are fewer. */
export function nthPrompt(text: string, n: number): number {
  let at = -1;
  for (let i = 0; i < n; i++) {
    at = text.indexOf('SAC>', at + 1);
    if (at < 0) return -1;
  }
  return at;
}
