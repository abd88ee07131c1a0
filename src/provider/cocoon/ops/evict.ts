// Eviction (docs/contracts/pod-to-vm.md, "VM event watcher and eviction"): the pod of a VM that
// died is deleted with a UID precondition, so the operator recreates it; its status shows phase
// `Failed` with the `agent` container terminated (exit code 1, the reason). A failed delete
// keeps every bit of state and is re-driven on the next tick (ops/drive.ts); a live pod never
// loses its provider record.
import { apiStatus, withSignal } from '../../../kube/client.ts';
import { pause } from '../../../util/deadline.ts';
import { logFor, type ProviderContext, type PublishCtx } from '../context.ts';
import { publish } from '../publication/held.ts';
import { statusOf } from '../publication/status.ts';
import { supersedeJobs } from '../readiness/jobs.ts';
import { markDeleted, type PodRecord, setEvicting, setHibernateOp, setOpRetry, takeHeld } from '../state.ts';
import { cancelRetry } from './failure.ts';

/** An eviction: the Failed status, the UID-fenced pod delete, the record and its probe dropped. */
export type EvictCtx = PublishCtx & Pick<ProviderContext, 'events' | 'metrics' | 'probes' | 'retryTimers'>;

export async function evict(ctx: EvictCtx, rec: PodRecord, reason: string, message: string): Promise<void> {
  const log = logFor(ctx, rec);
  setEvicting(rec, { reason, message });
  // The Failed status goes first, and is waited for: once the pod has a deletionTimestamp the
  // pod controller force-deletes it as soon as the provider no longer tracks it, and a status
  // still queued then would never land (test/integration/vm-events.test.ts).
  const evicted: PodRecord['termination'] = { kind: 'evicted', reason, message };
  try {
    await ctx.status.writeNow({ ...rec.pod, status: statusOf(ctx, { ...rec, termination: evicted }) });
  } catch (err) {
    log.warn(
      { err: String(err) },
      'writing the Failed status of an evicted pod failed; evicting all the same',
    );
  }
  const namespace = rec.pod.metadata?.namespace ?? '';
  const name = rec.pod.metadata?.name ?? '';
  let outcome: 'ok' | 'replaced' | 'failed' = 'failed';
  let last: unknown;
  // Two attempts, 200 ms apart, each bounded.
  for (const delay of [0, 200]) {
    if (delay > 0) await pause(delay, ctx.lifetime);
    try {
      await ctx.kube.write(
        (signal) =>
          ctx.kube.core.deleteNamespacedPod(
            { name, namespace, body: { preconditions: { uid: rec.uid } } },
            withSignal(signal),
          ),
        { timeoutMs: 5000 },
      );
      outcome = 'ok';
      break;
    } catch (err) {
      const code = apiStatus(err);
      if (code === 404) {
        outcome = 'ok';
        break;
      }
      if (code === 409) {
        outcome = 'replaced';
        break;
      }
      last = err;
    }
  }
  if (outcome === 'failed') {
    ctx.metrics.podEvictFailure();
    log.warn({ reason, err: String(last) }, 'evicting the pod failed; kept, retried on the next tick');
    return;
  }
  supersedeJobs(rec, 'evicted');
  takeHeld(rec);
  cancelRetry(ctx, rec.key);
  setHibernateOp(rec, undefined);
  setOpRetry(rec, undefined);
  ctx.probes.get(rec.key)?.stop();
  ctx.probes.delete(rec.key);
  if (outcome === 'ok') {
    ctx.events.event(rec.pod, 'Warning', 'Evicted', `${reason}: ${message}`.slice(0, 512));
    markDeleted(rec, evicted);
    publish(ctx, rec);
    log.warn({ reason, message }, 'pod evicted');
  } else {
    log.info('evict: another incarnation owns the name now; dropping ours');
  }
  if (ctx.pods.get(rec.key) === rec) ctx.pods.delete(rec.key);
}
