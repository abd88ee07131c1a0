// Pods evicted by the node's taint while this daemon was away (docs/contracts/pod-to-vm.md,
// "Evicted by the taint"): the node lifecycle controller deletes the pods of a node that stayed
// NotReady past their `tolerationSeconds` and marks them `DisruptionTarget`
// (`DeletionByTaintManager`). That is not a user's delete: the VM may still run and its state is
// the pod's only copy. So the DeletePod of such a pod keeps the VM (no snapshot, no push, no
// removal, no lease release) and indexes it for adoption: a replacement of the same identity
// that lands on this node adopts it in place (the ledger decides identity, ops/adopt.ts). A VM no
// replacement adopts within EVICTED_KEEP_MS is removed without a push: its identity runs on
// another host by then (its replacement woke from the registry), and a second copy, or a push
// over the newer state, is exactly the split brain to avoid.
import type { V1Pod } from '@kubernetes/client-node';
import { entryOwns } from '../../../authority/rules.ts';
import { removeArgv } from '../../../cocoon/argv.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import type { Logger } from '../../../log.ts';
import type { ProviderContext } from '../context.ts';
import type { PodRecord } from '../state.ts';
import { type ReleaseCtx, releaseLeases } from './delete.ts';

/** The VM of a taint-evicted pod, kept and indexed for a replacement. */
export type KeepEvictedCtx = Pick<ProviderContext, 'events' | 'keptEvicted' | 'orphansByName'>;
/** The tick's sweep of kept VMs: removal (no push) of the ones no replacement adopted. */
export type SweepEvictedCtx = ReleaseCtx &
  Pick<ProviderContext, 'cli' | 'keptEvicted' | 'ledger' | 'orphansByName' | 'pods'>;

/** How long a VM kept after a taint eviction waits for a replacement on this node. */
export const EVICTED_KEEP_MS = 10 * 60_000;

/** The pod was deleted by the taint manager (its `DisruptionTarget` condition says so). */
export function evictedByTaint(pod: V1Pod): boolean {
  return (
    pod.status?.conditions?.some(
      (c) => c.type === 'DisruptionTarget' && c.status === 'True' && c.reason === 'DeletionByTaintManager',
    ) ?? false
  );
}

/** What becomes of a kept VM (pure): adopted (it left the orphan index for a pod), still
 * waiting (also while a tracked pod claims its name: an adoption may be in flight, and a
 * claimant the ledger refuses only delays the removal), or due for removal. */
export function keptVerdict(
  kept: { vmId: string; at: number },
  indexed: VmRecord | undefined,
  claimed: boolean,
  now: number,
): 'adopted' | 'wait' | 'remove' {
  if (indexed?.id !== kept.vmId) return 'adopted';
  return !claimed && now - kept.at >= EVICTED_KEEP_MS ? 'remove' : 'wait';
}

/** DeletePod of a taint-evicted pod: the VM is kept and indexed for a replacement. */
export function keepEvictedVm(ctx: KeepEvictedCtx, rec: PodRecord, vm: VmRecord, log: Logger): void {
  ctx.orphansByName.set(vm.name, vm);
  ctx.keptEvicted.set(vm.name, { vmId: vm.id, at: performance.now() });
  ctx.events.event(
    rec.pod,
    'Normal',
    'VMKeptAfterEviction',
    `evicted by the node's taint, not deleted by a user: VM ${vm.name} (${vm.id}) is kept for a replacement of this identity on this node; removed without a push if none adopts it within ${EVICTED_KEEP_MS / 60_000} min`,
  );
  log.warn({ vmId: vm.id }, 'pod evicted by the taint: VM kept for a replacement on this node');
}

/** The tick's sweep of kept VMs: an adopted one is forgotten, an expired one removed (only the
 * very VM the ledger gives to vk-cocoon; never pushed). */
export async function sweepKeptEvicted(ctx: SweepEvictedCtx, now = performance.now()): Promise<void> {
  for (const [name, kept] of ctx.keptEvicted) {
    const claimed = [...ctx.pods.values()].some((r) => r.spec?.managed && r.spec.vmName === name);
    const verdict = keptVerdict(kept, ctx.orphansByName.get(name), claimed, now);
    if (verdict === 'wait') continue;
    ctx.keptEvicted.delete(name);
    if (verdict === 'adopted') continue;
    const vm = ctx.orphansByName.get(name) as VmRecord;
    ctx.orphansByName.delete(name);
    const entry = ctx.ledger.vm(name);
    if (!entry || !entryOwns(entry, entry.owner, vm)) continue;
    try {
      await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
    } catch (err) {
      if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
        ctx.log.warn({ vm: name, vmId: vm.id, err: String(err) }, 'kept VM removal failed; indexed again');
        ctx.orphansByName.set(name, vm);
        ctx.keptEvicted.set(name, { vmId: vm.id, at: now - EVICTED_KEEP_MS + 60_000 });
        continue;
      }
    }
    await ctx.ledger.forget('vm', name);
    await releaseLeases(ctx, vm);
    ctx.log.warn(
      { vm: name, vmId: vm.id },
      'no replacement adopted the VM kept after a taint eviction: removed without a push (its identity runs elsewhere)',
    );
  }
}
