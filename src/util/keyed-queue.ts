// Per-key serialization (docs/contracts/lifecycle.md "Single writer"): every entry point for one pod key runs
// through one promise chain, so two operations on a pod never interleave, while different
// keys run concurrently. A task that throws does not break the chain for the next one.

/** Wraps every task of a key when it runs (e.g. `runWithPriority`, src/util/priority.ts). */
export type TaskWrapper = <T>(key: string, task: () => Promise<T> | T) => Promise<T> | T;

export class KeyedQueue {
  #tails = new Map<string, Promise<unknown>>();
  readonly #around: TaskWrapper;

  constructor(opts: { around?: TaskWrapper } = {}) {
    this.#around = opts.around ?? ((_key, task) => task());
  }

  /** Runs `task` after every task queued earlier for `key`; resolves with its result. */
  run<T>(key: string, task: () => Promise<T> | T): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    const next = prev.then(
      () => this.#around(key, task),
      () => this.#around(key, task),
    );
    const tail = next.then(
      () => undefined,
      () => undefined,
    );
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return next;
  }

  /** True while a task for `key` is queued or running. */
  busy(key: string): boolean {
    return this.#tails.has(key);
  }

  get size(): number {
    return this.#tails.size;
  }
}
