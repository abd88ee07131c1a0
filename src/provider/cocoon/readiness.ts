// The level-triggered readiness reconcile (lifecycle.md §10) and the jobs it starts.
//
// `reconcile` runs inside the pod's queue. It gathers observable facts — the tracked pod,
// the intent, the post-clone marker, the VM record, the lease file, in-memory progress
// keyed by VM ID — and asks the pure `deriveOwedStep` what the pod is owed, then performs
// exactly that one step. Jobs (fixup, IP wait) run outside the queue; whatever way they end
// (success, error, exception, abort) they record an outcome inside the queue and enqueue
// another reconcile. They never decide readiness and never write the lifecycle, so no
// cancellation, update burst or exception can leave a pod without a decision.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { execArgv } from '../../cocoon/argv.ts';
import { CocoonCommandError } from '../../cocoon/runner.ts';
import {
  EVENT_MESSAGE_MAX_BYTES,
  MESSAGE_MAX_BYTES,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  parsePostCloneState,
  VM_IP,
} from '../../contract/annotations.ts';
import type { Backend } from '../../contract/vm.ts';
import { attemptErrorMessage, joinAttemptErrors } from '../../guest/attempts.ts';
import {
  FIXUP_BUDGET_MS,
  FIXUP_RETRY_DELAY_MS,
  type FixupNic,
  hintBase64,
  planFixup,
} from '../../guest/postclone.ts';
import { guestProfile } from '../../guest/profiles.ts';
import { isUnflushed } from '../../lifecycle/intent.ts';
import {
  deriveOwedStep,
  type OwedStep,
  READY_DEADLINE_REASON,
  type ReadinessFacts,
} from '../../lifecycle/owed.ts';
import { resolveIp } from '../../net/leases.ts';
import { monoNow } from '../../util/mono-clock.ts';
import { truncateUtf8 } from '../../util/text.ts';
import {
  failOp,
  flushIntent,
  isCurrent,
  logFor,
  type ProviderContext,
  patchAnnotations,
  publish,
  refreshIp,
  stageLifecycle,
  warnOnce,
} from './context.ts';
import {
  annotationsOf,
  applyAnnotations,
  type Job,
  type JobKind,
  type PodRecord,
  progressFor,
} from './record.ts';

/** Extra time a job may run past its budget before it is abandoned (§10.7). */
const JOB_GRACE_MS = 10_000;
const IP_POLL_MS = 200;
const NUDGE_TIMEOUT_MS = 20_000;

function nicsOf(rec: PodRecord): FixupNic[] {
  return (rec.vm?.nics ?? []).map((n) => ({ mac: n.mac, static: n.static }));
}

function backendOf(rec: PodRecord): Backend {
  return rec.vm?.hypervisor === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
}

/** t0 of §10.1: the later of "VM bound in this process" and "startup reconcile finished". */
function t0Of(ctx: ProviderContext, rec: PodRecord): number {
  return Math.max(rec.boundAt ?? monoNow(), ctx.startupDoneAt);
}

export function readinessFacts(ctx: ProviderContext, rec: PodRecord): ReadinessFacts {
  const ann = annotationsOf(rec);
  const spec = rec.spec;
  const job = rec.job;
  return {
    tracked: isCurrent(ctx, rec),
    uid: rec.uid,
    vmName: spec?.vmName ?? rec.vm?.name ?? '',
    deleting: rec.deleting,
    managed: spec?.managed ?? false,
    os: spec?.os ?? 'linux',
    hibernateRequested: spec?.hibernate ?? false,
    vm: rec.vm ? { id: rec.vm.id, backend: backendOf(rec), nics: nicsOf(rec) } : undefined,
    intent: rec.intent?.state ?? '',
    intentUnflushed: rec.intent ? isUnflushed(rec.intent) : false,
    postCloneState: parsePostCloneState(ann[POST_CLONE_STATE]),
    postCloneErrors: ann[POST_CLONE_ERRORS] ?? '',
    postCloneFailureReason: rec.postCloneFailureReason,
    job: job ? { uid: job.uid, vmId: job.vmId, hardDeadline: job.hardDeadline } : undefined,
    clonedBoot: rec.clonedBoot,
    chWindowsRestore: false,
    bootOp: 'create',
    progress: rec.progress
      ? {
          vmId: rec.progress.vmId,
          fixupSucceeded: rec.progress.fixupSucceeded,
          sacDone: rec.progress.sacDone,
          ipWaitStartedAt: rec.progress.ipWaitStartedAt,
        }
      : undefined,
    ip: rec.ip,
    t0: t0Of(ctx, rec),
    readyDeadlineSeconds: ctx.config.readyDeadlineSeconds,
  };
}

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

function setStep(ctx: ProviderContext, rec: PodRecord, name: string): void {
  if (rec.step?.name === name) return;
  rec.step = { name, since: monoNow() };
  publish(ctx, rec);
}

/** One readiness reconcile of a pod. Must run inside the pod's queue. */
export async function reconcile(ctx: ProviderContext, key: string): Promise<void> {
  const rec = ctx.pods.get(key);
  if (!rec || rec.deleting) return;
  const ipChanged = await refreshIp(ctx, rec);
  if (ipChanged && rec.intent?.state === 'ready') {
    // cocoon-net rebound the MAC (or the lease expired): keep the ip annotation in sync.
    applyAnnotations(rec, { [VM_IP]: rec.ip || null });
    await patchAnnotations(ctx, rec, { [VM_IP]: rec.ip || null });
    publish(ctx, rec);
  }
  const now = monoNow();
  const step = deriveOwedStep(readinessFacts(ctx, rec), now);
  ctx.metrics.readinessReconcile(step.kind);
  if (step.kind !== 'none') logFor(ctx, rec).debug({ step: step.kind, row: step.row }, 'readiness step');
  if ('abortJob' in step && step.abortJob) abortJob(rec, 'superseded by a newer decision');

  switch (step.kind) {
    case 'none':
      if (step.reason === 'job_in_flight' && rec.job)
        setStep(ctx, rec, rec.job.kind === 'fixup' ? 'PostCloneFixup' : 'WaitingForLease');
      break;
    case 'reflush':
      await flushIntent(ctx, rec);
      break;
    case 'startFixup':
      setStep(ctx, rec, STEP_NAMES.startFixup);
      startJob(ctx, rec, 'fixup', FIXUP_BUDGET_MS, (job) => runFixup(ctx, rec, job));
      break;
    case 'startSac':
      // Windows static IP over the serial console belongs to the next tier; until it exists
      // it fails loudly instead of leaving the pod creating (tier rule: never silently).
      rec.postCloneFailureReason = 'WindowsStaticIPFailed';
      await failOp(
        ctx,
        rec,
        'create',
        'WindowsStaticIPFailed',
        'sac: Windows static IP over the serial console is not supported by this vk-cocoon release',
      );
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
      const progress = progressFor(rec, step.vmId);
      progress.ipWaitStartedAt ??= step.startedAt;
      setStep(ctx, rec, STEP_NAMES.startIpWait);
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

/** Ready publication (R8, guarded by R9): stage `ready`, write status with podIP, then the
 * annotation; a refused stage (sticky failed) still refreshes the status as not ready. */
async function publishReady(ctx: ProviderContext, rec: PodRecord, vmId: string): Promise<void> {
  if (!isCurrent(ctx, rec) || rec.vm?.id !== vmId || rec.spec?.hibernate) return;
  if (!stageLifecycle(ctx, rec, 'ready')) {
    publish(ctx, rec);
    return;
  }
  applyAnnotations(rec, { [VM_IP]: rec.ip || null });
  rec.step = { name: 'Ready', since: monoNow() };
  if (rec.clonedBoot && rec.progress?.ipWaitStartedAt !== undefined) {
    ctx.metrics.ipWait(rec.pod.metadata?.namespace ?? '', 'ok');
  }
  await flushIntent(ctx, rec);
}

function abortJob(rec: PodRecord, why: string): void {
  if (!rec.job) return;
  rec.job.abort.abort(new Error(why));
  rec.job = undefined;
}

/** Registers and starts a job for the bound VM. At most one per pod key. */
function startJob(
  ctx: ProviderContext,
  rec: PodRecord,
  kind: JobKind,
  budgetMs: number,
  body: (job: Job) => Promise<void>,
): void {
  const vmId = rec.vm?.id;
  if (!vmId || rec.job) return;
  const abort = new AbortController();
  const startedAt = monoNow();
  const job: Job = {
    uid: rec.uid,
    vmId,
    kind,
    startedAt,
    hardDeadline: startedAt + budgetMs + JOB_GRACE_MS,
    abort,
    done: Promise.resolve(),
  };
  rec.job = job;
  const log = logFor(ctx, rec).child({ job: kind });
  job.done = (async () => {
    try {
      await body(job);
    } catch (err) {
      // An exception is an outcome like any other: the reconcile re-derives what is owed.
      log.warn({ err: err instanceof Error ? err.message : String(err) }, 'job ended with an exception');
    } finally {
      await ctx.queue.run(rec.key, () => {
        if (rec.job === job) rec.job = undefined;
      });
      ctx.reconcileSoon(rec.key);
    }
  })();
}

/** The job's abort signal composed with the provider-lifetime signal only (§10.6). */
function jobSignal(ctx: ProviderContext, job: Job): AbortSignal {
  return AbortSignal.any([ctx.lifetime, job.abort.signal]);
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}

/** Runs `fn` in the pod queue only if the job still owns the pod's VM (R9) and is still the
 * pod's registered job: a superseded job (aborted at its hard deadline, its successor
 * started) never writes a marker after its successor did. */
async function ifStillOwner(
  ctx: ProviderContext,
  rec: PodRecord,
  job: Job,
  fn: () => Promise<void> | void,
): Promise<boolean> {
  return await ctx.queue.run(rec.key, async () => {
    if (
      !isCurrent(ctx, rec) ||
      rec.job !== job ||
      rec.uid !== job.uid ||
      rec.vm?.id !== job.vmId ||
      rec.spec?.hibernate
    )
      return false;
    await fn();
    return true;
  });
}

/** Post-clone fixup (lifecycle.md §6.5): `post-clone-state=running`, then `cocoon vm exec`
 * attempts every 3 s within 180 s; success ⇒ `done`; exhaustion ⇒ `failed` + hint + errors
 * (the reconcile then decides `failed`, row 5). */
async function runFixup(ctx: ProviderContext, rec: PodRecord, job: Job): Promise<void> {
  const signal = jobSignal(ctx, job);
  const budgetEnd = job.startedAt + FIXUP_BUDGET_MS;
  const vmId = job.vmId;
  const vm = rec.vm;
  const spec = rec.spec;
  if (!vm || !spec) return;
  const plan = planFixup({
    clonedBoot: true,
    os: spec.os,
    backend: backendOf(rec),
    nics: nicsOf(rec),
    vmName: spec.vmName,
    sourceImage: rec.sourceImage,
    overlayQcow2Exists: existsSync(
      join(ctx.config.cocoonRootDir, 'run', 'cloudhypervisor', vmId, 'overlay.qcow2'),
    ),
  });
  if (!plan.needed) return;
  const log = logFor(ctx, rec).child({ job: 'fixup', kind: plan.kind });
  const marked = await ifStillOwner(ctx, rec, job, async () => {
    applyAnnotations(rec, { [POST_CLONE_STATE]: 'running' });
    await patchAnnotations(ctx, rec, { [POST_CLONE_STATE]: 'running' });
  });
  if (!marked) return;

  const errors: string[] = [];
  let attempts = 0;
  if (!plan.ok) {
    errors.push(`invalid fixup plan: ${plan.error}`);
    attempts = 1;
  } else {
    while (!signal.aborted) {
      const remaining = budgetEnd - monoNow();
      if (remaining <= 0) break;
      attempts++;
      try {
        await ctx.cli.run(execArgv({ vmId, command: plan.argv }), { timeoutMs: remaining, signal });
        log.info({ attempts }, 'post-clone fixup succeeded');
        await ifStillOwner(ctx, rec, job, async () => {
          const progress = progressFor(rec, vmId);
          progress.fixupSucceeded = true;
          progress.fixupAttempts = attempts;
          ctx.metrics.postclone(plan.kind, 'ok');
          ctx.metrics.postcloneAttempts('ok', attempts);
          applyAnnotations(rec, { [POST_CLONE_STATE]: 'done' });
          await patchAnnotations(ctx, rec, { [POST_CLONE_STATE]: 'done' });
          if (rec.intent?.state !== 'failed') {
            ctx.events.event(
              rec.pod,
              'Normal',
              'PostCloneSucceeded',
              `kind=${plan.kind} attempts=${attempts}`,
            );
          }
        });
        return;
      } catch (err) {
        if (signal.aborted) return; // superseded or shutdown: the next owner re-derives
        const text = err instanceof CocoonCommandError ? err.message : String(err);
        const entry = attemptErrorMessage(attempts, text);
        errors.push(text);
        log.info({ attempt: attempts, err: text }, 'post-clone fixup attempt failed');
        await ifStillOwner(ctx, rec, job, () => {
          ctx.events.event(
            rec.pod,
            'Warning',
            'PostCloneExecAttemptFailed',
            truncateUtf8(entry, EVENT_MESSAGE_MAX_BYTES),
          );
        });
        await abortableSleep(Math.min(FIXUP_RETRY_DELAY_MS, Math.max(0, budgetEnd - monoNow())), signal);
      }
    }
    if (signal.aborted) return;
  }
  // Exhaustion (§6.7): record the marker, hint and error chain; the reconcile decides.
  const joined = joinAttemptErrors(errors, MESSAGE_MAX_BYTES);
  log.warn({ attempts, errors: joined }, 'post-clone fixup budget exhausted');
  await ifStillOwner(ctx, rec, job, async () => {
    ctx.metrics.postclone(plan.kind, 'failed');
    ctx.metrics.postcloneAttempts('failed', attempts);
    const changes = {
      [POST_CLONE_STATE]: 'failed',
      [POST_CLONE_HINT]: plan.ok ? hintBase64(plan.hint) : null,
      [POST_CLONE_ERRORS]: joined,
    };
    applyAnnotations(rec, changes);
    rec.postCloneFailureReason = 'PostCloneExecExhausted';
    await patchAnnotations(ctx, rec, changes);
  });
}

/** The IP wait after a cloned boot (lifecycle.md §7.2): poll the lease every 200 ms until the
 * deadline; Windows gets one `ipconfig /renew` nudge at 30 s. It only observes: the
 * reconcile publishes ready or decides the timeout. */
async function runIpWait(
  ctx: ProviderContext,
  rec: PodRecord,
  job: Job,
  deadline: number,
  renewNudgeAt: number | undefined,
): Promise<void> {
  const signal = jobSignal(ctx, job);
  const log = logFor(ctx, rec).child({ job: 'ipwait' });
  while (!signal.aborted && monoNow() <= deadline + 50) {
    const vm = rec.vm;
    if (!vm || vm.id !== job.vmId || !isCurrent(ctx, rec)) return; // R9: no decision
    const snapshot = await ctx.leases.read();
    if (resolveIp(vm, snapshot, Date.now(), rec.ip).ip !== '') return;
    const progress = rec.progress?.vmId === job.vmId ? rec.progress : undefined;
    if (renewNudgeAt !== undefined && progress && !progress.renewNudgeSent && monoNow() >= renewNudgeAt) {
      progress.renewNudgeSent = true;
      const timeoutMs = Math.max(1, Math.min(NUDGE_TIMEOUT_MS, deadline - monoNow()));
      try {
        const nudge = guestProfile(rec.spec?.os ?? 'linux').renewNudge ?? [];
        await ctx.cli.run(execArgv({ vmId: job.vmId, command: nudge }), { timeoutMs, signal });
        ctx.metrics.renewNudge('ok');
        log.info('sent the Windows DHCP renew nudge');
      } catch (err) {
        ctx.metrics.renewNudge('failed');
        log.info({ err: String(err) }, 'Windows DHCP renew nudge failed');
      }
      continue; // re-check the lease right after the nudge
    }
    await abortableSleep(IP_POLL_MS, signal);
  }
}

/** Marks a VM as bound for readiness purposes (t0) and resets progress for a new VM ID. */
export function bindForReadiness(rec: PodRecord): void {
  if (!rec.vm) return;
  rec.boundAt = monoNow();
  progressFor(rec, rec.vm.id);
}

/** Aborts any job of a record (hibernate, delete, replaced VM: superseded, §10.6). */
export function supersedeJobs(rec: PodRecord, why: string): void {
  abortJob(rec, why);
}

export { refreshIp, warnOnce };
