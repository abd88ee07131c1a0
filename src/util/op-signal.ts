// The abort signal of the operation the current async context belongs to (issue 18: DeletePod
// aborts a pod's bring-up in flight instead of waiting behind it). Like the admission priority
// (src/util/priority.ts) it travels with the async context, so the bring-up does not pass a
// signal down through every step: the cocoon runner (src/cocoon/runner.ts) adds it to every
// call made inside, and a wait for shared work (src/util/singleflight.ts) ends on it.
//
// Shared work must never carry one caller's signal: a pull that several pods wait for goes on
// when one of them is deleted. Singleflight runs its work `detached`.
import { AsyncLocalStorage } from 'node:async_hooks';

const storage = new AsyncLocalStorage<AbortSignal | undefined>();

/** Runs `fn` with `signal` as the current operation's abort signal. */
export function runWithOpSignal<T>(signal: AbortSignal, fn: () => T): T {
  return storage.run(signal, fn);
}

/** The current operation's abort signal; `undefined` outside any. */
export function currentOpSignal(): AbortSignal | undefined {
  return storage.getStore();
}

/** Runs `fn` outside any operation's signal (work shared between operations). */
export function detached<T>(fn: () => T): T {
  return storage.run(undefined, fn);
}
