// The level-triggered readiness reconcile (docs/contracts/lifecycle.md, "Never stranded").
//
// `reconcile` runs inside the pod's queue. It gathers observable facts (facts.ts), asks the
// pure `deriveOwedStep` what the pod is owed, and performs exactly that one step. Long steps
// run as jobs (jobs.ts) that only record outcomes, so no cancellation, update burst or
// exception can leave a pod without a decision.
import {
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_IP,
} from '../../../contract/annotations.ts';
import { isUnflushed } from '../../../lifecycle/intent.ts';
import { deriveOwedStep, type OwedStep, READY_DEADLINE_REASON } from '../../../lifecycle/owed.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { isCurrent, logFor, type ProviderContext } from '../context.ts';
import { hold, patchAnnotations, publish, writePod } from '../publication/held.ts';
import { failOp, flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { refreshIp } from '../publication/status.ts';
import type { JobKind } from '../record-types.ts';
import {
  annotationsOf,
  applyAnnotations,
  type PodRecord,
  progressFor,
  recordProgress,
  setProbeReady,
  setStep,
} from '../state.ts';
import { readinessFacts } from './facts.ts';
import { abortJob, runFixup, runIpWait, startJob } from './jobs.ts';
import { runSac, sacJobBudgetMs } from './sac.ts';

const STEP_NAMES: Record<OwedStep['kind'], string> = {
  none: 'Waiting',
  reflush: 'Publishing',
  startFixup: 'PostCloneFixup',
  startSac: 'WindowsStaticIP',
  publishReady: 'Ready',
  decideFailed: 'Failed',
  startIpWait: 'WaitingForLease',
  ensureIpWait: 'WaitingForLease',
};

const JOB_STEPS: Record<JobKind, string> = {
  fixup: STEP_NAMES.startFixup,
  sac: STEP_NAMES.startSac,
  ipwait: STEP_NAMES.startIpWait,
};

function showStep(ctx: ProviderContext, rec: PodRecord, name: string): void {
  if (rec.step?.name === name) return;
  setStep(rec, name);
  publish(ctx, rec);
}

/** One readiness reconcile of a pod. Must run inside the pod's queue. */
export async function reconcile(ctx: ProviderContext, key: string): Promise<void> {
  const rec = ctx.pods.get(key);
  if (!rec || rec.deleting) return;
  const ipChanged = await refreshIp(ctx, rec);
  const ipStale = rec.spec?.managed === true && (annotationsOf(rec)[VM_IP] ?? '') !== rec.ip;
  if (rec.intent?.state === 'ready' && (ipChanged || ipStale) && isCurrent(ctx, rec)) {
    // cocoon-net rebound the MAC (or the lease expired), seen now or by the probe's own
    // refresh: the ip annotation and podIP change together, in one write; a failed write is
    // held and retried.
    const change = { [VM_IP]: rec.ip || null };
    applyAnnotations(rec, change);
    const outcome = await writePod(ctx, rec, change, { status: true, lifecycle: 'ready' });
    if (outcome === 'failed') hold(ctx, rec, { annotations: change, status: true });
  }
  const now = monoNow();
  const step = deriveOwedStep(readinessFacts(ctx, rec), now);
  ctx.metrics.readinessReconcile(step.kind);
  if (step.kind !== 'none') logFor(ctx, rec).debug({ step: step.kind, row: step.row }, 'readiness step');
  if ('abortJob' in step && step.abortJob) abortJob(rec, 'superseded by a newer decision');

  switch (step.kind) {
    case 'none':
      if (step.reason === 'job_in_flight' && rec.job) showStep(ctx, rec, JOB_STEPS[rec.job.kind]);
      break;
    case 'reflush':
      await flushIntent(ctx, rec);
      break;
    case 'startFixup':
      showStep(ctx, rec, STEP_NAMES.startFixup);
      startJob(ctx, rec, 'fixup', ctx.config.fixupBudgetSeconds * 1000, (job) => runFixup(ctx, rec, job));
      break;
    case 'startSac':
      showStep(ctx, rec, STEP_NAMES.startSac);
      startJob(ctx, rec, 'sac', sacJobBudgetMs(rec), (job) => runSac(ctx, rec, job));
      break;
    case 'publishReady':
      await publishReady(ctx, rec, step.vmId);
      break;
    case 'decideFailed':
      if (step.row === 5) {
        // The exhaustion marker, hint and errors may not have reached the apiserver (the
        // job's patch can fail during an outage): re-send them from the tracked copy first.
        const ann = annotationsOf(rec);
        await patchAnnotations(ctx, rec, {
          [POST_CLONE_STATE]: ann[POST_CLONE_STATE] ?? null,
          [POST_CLONE_HINT]: ann[POST_CLONE_HINT] ?? null,
          [POST_CLONE_ERRORS]: ann[POST_CLONE_ERRORS] ?? null,
        });
      }
      if (step.reason === READY_DEADLINE_REASON) ctx.metrics.readyDeadlineExceeded();
      if (step.reason === 'PostCloneIPWaitTimeout')
        ctx.metrics.ipWait(rec.pod.metadata?.namespace ?? '', 'timeout');
      await failOp(ctx, rec, 'create', step.reason, step.message);
      break;
    case 'startIpWait':
    case 'ensureIpWait': {
      if (progressFor(rec, step.vmId).ipWaitStartedAt === undefined) {
        recordProgress(rec, step.vmId, { ipWaitStartedAt: step.startedAt });
      }
      showStep(ctx, rec, STEP_NAMES.startIpWait);
      if (!rec.job) {
        startJob(ctx, rec, 'ipwait', Math.max(0, step.deadline - now), (job) =>
          runIpWait(ctx, rec, job, step.deadline, step.renewNudgeAt),
        );
      }
      break;
    }
  }
  // Row 1 pods (unmanaged) and anything else with an unflushed intent: re-flush (R1 tick).
  if (rec.intent && isUnflushed(rec.intent) && step.kind !== 'reflush' && isCurrent(ctx, rec)) {
    await flushIntent(ctx, rec);
  }
}

/** Ready publication (R8, guarded by R9): stage `ready`, then one write carrying the status
 * (podIP, PodReady) and the annotations; a refused stage (sticky failed) still refreshes the
 * status as not ready. */
async function publishReady(ctx: ProviderContext, rec: PodRecord, vmId: string): Promise<void> {
  const unchanged = () => isCurrent(ctx, rec) && rec.vm?.id === vmId && !rec.spec?.hibernate;
  if (!unchanged()) return;
  // Without a probe port the probe runs here once, before anything is staged (one ICMP echo, or
  // "an IP resolved" on a host without ICMP: docs/decisions.md, "ICMP probes"), so its result
  // goes into the ready write instead of a status write of its own a probe interval later. The
  // echo runs inside the pod's queue, so an update or a delete waits for it (at most the echo's
  // timeout); nothing is staged before it answers, and the facts are checked again after it.
  const ip = rec.ip;
  let answered = false;
  if (rec.spec?.probePort === undefined && ip !== '' && !rec.probeReady) {
    answered = ctx.icmp ? await ctx.icmp(ip) : true;
    if (!unchanged()) return;
  }
  if (!stageLifecycle(ctx, rec, 'ready')) {
    publish(ctx, rec);
    return;
  }
  applyAnnotations(rec, { [VM_IP]: rec.ip || null });
  setStep(rec, 'Ready');
  if (answered && rec.ip === ip && !rec.probeReady) {
    setProbeReady(rec, true);
    ctx.probes.get(rec.key)?.assumeReady();
  }
  if (rec.clonedBoot && rec.progress?.ipWaitStartedAt !== undefined) {
    ctx.metrics.ipWait(rec.pod.metadata?.namespace ?? '', 'ok');
  }
  if (rec.bootOp === 'wake') ctx.metrics.wake('ok');
  await flushIntent(ctx, rec);
}
