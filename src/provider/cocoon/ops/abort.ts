// DeletePod aborts a bring-up in flight (issue 18) instead of queueing behind it: a 30-minute
// pull or a clone that hangs must not hold the delete, nor a pod-controller worker.
//
// The bring-up runs under its own abort signal in the async context (src/util/op-signal.ts):
// every cocoon call it makes is killed when the signal fires, whether it waits for a slot or
// runs, and a wait for shared work (a pull other pods need too) ends while the work goes on.
// The aborted bring-up records nothing (no failure, no retry); the delete that aborted it runs
// next in the pod's queue and removes whatever the bring-up made: a bound VM as usual, an
// unbound one or the `creating` placeholder of a killed clone by the pod's VM name
// (ops/delete.ts, removeLeftover).
import { currentOpSignal, runWithOpSignal } from '../../../util/op-signal.ts';
import type { ProviderContext } from '../context.ts';
import type { PodRecord } from '../state.ts';

/** The bring-ups queued or running, by pod key. */
export type AbortCtx = Pick<ProviderContext, 'bringUps'>;

/** Wraps a bring-up for the pod's queue: registered at once (a delete that arrives while it
 * is still queued stops it before it starts), run under its abort signal. */
export function abortableBringUp(
  ctx: AbortCtx,
  rec: PodRecord,
  task: () => Promise<void>,
): () => Promise<void> {
  const abort = new AbortController();
  ctx.bringUps.get(rec.key)?.abort.abort(new Error('superseded by a newer bring-up'));
  ctx.bringUps.set(rec.key, { uid: rec.uid, abort });
  return async () => {
    try {
      if (!abort.signal.aborted) await runWithOpSignal(abort.signal, task);
    } finally {
      if (ctx.bringUps.get(rec.key)?.abort === abort) ctx.bringUps.delete(rec.key);
    }
  };
}

/** Aborts the bring-up of the pod incarnation `uid`, if one is queued or running; true when
 * there was one (the delete then looks for what it left by name). */
export function abortBringUp(ctx: AbortCtx, key: string, uid: string | undefined): boolean {
  const running = ctx.bringUps.get(key);
  if (!running || running.uid !== uid) return false;
  ctx.bringUps.delete(key);
  running.abort.abort(new Error('pod is being deleted'));
  return true;
}

/** True inside a bring-up that was aborted: it records nothing and returns. */
export function bringUpAborted(): boolean {
  return currentOpSignal()?.aborted === true;
}
