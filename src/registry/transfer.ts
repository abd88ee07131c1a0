// Small pieces every registry transfer shares (pull, push, cloud-image import): the MiB/s of a
// progress line, and the error text of a transfer that its caller aborted.

export const MiB = 1024 * 1024;

/** MiB per second, one decimal (0 for no time). */
export function rate(bytes: number, seconds: number): number {
  return seconds > 0 ? Math.round((bytes / MiB / seconds) * 10) / 10 : 0;
}

/** The text of a transfer's failure; when the caller aborted it (cap, shutdown), the abort's
 * reason comes first, since everything failed because of it. */
export function describeCause(cause: unknown, outer: AbortSignal | undefined): string {
  const text = cause instanceof Error ? cause.message : String(cause);
  if (outer?.aborted) {
    const reason = outer.reason instanceof Error ? outer.reason.message : 'aborted';
    return reason === text ? text : `${reason} (${text})`;
  }
  return text;
}
