// De-duplicates concurrent work per key: callers that arrive while a run for the key is in
// flight share its result; the next caller after it settles starts a new run.

export class Singleflight<T> {
  readonly #inflight = new Map<string, Promise<T>>();

  do(key: string, fn: () => Promise<T>): Promise<T> {
    const running = this.#inflight.get(key);
    if (running) return running;
    const p = fn().finally(() => {
      if (this.#inflight.get(key) === p) this.#inflight.delete(key);
    });
    this.#inflight.set(key, p);
    return p;
  }
}
