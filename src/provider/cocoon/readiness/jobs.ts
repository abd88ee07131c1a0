// The long readiness steps, run outside the pod's queue (docs/contracts/lifecycle.md,
// "Cancellation"): the post-clone fixup and the IP wait. Whatever way a job ends (success, error,
// exception, abort) it records its outcome inside the queue and enqueues another
// reconcile. Jobs never decide readiness and never write the lifecycle.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { execArgv } from '../../../cocoon/argv.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import {
  EVENT_MESSAGE_MAX_BYTES,
  MESSAGE_MAX_BYTES,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
} from '../../../contract/annotations.ts';
import { attemptErrorMessage, joinAttemptErrors } from '../../../guest/attempts.ts';
import { FIXUP_RETRY_DELAY_MS, hintBase64, planFixup } from '../../../guest/postclone.ts';
import { guestProfile } from '../../../guest/profiles.ts';
import { IP_WAIT_POLL_MS, WINDOWS_RENEW_NUDGE_TIMEOUT_MS } from '../../../lifecycle/owed.ts';
import { resolveIp } from '../../../net/lease-parse.ts';
import { pause } from '../../../util/deadline.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { isCurrent, logFor, type ProviderContext } from '../context.ts';
import { patchAnnotations } from '../publication/held.ts';
import type { Job, JobKind } from '../record-types.ts';
import {
  applyAnnotations,
  type PodRecord,
  recordProgress,
  setJob,
  setPostCloneFailureReason,
} from '../state.ts';
import { backendOf, nicsOf } from './facts.ts';

/** Extra time a job may run past its budget before it is abandoned. */
const JOB_GRACE_MS = 10_000;

export function abortJob(rec: PodRecord, why: string): void {
  if (!rec.job) return;
  rec.job.abort.abort(new Error(why));
  setJob(rec, undefined);
}

/** Registers and starts a job for the bound VM. At most one per pod key. */
export function startJob(
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
  };
  setJob(rec, job);
  const log = logFor(ctx, rec).child({ job: kind });
  void (async () => {
    try {
      await body(job);
    } catch (err) {
      // An exception is an outcome like any other: the reconcile re-derives what is owed.
      log.warn({ err: err instanceof Error ? err.message : String(err) }, 'job ended with an exception');
    } finally {
      await ctx.queue.run(rec.key, () => {
        if (rec.job === job) setJob(rec, undefined);
      });
      ctx.reconcileSoon(rec.key);
    }
  })();
}

/** The job's abort signal composed with the provider-lifetime signal only (docs/contracts/lifecycle.md "Cancellation"). */
export function jobSignal(ctx: ProviderContext, job: Job): AbortSignal {
  return AbortSignal.any([ctx.lifetime, job.abort.signal]);
}

/** Runs `fn` in the pod queue only if the job still owns the pod's VM (R9) and is still the
 * pod's registered job: a superseded job (aborted at its hard deadline, its successor
 * started) never writes a marker after its successor did. */
export async function ifStillOwner(
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

/** Post-clone fixup (docs/contracts/post-clone.md "Execution"): `post-clone-state=running`, then `cocoon vm exec`
 * attempts every 3 s within the fixup budget (`VK_FIXUP_BUDGET_SECONDS`, 180 s); success ⇒ `done`; exhaustion ⇒ `failed` + hint + errors
 * (the reconcile then decides `failed`, row 5). */
export async function runFixup(ctx: ProviderContext, rec: PodRecord, job: Job): Promise<void> {
  const signal = jobSignal(ctx, job);
  const budgetEnd = job.startedAt + ctx.config.fixupBudgetSeconds * 1000;
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
        await ctx.cli.run(execArgv({ vmId, command: plan.argv }), {
          timeoutMs: remaining,
          signal,
          priority: 'high',
        });
        log.info({ attempts }, 'post-clone fixup succeeded');
        await ifStillOwner(ctx, rec, job, async () => {
          recordProgress(rec, vmId, { fixupSucceeded: true, fixupAttempts: attempts });
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
        await pause(Math.min(FIXUP_RETRY_DELAY_MS, Math.max(0, budgetEnd - monoNow())), signal);
      }
    }
    if (signal.aborted) return;
  }
  // Exhaustion (docs/contracts/post-clone.md "Exhaustion"): record the marker, hint and error chain; the reconcile decides.
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
    setPostCloneFailureReason(rec, 'PostCloneExecExhausted');
    await patchAnnotations(ctx, rec, changes);
  });
}

/** The IP wait after a cloned boot (docs/contracts/lifecycle.md "IP wait"): woken by every
 * lease-file change (the file's watch, src/net/leases.ts), re-checked every 200 ms until the
 * deadline; Windows gets one `ipconfig /renew` nudge at 30 s. It only observes: the
 * reconcile publishes ready or decides the timeout. */
export async function runIpWait(
  ctx: ProviderContext,
  rec: PodRecord,
  job: Job,
  deadline: number,
  renewNudgeAt: number | undefined,
): Promise<void> {
  const signal = jobSignal(ctx, job);
  const log = logFor(ctx, rec).child({ job: 'ipwait' });
  using lease = ctx.leases.subscribe(); // one shared read per change; unsubscribed on return
  while (!signal.aborted && monoNow() <= deadline + 50) {
    const vm = rec.vm;
    if (!vm || vm.id !== job.vmId || !isCurrent(ctx, rec)) return; // R9: no decision
    const snapshot = await lease.snapshot();
    if (resolveIp(vm, snapshot, Date.now(), rec.ip).ip !== '') return;
    const progress = rec.progress?.vmId === job.vmId ? rec.progress : undefined;
    if (renewNudgeAt !== undefined && progress && !progress.renewNudgeSent && monoNow() >= renewNudgeAt) {
      recordProgress(rec, job.vmId, { renewNudgeSent: true });
      const timeoutMs = Math.max(1, Math.min(WINDOWS_RENEW_NUDGE_TIMEOUT_MS, deadline - monoNow()));
      try {
        const nudge = guestProfile(rec.spec?.os ?? 'linux').renewNudge ?? [];
        await ctx.cli.run(execArgv({ vmId: job.vmId, command: nudge }), {
          timeoutMs,
          signal,
          priority: 'high',
        });
        ctx.metrics.renewNudge('ok');
        log.info('sent the Windows DHCP renew nudge');
      } catch (err) {
        ctx.metrics.renewNudge('failed');
        log.info({ err: String(err) }, 'Windows DHCP renew nudge failed');
      }
      continue; // re-check the lease right after the nudge
    }
    await lease.wait(IP_WAIT_POLL_MS, signal);
  }
}

/** Aborts any job of a record (hibernate, delete, replaced VM: superseded). */
export function supersedeJobs(rec: PodRecord, why: string): void {
  abortJob(rec, why);
}
