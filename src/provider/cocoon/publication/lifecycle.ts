// The lifecycle intent of a pod (docs/contracts/lifecycle.md, "Intent rules" R1–R8): staging
// a state, flushing it in one write with the status and the runtime annotations, re-asserting
// it over a stale copy, and failOp with its once-per-VM Warning. Every function here runs
// inside the pod's queue (single writer per pod); records change only through the mutators
// of state.ts.
import {
  EVENT_MESSAGE_MAX_BYTES,
  LIFECYCLE_STATE_MESSAGE,
  type LifecycleState,
  VM_ID,
  VM_IP,
} from '../../../contract/annotations.ts';
import {
  buildLifecyclePatch,
  comparisonKey,
  isUnflushed,
  lifecycleAnnotations,
  markFlushed,
  stage,
} from '../../../lifecycle/intent.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { type FailOpCtx, generationOf, logFor, type ProviderContext, type PublishCtx } from '../context.ts';
import {
  applyAnnotations,
  markGenerationWentDown,
  markWarned,
  type PodRecord,
  setIntent,
  setStep,
} from '../state.ts';
import { publish, writePod } from './held.ts';
import { refreshIp } from './status.ts';
import type { PatchOutcome } from './write.ts';

/** Stages a lifecycle state (R1, R3, R4) and updates the tracked copy's annotations.
 * Returns false when the engine refused it (stale write or sticky failed). */
export function stageLifecycle(
  ctx: Pick<ProviderContext, 'log'>,
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
export async function flushIntent(ctx: PublishCtx, rec: PodRecord): Promise<PatchOutcome> {
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
export function warnOnce(
  ctx: Pick<ProviderContext, 'events'>,
  rec: PodRecord,
  reason: string,
  message: string,
): void {
  if (!markWarned(rec, reason)) return;
  ctx.events.event(rec.pod, 'Warning', reason, truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES));
}

/** failOp (docs/contracts/lifecycle.md "Failures and recovery"): counter, Warning `<op>: <error>`, stage `failed` with the error text, flush. */
export async function failOp(
  ctx: FailOpCtx,
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
