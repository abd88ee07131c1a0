// What a pod's published status is made of (docs/contracts/lifecycle.md, "Readiness and pod
// status"): the status computed from the record, the readiness condition, and the IP read
// from the lease file. Computing writes nothing; publishing is held.ts.
import type { V1PodStatus } from '@kubernetes/client-node';
import type { LifecycleState } from '../../../contract/annotations.ts';
import { computePodStatus } from '../../../lifecycle/status.ts';
import { resolveIp } from '../../../net/lease-parse.ts';
import { monoNow, wallAt } from '../../../util/mono-clock.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import type { ProviderContext } from '../context.ts';
import { type PodRecord, setIp } from '../state.ts';

/** Re-reads the lease file and updates the record's IP (R9: only for the same VM ID). */
export async function refreshIp(ctx: Pick<ProviderContext, 'leases'>, rec: PodRecord): Promise<boolean> {
  if (!rec.vm) return false;
  const snapshot = await ctx.leases.read();
  // Lease expiry is wall-clock time written by cocoon-net: compared with wall time.
  const { ip } = resolveIp(rec.vm, snapshot, Date.now(), rec.ip);
  if (ip === rec.ip) return false;
  setIp(rec, ip);
  return true;
}

/** The pod status from the record (docs/contracts/lifecycle.md, "Pod status"), with an
 * optional staged state. Pure: the writers record what was published. */
export function statusOf(
  ctx: Pick<ProviderContext, 'config' | 'nodeIP' | 'startupDoneAt'>,
  rec: PodRecord,
  lifecycle?: LifecycleState,
): V1PodStatus {
  const status = computePodStatus({
    vm: rec.vm ? { ip: rec.ip } : undefined,
    lifecycle: lifecycle ?? rec.intent?.state ?? '',
    probeReady: rec.probeReady,
    hostIP: ctx.nodeIP,
    startTime: rec.startTime,
    image: rec.pod.spec?.containers?.[0]?.image ?? '',
    termination: rec.termination,
    waitingReason: rec.vm
      ? undefined
      : rec.intent?.state === 'hibernated'
        ? 'Hibernated'
        : 'ContainerCreating',
    previous: rec.lastStatus,
    now: new Date(),
  });
  const out = { ...status } as unknown as V1PodStatus;
  const step = readinessCondition(ctx, rec, lifecycle ?? rec.intent?.state ?? '');
  if (step) out.conditions = [...(out.conditions ?? []), step];
  return out;
}

/** TS addition: the readiness step and deadline as a pod condition, so operators see what a
 * `creating` pod is waiting for and when it would be failed (issue: expose the deadline). */
function readinessCondition(
  ctx: Pick<ProviderContext, 'config' | 'startupDoneAt'>,
  rec: PodRecord,
  state: LifecycleState | '',
) {
  if (!rec.spec?.managed) return undefined;
  const retry = rec.createFailure;
  if (!rec.vm && retry?.transient && retry.retryAt !== undefined && state !== 'failed') {
    const giveUp = wallAt(retry.firstAt + ctx.config.readyDeadlineSeconds * 1000).toISOString();
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'False',
      reason: 'CreateBackoff',
      message: `step CreateBackoff; attempt ${retry.attempts} failed: ${truncateUtf8(retry.message, 512)}; next retry ${wallAt(retry.retryAt).toISOString()}; gives up at ${giveUp}`,
    };
  }
  const hibernating = hibernateCondition(rec, state);
  if (hibernating) return hibernating;
  if (!rec.vm) return undefined;
  const t0 = Math.max(rec.boundAt ?? monoNow(), ctx.startupDoneAt);
  const deadline = wallAt(t0 + ctx.config.readyDeadlineSeconds * 1000).toISOString();
  if (state === 'ready') {
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'True',
      reason: 'Ready',
      message: 'lifecycle ready',
    };
  }
  if (state === 'failed') {
    return {
      type: 'vm.cocoonstack.io/Readiness',
      status: 'False',
      reason: 'Failed',
      message: rec.intent?.message ?? '',
    };
  }
  const step = rec.step?.name ?? 'Starting';
  return {
    type: 'vm.cocoonstack.io/Readiness',
    status: 'False',
    reason: step,
    message: `step ${step}; ready deadline ${deadline}`,
  };
}

/** Hibernate and wake in the readiness condition: the phase in flight and the deadline of
 * every phase, `hibernated`, or a wake restoring the state (docs/decisions.md, "Hibernate
 * and wake"). */
function hibernateCondition(rec: PodRecord, state: LifecycleState | '') {
  const type = 'vm.cocoonstack.io/Readiness';
  const op = rec.hibernate;
  if (op && state === 'hibernating') {
    const phases = Object.entries(op.deadlines)
      .map(([phase, at]) => `${phase} by ${wallAt(at ?? 0).toISOString()}`)
      .join(', ');
    return {
      type,
      status: 'False',
      reason: 'Hibernating',
      message: `step Hibernating (${op.phase}); deadlines: ${phases}`,
    };
  }
  if (state === 'hibernated' && !rec.vm) {
    return {
      type,
      status: 'False',
      reason: 'Hibernated',
      message: 'lifecycle hibernated: the VM is removed and its state saved',
    };
  }
  if (rec.waking && !rec.vm && state === 'creating') {
    const since = rec.step?.since ?? monoNow();
    const by = wallAt(since + WAKE_BRINGUP_BUDGET_MS).toISOString();
    return {
      type,
      status: 'False',
      reason: 'Waking',
      message: `step Waking (restoring hibernated state); pull and clone by ${by}`,
    };
  }
  return undefined;
}

/** The longest a wake's pull (30 min cap) and clone (10 min) may take before it fails. */
const WAKE_BRINGUP_BUDGET_MS = 40 * 60_000;
