// The lifecycle metrics the provider records (docs/metrics.md), as a narrow interface, its
// adapter onto the prom-client registry of src/metrics, and `noMetrics` for tests that do
// not look at metrics.
import type {
  DeferredPushResult,
  HibernateEvidenceVerdict,
  HibernatePhase,
  LifecycleOp,
  Metrics,
  PostCloneKind,
  StartupResumeOp,
  VerifyResult,
} from '../../metrics/registry.ts';

type Outcome = 'ok' | 'failed';

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
  hibernate(namespace: string, phase: HibernatePhase, result: Outcome): void;
  wake(result: Outcome): void;
  snapshotSave(namespace: string, result: Outcome, seconds: number): void;
  snapshotPush(namespace: string, result: Outcome, seconds: number): void;
  /** A deferred delete-time push changed (`deferred`, `pushed`, `dropped`, a `failed` try);
   * `pending`: how many the ledger holds now. */
  deferredPush(result: DeferredPushResult, pending: number): void;
  snapshotVerify(result: VerifyResult): void;
  hibernateEvidence(verdict: HibernateEvidenceVerdict): void;
  cloneFromDir(result: Outcome): void;
  /** A peer restore that ran (a skip is not counted); the duration on success only, as Go. */
  peerRestore(namespace: string, result: Outcome, seconds: number): void;
  startupResume(op: StartupResumeOp): void;
  podEvictFailure(): void;
  vmInspectTransientFail(): void;
  staleCreate(outcome: string): void;
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
  hibernate: () => {},
  wake: () => {},
  snapshotSave: () => {},
  snapshotPush: () => {},
  deferredPush: () => {},
  snapshotVerify: () => {},
  hibernateEvidence: () => {},
  cloneFromDir: () => {},
  peerRestore: () => {},
  startupResume: () => {},
  podEvictFailure: () => {},
  vmInspectTransientFail: () => {},
  staleCreate: () => {},
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
    hibernate: (namespace, phase, result) => m.hibernate.inc({ namespace, phase, result }),
    wake: (result) => m.wake.inc({ result }),
    snapshotSave: (namespace, result, seconds) => {
      m.snapshotSave.inc({ result });
      m.snapshotSaveDuration.observe({ namespace }, seconds);
    },
    snapshotPush: (namespace, result, seconds) => {
      m.snapshotPush.inc({ result });
      m.snapshotPushDuration.observe({ namespace }, seconds);
    },
    deferredPush: (result, pending) => {
      m.deferredPush.inc({ result });
      m.deferredPushesPending.set(pending);
    },
    snapshotVerify: (result) => m.snapshotVerify.inc({ result }),
    hibernateEvidence: (verdict) => m.hibernateEvidence.inc({ verdict }),
    cloneFromDir: (result) => m.cloneFromDir.inc({ result }),
    peerRestore: (namespace, result, seconds) => {
      m.snapshotPeerRestore.inc({ result });
      if (result === 'ok') m.snapshotPeerRestoreDuration.observe({ namespace }, seconds);
    },
    startupResume: (op) => m.startupResume.inc({ op }),
    podEvictFailure: () => m.podEvictFailure.inc(),
    vmInspectTransientFail: () => m.vmInspectTransientFail.inc(),
    staleCreate: (outcome) => m.staleCreateReconcile.inc({ outcome }),
  };
}
