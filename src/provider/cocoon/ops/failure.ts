// Failed creates (docs/decisions.md, "Create failures"). Permanent failures are published
// `failed` and wait for a change of the pod's create inputs or a generation bump; transient
// ones stay `creating` and are retried on a backoff schedule, until the ready deadline turns
// them into `failed` too. Our own writes never re-run either.

import { EVENT_MESSAGE_MAX_BYTES, MESSAGE_MAX_BYTES } from '../../../contract/annotations.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { type FailOpCtx, generationOf, isCurrent, logFor, type ProviderContext } from '../context.ts';
import { createInputsKey } from '../inputs.ts';
import { publish } from '../publication/held.ts';
import { failOp, flushIntent, stageLifecycle } from '../publication/lifecycle.ts';
import { type PodRecord, setCreateFailure, setStep } from '../state.ts';

/** Transient create failures are retried 10 s, 20 s, … up to every 5 min (like the kubelet's
 * back-off), until the ready deadline turns them into `failed`. */
export const CREATE_RETRY_BASE_MS = 10_000;
export const CREATE_RETRY_MAX_MS = 5 * 60_000;

/** A create failure published, and the timer of its retry (which ctx.retryCreate starts). */
export type FailureCtx = FailOpCtx & Pick<ProviderContext, 'retryCreate' | 'retryTimers'>;

export async function createFailed(
  ctx: FailureCtx,
  rec: PodRecord,
  reason: string,
  message: string,
  transient: boolean,
): Promise<void> {
  const now = monoNow();
  const inputsKey = createInputsKey(rec.pod);
  const generation = rec.intent?.generation ?? generationOf(rec.pod);
  const prev = rec.createFailure;
  const streak = prev !== undefined && prev.inputsKey === inputsKey && prev.generation === generation;
  const attempts = streak ? prev.attempts + 1 : 1;
  const firstAt = streak ? prev.firstAt : now;
  const giveUp = transient && now - firstAt >= ctx.config.readyDeadlineSeconds * 1000;
  if (transient && !giveUp && rec.intent?.state !== 'failed') {
    const delay = Math.min(CREATE_RETRY_MAX_MS, CREATE_RETRY_BASE_MS * 2 ** Math.min(attempts - 1, 20));
    setCreateFailure(rec, {
      inputsKey,
      generation,
      transient,
      attempts,
      firstAt,
      retryAt: now + delay,
      message,
    });
    setStep(rec, 'CreateBackoff');
    ctx.metrics.podLifecycle('create', 'failed', 'transient');
    // One event per (pod, reason): repeats are aggregated into its count.
    ctx.events.event(
      rec.pod,
      'Warning',
      reason,
      truncateUtf8(`create: ${message}; retrying`, EVENT_MESSAGE_MAX_BYTES),
    );
    logFor(ctx, rec).warn(
      { reason, err: message, attempts, retryInMs: delay },
      'create failed; retrying with backoff',
    );
    // The last error shows on the pod while it retries: the lifecycle message (`creating`
    // carries one only here; the next attempt's outcome replaces it) and the readiness
    // condition (publication/status.ts), written together now.
    const shown = truncateUtf8(`retrying after attempt ${attempts}: ${message}`, MESSAGE_MAX_BYTES);
    if (stageLifecycle(ctx, rec, 'creating', shown)) await flushIntent(ctx, rec);
    publish(ctx, rec);
    scheduleRetry(ctx, rec, delay);
    return;
  }
  setCreateFailure(rec, {
    inputsKey,
    generation,
    transient: false,
    attempts,
    firstAt,
    retryAt: undefined,
    message,
  });
  await failOp(
    ctx,
    rec,
    'create',
    reason,
    giveUp ? `${message} (gave up after ${attempts} attempts)` : message,
  );
}

/** A pod published `failed` at its current generation before this process tracked it
 * stays parked (failed is sticky across restarts). */
export function parkFailed(rec: PodRecord, message: string, generation: bigint): void {
  setCreateFailure(rec, {
    inputsKey: createInputsKey(rec.pod),
    generation,
    transient: false,
    attempts: 1,
    firstAt: monoNow(),
    retryAt: undefined,
    message,
  });
}

function scheduleRetry(
  ctx: Pick<ProviderContext, 'pods' | 'queue' | 'retryCreate' | 'retryTimers'>,
  rec: PodRecord,
  delayMs: number,
): void {
  cancelRetry(ctx, rec.key);
  const t = setTimeout(() => {
    ctx.retryTimers.delete(rec.key);
    void ctx.queue
      .run(rec.key, () => {
        const f = rec.createFailure;
        return isCurrent(ctx, rec) && !rec.vm && !rec.bringingUp && f?.transient === true;
      })
      .then((due) => {
        if (due) ctx.retryCreate(rec);
      });
  }, delayMs);
  t.unref();
  ctx.retryTimers.set(rec.key, t);
}

export function cancelRetry(ctx: Pick<ProviderContext, 'retryTimers'>, key: string): void {
  clearTimeout(ctx.retryTimers.get(key));
  ctx.retryTimers.delete(key);
}
