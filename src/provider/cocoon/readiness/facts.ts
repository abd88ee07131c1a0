// The observable facts of one pod that the owed-step table reads (docs/contracts/
// lifecycle.md, "Owed steps"): gathered from the tracked record, never from what a job
// remembers.

import { POST_CLONE_ERRORS, POST_CLONE_STATE, parsePostCloneState } from '../../../contract/annotations.ts';
import type { Backend } from '../../../contract/vm.ts';
import type { FixupNic } from '../../../guest/postclone.ts';
import { isUnflushed } from '../../../lifecycle/intent.ts';
import type { ReadinessFacts } from '../../../lifecycle/owed.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { isCurrent, type ProviderContext } from '../context.ts';
import { annotationsOf, type PodRecord } from '../state.ts';

export function nicsOf(rec: PodRecord): FixupNic[] {
  return (rec.vm?.nics ?? []).map((n) => ({ mac: n.mac, static: n.static }));
}

export function backendOf(rec: PodRecord): Backend {
  return rec.vm?.hypervisor === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
}

/** t0 of the ready deadline: the later of "VM bound in this process" and "startup
 * reconcile finished". */
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
    chWindowsRestore: rec.chWindowsRestore,
    bootOp: rec.bootOp,
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
