// CreatePod: validation and the claim of the pod (`creating`), then the bring-up (clone or
// run) in the pod's own queue, so a slow pull never holds one of the pod controller's
// workers. Failures are recorded on the record (ops/failure.ts), never thrown, except a
// missing VM name, which stays a CreatePod error.
import type { V1Pod } from '@kubernetes/client-node';
import { guestProfile } from '../../../guest/profiles.ts';
import { seedFromAnnotations } from '../../../lifecycle/intent.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { type BringUpResult, cloneBringUp, isTransientCreateError, runBringUp } from '../bringup.ts';
import { holderOfName } from '../claims.ts';
import { decodeSpec, generationOf, isCurrent, logFor, type ProviderContext } from '../context.ts';
import { publish } from '../publication/held.ts';
import { flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { newRecord, type PodRecord, setBringingUp, setIntent, setSpec, setStep } from '../state.ts';
import { adoptByName, adoptUnmanaged, salvageByName } from './adopt.ts';
import { bind, detach } from './bind.ts';
import { cancelRetry, createFailed, parkFailed } from './failure.ts';
import { refuseHibernate } from './hibernate.ts';

export const keyOf = (pod: V1Pod) => `${pod.metadata?.namespace ?? ''}/${pod.metadata?.name ?? ''}`;

function nameHeldMessage(vmName: string, holder: PodRecord): string {
  const vm = holder.vm ? ` (VM ${holder.vm.id})` : '';
  return `VM name ${vmName} is already used by pod ${holder.key}${vm}; two pods never share a VM: give this pod a distinct vm.cocoonstack.io/name`;
}

/** Requests of the next tier that this release decodes but cannot honour: refused loudly,
 * never a fresh boot in their place (docs/decisions.md, "Not built yet"). */
function unbuiltFeature(spec: VMSpec): string | undefined {
  const notYet = 'is not supported by this vk-cocoon release (its tier is not built yet)';
  if (spec.restoreFromHibernate)
    return `restore-from-hibernate: restoring hibernated state ${notYet}; the pod was not booted fresh`;
  if (spec.forkFrom) return `fork-from: forking from ${spec.forkFrom} ${notYet}`;
  if (spec.cloneFromDir) return `clone-from-dir: cloning from ${spec.cloneFromDir} ${notYet}`;
  return undefined;
}

/** Validation and the claim of a create attempt (inside the pod's queue). Returns the
 * record when a bring-up is owed. */
export async function claim(ctx: ProviderContext, pod: V1Pod): Promise<PodRecord | undefined> {
  const key = keyOf(pod);
  const uid = pod.metadata?.uid ?? '';
  const existing = ctx.pods.get(key);
  if (existing?.deleting) throw new Error('delete operation still in flight');
  if (existing && existing.uid === uid && (existing.vm || existing.bringingUp)) {
    // Idempotent: a repeated CreatePod only refreshes status.
    publish(ctx, existing);
    return undefined;
  }
  if (existing && existing.uid !== uid) detach(ctx, existing);

  const decoded = decodeSpec(pod);
  if (!decoded.ok && decoded.errors.some((e) => e.code === 'missing_vmname')) {
    ctx.metrics.podLifecycle('create', 'skipped', 'missing_vmname');
    throw new Error(decoded.errors.map((e) => e.message).join('; '));
  }
  const fresh = existing?.uid !== uid;
  const rec = fresh ? newRecord(key, pod, undefined) : existing;
  setSpec(rec, decoded.ok ? decoded.spec : undefined);
  cancelRetry(ctx, key);
  ctx.pods.set(key, rec);
  const log = logFor(ctx, rec);
  if (fresh) {
    // R7: a pod this process has not tracked yet (after a restart) keeps its published
    // state. A `failed` at its current generation stays parked: failed is sticky across
    // restarts, and only a generation bump (or an input change seen live) re-runs it.
    const seeded = seedFromAnnotations(uid, pod.metadata?.annotations);
    setIntent(rec, seeded);
    if (seeded?.state === 'failed' && generationOf(pod) <= seeded.generation) {
      parkFailed(rec, seeded.message, seeded.generation);
      log.info({ message: seeded.message }, 'pod was published failed at its generation; parked');
      publish(ctx, rec);
      return undefined;
    }
  }

  if (!decoded.ok) {
    // Bad input: a Warning naming the key, lifecycle failed, never a VM, never a crash.
    const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}`;
    await createFailed(ctx, rec, 'CreateBringUpFailed', message, false);
    return undefined;
  }
  const spec = decoded.spec;
  for (const w of decoded.warnings) log.warn({ key: w.key }, w.message);

  // Claim the incarnation (R1). A re-run after a failure is a new attempt (R4): it only
  // happens when the pod's create inputs changed or its generation went up.
  if (stageLifecycle(ctx, rec, 'creating')) await flushIntent(ctx, rec);

  if (!spec.managed) {
    await adoptUnmanaged(ctx, rec, spec);
    return undefined;
  }
  if (spec.hibernate) {
    await refuseHibernate(ctx, rec, 'create');
    return undefined;
  }
  const guest = guestProfile(spec.os);
  if (!guest.supported.ok) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', guest.supported.message, false);
    return undefined;
  }
  const unbuilt = unbuiltFeature(spec);
  if (unbuilt) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', unbuilt, false);
    return undefined;
  }
  const holder = holderOfName(ctx.pods, key, spec.vmName);
  if (holder) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', nameHeldMessage(spec.vmName, holder), false);
    return undefined;
  }
  if (await adoptByName(ctx, rec, spec)) return undefined;
  setBringingUp(rec, true);
  return rec;
}

/** Queues the bring-up of a claimed record behind whatever the pod's queue holds. */
export function startBringUp(ctx: ProviderContext, rec: PodRecord): void {
  setBringingUp(rec, true);
  void ctx.queue
    .run(rec.key, () => bringUp(ctx, rec))
    .catch((err: unknown) => logFor(ctx, rec).warn({ err: String(err) }, 'bring-up failed'));
}

/** The bring-up (clone or run) of a claimed record, in the pod's queue. */
async function bringUp(ctx: ProviderContext, rec: PodRecord): Promise<void> {
  try {
    if (!isCurrent(ctx, rec) || rec.vm || !rec.spec?.managed) return;
    const spec = rec.spec;
    const log = logFor(ctx, rec);
    const started = performance.now();
    setStep(rec, 'BringingUp');
    let result: BringUpResult;
    try {
      result =
        spec.mode === 'run'
          ? await runBringUp(ctx, spec, log)
          : await cloneBringUp(ctx, spec, ctx.puller, log);
    } catch (err) {
      // The VM may exist all the same: a clone that printed its record and then failed to
      // settle, or one that finished after a restart and now holds the name.
      if (await salvageByName(ctx, rec, spec, err)) return;
      const message = err instanceof Error ? err.message : String(err);
      await createFailed(ctx, rec, 'CreateBringUpFailed', message, isTransientCreateError(err));
      return;
    }
    ctx.metrics.bootDuration(
      rec.pod.metadata?.namespace ?? '',
      spec.mode === 'run' ? 'run' : 'clone',
      spec.backend,
      (performance.now() - started) / 1000,
    );
    await bind(ctx, rec, result.vm, { clonedBoot: result.clonedBoot, sourceImage: result.sourceImage });
    ctx.metrics.podLifecycle('create', 'ok', '');
    log.info({ vmId: result.vm.id, ms: Math.round(performance.now() - started) }, 'VM up');
  } finally {
    setBringingUp(rec, false);
  }
}
