// Bounded waiting: runs one operation under a per-call timeout and an optional caller
// abort. The operation gets an AbortSignal to hand to its I/O (fetch, child process), so a
// timeout cancels the work instead of only abandoning it; the returned promise settles at
// the bound even when the operation ignores its signal (a black-holed connection). Timers
// are monotonic (setTimeout), never computed from the wall clock.

/** An operation did not finish within its bound. */
export class DeadlineError extends Error {
  override name = 'DeadlineError';
  readonly timeoutMs: number;
  constructor(what: string, timeoutMs: number) {
    super(`${what} timed out after ${timeoutMs} ms`);
    this.timeoutMs = timeoutMs;
  }
}

/** An operation was aborted by its caller before it finished. */
export class AbortedError extends Error {
  override name = 'AbortedError';
  constructor(what: string, cause?: unknown) {
    super(`${what} aborted`, cause === undefined ? undefined : { cause });
  }
}

export interface DeadlineOptions {
  /** Bound of the operation; undefined means no timeout. */
  timeoutMs?: number;
  /** Caller-side abort. */
  signal?: AbortSignal;
  /** Names the operation in error messages (default `operation`). */
  what?: string;
}

/**
 * Runs `fn` with a signal that fires at `timeoutMs` or when `opts.signal` aborts, whichever
 * comes first, and rejects at that moment with DeadlineError / AbortedError even if `fn`
 * never settles. Without a timeout and a signal, `fn` runs as is (with an inert signal).
 */
export async function withDeadline<T>(
  fn: (signal: AbortSignal) => Promise<T>,
  opts: DeadlineOptions = {},
): Promise<T> {
  const what = opts.what ?? 'operation';
  if (opts.signal?.aborted) throw new AbortedError(what, opts.signal.reason);
  const ac = new AbortController();
  if (opts.timeoutMs === undefined && !opts.signal) return await fn(ac.signal);
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const bound = new Promise<never>((_, reject) => {
    if (opts.timeoutMs !== undefined) {
      const ms = opts.timeoutMs;
      timer = setTimeout(() => {
        const err = new DeadlineError(what, ms);
        ac.abort(err);
        reject(err);
      }, ms);
    }
    if (opts.signal) {
      const caller = opts.signal;
      onAbort = () => {
        const err = new AbortedError(what, caller.reason);
        ac.abort(err);
        reject(err);
      };
      caller.addEventListener('abort', onAbort, { once: true });
    }
  });
  try {
    return await Promise.race([fn(ac.signal), bound]);
  } catch (err) {
    // The operation's own rejection caused by our abort (fetch's AbortError) is reported
    // as the bound that fired.
    if (ac.signal.aborted && ac.signal.reason instanceof Error) throw ac.signal.reason;
    throw err;
  } finally {
    clearTimeout(timer);
    if (onAbort) opts.signal?.removeEventListener('abort', onAbort);
  }
}

/** Resolves after `ms` (a plain timer; mockable with node:test mock timers). */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects): the pause between
 * attempts of work that stops on its own when cancelled. */
export function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}

/** `p`, or the signal's reason once it aborts (the work behind `p` goes on: a shared pull or
 * import one caller stops waiting for). */
export function untilAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

/** `AbortSignal.timeout(ms)` on a plain (unref'd) `setTimeout`, so tests with mock timers can
 * expire it without waiting; it aborts with the same `TimeoutError` DOMException. */
export function timeoutSignal(ms: number): AbortSignal {
  const ac = new AbortController();
  const timer = setTimeout(
    () => ac.abort(new DOMException('The operation was aborted due to timeout', 'TimeoutError')),
    Math.max(0, ms),
  );
  timer.unref?.();
  return ac.signal;
}
