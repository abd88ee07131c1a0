// A keyed work queue with client-go workqueue semantics (docs/contracts/virtual-node.md "Queues and retries"): a key is
// handled by at most one worker at a time; events for a busy key coalesce into one re-run;
// failures are retried with per-key exponential backoff (5 ms doubling to 1000 s) and no
// give-up. Hand-written because no maintained npm package offers these semantics.
// A key's handler runs under the priority (src/util/priority.ts) of the context that added
// it, not of whichever key's completion happened to start it.
import { currentPriority, runWithPriority } from './priority.ts';

export interface WorkQueueOptions {
  concurrency: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
}

export class WorkQueue {
  readonly #handler: (key: string) => Promise<void>;
  readonly #concurrency: number;
  readonly #baseDelayMs: number;
  readonly #maxDelayMs: number;
  readonly #fifo: string[] = [];
  readonly #queued = new Set<string>();
  readonly #processing = new Set<string>();
  readonly #dirty = new Set<string>();
  readonly #failures = new Map<string, number>();
  readonly #timers = new Map<string, NodeJS.Timeout>();
  /** Priority of the context that added the key (kept when a later add has none). */
  readonly #priority = new Map<string, number | undefined>();
  #running = 0;
  #stopped = false;
  #idleWaiters: (() => void)[] = [];
  onError: (key: string, err: unknown, attempt: number) => void = () => {};

  constructor(handler: (key: string) => Promise<void>, opts: WorkQueueOptions) {
    this.#handler = handler;
    this.#concurrency = opts.concurrency;
    this.#baseDelayMs = opts.baseDelayMs ?? 5;
    this.#maxDelayMs = opts.maxDelayMs ?? 1_000_000;
  }

  add(key: string): void {
    if (this.#stopped) return;
    const priority = currentPriority();
    if (priority !== undefined || !this.#priority.has(key)) this.#priority.set(key, priority);
    if (this.#processing.has(key)) {
      this.#dirty.add(key);
      return;
    }
    if (this.#queued.has(key)) return;
    this.#queued.add(key);
    this.#fifo.push(key);
    this.#pump();
  }

  /** Adds the key after `ms` unless it is added sooner (the earlier timer wins). */
  addAfter(key: string, ms: number): void {
    if (this.#stopped) return;
    if (this.#timers.has(key)) return;
    const t = setTimeout(() => {
      this.#timers.delete(key);
      this.add(key);
    }, ms);
    t.unref();
    this.#timers.set(key, t);
  }

  /** Resets the key's backoff (after a success). */
  forget(key: string): void {
    this.#failures.delete(key);
  }

  retries(key: string): number {
    return this.#failures.get(key) ?? 0;
  }

  get length(): number {
    return this.#fifo.length + this.#processing.size + this.#timers.size;
  }

  #pump(): void {
    while (!this.#stopped && this.#running < this.#concurrency && this.#fifo.length > 0) {
      const key = this.#fifo.shift() as string;
      this.#queued.delete(key);
      this.#processing.add(key);
      this.#running++;
      void this.#process(key);
    }
    if (this.#running === 0 && this.#fifo.length === 0) {
      for (const w of this.#idleWaiters.splice(0)) w();
    }
  }

  #process(key: string): Promise<void> {
    return runWithPriority(this.#priority.get(key), () => this.#handle(key));
  }

  async #handle(key: string): Promise<void> {
    try {
      await this.#handler(key);
      this.#failures.delete(key);
    } catch (err) {
      const n = (this.#failures.get(key) ?? 0) + 1;
      this.#failures.set(key, n);
      this.onError(key, err, n);
      const delay = Math.min(this.#maxDelayMs, this.#baseDelayMs * 2 ** Math.min(n - 1, 40));
      // A retry must not be dropped by a pending dirty mark: the timer re-adds it.
      this.#timers.get(key) && clearTimeout(this.#timers.get(key));
      this.#timers.delete(key);
      this.addAfter(key, delay);
    } finally {
      this.#processing.delete(key);
      this.#running--;
      if (this.#dirty.delete(key)) this.add(key);
      if (!this.#queued.has(key) && !this.#timers.has(key)) this.#priority.delete(key);
      this.#pump();
    }
  }

  /** Resolves when no key is queued or running (delayed retries do not count). */
  idle(): Promise<void> {
    if (this.#running === 0 && this.#fifo.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /** Stops taking work; running handlers finish on their own. */
  stop(): void {
    this.#stopped = true;
    for (const t of this.#timers.values()) clearTimeout(t);
    this.#timers.clear();
    this.#fifo.length = 0;
    this.#queued.clear();
    this.#priority.clear();
    for (const w of this.#idleWaiters.splice(0)) w();
  }
}
