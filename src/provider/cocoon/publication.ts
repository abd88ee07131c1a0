// The provider's write paths (docs/contracts/lifecycle.md, "Intent rules" R1–R9): staging
// and flushing the lifecycle intent, provider-owned annotation patches, status publication,
// Warning events and failOp. Every function here runs inside the pod's queue (single writer
// per pod); records change only through the mutators of state.ts.
import type { V1PodStatus } from '@kubernetes/client-node';
import {
  EVENT_MESSAGE_MAX_BYTES,
  LIFECYCLE_STATE_MESSAGE,
  type LifecycleState,
  VM_ID,
  VM_IP,
} from '../../contract/annotations.ts';
import { apiErrorMessage, apiStatus, mergePatch, withSignal } from '../../kube/client.ts';
import {
  buildLifecyclePatch,
  comparisonKey,
  isUnflushed,
  lifecycleAnnotations,
  markFlushed,
  stage,
} from '../../lifecycle/intent.ts';
import { computePodStatus } from '../../lifecycle/status.ts';
import { resolveIp } from '../../net/leases.ts';
import { monoNow, wallAt } from '../../util/mono-clock.ts';
import { truncateUtf8 } from '../../util/text.ts';
import { generationOf, isCurrent, logFor, type ProviderContext } from './context.ts';
import {
  applyAnnotations,
  dropHeldStatus,
  holdChanges,
  markGenerationWentDown,
  markWarned,
  type PodRecord,
  setHeldTimer,
  setIntent,
  setIp,
  setLastStatus,
  setLastWriteRV,
  setStep,
  setWrittenStatus,
  takeHeld,
} from './state.ts';

export type PatchOutcome = 'ok' | 'superseded' | 'failed';

/** How long an intermediate state of a bring-up (the VM id, Running without an IP, the
 * current step) may stay unwritten, waiting to ride along with the pod's next write
 * (docs/decisions.md, "Writes per bring-up"). */
export const PUBLISH_GRACE_MS = 1500;

export interface WriteOptions {
  /** Write the status too (computed now, with `lifecycle` as the staged state). */
  status?: boolean;
  lifecycle?: LifecycleState;
  /** `high` for the write that completes a bring-up (`ready`). */
  priority?: 'high' | 'normal';
}

/** The one write path of the provider-owned state of a pod: `changes` plus whatever is
 * held, in ONE write. With a status (asked for, or held) it is a UID-fenced strategic merge
 * patch of `pods/<name>/status` carrying `metadata.annotations` too; otherwise a UID-fenced
 * JSON merge patch of the annotations. Either way 3 attempts, 500 ms apart, 5 s each;
 * 404/409/422 mean another incarnation owns the name now (R2): superseded. A failed write
 * holds its held part again for the next write or the grace timer. */
export async function writePod(
  ctx: ProviderContext,
  rec: PodRecord,
  changes: Record<string, string | null>,
  opts: WriteOptions = {},
): Promise<PatchOutcome> {
  const held = takeHeld(rec);
  const annotations = { ...(held?.annotations ?? {}), ...changes };
  const withStatus =
    (opts.status === true || held?.status === true) && isCurrent(ctx, rec) && !rec.termination;
  let outcome: PatchOutcome = 'ok';
  if (withStatus) outcome = await writeWithStatus(ctx, rec, annotations, opts);
  else if (Object.keys(annotations).length > 0) outcome = await annotationPatch(ctx, rec, annotations);
  if (outcome === 'failed' && held && isCurrent(ctx, rec)) {
    // Not written: held again; changes held meanwhile are newer and win.
    const newer = takeHeld(rec);
    hold(ctx, rec, {
      annotations: { ...held.annotations, ...(newer?.annotations ?? {}) },
      status: held.status || newer?.status === true,
    });
  }
  return outcome;
}

/** A UID-fenced annotation patch (see {@link writePod}); carries whatever is held. */
export function patchAnnotations(
  ctx: ProviderContext,
  rec: PodRecord,
  annotations: Record<string, string | null>,
): Promise<PatchOutcome> {
  return writePod(ctx, rec, annotations);
}

async function writeWithStatus(
  ctx: ProviderContext,
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
    const code = apiStatus(err);
    if (code === 404 || code === 409 || code === 422) return 'superseded';
    logFor(ctx, rec).warn(
      { err: apiErrorMessage(err), keys: Object.keys(annotations) },
      'status write failed; will retry',
    );
    return 'failed';
  }
}

/** Holds changes of a bring-up for the pod's next write; if none comes within
 * {@link PUBLISH_GRACE_MS} of the first held change, the timer writes them (one write). */
export function hold(
  ctx: ProviderContext,
  rec: PodRecord,
  changes: { annotations?: Record<string, string | null>; status?: boolean },
): void {
  if (changes.annotations) applyAnnotations(rec, changes.annotations);
  const held = holdChanges(rec, changes, monoNow());
  if (held.timer) return;
  const timer = setTimeout(
    () => {
      if (ctx.lifetime.aborted) return;
      void ctx.queue
        .run(rec.key, () => flushHeld(ctx, rec, true))
        .catch((err: unknown) => logFor(ctx, rec).warn({ err: String(err) }, 'held write failed'));
    },
    Math.max(0, held.since + PUBLISH_GRACE_MS - monoNow()),
  );
  timer.unref();
  setHeldTimer(rec, timer);
}

/** Writes what is held (inside the pod's queue). With `dueOnly`, only once the grace of the
 * held write has passed (a timer of an earlier window may fire late). */
export async function flushHeld(
  ctx: ProviderContext,
  rec: PodRecord,
  dueOnly = false,
): Promise<PatchOutcome> {
  const held = rec.held;
  if (!held) return 'ok';
  if (!isCurrent(ctx, rec)) {
    takeHeld(rec);
    return 'superseded';
  }
  if (dueOnly && monoNow() < held.since + PUBLISH_GRACE_MS - 50) return 'ok';
  return await writePod(ctx, rec, {});
}

/** Intermediate states are held while the pod is being brought up (managed, `creating`,
 * not in a create backoff): the next state usually follows within moments. */
export function holding(ctx: ProviderContext, rec: PodRecord): boolean {
  if (!isCurrent(ctx, rec) || rec.termination || !rec.spec?.managed || rec.createFailure) return false;
  const state = rec.intent?.state ?? '';
  return state === '' || state === 'creating';
}

/** A UID-fenced JSON merge patch of provider-owned annotations: 3 attempts, 500 ms apart,
 * 5 s each, every attempt cancelled at its bound (Kube.writeRetrying). */
async function annotationPatch(
  ctx: ProviderContext,
  rec: PodRecord,
  annotations: Record<string, string | null>,
): Promise<PatchOutcome> {
  const namespace = rec.pod.metadata?.namespace ?? '';
  const name = rec.pod.metadata?.name ?? '';
  const body = { metadata: { uid: rec.uid, annotations } };
  try {
    const res = await ctx.kube.writeRetrying((signal) =>
      ctx.kube.core.patchNamespacedPod({ namespace, name, body }, withSignal(signal, mergePatch)),
    );
    setLastWriteRV(rec, res.metadata?.resourceVersion);
    logFor(ctx, rec).debug({ annotations: Object.keys(annotations) }, 'annotations written');
    return 'ok';
  } catch (err) {
    const code = apiStatus(err);
    if (code === 404 || code === 409 || code === 422) return 'superseded';
    logFor(ctx, rec).warn(
      { err: apiErrorMessage(err), keys: Object.keys(annotations) },
      'annotation patch failed; will retry on the next tick',
    );
    return 'failed';
  }
}

/** Re-reads the lease file and updates the record's IP (R9: only for the same VM ID). */
export async function refreshIp(ctx: ProviderContext, rec: PodRecord): Promise<boolean> {
  if (!rec.vm) return false;
  const snapshot = await ctx.leases.read();
  // Lease expiry is wall-clock time written by cocoon-net: compared with wall time.
  const { ip } = resolveIp(rec.vm, snapshot, Date.now(), rec.ip);
  if (ip === rec.ip) return false;
  setIp(rec, ip);
  return true;
}

/** The pod status from the record (docs/contracts/lifecycle.md, "Pod status"), with an
 * optional staged state. Pure: {@link publish} records what was published. */
export function statusOf(ctx: ProviderContext, rec: PodRecord, lifecycle?: LifecycleState): V1PodStatus {
  const status = computePodStatus({
    vm: rec.vm ? { ip: rec.ip } : undefined,
    lifecycle: lifecycle ?? rec.intent?.state ?? '',
    probeReady: rec.probeReady,
    hostIP: ctx.nodeIP,
    startTime: rec.startTime,
    image: rec.pod.spec?.containers?.[0]?.image ?? '',
    termination: rec.termination,
    waitingReason: rec.vm ? undefined : 'ContainerCreating',
    previous: rec.lastStatus,
    now: new Date(),
  });
  const out = { ...status } as unknown as V1PodStatus;
  const step = readinessCondition(ctx, rec, lifecycle ?? rec.intent?.state ?? '');
  if (step) out.conditions = [...(out.conditions ?? []), step];
  return out;
}

/** TS addition: the readiness step and deadline as a pod condition, so operators see what a
 * `creating` pod is waiting for and when it would be failed (issue: expose the deadline). */
function readinessCondition(ctx: ProviderContext, rec: PodRecord, state: LifecycleState | '') {
  if (!rec.spec?.managed) return undefined;
  const retry = rec.createFailure;
  if (!rec.vm && retry?.transient && retry.retryAt !== undefined && state !== 'failed') {
    const giveUp = wallAt(retry.firstAt + ctx.config.readyDeadlineSeconds * 1000).toISOString();
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'False',
      reason: 'CreateBackoff',
      message: `step CreateBackoff; attempt ${retry.attempts} failed: ${truncateUtf8(retry.message, 512)}; next retry ${wallAt(retry.retryAt).toISOString()}; gives up at ${giveUp}`,
    };
  }
  if (!rec.vm) return undefined;
  const t0 = Math.max(rec.boundAt ?? monoNow(), ctx.startupDoneAt);
  const deadline = wallAt(t0 + ctx.config.readyDeadlineSeconds * 1000).toISOString();
  if (state === 'ready') {
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'True',
      reason: 'Ready',
      message: 'lifecycle ready',
    };
  }
  if (state === 'failed') {
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'False',
      reason: 'Failed',
      message: rec.intent?.message ?? '',
    };
  }
  const step = rec.step?.name ?? 'Starting';
  return {
    type: 'vm.cocoonstack.io/Readiness',
    status: 'False',
    reason: step,
    message: `step ${step}; ready deadline ${deadline}`,
  };
}

/** Publishes the current status: during a bring-up it is held for the next write (at most
 * {@link PUBLISH_GRACE_MS}); otherwise through the framework's status writer (async,
 * deduped). */
export function publish(ctx: ProviderContext, rec: PodRecord): void {
  if (!isCurrent(ctx, rec) && !rec.termination) return;
  const status = statusOf(ctx, rec);
  setLastStatus(rec, status as never);
  if (holding(ctx, rec)) {
    if (rec.held?.status || JSON.stringify(status) !== rec.writtenStatus) hold(ctx, rec, { status: true });
    return;
  }
  // The status goes out now; held annotations (if any) keep waiting for their timer.
  dropHeldStatus(rec);
  ctx.status.notify({ ...rec.pod, status });
}

/** Stages a lifecycle state (R1, R3, R4) and updates the tracked copy's annotations.
 * Returns false when the engine refused it (stale write or sticky failed). */
export function stageLifecycle(
  ctx: ProviderContext,
  rec: PodRecord,
  state: LifecycleState,
  message = '',
): boolean {
  // The generation we publish never goes down: a pod whose generation annotation went down,
  // vanished or stopped parsing is published at the intent's generation, so no decision can
  // be refused as stale (R3 guards against stale copies; ours is always the newest).
  const podGen = generationOf(rec.pod);
  const held = rec.intent?.uid === rec.uid ? rec.intent.generation : 0n;
  if (podGen < held && !rec.generationWentDown) {
    markGenerationWentDown(rec);
    logFor(ctx, rec).warn(
      { podGeneration: String(podGen), observedGeneration: String(held) },
      'cocoonset generation went down or stopped parsing; publishing at the observed generation',
    );
  }
  const gen = podGen > held ? podGen : held;
  const res = stage(rec.intent, { uid: rec.uid, state, generation: gen, message }, gen);
  if (!res.accepted) {
    logFor(ctx, rec).debug({ state, reason: res.reason }, 'lifecycle stage refused');
    return false;
  }
  setIntent(rec, res.record);
  applyAnnotations(rec, {
    ...lifecycleAnnotations(res.record),
    [LIFECYCLE_STATE_MESSAGE]: res.record.message || null,
  });
  return true;
}

/** Flushes an unflushed intent (R8): the triple, the runtime annotations and the pod status
 * computed with this intent go out in ONE write (a pods/status patch carrying the
 * annotations), so no version of the pod is `ready` without its podIP, or Ready without
 * `ready`. */
export async function flushIntent(ctx: ProviderContext, rec: PodRecord): Promise<PatchOutcome> {
  const intent = rec.intent;
  if (!intent || !isUnflushed(intent)) return 'ok';
  if (intent.state === 'ready' && rec.clonedBoot && rec.vm) {
    // A re-flush after a failed write: the lease may have gone meanwhile. Never publish
    // ready without an IP: step back to creating (the reconcile waits again).
    await refreshIp(ctx, rec);
    if (!rec.ip) {
      logFor(ctx, rec).warn('the IP went away before ready was published; waiting for a lease again');
      stageLifecycle(ctx, rec, 'creating');
      return 'failed';
    }
  }
  const patch = buildLifecyclePatch(rec.uid, intent);
  // The runtime annotations ride along: if the id was held or its write was lost (API
  // outage), the id and ip still reach the apiserver with the decision.
  const extra: Record<string, string | null> = {};
  if (rec.vm && rec.spec?.managed) extra[VM_ID] = rec.vm.id;
  if (intent.state === 'ready') extra[VM_IP] = rec.ip || null;
  const outcome = await writePod(
    ctx,
    rec,
    { ...patch.metadata.annotations, ...extra },
    { status: true, lifecycle: intent.state, priority: intent.state === 'ready' ? 'high' : 'normal' },
  );
  if (outcome === 'ok' && rec.intent === intent) setIntent(rec, markFlushed(intent, comparisonKey(intent)));
  if (outcome === 'superseded') {
    logFor(ctx, rec).info('lifecycle write superseded by another incarnation; dropping intent');
  }
  if (outcome === 'ok') {
    logFor(ctx, rec).info(
      { state: intent.state, generation: String(intent.generation), message: intent.message || undefined },
      'lifecycle published',
    );
    publish(ctx, rec);
  }
  return outcome;
}

/** Emits a Warning once per (VM ID, reason) (docs/contracts/lifecycle.md "Idempotency keyed by VM ID"). */
export function warnOnce(ctx: ProviderContext, rec: PodRecord, reason: string, message: string): void {
  if (!markWarned(rec, reason)) return;
  ctx.events.event(rec.pod, 'Warning', reason, truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES));
}

/** failOp (docs/contracts/lifecycle.md "Failures and recovery"): counter, Warning `<op>: <error>`, stage `failed` with the error text, flush. */
export async function failOp(
  ctx: ProviderContext,
  rec: PodRecord,
  op: 'create' | 'update' | 'delete',
  reason: string,
  message: string,
): Promise<void> {
  ctx.metrics.podLifecycle(op, 'failed', reason);
  warnOnce(ctx, rec, reason, `${op}: ${message}`);
  logFor(ctx, rec).warn({ op, reason, err: message }, 'lifecycle failed');
  if (stageLifecycle(ctx, rec, 'failed', message)) {
    setStep(rec, 'Failed');
    await flushIntent(ctx, rec);
  }
  publish(ctx, rec);
}

/** The pod's lifecycle annotations differ from our intent (a stale copy came back, R6):
 * mark it unflushed so the next flush re-asserts it. */
export function reassertIfStale(
  rec: PodRecord,
  incoming: Record<string, string> | undefined,
  incomingRV?: string,
): void {
  const intent = rec.intent;
  if (!intent) return;
  // A copy older than our own last write is watch lag, not a stale writer: the newer
  // version (ours) is already on its way. resourceVersions are etcd revisions here;
  // when either is not a plain integer we re-assert to stay on the safe side.
  if (incomingRV && rec.lastWriteRV && /^\d+$/.test(incomingRV) && /^\d+$/.test(rec.lastWriteRV)) {
    if (BigInt(incomingRV) < BigInt(rec.lastWriteRV)) return;
  }
  const want = lifecycleAnnotations(intent);
  const have = incoming ?? {};
  const stale = Object.entries(want).some(([k, v]) => (have[k] ?? '') !== v);
  if (stale) setIntent(rec, { ...intent, flushedKey: '' });
}
