// CreatePod admission (docs/contracts/pod-to-vm.md, "Admission"): the facts of every tracked
// pod are gathered here, the arithmetic is src/lifecycle/admission.ts, and a pod that does not
// fit is rejected the way the kubelet rejects it: a Warning event with the reason
// (`OutOfpods`, `OutOfcpu`, `OutOfmemory`) and a `Failed` status, written before CreatePod
// returns, with no record, no claim and no VM.
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import {
  type Admission,
  type AdmissionReason,
  admit,
  type Footprint,
  type PodFacts,
  recordFootprint,
  rejectedStatus,
  usage,
  vmEstimate,
} from '../../lifecycle/admission.ts';
import { seedFromAnnotations } from '../../lifecycle/intent.ts';
import type { VMSpec } from '../../vmspec/decode.ts';
import { localSnapshotName } from '../../vmspec/snapshot-name.ts';
import { decodeSpec, type ProviderContext } from './context.ts';
import type { PodRecord } from './state.ts';

/** Rejections remembered for a repeated CreatePod, oldest forgotten first: a rejected pod is
 * never tracked, so no DeletePod comes to forget it; the bound keeps the table small. */
const REJECTED_KEPT = 4096;

/** The size a pod's VM will have, with the clone source's saved size when it was seen. */
export function estimateOf(ctx: ProviderContext, spec: VMSpec | undefined): Footprint {
  if (!spec?.managed) return { cpuMilli: 0n, memoryBytes: 0n };
  const source =
    spec.mode !== 'run' && spec.forkFrom === '' && spec.cloneFromDir === '' && spec.image !== ''
      ? ctx.sourceSizes.get(localSnapshotName(spec.image))
      : undefined;
  return vmEstimate(spec, source);
}

/** Where a tracked record stands for admission (src/lifecycle/admission.ts, header). */
export function factsOf(ctx: ProviderContext, rec: PodRecord): PodFacts {
  const estimate = estimateOf(ctx, rec.spec);
  const vmSize = rec.vm ? recordFootprint(rec.vm.cpus, rec.vm.memoryBytes) : undefined;
  if (rec.deleting || rec.termination || rec.evicting || rec.pod.metadata?.deletionTimestamp)
    return { state: 'gone', vmSize, estimate };
  if (rec.vm) return { state: 'vm', vmSize, estimate };
  const state = rec.intent?.state ?? '';
  const owed =
    rec.spec?.managed === true &&
    (rec.bringingUp || rec.waking || state === '' || state === 'creating') &&
    state !== 'hibernated' &&
    !(rec.createFailure && !rec.createFailure.transient);
  return { state: owed ? 'owed' : 'idle', vmSize, estimate };
}

/** The admission verdict for a pod no record tracks yet. Synchronous on purpose: the caller
 * claims the pod in the same tick, so two concurrent CreatePods never both fit the last slot. */
export function decide(ctx: ProviderContext, pod: V1Pod): Admission {
  const decoded = decodeSpec(pod);
  const request = estimateOf(ctx, decoded.ok ? decoded.spec : undefined);
  const facts: PodFacts[] = [];
  for (const r of ctx.pods.values()) facts.push(factsOf(ctx, r));
  const used = usage(facts);
  const alloc = ctx.allocatable ?? {
    pods: ctx.config.nodePods,
    cpuMilli: undefined,
    memoryBytes: undefined,
  };
  return admit(request, used, alloc);
}

/** The verdict for a CreatePod: ok ⇒ the caller claims the pod in the same tick (no await
 * in between, so two concurrent CreatePods never both fit the last slot); otherwise the
 * caller publishes it with {@link reject}. Only a pod new to this node is checked: a tracked
 * one (a repeated CreatePod), one that carries our lifecycle annotations (admitted by an
 * earlier process of this node) and a same-name replacement of a tracked pod (it takes its
 * predecessor's place) go on unchecked; a pod rejected before gets the same verdict again. */
export function admission(ctx: ProviderContext, pod: V1Pod, key: string): Admission {
  const uid = pod.metadata?.uid ?? '';
  const earlier = ctx.rejected.get(key);
  if (earlier?.uid === uid) return { ok: false, reason: earlier.reason, message: earlier.message };
  if (ctx.pods.has(key) || seedFromAnnotations(uid, pod.metadata?.annotations) !== undefined)
    return { ok: true };
  return decide(ctx, pod);
}

/** Publishes a rejection: the Warning event (once), the `Failed` status, written and waited
 * for (a failure throws: the pod controller retries the CreatePod, which repeats the verdict,
 * so the pod is never left Pending without a word). */
export async function reject(
  ctx: ProviderContext,
  pod: V1Pod,
  key: string,
  reason: AdmissionReason,
  message: string,
): Promise<void> {
  const uid = pod.metadata?.uid ?? '';
  const first = ctx.rejected.get(key)?.uid !== uid;
  ctx.rejected.delete(key);
  ctx.rejected.set(key, { uid, reason, message });
  for (const k of ctx.rejected.keys()) {
    if (ctx.rejected.size <= REJECTED_KEPT) break;
    ctx.rejected.delete(k);
  }
  if (first) {
    ctx.events.event(pod, 'Warning', reason, message);
    ctx.metrics.podLifecycle('create', 'skipped', reason);
    ctx.log.warn({ pod: key, reason, err: message }, 'pod rejected by admission');
  }
  const status = rejectedStatus(reason, message, ctx.nodeIP, new Date()) as unknown as V1PodStatus;
  await ctx.status.writeNow({ ...pod, status });
}
