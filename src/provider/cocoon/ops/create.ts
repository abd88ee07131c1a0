// CreatePod: validation and the claim of the pod (`creating`), then the bring-up (clone or
// run) in the pod's own queue, so a slow pull never holds one of the pod controller's
// workers. Failures are recorded on the record (ops/failure.ts), never thrown, except a
// missing VM name, which stays a CreatePod error.
import type { V1Pod } from '@kubernetes/client-node';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import { guestProfile } from '../../../guest/profiles.ts';
import { keyOf } from '../../../kube/key.ts';
import { seedFromAnnotations } from '../../../lifecycle/intent.ts';
import type { Logger } from '../../../log.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { networkRefusal } from '../../../vmspec/network-policy.ts';
import { CPU_CLASS_MISMATCH, checkSnapshotCpuClass } from '../../../vmspec/snapshot-cpu-class.ts';
import { checkAdopt, checkClaim, confirmVm, intendVm } from '../authority.ts';
import {
  type BringUpResult,
  cloneBringUp,
  inspectVm,
  isTransientCreateError,
  runBringUp,
} from '../bringup.ts';
import { holderOfName, holderOfVm } from '../claims.ts';
import { type BringUpCtx, decodeSpec, generationOf, isCurrent, logFor } from '../context.ts';
import { publish } from '../publication/held.ts';
import { failOp, flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import {
  newRecord,
  type PodRecord,
  setBringingUp,
  setIntent,
  setOpRetry,
  setSpec,
  setStep,
  setWaking,
} from '../state.ts';
import { abortableBringUp, bringUpAborted } from './abort.ts';
import { adoptByName, adoptUnmanaged, salvageByName } from './adopt.ts';
import { bind, detach } from './bind.ts';
import { cancelRetry, createFailed, parkFailed } from './failure.ts';
import { HIBERNATE_PREFIX } from './hibernate.ts';
import { LifecycleError, restoreBringUp, WAKE_PREFIX, wakeOwed } from './restore.ts';
import { scheduleOpRetry } from './retry.ts';
import { dirBringUp, dropStaleFork, forkBringUp, planSource, type SourcePlan } from './sources.ts';

function nameHeldMessage(vmName: string, holder: PodRecord): string {
  const vm = holder.vm ? ` (VM ${holder.vm.id})` : '';
  return `VM name ${vmName} is already used by pod ${holder.key}${vm}; two pods never share a VM: give this pod a distinct vm.cocoonstack.io/name`;
}

/** Validation and the claim of a create attempt (inside the pod's queue). Returns the
 * record when a bring-up is owed. */
export async function claim(ctx: BringUpCtx, pod: V1Pod): Promise<PodRecord | undefined> {
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
    // A failed hibernate or wake is not parked: its op retry survives the restart.
    const opFailure = [HIBERNATE_PREFIX, WAKE_PREFIX].some((p) => seeded?.message.startsWith(p));
    if (seeded?.state === 'failed' && !opFailure && generationOf(pod) <= seeded.generation) {
      parkFailed(rec, seeded.message, seeded.generation);
      log.info({ message: seeded.message }, 'pod was published failed at its generation; parked');
      publish(ctx, rec);
      return undefined;
    }
  }

  const gate = checkSnapshotCpuClass(pod, ctx.config.snapshotCpuClass);
  if (!gate.ok) {
    // The snapshot CPU-class gate (pod-to-vm.md §12): refused, never a VM, never retried.
    await createFailed(ctx, rec, CPU_CLASS_MISMATCH, gate.message, false);
    return undefined;
  }
  if (!decoded.ok) {
    // Bad input: a Warning naming the key, lifecycle failed, never a VM, never a crash.
    const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}`;
    await createFailed(ctx, rec, 'CreateBringUpFailed', message, false);
    return undefined;
  }
  const spec = decoded.spec;
  for (const w of decoded.warnings) log.warn({ key: w.key }, w.message);

  // A pod published hibernated that still asks for hibernate keeps its state, with no
  // registry call and no write (its saved state is the operator's to delete). One caught
  // between the VM's removal and `hibernated` is confirmed from the registry by the bring-up,
  // without a `creating` in between.
  const seededState = rec.intent?.state;
  if (spec.managed && spec.hibernate && seededState === 'hibernated' && !rec.vm) {
    setStep(rec, 'Hibernated');
    publish(ctx, rec);
    return undefined;
  }
  const confirmHibernated = spec.managed && spec.hibernate && seededState === 'hibernating';
  // After a restart, a pod that was hibernated, or whose wake failed, is owed a wake.
  if (spec.managed && !spec.hibernate && !rec.vm && wakeOwed(rec)) setWaking(rec, true);
  // Claim the incarnation (R1). A re-run after a failure is a new attempt (R4): it only
  // happens when the pod's create inputs changed or its generation went up.
  if (!confirmHibernated && stageLifecycle(ctx, rec, 'creating')) await flushIntent(ctx, rec);

  if (!spec.managed) {
    await adoptUnmanaged(ctx, rec, spec);
    return undefined;
  }
  const guest = guestProfile(spec.os);
  if (!guest.supported.ok) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', guest.supported.message, false);
    return undefined;
  }
  const holder = holderOfName(ctx.pods, key, spec.vmName);
  if (holder) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', nameHeldMessage(spec.vmName, holder), false);
    return undefined;
  }
  // The VM name itself is a claim to check (docs/security.md): not a reserved shape, not a
  // VM or snapshot of another identity, not a base image's name.
  const named = checkClaim(ctx, rec, spec.vmName);
  if (!named.ok) {
    await createFailed(ctx, rec, 'CreateBringUpFailed', named.message, false);
    return undefined;
  }
  if (await adoptByName(ctx, rec, spec)) return undefined;
  setBringingUp(rec, true);
  return rec;
}

/** Queues the bring-up of a claimed record behind whatever the pod's queue holds. */
export function startBringUp(ctx: BringUpCtx, rec: PodRecord): void {
  setBringingUp(rec, true);
  void ctx.queue
    .run(
      rec.key,
      abortableBringUp(ctx, rec, () => bringUp(ctx, rec)),
    )
    .catch((err: unknown) => logFor(ctx, rec).warn({ err: String(err) }, 'bring-up failed'));
}

/** The bring-up (clone or run) of a claimed record, in the pod's queue. */
async function bringUp(ctx: BringUpCtx, rec: PodRecord): Promise<void> {
  try {
    if (!isCurrent(ctx, rec) || rec.vm || !rec.spec?.managed) return;
    const spec = rec.spec;
    const log = logFor(ctx, rec);
    // The network allow-list (vmspec/network-policy.ts), before any cocoon call: every boot
    // (create, retry, wake) comes through here, and a refusal is the pod's to fix.
    const refused = networkRefusal(ctx.config.networkPolicy, rec.pod.metadata?.namespace ?? '', spec.network);
    if (refused !== undefined) return await createFailed(ctx, rec, 'NetworkRefused', refused, false);
    const started = performance.now();
    setStep(rec, 'BringingUp');
    let result: BringUpResult & { source: string };
    let plan: SourcePlan | undefined;
    try {
      plan = await planSource(ctx, rec, spec, log);
      if (plan.kind === 'hibernated') {
        await confirmHibernated(ctx, rec, plan.where);
        return;
      }
      if (plan.kind !== 'restore') await dropStaleFork(ctx, rec, spec.vmName, log);
      // The intent goes to the ledger before cocoon makes anything (docs/security.md).
      await intendVm(ctx, rec, spec.vmName);
      result = await bringUpFrom(ctx, rec, spec, plan, log);
      await confirmVm(ctx, rec, result.vm);
    } catch (err) {
      // DeletePod aborted it: nothing to record; the delete removes what it made (ops/abort.ts).
      if (bringUpAborted()) return;
      // The VM may exist all the same: a clone that printed its record and then failed to
      // settle, or one that finished after a restart and now holds the name.
      if (await salvageByName(ctx, rec, spec, err)) return;
      await bringUpFailed(ctx, rec, plan, err);
      return;
    }
    ctx.metrics.bootDuration(
      rec.pod.metadata?.namespace ?? '',
      spec.mode === 'run' ? 'run' : 'clone',
      spec.backend,
      (performance.now() - started) / 1000,
    );
    const woken = plan.kind === 'restore';
    await bind(ctx, rec, result.vm, {
      clonedBoot: result.clonedBoot,
      sourceImage: result.sourceImage,
      bootOp: woken ? 'wake' : 'create',
      chWindowsRestore: woken && spec.backend === 'cloud-hypervisor' && spec.os === 'windows',
    });
    setWaking(rec, false);
    setOpRetry(rec, undefined);
    ctx.metrics.podLifecycle(rec.bootOp === 'wake' ? 'update' : 'create', 'ok', '');
    if (woken) ctx.events.event(rec.pod, 'Normal', 'Woken', `cloned from ${result.source}`);
    log.info(
      { vmId: result.vm.id, ms: Math.round(performance.now() - started), source: result.source },
      'VM up',
    );
  } finally {
    setBringingUp(rec, false);
  }
}

/** The bring-up of a planned source. */
async function bringUpFrom(
  ctx: BringUpCtx,
  rec: PodRecord,
  spec: VMSpec,
  plan: SourcePlan,
  log: Logger,
): Promise<BringUpResult & { source: string }> {
  if (plan.kind !== 'restore') await ctx.ledger.setRestore(spec.vmName, undefined);
  switch (plan.kind) {
    case 'restore': {
      // A restart during a CH+Windows wake must still know it was a restore (no PnP fixup).
      const chWindows = spec.backend === 'cloud-hypervisor' && spec.os === 'windows';
      await ctx.ledger.setRestore(spec.vmName, chWindows ? '' : undefined);
      const r = await restoreBringUp(ctx, spec, rec, log);
      if (chWindows) await ctx.ledger.setRestore(spec.vmName, r.vm.id);
      return { vm: r.vm, clonedBoot: true, sourceImage: '', source: r.source };
    }
    case 'dir':
      return { ...(await dirBringUp(ctx, rec, spec)), source: spec.cloneFromDir };
    case 'fork':
      return { ...(await forkBringUp(ctx, rec, spec, log)), source: `fork-${spec.forkFrom}` };
    case 'run':
      return { ...(await runBringUp(ctx, spec, log)), source: spec.image };
    default:
      return { ...(await cloneBringUp(ctx, rec, spec, ctx.puller, log)), source: spec.image };
  }
}

/** A failed bring-up: a wake fails the pod with a `wake: ` message and is op-retried; a
 * create records its failure (retried on backoff when transient, ops/failure.ts). */
async function bringUpFailed(
  ctx: BringUpCtx,
  rec: PodRecord,
  plan: SourcePlan | undefined,
  err: unknown,
): Promise<void> {
  let message = err instanceof Error ? err.message : String(err);
  const reason = err instanceof LifecycleError ? err.reason : 'CreateBringUpFailed';
  let transient = err instanceof LifecycleError ? err.transient : isTransientCreateError(err);
  if (err instanceof CocoonCommandError && err.errorClass === 'vm_name_taken' && rec.spec) {
    // The name is held by a VM no pod of ours holds: a create of this identity still in
    // flight (a killed predecessor's, after a restart) that was `creating` when salvage
    // looked, or finished since: transient, the retry's salvage adopts it once it runs. A VM
    // the ledger does not give to this identity (made by hand, another tenant's) is refused.
    const holder = await inspectVm(ctx, rec.spec.vmName).catch(() => undefined);
    if (holder && !holderOfVm(ctx.pods, rec.key, holder)) {
      const verdict = checkAdopt(ctx, rec, holder);
      if (verdict.ok) {
        transient = true;
        message = `${message}; VM ${holder.id} (${holder.state}) of that name is not held by any pod: adopting it on the retry`;
      } else {
        transient = false;
        message = verdict.message;
      }
    }
  }
  if (rec.waking && plan?.kind === 'restore') {
    ctx.metrics.wake('failed');
    scheduleOpRetry(ctx, rec, 'wake');
    await failOp(ctx, rec, 'update', reason, `${WAKE_PREFIX}${message}`);
    return;
  }
  await createFailed(ctx, rec, reason, message, transient);
}

/** Hibernate requested and the state is saved: the pod is `hibernated`, with no VM. */
async function confirmHibernated(ctx: BringUpCtx, rec: PodRecord, where: string): Promise<void> {
  setWaking(rec, false);
  if (stageLifecycle(ctx, rec, 'hibernated')) {
    setStep(rec, 'Hibernated');
    await flushIntent(ctx, rec);
  }
  publish(ctx, rec);
  logFor(ctx, rec).info({ where }, 'hibernated state confirmed; nothing to boot');
}
