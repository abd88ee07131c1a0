// Op retry (docs/contracts/pod-to-vm.md, "Op retry"): a failed hibernate, wake or
// inconclusive lift is tried again after 15 s, doubling to at most 5 min. The timer only
// enqueues a reconcile of the pod, which re-derives what its annotations ask (ops/drive.ts);
// a retry of a pod no longer tracked with that UID does nothing. After a restart the debt is
// re-derived from the pod's published `failed` (its message names the operation).
import { monoNow } from '../../../util/mono-clock.ts';
import { isCurrent, type ProviderContext } from '../context.ts';
import type { RetryOp } from '../record-types.ts';
import { type PodRecord, setOpRetry } from '../state.ts';

export const OP_RETRY_BASE_MS = 15_000;
export const OP_RETRY_MAX_MS = 5 * 60_000;

/** The delay after `previous` (15, 30, 60, 120, 240, 300, 300 … s). */
export function nextOpRetryDelay(previous: number | undefined): number {
  return previous === undefined ? OP_RETRY_BASE_MS : Math.min(OP_RETRY_MAX_MS, previous * 2);
}

/** What an op retry's timer needs: the tracked records and the reconcile it enqueues. */
export type OpRetryCtx = Pick<ProviderContext, 'pods' | 'reconcileSoon'>;

/** Records the next attempt of `op` and arms its timer. */
export function scheduleOpRetry(ctx: OpRetryCtx, rec: PodRecord, op: RetryOp): void {
  const prev = rec.opRetry?.op === op ? rec.opRetry.delayMs : undefined;
  const delayMs = nextOpRetryDelay(prev);
  const timer = setTimeout(() => {
    if (isCurrent(ctx, rec)) ctx.reconcileSoon(rec.key);
  }, delayMs);
  timer.unref();
  setOpRetry(rec, { op, delayMs, due: monoNow() + delayMs, timer });
}

/** True while a retry of `op` is recorded and not due yet. */
export function retryPending(rec: PodRecord, op: RetryOp): boolean {
  return rec.opRetry?.op === op && monoNow() < rec.opRetry.due;
}
