// UpdatePod: track the newer copy (our own annotations never roll back), then decide from
// it: re-run a failed create only when its inputs changed, report annotations that stopped
// decoding, keep managing a VM whose `managed` flag was turned off, echo a newer generation,
// hibernate, lift or wake as the hibernate annotation asks (ops/drive.ts), and enqueue the
// readiness reconcile. An update never cancels work in
// flight (seed 000).

import type { V1Pod } from '@kubernetes/client-node';
import {
  EVENT_MESSAGE_MAX_BYTES,
  LIFECYCLE_OBSERVED_GENERATION,
  VM_ID,
  VM_IP,
} from '../../../contract/annotations.ts';
import { keyOf } from '../../../kube/key.ts';
import { echoGeneration } from '../../../lifecycle/intent.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { type BringUpCtx, decodeSpec, generationOf, logFor } from '../context.ts';
import { createInputsKey } from '../inputs.ts';
import { flushIntent, reassertIfStale, warnOnce } from '../publication/lifecycle.ts';
import { applyAnnotations, type PodRecord, retrack, setIntent, setSpec, unbindVm } from '../state.ts';
import { type AdoptUnmanagedCtx, adoptUnmanaged } from './adopt.ts';
import { claim, startBringUp } from './create.ts';
import { type DriveCtx, driveOps } from './drive.ts';
import { wakeOwed } from './restore.ts';

/** An update may claim and bring up, adopt an unmanaged pod's VM, or drive a hibernate, lift or
 * wake: nearly the whole context, as ops/drive.ts. */
export type UpdateCtx = AdoptUnmanagedCtx & BringUpCtx & DriveCtx;

export async function updatePod(ctx: UpdateCtx, pod: V1Pod): Promise<void> {
  const key = keyOf(pod);
  const rec = ctx.pods.get(key);
  if (!rec || rec.uid !== pod.metadata?.uid) {
    const claimed = await claim(ctx, pod);
    if (claimed) startBringUp(ctx, claimed);
    return;
  }
  if (rec.deleting) throw new Error('delete operation still in flight');
  // Track the new copy, keeping provider-owned annotations (R6: a stale copy never wins).
  reassertIfStale(rec, pod.metadata?.annotations, pod.metadata?.resourceVersion);
  retrack(rec, pod);
  const decoded = decodeSpec(pod);
  if (!rec.vm) {
    if (rec.bringingUp) {
      await flushIntent(ctx, rec);
      return;
    }
    if (decoded.ok && decoded.spec.managed && wakeOwed(rec)) {
      // Hibernated (or a failed wake): the generation is echoed, and a withdrawn hibernate
      // request wakes it (ops/drive.ts).
      setSpec(rec, decoded.spec);
      echo(rec, pod);
      await flushIntent(ctx, rec);
      await driveOps(ctx, rec);
      return;
    }
    // No VM (a failed or parked create): a new attempt only when the pod's create inputs
    // changed or its generation went up; never for our own writes, status or label updates
    // (docs/decisions.md, "Create failures").
    const f = rec.createFailure;
    if (!f || f.inputsKey !== createInputsKey(pod) || generationOf(pod) > f.generation) {
      const claimed = await claim(ctx, pod);
      if (claimed) startBringUp(ctx, claimed);
    } else {
      await flushIntent(ctx, rec);
    }
    return;
  }
  if (!decoded.ok) {
    // The VM stays and keeps its state; the edit is reported, never silently dropped.
    const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}; the VM is kept and the change is not applied`;
    ctx.events.event(
      rec.pod,
      'Warning',
      'UpdateInvalidAnnotations',
      truncateUtf8(`update: ${message}`, EVENT_MESSAGE_MAX_BYTES),
    );
    logFor(ctx, rec).warn({ err: message }, 'annotations no longer decode');
  } else if (!rec.ownsVm && !decoded.spec.managed) {
    // An unmanaged pod's operator re-pointed it: the new id is validated like the first.
    const ann = pod.metadata?.annotations ?? {};
    setSpec(rec, decoded.spec);
    if ((ann[VM_ID] ?? '') !== rec.vm.id || (ann[VM_IP] ?? '') !== rec.ip) {
      unbindVm(rec);
      await adoptUnmanaged(ctx, rec, decoded.spec);
    }
    // Its VM is the operator's: a hibernate request is not ours to honour, and says so.
    if (decoded.spec.hibernate)
      warnOnce(
        ctx,
        rec,
        'HibernateUnmanaged',
        `update: hibernate requested on an unmanaged pod; its VM ${rec.vm?.name ?? ''} belongs to the operator and vk-cocoon does not hibernate it`,
      );
    return;
  } else if (rec.ownsVm && !decoded.spec.managed) {
    // `managed` turned off on a live pod: we created the VM, so we keep managing it and
    // remove it with the pod (docs/decisions.md), instead of leaking it.
    warnOnce(
      ctx,
      rec,
      'ManagedFlagRemoved',
      `update: cocoonset.cocoonstack.io/managed was turned off on a running pod; vk-cocoon keeps managing VM ${rec.vm.name} and removes it when the pod is deleted`,
    );
  } else {
    setSpec(rec, decoded.spec);
  }
  if (!rec.spec?.managed) return;
  echo(rec, pod);
  await flushIntent(ctx, rec);
  // Hibernate, lift (the hibernate annotation decides; a hibernate in flight goes on).
  await driveOps(ctx, rec);
  ctx.reconcileSoon(key);
}

/** Generation echo (R5): re-stamp the current state with a newer generation. */
function echo(rec: PodRecord, pod: V1Pod): void {
  if (!rec.intent) return;
  const e = echoGeneration(rec.intent, generationOf(pod));
  if (e.changed) {
    setIntent(rec, { ...e.record });
    applyAnnotations(rec, { [LIFECYCLE_OBSERVED_GENERATION]: e.record.generation.toString() });
  }
}
