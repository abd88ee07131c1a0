// Startup reconcile: runs once, to completion, before the node registers. A VM, by ID or by
// name, goes to at most one pod (the oldest claimant); no VM any pod references is ever
// removed as an orphan; everything else the orphan policy decides (docs/decisions.md, "VM
// ownership").
import type { V1Pod } from '@kubernetes/client-node';
import { ownerOf } from '../../../authority/owner.ts';
import { entryOwns, mayAdopt } from '../../../authority/rules.ts';
import { listArgv, removeArgv, startArgv } from '../../../cocoon/argv.ts';
import { parseVmList, type VmRecord } from '../../../cocoon/records.ts';
import {
  EVENT_MESSAGE_MAX_BYTES,
  LIFECYCLE_STATE,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
  VM_IP,
} from '../../../contract/annotations.ts';
import { keyOf } from '../../../kube/key.ts';
import { seedFromAnnotations } from '../../../lifecycle/intent.ts';
import { startTimeFromApi, statusFromApi } from '../../../lifecycle/status.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { isClonedBootSpec, type VMSpec } from '../../../vmspec/decode.ts';
import { cpuClassStartupError } from '../../../vmspec/snapshot-cpu-class.ts';
import { byAge, holderOfName, isManagedRaw, referencedVms } from '../claims.ts';
import { decodeSpec, type FailOpCtx, type ProviderContext } from '../context.ts';
import { patchAnnotations, publish } from '../publication/held.ts';
import { failOp } from '../publication/lifecycle.ts';
import { refreshIp } from '../publication/status.ts';
import { indexLocalSnapshots } from '../snapshots.ts';
import {
  applyAnnotations,
  bindVm,
  newRecord,
  type PodRecord,
  setIntent,
  setLastStatus,
  setProbeReady,
} from '../state.ts';
import { type AdoptUnmanagedCtx, adoptUnmanaged } from './adopt.ts';
import { type ReleaseCtx, releaseLeases } from './delete.ts';
import { HIBERNATE_PREFIX } from './hibernate.ts';
import { type OpRetryCtx, scheduleOpRetry } from './retry.ts';
import { reconcileStaleCreates, type StaleCtx } from './stale.ts';
import { takeOverAtFirstStart, type UpgradeCtx } from './upgrade.ts';

/** Startup reconcile: the ledger, stale creates, adoption by ID and by name, orphans, probes. */
export type StartupCtx = AdoptUnmanagedCtx &
  FailOpCtx &
  OpRetryCtx &
  ReleaseCtx &
  StaleCtx &
  UpgradeCtx &
  Pick<ProviderContext, 'icmp' | 'localSnapshots' | 'orphansByName' | 'startProbe'>;

export async function startupReconcile(ctx: StartupCtx, pods: V1Pod[]): Promise<void> {
  // Step 2: the snapshot CPU-class gate; a mismatching non-terminal pod refuses the startup.
  const gate = cpuClassStartupError(pods, ctx.config.snapshotCpuClass);
  if (gate) throw new Error(gate);
  const { stdout } = await ctx.cli.run(listArgv(), { timeoutMs: 60_000 });
  const listed = parseVmList(stdout);
  if (!listed.ok) throw new Error(`cocoon vm list: ${listed.error}`);
  // Placeholders of interrupted creates free their names (or become adoptable) first.
  await reconcileStaleCreates(ctx, listed.value);
  // The provenance ledger against what cocoon shows, then (first start only) the upgrade rule.
  const snapshots = await indexLocalSnapshots(ctx);
  const reconciled = await ctx.ledger.reconcile(listed.value, snapshots);
  ctx.log.info({ ...reconciled, ...ctx.ledger.size() }, 'provenance ledger reconciled');
  if (ctx.ledger.firstStart) await takeOverAtFirstStart(ctx, pods, listed.value, snapshots);
  const byId = new Map(listed.value.map((vm) => [vm.id, vm]));
  const byName = new Map(listed.value.map((vm) => [vm.name, vm]));
  const live = pods
    .filter((p) => p.status?.phase !== 'Succeeded' && p.status?.phase !== 'Failed')
    .sort(byAge);
  const claimed = new Set<string>();

  // Pass 1: pods that name an existing VM by its ID keep it (oldest first).
  for (const pod of live) {
    const ann = pod.metadata?.annotations ?? {};
    const vm = ann[VM_ID] ? byId.get(ann[VM_ID]) : undefined;
    if (!vm || claimed.has(vm.id)) continue;
    const key = keyOf(pod);
    const decoded = decodeSpec(pod);
    if (!isManagedRaw(pod)) {
      if (!decoded.ok) continue; // CreatePod reports the invalid annotations
      const rec = seeded(ctx, pod, decoded.spec);
      await adoptUnmanaged(ctx, rec, decoded.spec);
      if (rec.vm) claimed.add(vm.id);
      continue;
    }
    if (vm.state === 'creating') continue;
    const verdict = mayAdopt(ownerOf(pod, vm.name), vm, ctx.ledger.vm(vm.name));
    if (!verdict.ok) {
      // Its CreatePod reports the refusal; the VM stays its owner's (or the host's).
      ctx.log.warn({ pod: key, vm: vm.name, vmId: vm.id, rule: verdict.rule }, verdict.message);
      continue;
    }
    claimed.add(vm.id);
    const rec = seeded(ctx, pod, decoded.ok ? decoded.spec : undefined);
    adopt(ctx, rec, vm);
    if (!decoded.ok) {
      // Its annotations stopped decoding: the VM is kept (never destroyed because of an
      // annotation edit) and the problem is reported.
      const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}; the VM ${vm.name} is kept`;
      ctx.events.event(
        pod,
        'Warning',
        'UpdateInvalidAnnotations',
        truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES),
      );
      ctx.log.warn(
        { pod: key, vm: vm.name, vmId: vm.id, err: message },
        'adopted a VM of a pod whose annotations do not decode',
      );
    }
    await refreshIp(ctx, rec);
    ctx.log.info({ pod: key, vm: vm.name, vmId: vm.id, intent: rec.intent?.state }, 'adopted after restart');
  }

  // Pass 2: managed pods without a live VM ID adopt the VM of their name, unless another
  // pod holds that VM or that name.
  for (const pod of live) {
    const key = keyOf(pod);
    if (ctx.pods.has(key) || !isManagedRaw(pod)) continue;
    const decoded = decodeSpec(pod);
    if (!decoded.ok) continue;
    const spec = decoded.spec;
    const ann = pod.metadata?.annotations ?? {};
    if (ann[VM_ID] && !byId.has(ann[VM_ID])) {
      ctx.log.warn(
        { pod: key, vmId: ann[VM_ID] },
        'pod names a VM that does not exist; leaving it to CreatePod',
      );
      continue;
    }
    const vm = byName.get(spec.vmName);
    if (!vm && ann[LIFECYCLE_STATE] === 'hibernated' && !holderOfName(ctx.pods, key, spec.vmName)) {
      // Tracked without a VM: it holds its VM name from now on (claims.ts).
      seeded(ctx, pod, spec);
      continue;
    }
    if (!vm || vm.state === 'creating' || claimed.has(vm.id) || holderOfName(ctx.pods, key, spec.vmName))
      continue;
    if (!mayAdopt(ownerOf(pod, vm.name), vm, ctx.ledger.vm(vm.name)).ok) continue;
    claimed.add(vm.id);
    const rec = seeded(ctx, pod, spec);
    adopt(ctx, rec, vm);
    await refreshIp(ctx, rec);
    ctx.metrics.adoptByName();
    const changes: Record<string, string | null> = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
    if ((ann[VM_ID] ?? '') !== vm.id) {
      // A marker written without this VM's ID on the pod cannot be attributed to it.
      changes[POST_CLONE_STATE] = null;
      changes[POST_CLONE_HINT] = null;
      changes[POST_CLONE_ERRORS] = null;
    }
    applyAnnotations(rec, changes);
    await patchAnnotations(ctx, rec, changes);
    ctx.log.info(
      { pod: key, vm: vm.name, vmId: vm.id, intent: rec.intent?.state },
      'adopted by VM name after restart',
    );
  }

  await sweepOrphans(ctx, listed.value, claimed, referencedVms(live));
  ctx.startupDoneAt = monoNow();
  for (const rec of [...ctx.pods.values()]) {
    if (rec.vm && rec.ownsVm) {
      seedProbe(ctx, rec);
      ctx.startProbe(rec, { ready: rec.probeReady });
    }
    if (rec.vm && rec.ownsVm && rec.spec?.hibernate) await resumeHibernate(ctx, rec, rec.vm.id);
    publish(ctx, rec);
    ctx.reconcileSoon(rec.key);
  }
}

/** A hibernate requested (or in flight) while the daemon was down resumes from the running VM
 * (the reconcile drives it, ops/drive.ts): `vm start` first, since a VMM killed with the host
 * can leave a stopped record (a no-op on a running VM). A start failure is `failed` with a
 * `hibernate: ` message and an op retry. */
async function resumeHibernate(
  ctx: FailOpCtx & OpRetryCtx & Pick<ProviderContext, 'cli'>,
  rec: PodRecord,
  vmId: string,
): Promise<void> {
  ctx.metrics.startupResume('hibernate');
  ctx.events.event(rec.pod, 'Normal', 'ResumedAfterRestart', 'op=hibernate');
  try {
    await ctx.cli.run(startArgv(vmId), { timeoutMs: 60_000 });
  } catch (err) {
    scheduleOpRetry(ctx, rec, 'hibernate');
    const why = err instanceof Error ? err.message : String(err);
    await failOp(
      ctx,
      rec,
      'update',
      'ResumeStartFailed',
      `${HIBERNATE_PREFIX}vm start ${vmId} before resuming the hibernate: ${why}`,
    );
  }
}

/** A tracked record for a pod found at startup, its intent seeded from its annotations and
 * its previous status from the API copy (R7): a pod whose published state is right is
 * re-published as it is, with its transition times, and costs no write. */
function seeded(ctx: Pick<ProviderContext, 'pods'>, pod: V1Pod, spec: VMSpec | undefined): PodRecord {
  const rec = newRecord(keyOf(pod), pod, spec);
  setIntent(rec, seedFromAnnotations(rec.uid, pod.metadata?.annotations));
  const previous = statusFromApi(pod.status);
  if (previous) setLastStatus(rec, previous);
  ctx.pods.set(rec.key, rec);
  return rec;
}

/** Binds the VM a managed pod holds after a restart (a CH+Windows wake's restore flag comes
 * from the ledger: a restored guest never gets the PnP fixup of a fresh clone). */
function adopt(ctx: Pick<ProviderContext, 'ledger'>, rec: PodRecord, vm: VmRecord): void {
  bindVm(rec, vm, {
    owns: true,
    clonedBoot: rec.spec ? isClonedBootSpec(rec.spec) : false,
    startTime: startTimeFromApi(rec.pod.status) ?? new Date(),
    chWindowsRestore: ctx.ledger.restoreFlag(vm.name),
  });
}

/** The probe result a restart starts from (R7): the `Ready` the pod shows (the previous
 * incarnation's last result) stands until the probe says otherwise; on a host without ICMP a
 * pod without a probe port is ready once its IP resolved, known now. */
function seedProbe(ctx: Pick<ProviderContext, 'icmp'>, rec: PodRecord): void {
  const shown =
    rec.intent?.state === 'ready' &&
    rec.pod.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
  setProbeReady(rec, rec.spec?.probePort === undefined && !ctx.icmp ? rec.ip !== '' : shown);
}

/** Orphans: VMs no pod holds and no pod references by ID or name. */
async function sweepOrphans(
  ctx: ReleaseCtx & Pick<ProviderContext, 'cli' | 'ledger' | 'orphansByName'>,
  vms: readonly VmRecord[],
  claimed: ReadonlySet<string>,
  refs: { ids: Set<string>; names: Set<string> },
): Promise<void> {
  for (const vm of vms) {
    if (claimed.has(vm.id) || vm.state === 'creating') continue;
    if (refs.ids.has(vm.id) || refs.names.has(vm.name)) {
      ctx.log.info({ vm: vm.name, vmId: vm.id }, 'VM referenced by a pod that does not hold it; kept');
      ctx.orphansByName.set(vm.name, vm);
      continue;
    }
    const policy = ctx.config.orphanPolicy;
    const ours = ctx.ledger.vm(vm.name);
    if (policy === 'destroy' && !(ours && ours.origin !== 'pulled' && entryOwns(ours, ours.owner, vm))) {
      // Never destroyed: vk-cocoon did not make it (a host VM, a Go-era VM no pod names).
      ctx.metrics.orphanVm();
      ctx.log.warn(
        { vm: vm.name, vmId: vm.id },
        'VM no pod claims was not made by vk-cocoon (provenance ledger): kept',
      );
      ctx.orphansByName.set(vm.name, vm);
      continue;
    }
    if (policy === 'destroy') {
      ctx.log.warn({ vm: vm.name, vmId: vm.id }, 'orphan VM: destroying (VK_ORPHAN_POLICY=destroy)');
      try {
        await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
        await ctx.ledger.forget('vm', vm.name);
        await releaseLeases(ctx, vm);
      } catch (err) {
        ctx.log.warn({ vm: vm.name, err: String(err) }, 'orphan removal failed; indexing it for adoption');
        ctx.orphansByName.set(vm.name, vm);
      }
    } else {
      if (policy === 'alert') {
        ctx.metrics.orphanVm();
        ctx.log.warn({ vm: vm.name, vmId: vm.id }, 'orphan VM kept (VK_ORPHAN_POLICY=alert)');
      }
      ctx.orphansByName.set(vm.name, vm);
    }
  }
}
