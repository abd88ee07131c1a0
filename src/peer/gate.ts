// Bounds of the peer restore (docs/peer-restore.md): counting gates (the server's
// non-blocking stream and plan gates, the client's blocking restore gate), the shared
// byte-rate bucket and the client's worker pool. Timers are monotonic (performance.now, setTimeout).
import { setTimeout as sleep } from 'node:timers/promises';

/** A counting gate of `limit` slots: taken at once (`tryTake`) or waited for (`take`). */
export class Gate {
  readonly limit: number;
  #used = 0;
  readonly #waiters: Array<() => void> = [];

  constructor(limit: number) {
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`gate limit ${limit} must be ≥ 1`);
    this.limit = limit;
  }

  get used(): number {
    return this.#used;
  }

  /** Takes a slot when one is free; false (nothing taken) when the gate is full. */
  tryTake(): boolean {
    if (this.#used >= this.limit) return false;
    this.#used++;
    return true;
  }

  /** Waits for a slot, first come first served; rejects with the signal's reason when it aborts first. */
  async take(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    if (this.tryTake()) return;
    await new Promise<void>((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = this.#waiters.indexOf(grant);
        if (i >= 0) this.#waiters.splice(i, 1);
        reject(signal?.reason);
      };
      this.#waiters.push(grant);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Returns a slot: to the first waiter when there is one. */
  release(): void {
    const next = this.#waiters.shift();
    if (next) next();
    else if (this.#used > 0) this.#used--;
  }
}

/** Per-key slot counts (a caller's share of the stream gate). */
export class KeyedCount {
  readonly limit: number;
  readonly #counts = new Map<string, number>();

  constructor(limit: number) {
    this.limit = limit;
  }

  tryTake(key: string): boolean {
    const n = this.#counts.get(key) ?? 0;
    if (n >= this.limit) return false;
    this.#counts.set(key, n + 1);
    return true;
  }

  release(key: string): void {
    const n = (this.#counts.get(key) ?? 0) - 1;
    if (n > 0) this.#counts.set(key, n);
    else this.#counts.delete(key);
  }
}

/**
 * A token bucket of `bytesPerSecond` shared by every stream that draws from it, holding at
 * most one second of burst. `take(n)` waits until `n` bytes may go; waits are served in the
 * order asked (each reservation moves the bucket's clock on). 0 means unbounded.
 */
export class TokenBucket {
  readonly bytesPerSecond: number;
  /** Monotonic time (ms) at which everything reserved so far has been paid for. */
  #paidUntil = Number.NEGATIVE_INFINITY;

  constructor(bytesPerSecond: number) {
    this.bytesPerSecond = bytesPerSecond;
  }

  /** Reserves `n` bytes at monotonic time `now` (ms); returns how long to wait before sending them. */
  reserve(n: number, now: number = performance.now()): number {
    if (this.bytesPerSecond <= 0 || n <= 0) return 0;
    this.#paidUntil = Math.max(this.#paidUntil, now - 1000) + (n * 1000) / this.bytesPerSecond;
    return Math.max(0, this.#paidUntil - now);
  }

  async take(n: number, signal?: AbortSignal): Promise<void> {
    const wait = this.reserve(n);
    if (wait > 0) await sleep(wait, undefined, signal ? { signal } : undefined);
  }
}

/**
 * Runs `work` over `tasks` with at most `limit` at once and resolves with the sum of what they
 * return. The first failure aborts `ac` (the others' requests with it) and is what rejects,
 * once every worker has stopped; no task starts after it.
 */
export async function runPool<T>(
  tasks: readonly T[],
  limit: number,
  ac: AbortController,
  work: (task: T) => Promise<number>,
): Promise<number> {
  let next = 0;
  let total = 0;
  let first: { err: unknown } | undefined;
  const worker = async () => {
    while (!first && !ac.signal.aborted && next < tasks.length) {
      const task = tasks[next++] as T;
      try {
        const n = await work(task);
        total += n;
      } catch (err) {
        if (!first) {
          first = { err };
          ac.abort();
        }
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, tasks.length) }, worker));
  if (first) throw first.err;
  if (ac.signal.aborted) throw new Error('aborted');
  return total;
}
