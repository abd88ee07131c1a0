// Hibernate (docs/contracts/pod-to-vm.md, "Hibernate"): lifecycle `hibernating` → NIC drop
// (CH+Windows) → `snapshot save` → push `<vmName>:hibernate` → clear id, ip and post-clone
// state on the pod → remove the VM and release its leases → `hibernated`. The slow phases run
// outside the pod's queue (a push of gigabytes never holds the pod's other work); the commit
// and the rollback run inside it and re-check that the hibernate still owns the pod.
//
// Truth at every point (docs/decisions.md, "Hibernate and wake"): the VM is removed only after
// the manifest PUT succeeded and the id is cleared on the pod, so the VM and its id are never
// both gone while no complete snapshot exists; a daemon killed at any phase re-runs the
// hibernate from the running VM, or confirms `hibernated` from the registry.
import { execArgv, netArgv } from '../../../cocoon/argv.ts';
import { timeoutSignal } from '../../../util/deadline.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { checkPush, enforce, ownerOfRec, podRef, pushStamps } from '../authority.ts';
import { logFor, type ProviderContext } from '../context.ts';
import { flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { backendOf } from '../readiness/facts.ts';
import { supersedeJobs } from '../readiness/jobs.ts';
import type { HibernateOp, HibernatePhase } from '../record-types.ts';
import { saveSnapshot } from '../snapshots.ts';
import { type PodRecord, setHibernateOp, setStep } from '../state.ts';
import { commit, type HibernateEndCtx, PhaseFailure, renewDetached, rollback } from './hibernate-end.ts';

export { backToCreating, HIBERNATE_PREFIX } from './hibernate-end.ts';

/** A hibernate: its phases (NIC drop, save, push) outside the queue, then the commit or rollback. */
export type HibernateCtx = HibernateEndCtx & Pick<ProviderContext, 'localSnapshots' | 'peer'>;

/** Budget of each phase; the deadlines of a hibernate are fixed when it starts. */
export const PHASE_BUDGET_MS: Readonly<Record<HibernatePhase, number>> = {
  dhcp_release: 20_000,
  netresize: 60_000,
  snapshot: 5 * 60_000,
  push: 15 * 60_000,
  remove: 90_000,
};

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** CH+Windows guests drop their NIC before the save (a Windows restore hot-adds a fresh one). */
export function dropsNic(rec: PodRecord): boolean {
  return backendOf(rec) === 'cloud-hypervisor' && rec.spec?.os === 'windows';
}

/** The phases of this pod's hibernate, in order. */
function phasesOf(rec: PodRecord, withRegistry: boolean): HibernatePhase[] {
  const out: HibernatePhase[] = dropsNic(rec) ? ['dhcp_release', 'netresize'] : [];
  out.push('snapshot');
  if (withRegistry) out.push('push');
  out.push('remove');
  return out;
}

/** Starts a hibernate of the bound VM. Runs in the pod's queue. */
export async function startHibernate(ctx: HibernateCtx, rec: PodRecord): Promise<void> {
  const vm = rec.vm;
  if (!vm || !rec.spec) return;
  supersedeJobs(rec, 'hibernate requested');
  if (!stageLifecycle(ctx, rec, 'hibernating')) return;
  const phases = phasesOf(rec, ctx.store !== undefined);
  const deadlines: Partial<Record<HibernatePhase, number>> = {};
  let at = monoNow();
  for (const p of phases) {
    at += PHASE_BUDGET_MS[p];
    deadlines[p] = at;
  }
  const op: HibernateOp = {
    uid: rec.uid,
    vmId: vm.id,
    phase: phases[0] ?? 'snapshot',
    deadlines,
    abort: new AbortController(),
  };
  setHibernateOp(rec, op);
  setStep(rec, 'Hibernating');
  logFor(ctx, rec).info({ phases }, 'hibernating');
  await flushIntent(ctx, rec);
  void runHibernate(ctx, rec, op).catch((err: unknown) =>
    logFor(ctx, rec).error({ err: errText(err) }, 'hibernate ended with an exception'),
  );
}

/** The slow phases, outside the pod's queue; then the commit or the rollback inside it. */
async function runHibernate(ctx: HibernateCtx, rec: PodRecord, first: HibernateOp): Promise<void> {
  const log = logFor(ctx, rec).child({ op: 'hibernate' });
  const ns = rec.pod.metadata?.namespace ?? '';
  const vmName = rec.spec?.vmName ?? rec.vm?.name ?? '';
  // The identity guard on create compares this with the pod's VMSpec image (sources.ts).
  const image = rec.spec?.image ?? '';
  let op = first;
  const done = { nicDropped: false, pushed: false };
  const enter = (phase: HibernatePhase): AbortSignal => {
    const next = { ...op, phase };
    if (rec.hibernate === op) setHibernateOp(rec, next);
    op = next;
    const left = Math.max(0, (op.deadlines[phase] ?? monoNow()) - monoNow());
    return AbortSignal.any([op.abort.signal, ctx.lifetime, timeoutSignal(left)]);
  };
  const vmId = op.vmId;
  try {
    if (dropsNic(rec)) {
      let signal = enter('dhcp_release');
      try {
        await ctx.cli.run(execArgv({ vmId, command: ['cmd', '/c', 'ipconfig', '/release'] }), {
          timeoutMs: PHASE_BUDGET_MS.dhcp_release,
          signal,
        });
        ctx.metrics.hibernate(ns, 'dhcp_release', 'ok');
      } catch (err) {
        // Best effort: the NIC is dropped either way.
        ctx.metrics.hibernate(ns, 'dhcp_release', 'failed');
        log.warn({ err: errText(err) }, 'ipconfig /release failed; dropping the NIC anyway');
      }
      signal = enter('netresize');
      try {
        await ctx.cli.run(netArgv(vmId, 0), { timeoutMs: PHASE_BUDGET_MS.netresize, signal });
        done.nicDropped = true;
        ctx.metrics.hibernate(ns, 'netresize', 'ok');
      } catch (err) {
        ctx.metrics.hibernate(ns, 'netresize', 'failed');
        renewDetached(ctx, vmId, log);
        throw new PhaseFailure('netresize', `dropping the NIC of VM ${vmName}: ${errText(err)}`);
      }
    }
    const signal = enter('snapshot');
    const saveStart = performance.now();
    try {
      await saveSnapshot(ctx, vmName, vmId, {
        signal,
        log,
        owner: ownerOfRec(rec, vmName),
        pod: podRef(rec),
      });
      ctx.metrics.snapshotSave(ns, 'ok', (performance.now() - saveStart) / 1000);
      ctx.metrics.hibernate(ns, 'snapshot', 'ok');
    } catch (err) {
      ctx.metrics.snapshotSave(ns, 'failed', (performance.now() - saveStart) / 1000);
      ctx.metrics.hibernate(ns, 'snapshot', 'failed');
      throw new PhaseFailure('snapshot', `snapshot save ${vmName}: ${errText(err)}`);
    }
    if (ctx.store) {
      const signal = enter('push');
      const pushStart = performance.now();
      try {
        // Never over another identity's tag or a base image (docs/security.md, rule push).
        enforce(await checkPush(ctx, rec, vmName, 'hibernate', signal));
        const r = await ctx.store.push({
          localName: vmName,
          repo: vmName,
          tag: 'hibernate',
          baseImage: image,
          fromNode: ctx.config.nodeName,
          peer: ctx.peer?.stamp,
          ...pushStamps(rec),
          signal,
          log,
        });
        done.pushed = true;
        ctx.metrics.snapshotPush(ns, 'ok', (performance.now() - pushStart) / 1000);
        ctx.metrics.hibernate(ns, 'push', 'ok');
        log.info({ digest: r.digest, snapshotId: r.snapshotId, bytes: r.bytes }, 'hibernate snapshot pushed');
      } catch (err) {
        ctx.metrics.snapshotPush(ns, 'failed', (performance.now() - pushStart) / 1000);
        ctx.metrics.hibernate(ns, 'push', 'failed');
        throw new PhaseFailure('push', `push ${vmName}:hibernate: ${errText(err)}`);
      }
    }
  } catch (err) {
    // Shutdown: the next process re-derives the hibernate from the running VM.
    if (ctx.lifetime.aborted) return;
    const failure = err instanceof PhaseFailure ? err : new PhaseFailure(op.phase, errText(err));
    const late = monoNow() >= (op.deadlines[failure.phase] ?? Number.POSITIVE_INFINITY);
    if (late) failure.message = `${failure.message} (phase ${failure.phase} passed its deadline)`;
    await ctx.queue.run(rec.key, () => rollback(ctx, rec, op, failure, done, log));
    return;
  }
  if (ctx.lifetime.aborted) return;
  await ctx.queue.run(rec.key, () => commit(ctx, rec, op, done, log));
}
