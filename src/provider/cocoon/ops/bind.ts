// Binding a VM to a pod and detaching a superseded incarnation.
import type { VmRecord } from '../../../cocoon/records.ts';
import {
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
  VM_IP,
} from '../../../contract/annotations.ts';
import { isCurrent, logFor, type ProviderContext, type PublishCtx } from '../context.ts';
import { hold, holding, patchAnnotations, publish } from '../publication/held.ts';
import { stageLifecycle } from '../publication/lifecycle.ts';
import { refreshIp } from '../publication/status.ts';
import { supersedeJobs } from '../readiness/jobs.ts';
import type { BootOp } from '../record-types.ts';
import {
  annotationsOf,
  applyAnnotations,
  bindVm,
  type PodRecord,
  setPostCloneFailureReason,
  takeHeld,
} from '../state.ts';
import { cancelRetry } from './failure.ts';

/** A bind publishes the VM, starts its probe and enqueues the readiness reconcile. */
export type BindCtx = PublishCtx & Pick<ProviderContext, 'reconcileSoon' | 'startProbe'>;
/** A detach drops the record, its probe and its retry, and indexes its VM by name. */
export type DetachCtx = Pick<ProviderContext, 'orphansByName' | 'pods' | 'probes' | 'retryTimers'>;

/** Binds a VM the pod now holds: id/ip annotations (UID-fenced), probe, status, reconcile. */
export async function bind(
  ctx: BindCtx,
  rec: PodRecord,
  vm: VmRecord,
  opts: { clonedBoot: boolean; sourceImage?: string; bootOp?: BootOp; chWindowsRestore?: boolean },
): Promise<void> {
  if (!isCurrent(ctx, rec)) return;
  const previousId = annotationsOf(rec)[VM_ID] ?? '';
  bindVm(rec, vm, { owns: true, ...opts });
  // A VM now exists: the last retry's error (ops/failure.ts) no longer describes the pod.
  if (rec.intent?.state === 'creating' && rec.intent.message !== '') stageLifecycle(ctx, rec, 'creating');
  await refreshIp(ctx, rec);
  const changes: Record<string, string | null> = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
  if (previousId !== vm.id) {
    // The post-clone marker belongs to the VM it was written for: a replacement VM gets
    // its own fixup, never the previous VM's `done` or `failed`.
    changes[POST_CLONE_STATE] = null;
    changes[POST_CLONE_HINT] = null;
    changes[POST_CLONE_ERRORS] = null;
    setPostCloneFailureReason(rec, undefined);
  }
  if (holding(ctx, rec)) {
    // A bring-up: the id, ip and Running status ride along with the next write (usually
    // `ready`), or go out on their own after the grace (docs/decisions.md, "Writes per
    // bring-up").
    hold(ctx, rec, { annotations: changes });
  } else {
    applyAnnotations(rec, changes);
    const outcome = await patchAnnotations(ctx, rec, changes);
    if (outcome === 'superseded') {
      logFor(ctx, rec).info('another incarnation owns the name now; detaching quietly');
      return;
    }
  }
  ctx.startProbe(rec);
  publish(ctx, rec);
  ctx.reconcileSoon(rec.key);
}

/** Detaches a superseded incarnation: its VM is indexed by name for adoption by the next one. */
export function detach(ctx: DetachCtx, rec: PodRecord): void {
  supersedeJobs(rec, 'superseded by a new incarnation');
  takeHeld(rec);
  cancelRetry(ctx, rec.key);
  ctx.probes.get(rec.key)?.stop();
  ctx.probes.delete(rec.key);
  if (rec.vm && rec.ownsVm) ctx.orphansByName.set(rec.vm.name, rec.vm);
  if (ctx.pods.get(rec.key) === rec) ctx.pods.delete(rec.key);
}
