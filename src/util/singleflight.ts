// De-duplicates concurrent work per key: callers that arrive while a run for the key is in
// flight share its result; the next caller after it settles starts a new run.
//
// The run belongs to no caller: it runs outside the caller's operation signal (a pod's
// bring-up that DeletePod aborts must not kill a pull other pods wait for), and a caller
// whose operation is aborted stops waiting at once while the run goes on (src/util/op-signal.ts).
import { untilAborted } from './deadline.ts';
import { currentOpSignal, detached } from './op-signal.ts';

export class Singleflight<T> {
  readonly #inflight = new Map<string, Promise<T>>();

  do(key: string, fn: () => Promise<T>): Promise<T> {
    let p = this.#inflight.get(key);
    if (!p) {
      const run: Promise<T> = detached(fn).finally(() => {
        if (this.#inflight.get(key) === run) this.#inflight.delete(key);
      });
      // Handled here too: every waiter may have stopped waiting by the time it settles.
      run.catch(() => {});
      this.#inflight.set(key, run);
      p = run;
    }
    return untilAborted(p, currentOpSignal());
  }
}
