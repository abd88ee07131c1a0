// The lifecycle metrics the provider records (docs/metrics.md), as a narrow interface, its
// adapter onto the prom-client registry of src/metrics, and `noMetrics` for tests that do
// not look at metrics.
import type { LifecycleOp, Metrics, PostCloneKind } from '../../metrics/registry.ts';

export interface LifecycleMetrics {
  podLifecycle(op: string, result: 'ok' | 'failed' | 'skipped', reason: string): void;
  postclone(kind: string, result: 'ok' | 'failed'): void;
  postcloneAttempts(result: 'ok' | 'failed', attempts: number): void;
  ipWait(namespace: string, result: 'ok' | 'timeout'): void;
  renewNudge(result: 'ok' | 'failed'): void;
  bootDuration(namespace: string, mode: string, backend: string, seconds: number): void;
  readinessReconcile(step: string): void;
  readyDeadlineExceeded(): void;
  orphanVm(): void;
  adoptByName(): void;
  leaseRelease(result: string): void;
  probeDuration(namespace: string, seconds: number): void;
}

export const noMetrics: LifecycleMetrics = {
  podLifecycle: () => {},
  postclone: () => {},
  postcloneAttempts: () => {},
  ipWait: () => {},
  renewNudge: () => {},
  bootDuration: () => {},
  readinessReconcile: () => {},
  readyDeadlineExceeded: () => {},
  orphanVm: () => {},
  adoptByName: () => {},
  leaseRelease: () => {},
  probeDuration: () => {},
};

/** Adapts the prom-client registry to the provider's narrow LifecycleMetrics interface. */
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
