// What a write carries and when it goes out (docs/decisions.md, "Writes per bring-up";
// docs/contracts/lifecycle.md, "Publication during a bring-up"): during a bring-up the
// changes that are not decisions are held for the pod's next write, or written together
// once PUBLISH_GRACE_MS has passed; otherwise a status goes to the framework's status writer
// at once. Every function here runs inside the pod's queue.
import { monoNow } from '../../../util/mono-clock.ts';
import { isCurrent, logFor, type ProviderContext, type PublishCtx } from '../context.ts';
import {
  applyAnnotations,
  dropHeldStatus,
  holdChanges,
  type PodRecord,
  setHeldTimer,
  setLastStatus,
  takeHeld,
} from '../state.ts';
import { statusOf } from './status.ts';
import { type PatchOutcome, send, type WriteOptions } from './write.ts';

/** How long an intermediate state of a bring-up (the VM id, Running without an IP, the
 * current step) may stay unwritten, waiting to ride along with the pod's next write
 * (docs/decisions.md, "Writes per bring-up"). */
export const PUBLISH_GRACE_MS = 1500;

/** The one write path of the provider-owned state of a pod: `changes` plus whatever is
 * held, in ONE write (see write.ts). With a status (asked for, or held) it is a pods/status
 * patch carrying the annotations too. A failed write holds its held part again for the next
 * write or the grace timer. */
export async function writePod(
  ctx: PublishCtx,
  rec: PodRecord,
  changes: Record<string, string | null>,
  opts: WriteOptions = {},
): Promise<PatchOutcome> {
  const held = takeHeld(rec);
  const annotations = { ...(held?.annotations ?? {}), ...changes };
  const withStatus =
    (opts.status === true || held?.status === true) && isCurrent(ctx, rec) && !rec.termination;
  const outcome = await send(ctx, rec, annotations, withStatus, opts);
  if (outcome === 'failed' && held && isCurrent(ctx, rec)) {
    // Not written: held again; changes held meanwhile are newer and win.
    const newer = takeHeld(rec);
    hold(ctx, rec, {
      annotations: { ...held.annotations, ...(newer?.annotations ?? {}) },
      status: held.status || newer?.status === true,
    });
  }
  return outcome;
}

/** A UID-fenced annotation patch (see {@link writePod}); carries whatever is held. */
export function patchAnnotations(
  ctx: PublishCtx,
  rec: PodRecord,
  annotations: Record<string, string | null>,
): Promise<PatchOutcome> {
  return writePod(ctx, rec, annotations);
}

/** Holds changes of a bring-up for the pod's next write; if none comes within
 * {@link PUBLISH_GRACE_MS} of the first held change, the timer writes them (one write). */
export function hold(
  ctx: PublishCtx,
  rec: PodRecord,
  changes: { annotations?: Record<string, string | null>; status?: boolean },
): void {
  if (changes.annotations) applyAnnotations(rec, changes.annotations);
  const held = holdChanges(rec, changes, monoNow());
  if (held.timer) return;
  const timer = setTimeout(
    () => {
      if (ctx.lifetime.aborted) return;
      void ctx.queue
        .run(rec.key, () => flushHeld(ctx, rec, true))
        .catch((err: unknown) => logFor(ctx, rec).warn({ err: String(err) }, 'held write failed'));
    },
    Math.max(0, held.since + PUBLISH_GRACE_MS - monoNow()),
  );
  timer.unref();
  setHeldTimer(rec, timer);
}

/** Writes what is held (inside the pod's queue). With `dueOnly`, only once the grace of the
 * held write has passed (a timer of an earlier window may fire late). */
export async function flushHeld(ctx: PublishCtx, rec: PodRecord, dueOnly = false): Promise<PatchOutcome> {
  const held = rec.held;
  if (!held) return 'ok';
  if (!isCurrent(ctx, rec)) {
    takeHeld(rec);
    return 'superseded';
  }
  if (dueOnly && monoNow() < held.since + PUBLISH_GRACE_MS - 50) return 'ok';
  return await writePod(ctx, rec, {});
}

/** Intermediate states are held while the pod is being brought up (managed, `creating`,
 * not in a create backoff): the next state usually follows within moments. */
export function holding(ctx: Pick<ProviderContext, 'pods'>, rec: PodRecord): boolean {
  if (!isCurrent(ctx, rec) || rec.termination || !rec.spec?.managed || rec.createFailure) return false;
  const state = rec.intent?.state ?? '';
  return state === '' || state === 'creating';
}

/** Publishes the current status: during a bring-up it is held for the next write (at most
 * {@link PUBLISH_GRACE_MS}); otherwise through the framework's status writer (async,
 * deduped against what it wrote and against the pod's API copy). */
export function publish(ctx: PublishCtx, rec: PodRecord): void {
  if (!isCurrent(ctx, rec) && !rec.termination) return;
  const status = statusOf(ctx, rec);
  setLastStatus(rec, status as never);
  if (holding(ctx, rec)) {
    if (rec.held?.status || JSON.stringify(status) !== rec.writtenStatus) hold(ctx, rec, { status: true });
    return;
  }
  // The status goes out now; held annotations (if any) keep waiting for their timer.
  dropHeldStatus(rec);
  ctx.status.notify({ ...rec.pod, status });
}
