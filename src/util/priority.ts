// Work priority by pod admission order (issue 9, docs/decisions.md "Priority"): under a burst
// the shared resources (the `cocoon` call pool, the API write buckets) serve the pod that was
// admitted first before pods admitted later, so pods finish one after another instead of all
// advancing stage by stage together.
//
// The priority travels implicitly with the async context (AsyncLocalStorage), so no call site
// passes it: the provider runs each per-pod operation under `runWithPriority(seq, …)` and
// every `cocoon` call or API write made inside it, including jobs, timers and promise
// continuations started from it, carries that sequence.
//
// Ranking of waiters (RankedList): explicit `high` first (the existing CliPriority /
// WritePriority flag), then calls without a priority context (framework and node work:
// health checks, force deletes, kubelet API requests; a small, bounded stream, so they can
// never starve and never be starved), then by admission sequence, oldest first, then by
// arrival (FIFO among equals).
import { AsyncLocalStorage } from 'node:async_hooks';

const storage = new AsyncLocalStorage<number | undefined>();

/** Runs `fn` with `seq` as the current priority (lower runs first); `undefined` runs it
 * without one (as unprioritized work, whatever the caller's context was). */
export function runWithPriority<T>(seq: number | undefined, fn: () => T): T {
  if (seq !== undefined && !Number.isFinite(seq)) throw new TypeError(`priority must be finite, got ${seq}`);
  return storage.run(seq, fn);
}

/** The priority of the current async context; `undefined` outside any `runWithPriority`. */
export function currentPriority(): number | undefined {
  return storage.getStore();
}

/** Assigns admission sequences to keys: the first `seq(key)` of a key gets the next number
 * (monotonically increasing), later calls the same one until the key is forgotten. */
export class AdmissionOrder {
  #next = 0;
  readonly #seqs = new Map<string, number>();

  seq(key: string): number {
    let seq = this.#seqs.get(key);
    if (seq === undefined) {
      seq = ++this.#next;
      this.#seqs.set(key, seq);
    }
    return seq;
  }

  /** Drops the key's sequence; its next `seq` is a new, later one. */
  forget(key: string): void {
    this.#seqs.delete(key);
  }

  get size(): number {
    return this.#seqs.size;
  }

  /** Runs `task` under the key's admission sequence; afterwards (however it ends) the key is
   * forgotten unless `keep()` says it is still admitted (e.g. the pod is still tracked). */
  run<T>(key: string, task: () => Promise<T> | T, keep: () => boolean): Promise<T> {
    return runWithPriority(this.seq(key), async () => {
      try {
        return await task();
      } finally {
        if (!keep()) this.forget(key);
      }
    });
  }
}

/** Where a waiter stands: see the ranking in the header. */
export interface Rank {
  /** Explicitly marked high (CliPriority / WritePriority `high`). */
  readonly high: boolean;
  /** Admission sequence; -Infinity for calls without a priority context. */
  readonly seq: number;
  /** Arrival order (FIFO among equals). */
  readonly order: number;
}

let arrivals = 0;

/** The rank of a waiter arriving now in the current async context. */
export function rankNow(high = false): Rank {
  return { high, seq: currentPriority() ?? Number.NEGATIVE_INFINITY, order: ++arrivals };
}

/** Negative when `a` is served before `b`. */
export function compareRank(a: Rank, b: Rank): number {
  if (a.high !== b.high) return a.high ? -1 : 1;
  if (a.seq !== b.seq) return a.seq < b.seq ? -1 : 1;
  return a.order - b.order;
}

/** Waiters kept sorted by rank (binary-search insertion: hundreds of waiters, O(log n) to
 * find the place, one splice to insert). */
export class RankedList<T extends { readonly rank: Rank }> {
  readonly #items: T[] = [];

  get length(): number {
    return this.#items.length;
  }

  /** How many current waiters are served before a newcomer of rank `rank`. */
  ahead(rank: Rank): number {
    let lo = 0;
    let hi = this.#items.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (compareRank((this.#items[mid] as T).rank, rank) <= 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  insert(item: T): void {
    this.#items.splice(this.ahead(item.rank), 0, item);
  }

  /** Removes and returns the first waiter. */
  shift(): T | undefined {
    return this.#items.shift();
  }

  /** Removes `item` if present; true when it was. */
  remove(item: T): boolean {
    const i = this.#items.indexOf(item);
    if (i < 0) return false;
    this.#items.splice(i, 1);
    return true;
  }
}
