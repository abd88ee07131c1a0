// The end of a hibernate (docs/contracts/pod-to-vm.md, "Hibernate" steps 5–7 and
// "Rollback"), inside the pod's queue: the commit (clear the id, remove the VM, `hibernated`)
// or the bounded rollback (NIC back, id re-published, `failed`, op retry); and the way back
// to ready of a VM that is kept.
import { execArgv, inspectArgv, netArgv, removeArgv } from '../../../cocoon/argv.ts';
import { parseVmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import { VM_ID, VM_IP } from '../../../contract/annotations.ts';
import type { Logger } from '../../../log.ts';
import { type FailOpCtx, isCurrent, type ProviderContext, type PublishCtx } from '../context.ts';
import { hold, writePod } from '../publication/held.ts';
import { failOp, flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { refreshIp } from '../publication/status.ts';
import { clearedRuntime, type HibernateOp, type HibernatePhase } from '../record-types.ts';
import {
  applyAnnotations,
  type PodRecord,
  refreshVm,
  restartReadyClock,
  setHibernateOp,
  setOpRetry,
  setStep,
  unbindVm,
} from '../state.ts';
import { type ReleaseCtx, releaseLeases } from './delete.ts';
import { type OpRetryCtx, scheduleOpRetry } from './retry.ts';

/** The commit and the rollback of a hibernate, inside the pod's queue. */
export type HibernateEndCtx = BackToCreatingCtx &
  FailOpCtx &
  OpRetryCtx &
  ReleaseCtx &
  Pick<ProviderContext, 'cli' | 'ledger' | 'probes' | 'store'>;
/** A kept VM back to ready: `creating`, then the reconcile. */
export type BackToCreatingCtx = PublishCtx & Pick<ProviderContext, 'reconcileSoon'>;

/** Every hibernate failure message starts with this (a withdrawn request lifts it). */
export const HIBERNATE_PREFIX = 'hibernate: ';
/** A rollback is bounded and not cancellable by the caller. */
const ROLLBACK_BUDGET_MS = 30_000;
const REMOVE_TIMEOUT_MS = 90_000;

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

const REASON: Readonly<Record<HibernatePhase, string>> = {
  dhcp_release: 'HibernateNetResizeFailed',
  netresize: 'HibernateNetResizeFailed',
  snapshot: 'HibernateSnapshotFailed',
  push: 'HibernatePushFailed',
  remove: 'HibernateRemoveFailed',
};

export class PhaseFailure extends Error {
  readonly phase: HibernatePhase;
  constructor(phase: HibernatePhase, message: string) {
    super(message);
    this.phase = phase;
  }
}

/** True while `op` is the hibernate of the tracked incarnation and its VM. */
export function owns(ctx: Pick<ProviderContext, 'pods'>, rec: PodRecord, op: HibernateOp): boolean {
  return isCurrent(ctx, rec) && rec.hibernate === op && rec.vm?.id === op.vmId;
}

/** Inside the queue: clear the id, remove the VM, `hibernated`. */
export async function commit(
  ctx: HibernateEndCtx,
  rec: PodRecord,
  op: HibernateOp,
  done: { nicDropped: boolean; pushed: boolean },
  log: Logger,
): Promise<void> {
  if (!owns(ctx, rec, op)) {
    log.info('hibernate superseded (pod deleted or replaced); nothing to commit');
    return;
  }
  const vm = rec.vm;
  const vmName = rec.spec?.vmName ?? vm?.name ?? '';
  if (!vm) return;
  if (!rec.spec?.hibernate) {
    // Withdrawn while saving or pushing: the VM stays and goes back to ready; the snapshot we
    // just pushed would otherwise be evidence for a later create.
    log.info('hibernate withdrawn before the VM was removed; keeping the VM');
    if (done.pushed) await deleteOwnTag(ctx, vmName, log);
    if (done.nicDropped) await restoreNic(ctx, rec, log);
    setHibernateOp(rec, undefined);
    await backToCreating(ctx, rec);
    return;
  }
  const removing: HibernateOp = { ...op, phase: 'remove' };
  setHibernateOp(rec, removing);
  op = removing;
  // The operator reads an empty id as "not live": the id goes before the VM does.
  const cleared = clearedRuntime();
  applyAnnotations(rec, cleared);
  const outcome = await writePod(ctx, rec, cleared);
  if (outcome === 'superseded') return;
  if (outcome === 'failed') {
    const failure = new PhaseFailure('remove', `clearing the VM id on the pod failed; VM ${vmName} kept`);
    await rollback(ctx, rec, op, failure, done, log);
    return;
  }
  try {
    await ctx.cli.run(removeArgv(vm.id), { timeoutMs: REMOVE_TIMEOUT_MS });
  } catch (err) {
    if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
      ctx.metrics.hibernate(rec.pod.metadata?.namespace ?? '', 'remove', 'failed');
      await rollback(ctx, rec, op, new PhaseFailure('remove', `vm rm ${vm.id}: ${errText(err)}`), done, log);
      return;
    }
  }
  // The VM is gone; its identity keeps the saved snapshot's entry (a wake uses it).
  await ctx.ledger.forget('vm', vm.name);
  await releaseLeases(ctx, vm);
  ctx.probes.get(rec.key)?.stop();
  ctx.probes.delete(rec.key);
  unbindVm(rec);
  setHibernateOp(rec, undefined);
  setOpRetry(rec, undefined);
  ctx.metrics.hibernate(rec.pod.metadata?.namespace ?? '', 'remove', 'ok');
  ctx.metrics.podLifecycle('update', 'ok', '');
  stageLifecycle(ctx, rec, 'hibernated');
  setStep(rec, 'Hibernated');
  await flushIntent(ctx, rec);
  const where = ctx.store ? 'snapshot pushed to registry' : 'saved locally (no registry pusher configured)';
  ctx.events.event(rec.pod, 'Normal', 'Hibernated', where);
  log.info({ vmId: vm.id }, `hibernated: ${where}`);
}

/** Inside the queue, bounded: the VM keeps running with its id published; `failed` with a
 * `hibernate: ` message; the op retry tries again. */
export async function rollback(
  ctx: HibernateEndCtx,
  rec: PodRecord,
  op: HibernateOp,
  failure: PhaseFailure,
  done: { nicDropped: boolean; pushed: boolean },
  log: Logger,
): Promise<void> {
  if (!owns(ctx, rec, op)) return;
  const vm = rec.vm;
  if (!vm) return;
  log.warn({ phase: failure.phase, err: failure.message }, 'hibernate failed; rolling back');
  if (done.pushed) await deleteOwnTag(ctx, rec.spec?.vmName ?? vm.name, log);
  if (done.nicDropped) {
    await restoreNic(ctx, rec, log);
    await refreshIp(ctx, rec); // a new MAC: no DHCP IP until its lease
  }
  // The id (and the ip, when it was cleared) go back with the failure, in one write.
  hold(ctx, rec, { annotations: { [VM_ID]: vm.id, [VM_IP]: rec.ip || null } });
  setHibernateOp(rec, undefined);
  scheduleOpRetry(ctx, rec, 'hibernate');
  await failOp(ctx, rec, 'update', REASON[failure.phase], `${HIBERNATE_PREFIX}${failure.message}`);
}

/** Re-adds the NIC a CH+Windows hibernate dropped: new MAC, DHCP IP cleared until the new
 * lease, and a detached `ipconfig /renew`. */
export async function restoreNic(
  ctx: Pick<ProviderContext, 'cli'>,
  rec: PodRecord,
  log: Logger,
): Promise<void> {
  const vm = rec.vm;
  if (!vm) return;
  const signal = AbortSignal.timeout(ROLLBACK_BUDGET_MS);
  try {
    await ctx.cli.run(netArgv(vm.id, 1), { timeoutMs: ROLLBACK_BUDGET_MS, signal });
    const { stdout } = await ctx.cli.run(inspectArgv(vm.id), { timeoutMs: ROLLBACK_BUDGET_MS, signal });
    const live = parseVmRecord(stdout);
    if (live.ok) refreshVm(rec, live.value);
    renewDetached(ctx, vm.id, log);
  } catch (err) {
    log.error({ err: errText(err) }, 'could not re-add the NIC after a failed hibernate');
  }
}

/** `ipconfig /renew` in the guest, not awaited (the rollback is bounded without it). */
export function renewDetached(ctx: Pick<ProviderContext, 'cli'>, vmId: string, log: Logger): void {
  void ctx.cli
    .run(execArgv({ vmId, command: ['cmd', '/c', 'ipconfig', '/renew'] }), { timeoutMs: 20_000 })
    .catch((err: unknown) => log.warn({ err: errText(err) }, 'ipconfig /renew failed'));
}

/** The provider deletes `:hibernate` only to undo its own hibernate (docs/registry.md, "Rules the operator relies on"). */
async function deleteOwnTag(ctx: Pick<ProviderContext, 'store'>, vmName: string, log: Logger): Promise<void> {
  try {
    await ctx.store?.deleteTag(vmName, 'hibernate', AbortSignal.timeout(ROLLBACK_BUDGET_MS));
  } catch (err) {
    log.warn({ err: errText(err) }, 'could not delete the :hibernate tag of an undone hibernate');
  }
}

/** The VM is kept and goes back through `creating` to a ready publication. */
export async function backToCreating(ctx: BackToCreatingCtx, rec: PodRecord): Promise<void> {
  if (!stageLifecycle(ctx, rec, 'creating')) return;
  restartReadyClock(rec);
  setStep(rec, 'Resuming');
  await flushIntent(ctx, rec);
  ctx.reconcileSoon(rec.key);
}
