// The clock of every deadline and budget in the daemon (docs/decisions.md, "Bounded
// waiting"): monotonic milliseconds, so a wall-clock step (NTP, an operator's `date -s`)
// can neither stretch nor cut short the IP wait, the fixup budget or the ready deadline.
// Wall time is used only where it is shown to people or compared with other processes'
// timestamps (lease expiry, RFC 3339 deadlines in a pod condition).

/** Monotonic whole milliseconds since process start (integers: timers and
 * `AbortSignal.timeout` reject fractional delays). */
export function monoNow(): number {
  return (frozenAt ?? Math.floor(performance.now())) + offsetMs;
}

let offsetMs = 0;
let frozenAt: number | undefined;

/** Test seam: stops (true) or restarts (false) the clock's own progress, so only
 * {@link advanceMonoClockForTests} moves it (tests that also mock timers stay deterministic
 * under load). Never called by the daemon. */
export function freezeMonoClockForTests(frozen: boolean): void {
  if (frozen && frozenAt === undefined) frozenAt = Math.floor(performance.now());
  if (!frozen && frozenAt !== undefined) {
    offsetMs += frozenAt - Math.floor(performance.now());
    frozenAt = undefined;
  }
}

/** Test seam: moves the monotonic clock forward (budgets and deadlines expire without
 * waiting for them). Never called by the daemon. */
export function advanceMonoClockForTests(ms: number): void {
  offsetMs += ms;
}

/** The wall-clock time at which the monotonic instant `mono` happens (for display). */
export function wallAt(mono: number): Date {
  return new Date(Date.now() + (mono - monoNow()));
}
