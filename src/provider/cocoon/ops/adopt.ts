// Adopting a VM that already exists instead of creating one (docs/decisions.md, "VM
// ownership"): an unmanaged pod's pre-written VM, a kept orphan with the pod's VM name, and
// the VM of a bring-up that failed after the VM was made. A VM another pod holds is never
// adopted.

import { mayAttachUnmanaged } from '../../../authority/rules.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import { VM_ID, VM_IP } from '../../../contract/annotations.ts';
import { startTimeFromApi } from '../../../lifecycle/status.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { isClonedBootSpec } from '../../../vmspec/decode.ts';
import { checkAdopt, confirmVm, ownerOfRec } from '../authority.ts';
import { inspectVm, inspectWithRetry, SettleError } from '../bringup.ts';
import { holderOfVm, isVmId } from '../claims.ts';
import { logFor, type ProviderContext } from '../context.ts';
import { publish } from '../publication/held.ts';
import { flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { bindVm, type PodRecord, setIp, setProbeReady } from '../state.ts';
import { type BindCtx, bind } from './bind.ts';
import { createFailed, type FailureCtx } from './failure.ts';

/** An unmanaged pod's VM: inspected, checked against the ledger, published; or a create failure. */
export type AdoptUnmanagedCtx = FailureCtx & Pick<ProviderContext, 'cli' | 'ledger'>;
/** The VM of a failed bring-up, found under the pod's name: bound like a new one. */
export type SalvageCtx = BindCtx & Pick<ProviderContext, 'cli' | 'ledger' | 'metrics'>;
/** Adoption of a kept orphan by name (or a create failure when it cannot be inspected). */
export type AdoptCtx = AdoptUnmanagedCtx & SalvageCtx & Pick<ProviderContext, 'orphansByName'>;

/** An unmanaged pod names its VM in `vm.cocoonstack.io/id`, written by its operator. That
 * is pod-authored input: only a full VM ID of a VM on this host that no other pod holds is
 * accepted; the VM is never touched. */
export async function adoptUnmanaged(ctx: AdoptUnmanagedCtx, rec: PodRecord, spec: VMSpec): Promise<void> {
  const ann = rec.pod.metadata?.annotations ?? {};
  const id = ann[VM_ID] ?? '';
  const ip = ann[VM_IP] ?? '';
  const fail = (message: string, transient = false) =>
    createFailed(
      ctx,
      rec,
      'CreateBringUpFailed',
      `unmanaged vm ${spec.vmName || rec.key}: ${message}`,
      transient,
    );
  if (!id || !ip)
    return await fail('missing pre-assigned IP/VMID (vm.cocoonstack.io/id and vm.cocoonstack.io/ip)');
  if (!isVmId(id)) {
    return await fail(
      `vm.cocoonstack.io/id must be a full 26-character cocoon VM ID, got ${JSON.stringify(truncateUtf8(id, 64))}`,
    );
  }
  let found: VmRecord | undefined;
  try {
    found = await inspectVm(ctx, id);
  } catch (err) {
    return await fail(`cannot inspect VM ${id}: ${err instanceof Error ? err.message : String(err)}`, true);
  }
  if (!found || found.id !== id) return await fail(`no VM with id ${id} exists on this node`);
  const holder = holderOfVm(ctx.pods, rec.key, { id });
  if (holder) return await fail(`VM ${id} is already bound to pod ${holder.key}`);
  const attach = mayAttachUnmanaged(ownerOfRec(rec, found.name), id, ctx.ledger.vmById(id));
  if (!attach.ok) return await fail(attach.message);
  const vm: VmRecord = {
    ...found,
    nics: [{ mac: '', tap: '', netnsPath: '', static: { ip, gateway: '', prefix: 32 } }],
  };
  // The start the pod already shows (a restart re-adopting it) stays: same VM, same start.
  bindVm(rec, vm, { owns: false, clonedBoot: false, startTime: startTimeFromApi(rec.pod.status) });
  setIp(rec, ip);
  setProbeReady(rec, true);
  if (stageLifecycle(ctx, rec, 'ready')) await flushIntent(ctx, rec);
  publish(ctx, rec);
}

/** A VM kept at startup (orphan policy) with the pod's VM name is adopted, not re-cloned.
 * True when the create is settled (adopted, or failed on an inconclusive inspect). */
export async function adoptByName(ctx: AdoptCtx, rec: PodRecord, spec: VMSpec): Promise<boolean> {
  const indexed = ctx.orphansByName.get(spec.vmName);
  if (!indexed) return false;
  let vm: VmRecord | undefined;
  try {
    vm = await inspectWithRetry(ctx, indexed.id);
  } catch (err) {
    await createFailed(ctx, rec, 'CreateAdoptInspectFailed', `inspect ${spec.vmName}: ${String(err)}`, true);
    return true;
  }
  ctx.orphansByName.delete(spec.vmName);
  if (!vm || vm.name !== spec.vmName) return false;
  if (holderOfVm(ctx.pods, rec.key, vm)) return false;
  const verdict = checkAdopt(ctx, rec, vm);
  if (!verdict.ok) {
    // Kept for its owner (or the host): this pod's clone then finds the name taken.
    ctx.orphansByName.set(spec.vmName, vm);
    logFor(ctx, rec).warn({ vmId: vm.id, rule: verdict.rule }, verdict.message);
    return false;
  }
  await confirmVm(ctx, rec, vm);
  await bind(ctx, rec, vm, {
    clonedBoot: isClonedBootSpec(spec),
    // A CH+Windows wake interrupted by a restart is still a restore (no PnP fixup).
    chWindowsRestore: ctx.ledger.restoreFlag(vm.name),
  });
  ctx.metrics.podLifecycle('create', 'ok', 'adopted');
  logFor(ctx, rec).info({ vmId: vm.id }, 'adopted an existing VM by name');
  return true;
}

/** After a failed bring-up: the VM with the pod's name, if one exists, is running and no
 * other pod holds it, is adopted (the clone did happen). */
export async function salvageByName(
  ctx: SalvageCtx,
  rec: PodRecord,
  spec: VMSpec,
  err: unknown,
): Promise<boolean> {
  const nameTaken = err instanceof CocoonCommandError && err.errorClass === 'vm_name_taken';
  if (!nameTaken && !(err instanceof SettleError)) return false;
  let vm: VmRecord | undefined;
  try {
    vm = await inspectWithRetry(ctx, spec.vmName);
  } catch {
    return false;
  }
  // Only a running VM is adopted: a stopped or half-made one is not the bring-up that was owed
  // (the create is retried; docs/contracts/pod-to-vm.md "CreatePod").
  if (!vm || vm.name !== spec.vmName || vm.state !== 'running') return false;
  if (holderOfVm(ctx.pods, rec.key, vm)) return false;
  // Only a VM the ledger gives to this identity: a host VM or another tenant's of that name
  // is never bound (the failure then names the rule).
  if (!checkAdopt(ctx, rec, vm).ok) return false;
  await confirmVm(ctx, rec, vm);
  await bind(ctx, rec, vm, {
    clonedBoot: isClonedBootSpec(spec),
    // A CH+Windows wake interrupted by a restart is still a restore (no PnP fixup).
    chWindowsRestore: ctx.ledger.restoreFlag(vm.name),
  });
  ctx.metrics.podLifecycle('create', 'ok', 'adopted');
  logFor(ctx, rec).info(
    { vmId: vm.id, err: err instanceof Error ? err.message : String(err) },
    "the bring-up failed but the VM exists under the pod's name: adopted it",
  );
  return true;
}
