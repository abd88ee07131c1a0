// One UID-fenced write of a pod's provider-owned state (docs/contracts/lifecycle.md R2, R8):
// a pods/status patch carrying the annotations and the status computed now, or a JSON merge
// patch of the annotations alone. Both go to pods/<name>/status, never to the pod itself: a
// node identity may not patch pods (the Node authorizer has no pod patch, and NodeRestriction
// admits only status updates of the node's own pods), while the status subresource keeps
// metadata.annotations. Nothing here knows about held changes: held.ts decides what a write
// carries.
import type { LifecycleState } from '../../../contract/annotations.ts';
import { apiErrorMessage, apiStatus, mergePatch, withSignal } from '../../../kube/client.ts';
import { logFor, type ProviderContext, type PublishCtx } from '../context.ts';
import { type PodRecord, setLastStatus, setLastWriteRV, setWrittenStatus } from '../state.ts';
import { statusOf } from './status.ts';

export type PatchOutcome = 'ok' | 'superseded' | 'failed';

export interface WriteOptions {
  /** Write the status too (computed now, with `lifecycle` as the staged state). */
  status?: boolean;
  lifecycle?: LifecycleState;
  /** `high` for the write that completes a bring-up (`ready`). */
  priority?: 'high' | 'normal';
}

/** Sends `annotations` in one write: with `withStatus` a UID-fenced strategic merge patch of
 * `pods/<name>/status` carrying them and the status; otherwise (when there are any) a
 * UID-fenced JSON merge patch of `pods/<name>/status` carrying them alone. Either way 3 attempts, 500 ms apart, 5 s each; 404/409/422
 * mean another incarnation owns the name now (R2): superseded. */
export async function send(
  ctx: PublishCtx,
  rec: PodRecord,
  annotations: Record<string, string | null>,
  withStatus: boolean,
  opts: WriteOptions,
): Promise<PatchOutcome> {
  if (withStatus) return await writeWithStatus(ctx, rec, annotations, opts);
  if (Object.keys(annotations).length > 0) return await annotationPatch(ctx, rec, annotations);
  return 'ok';
}

async function writeWithStatus(
  ctx: PublishCtx,
  rec: PodRecord,
  annotations: Record<string, string | null>,
  opts: WriteOptions,
): Promise<PatchOutcome> {
  const status = statusOf(ctx, rec, opts.lifecycle);
  const json = JSON.stringify(status);
  const hasAnnotations = Object.keys(annotations).length > 0;
  if (!hasAnnotations && json === rec.writtenStatus) return 'ok';
  try {
    const rv = await ctx.status.writeNow(
      { ...rec.pod, status },
      { annotations: hasAnnotations ? annotations : undefined, priority: opts.priority ?? 'normal' },
    );
    setLastStatus(rec, status as never);
    setWrittenStatus(rec, json);
    if (rv !== undefined) setLastWriteRV(rec, rv);
    return 'ok';
  } catch (err) {
    return failedWrite(ctx, rec, err, annotations, 'status write failed; will retry');
  }
}

/** A UID-fenced JSON merge patch of provider-owned annotations on pods/<name>/status (which
 * keeps metadata.annotations, and is all a node identity may write): 3 attempts, 500 ms apart,
 * 5 s each, every attempt cancelled at its bound (Kube.writeRetrying). */
async function annotationPatch(
  ctx: PublishCtx,
  rec: PodRecord,
  annotations: Record<string, string | null>,
): Promise<PatchOutcome> {
  const namespace = rec.pod.metadata?.namespace ?? '';
  const name = rec.pod.metadata?.name ?? '';
  const body = { metadata: { uid: rec.uid, annotations } };
  try {
    const res = await ctx.kube.writeRetrying((signal) =>
      ctx.kube.core.patchNamespacedPodStatus({ namespace, name, body }, withSignal(signal, mergePatch)),
    );
    setLastWriteRV(rec, res.metadata?.resourceVersion);
    logFor(ctx, rec).debug({ annotations: Object.keys(annotations) }, 'annotations written');
    return 'ok';
  } catch (err) {
    return failedWrite(ctx, rec, err, annotations, 'annotation patch failed; will retry on the next tick');
  }
}

/** 404/409/422 mean another incarnation owns the name now (docs/contracts/lifecycle.md R2):
 * superseded; anything else is logged and retried. */
function failedWrite(
  ctx: Pick<ProviderContext, 'log'>,
  rec: PodRecord,
  err: unknown,
  annotations: Record<string, string | null>,
  message: string,
): PatchOutcome {
  const code = apiStatus(err);
  if (code === 404 || code === 409 || code === 422) return 'superseded';
  logFor(ctx, rec).warn({ err: apiErrorMessage(err), keys: Object.keys(annotations) }, message);
  return 'failed';
}
