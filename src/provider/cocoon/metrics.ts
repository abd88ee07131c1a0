// The lifecycle metrics the provider records (pod-to-vm.md §11), as a narrow interface so
// the provider does not depend on how they are exported. `src/metrics` implements it on
// prom-client; `noMetrics` serves tests that do not look at metrics.

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
