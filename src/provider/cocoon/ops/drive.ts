// What a managed pod's hibernate annotation asks of its VM, re-derived on every update,
// readiness reconcile, op retry and after a restart (level-triggered, like the readiness
// reconcile; docs/contracts/pod-to-vm.md, "UpdatePod" rows 7–10):
//
//   hibernate requested, VM present            ⇒ hibernate (unless a failed one waits for its retry)
//   hibernate requested, no VM                 ⇒ nothing (hibernated; a create is CreatePod's)
//   not requested, VM present, `hibernating`
//     or failed with a `hibernate: ` message   ⇒ lift: back to `creating`, then ready
//   not requested, no VM, `hibernated`
//     or failed with a `wake: ` message        ⇒ wake (unless a failed one waits for its retry)
//
// Runs in the pod's queue; it never starts a second operation while one is in flight.
import { inspectVm } from '../bringup.ts';
import { type BringUpCtx, isCurrent, logFor } from '../context.ts';
import { hold } from '../publication/held.ts';
import { failOp, flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { backendOf } from '../readiness/facts.ts';
import { clearedRuntime } from '../record-types.ts';
import { type PodRecord, refreshVm, setCreateFailure, setOpRetry, setStep, setWaking } from '../state.ts';
import { startBringUp } from './create.ts';
import { type EvictCtx, evict } from './evict.ts';
import {
  backToCreating,
  dropsNic,
  HIBERNATE_PREFIX,
  type HibernateCtx,
  startHibernate,
} from './hibernate.ts';
import { restoreNic } from './hibernate-end.ts';
import { hibernateEvidence, wakeOwed } from './restore.ts';
import { retryPending, scheduleOpRetry } from './retry.ts';

/** Nearly the whole context (a drive may evict, hibernate, lift or wake, which starts a
 * bring-up): see BringUpCtx in context.ts. */
export type DriveCtx = BringUpCtx & EvictCtx & HibernateCtx;

/** A hibernate that did not finish left the VM: it goes back to ready when withdrawn. */
function liftOwed(rec: PodRecord): boolean {
  const state = rec.intent?.state;
  const message = rec.intent?.message ?? '';
  return state === 'hibernating' || (state === 'failed' && message.startsWith(HIBERNATE_PREFIX));
}

export async function driveOps(ctx: DriveCtx, rec: PodRecord): Promise<void> {
  // An eviction whose delete failed is re-driven first (ops/evict.ts).
  if (rec.evicting && isCurrent(ctx, rec)) {
    await evict(ctx, rec, rec.evicting.reason, rec.evicting.message);
    return;
  }
  if (!isCurrent(ctx, rec) || !rec.spec?.managed || rec.hibernate || rec.bringingUp) return;
  if (rec.spec.hibernate) {
    // A VM gone while hibernate was asked for (before, during or after an unfinished
    // hibernate): the registry says what is left.
    const orphaned = rec.intent?.state === 'ready' || liftOwed(rec);
    if (!rec.vm && orphaned && !retryPending(rec, 'hibernate')) await confirmFromEvidence(ctx, rec);
    if (!rec.vm || !rec.ownsVm) return;
    if (rec.intent?.state === 'failed' && retryPending(rec, 'hibernate')) return;
    await startHibernate(ctx, rec);
    return;
  }
  if (rec.opRetry?.op === 'hibernate') setOpRetry(rec, undefined);
  if (rec.vm) {
    if (rec.ownsVm && liftOwed(rec) && !retryPending(rec, 'lift')) await lift(ctx, rec);
    return;
  }
  if (wakeOwed(rec) && !retryPending(rec, 'wake')) await startWake(ctx, rec);
}

/** Hibernate requested, no VM, the last hibernate unfinished: `hibernated` when its snapshot is
 * in the registry (or local store), else `failed` "hibernated state lost" (not a `hibernate: `
 * failure: nothing re-runs it). A registry that does not answer ⇒ op retry. */
async function confirmFromEvidence(ctx: DriveCtx, rec: PodRecord): Promise<void> {
  const spec = rec.spec;
  if (!spec) return;
  let found: Awaited<ReturnType<typeof hibernateEvidence>>;
  try {
    found = await hibernateEvidence(ctx, spec, rec);
  } catch {
    scheduleOpRetry(ctx, rec, 'hibernate');
    return;
  }
  setOpRetry(rec, undefined);
  if (found) {
    // A failed hibernate is sticky (R4) except for a new attempt: `hibernating` first, in memory.
    if (rec.intent?.state === 'failed') stageLifecycle(ctx, rec, 'hibernating');
    if (stageLifecycle(ctx, rec, 'hibernated')) {
      setStep(rec, 'Hibernated');
      await flushIntent(ctx, rec);
    }
    logFor(ctx, rec).info({ where: found.where }, 'VM gone after its hibernate snapshot: hibernated');
    return;
  }
  await failOp(
    ctx,
    rec,
    'update',
    'HibernateEvidenceFailed',
    `hibernated state lost: VM ${spec.vmName} is gone and no hibernated snapshot of it exists; delete the pod to boot it fresh`,
  );
}

/** Lift (UpdatePod row 10): a CH VM must answer a live inspect as running first; then
 * `creating` and the readiness reconcile publishes ready. Inconclusive ⇒ op retry. */
async function lift(ctx: DriveCtx, rec: PodRecord): Promise<void> {
  const vm = rec.vm;
  if (!vm) return;
  const log = logFor(ctx, rec);
  let live: Awaited<ReturnType<typeof inspectVm>>;
  try {
    live = await inspectVm(ctx, vm.id);
  } catch (err) {
    log.warn({ err: String(err) }, 'lift: inspect inconclusive; retrying later');
    scheduleOpRetry(ctx, rec, 'lift');
    return;
  }
  if (!live) {
    // Gone behind our back: the failure stands (VM deaths are the event watcher's).
    log.warn('lift: the VM is gone; the pod stays failed');
    return;
  }
  if (backendOf(rec) === 'cloud-hypervisor' && live.state !== 'running') {
    log.warn({ state: live.state }, 'lift: the VM is not running; retrying later');
    scheduleOpRetry(ctx, rec, 'lift');
    return;
  }
  refreshVm(rec, live);
  // A CH+Windows hibernate stopped after its NIC drop (a shutdown, a crash) left no NIC.
  if (dropsNic(rec) && live.nics.length === 0) await restoreNic(ctx, rec, log);
  setOpRetry(rec, undefined);
  log.info('hibernate withdrawn: the VM is kept and goes back to ready');
  await backToCreating(ctx, rec);
}

/** Wake (docs/contracts/pod-to-vm.md, "Wake"): `creating` with the stale runtime annotations
 * cleared in the same write, then a bring-up that restores the hibernated state. */
export async function startWake(ctx: DriveCtx, rec: PodRecord): Promise<void> {
  if (!stageLifecycle(ctx, rec, 'creating')) return;
  hold(ctx, rec, { annotations: clearedRuntime() });
  setWaking(rec, true);
  setCreateFailure(rec, undefined);
  setStep(rec, 'Waking');
  logFor(ctx, rec).info('waking');
  await flushIntent(ctx, rec);
  startBringUp(ctx, rec);
}
