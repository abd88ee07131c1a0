// Adapts the prom-client registry to the provider's narrow LifecycleMetrics interface.
import type { LifecycleMetrics } from '../provider/cocoon/metrics.ts';
import type { LifecycleOp, Metrics, PostCloneKind } from './registry.ts';

export function lifecycleMetrics(m: Metrics): LifecycleMetrics {
  return {
    podLifecycle: (op, result, reason) => m.podLifecycle.inc({ op: op as LifecycleOp, result, reason }),
    postclone: (kind, result) => m.postclone.inc({ kind: kind as PostCloneKind, result }),
    postcloneAttempts: (result, attempts) => m.postcloneRetryAttempts.observe({ result }, attempts),
    ipWait: (namespace, result) => m.wakeIpWait.inc({ namespace, result }),
    renewNudge: (result) => m.wakeRenewNudge.inc({ result }),
    bootDuration: (namespace, mode, backend, seconds) =>
      m.vmBootDuration.observe({ namespace, mode, backend }, seconds),
    readinessReconcile: (step) => m.readinessReconcile.inc({ step }),
    readyDeadlineExceeded: () => m.readyDeadlineExceeded.inc(),
    orphanVm: () => m.orphanVm.inc(),
    adoptByName: () => m.reconcileAdoptByName.inc(),
    leaseRelease: (result) => m.leaseRelease.inc({ result }),
    probeDuration: (namespace, seconds) => m.probeDuration.observe({ namespace }, seconds),
  };
}
