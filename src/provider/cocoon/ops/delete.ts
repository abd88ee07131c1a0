// DeletePod: the VM this pod holds is removed, its DHCP leases released after a confirmed
// removal, and the local snapshots named after that VM removed unless kept. A pod that never
// held a VM of its own (unmanaged, failed create, a name another pod holds) removes nothing.

import type { V1Pod } from '@kubernetes/client-node';
import { entryOwns, mayRemove } from '../../../authority/rules.ts';
import { removeArgv } from '../../../cocoon/argv.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError, POD_OP_QUEUE } from '../../../cocoon/runner.ts';
import { KEEP_SNAPSHOT_ON_DELETE } from '../../../contract/annotations.ts';
import type { Logger } from '../../../log.ts';
import { releaseLease } from '../../../net/release.ts';
import { NotFoundError } from '../../../pods/ports.ts';
import { mayDropSnapshot, ownerOfRec } from '../authority.ts';
import { inspectVm } from '../bringup.ts';
import { holderOfName } from '../claims.ts';
import { logFor, type ProviderContext } from '../context.ts';
import { supersedeJobs } from '../readiness/jobs.ts';
import { dropSnapshot } from '../snapshots.ts';
import { markDeleted, type PodRecord, setDeleting, setHibernateOp, setOpRetry, takeHeld } from '../state.ts';
import { type DeleteSnapshotCtx, SnapshotKeptVm, snapshotBeforeDelete } from './delete-snapshot.ts';
import { evictedByTaint, type KeepEvictedCtx, keepEvictedVm } from './evicted.ts';
import { cancelRetry } from './failure.ts';
import { reconcileOnce } from './stale.ts';

/** A delete: the snapshot before it, the VM's removal or its keeping, leases, local snapshots. */
export type DeleteCtx = DeleteSnapshotCtx &
  KeepEvictedCtx &
  ReleaseCtx &
  Pick<ProviderContext, 'orphansByName' | 'pods' | 'probes' | 'retryTimers'>;
/** The lease release after a confirmed removal (every op that removes a VM). */
export type ReleaseCtx = Pick<ProviderContext, 'config' | 'log' | 'metrics'>;

export async function deletePod(
  ctx: DeleteCtx,
  pod: V1Pod,
  key: string,
  opts: { abortedBringUp?: boolean } = {},
): Promise<void> {
  const rec = ctx.pods.get(key);
  if (!rec) throw new NotFoundError(`pod ${key} is not known to the provider`);
  if (rec.uid !== pod.metadata?.uid) return; // superseded incarnation: success
  const log = logFor(ctx, rec);
  supersedeJobs(rec, 'pod is being deleted');
  cancelRetry(ctx, key);
  // A hibernate in flight is abandoned (its commit finds the pod gone); no retry outlives it.
  rec.hibernate?.abort.abort(new Error('pod is being deleted'));
  setHibernateOp(rec, undefined);
  setOpRetry(rec, undefined);
  ctx.probes.get(key)?.stop();
  ctx.probes.delete(key);
  const vm = rec.vm;
  const keep =
    (pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE] ??
      rec.pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE]) === 'true';
  if (!rec.ownsVm || !vm) {
    // A bring-up this delete aborted (or an earlier attempt of a pod still `creating`, the
    // retry of a delete that failed here included) may have left a VM or a placeholder under
    // the pod's name: level-triggered, looked for on every such delete.
    const state = rec.intent?.state ?? '';
    if (!vm && (opts.abortedBringUp || rec.waking || state === '' || state === 'creating'))
      await removeLeftover(ctx, rec, log);
    // A hibernated pod owns the local copy of its state (unless another pod holds the name).
    const name = rec.spec?.managed ? rec.spec.vmName : '';
    if (name && !keep && rec.intent?.state === 'hibernated' && !holderOfName(ctx.pods, key, name)) {
      await dropOwnSnapshots(ctx, rec, name, log);
    }
    forget(ctx, rec);
    ctx.metrics.podLifecycle('delete', 'skipped', rec.spec?.managed === false ? 'unmanaged' : 'no_vm');
    return;
  }
  if (rec.spec?.managed && evictedByTaint(pod)) {
    keepEvictedVm(ctx, rec, vm, log);
    forget(ctx, rec);
    ctx.metrics.podLifecycle('delete', 'skipped', 'evicted_kept');
    return;
  }
  setDeleting(rec, true);
  try {
    // Deferred: the local `<vmName>` holds the state until its push lands (deferred-push.ts).
    const pushed = await snapshotBeforeDelete(ctx, rec, pod, vm, keep, log);
    try {
      await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000, ...POD_OP_QUEUE });
    } catch (err) {
      if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
        throw new Error(`kept VM ${vm.id}: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    await ctx.ledger.forget('vm', vm.name);
    // Lease release only after a confirmed removal.
    await releaseLeases(ctx, vm);
    if (!keep && vm.name) await dropOwnSnapshots(ctx, rec, vm.name, log, pushed === 'deferred');
  } catch (err) {
    setDeleting(rec, false);
    ctx.metrics.podLifecycle('delete', 'failed', err instanceof SnapshotKeptVm ? 'snapshot' : 'remove');
    log.warn({ err: String(err) }, 'delete failed; the pod stays Terminating and is retried');
    throw err;
  }
  forget(ctx, rec);
  markDeleted(rec);
  ctx.metrics.podLifecycle('delete', 'ok', '');
  log.info({ vmId: vm.id }, 'VM removed');
}

/** After an aborted bring-up (ops/abort.ts): the VM under the pod's name that no other pod
 * holds is what the bring-up made (it ran under this pod's claim of the name). A `creating`
 * placeholder of the killed clone is handed to `vm reconcile-stale-create`, which removes it
 * once its creator is dead (only cocoon knows; ops/stale.ts); any other is removed and its
 * leases released. Anything inconclusive throws: the delete fails and is retried, so the pod
 * never finishes deleting with its VM left behind. */
async function removeLeftover(ctx: DeleteCtx, rec: PodRecord, log: Logger): Promise<void> {
  const name = rec.spec?.managed ? rec.spec.vmName : '';
  if (!name || holderOfName(ctx.pods, rec.key, name)) return;
  // Only what the ledger gives to this pod's identity (its intent, written before the
  // clone): a hand-made VM or another tenant's of that name is never removed.
  const entry = ctx.ledger.vm(name);
  const owner = ownerOfRec(rec, name);
  if (!mayRemove(owner, entry)) return;
  const left = await inspectVm(ctx, name);
  // The very VM the entry was written for (its ID, or made after the intent), not just one of
  // that name.
  if (!left || !entryOwns(entry, owner, left)) return;
  if (left.state === 'creating') {
    const outcome = await reconcileOnce(ctx, left, log);
    if (outcome === 'collected' || outcome === 'not-found') {
      await ctx.ledger.forget('vm', name);
      log.info({ vmId: left.id, outcome }, 'the aborted bring-up left a placeholder: collected');
      return;
    }
    if (outcome !== 'not-creating')
      throw new Error(
        `the aborted bring-up's placeholder ${left.id} of ${name} is not collected yet (${String(outcome)}); retried`,
      );
  }
  try {
    await ctx.cli.run(removeArgv(left.id), { timeoutMs: 60_000, ...POD_OP_QUEUE });
  } catch (err) {
    if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) throw err;
  }
  await ctx.ledger.forget('vm', name);
  await releaseLeases(ctx, left);
  ctx.orphansByName.delete(name);
  log.info({ vmId: left.id, state: left.state }, 'removed the VM an aborted bring-up left');
}

/** `<vmName>` (unless its deferred push still needs it) and `fork-<vmName>`, each only when the ledger gives it to this pod's identity
 * (a base image or another tenant's snapshot of that name is never removed). */
async function dropOwnSnapshots(
  ctx: Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots'>,
  rec: PodRecord,
  vmName: string,
  log: Logger,
  keepState = false,
): Promise<void> {
  const owner = ownerOfRec(rec, vmName);
  for (const name of keepState ? [`fork-${vmName}`] : [vmName, `fork-${vmName}`]) {
    if (mayDropSnapshot(ctx, owner, name)) await dropSnapshot(ctx, name, log);
    else if (ctx.localSnapshots.has(name))
      log.info({ snapshot: name }, 'local snapshot not written for this identity; kept');
  }
}

/** Releases the DHCP leases of a removed VM's NICs through cocoon-net's control socket. */
export async function releaseLeases(ctx: ReleaseCtx, vm: VmRecord): Promise<void> {
  const macs = [
    ...new Set(
      vm.nics
        .filter((n) => !n.static)
        .map((n) => n.mac.toLowerCase())
        .filter(Boolean),
    ),
  ];
  for (const mac of macs) {
    const r = await releaseLease(ctx.config.netControlSocket, mac);
    ctx.metrics.leaseRelease(r.result);
    if (r.result === 'failed')
      ctx.log.warn({ vm: vm.name, mac, err: r.detail }, 'lease release failed; expiry is the fallback');
  }
}

function forget(ctx: Pick<ProviderContext, 'pods'>, rec: PodRecord): void {
  supersedeJobs(rec, 'forgotten');
  takeHeld(rec);
  if (ctx.pods.get(rec.key) === rec) ctx.pods.delete(rec.key);
}
