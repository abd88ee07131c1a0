// The provider's Prometheus metrics (docs/metrics.md "`cocoon_vk_*` families"): every `cocoon_vk_*` family declared on
// one private prom-client Registry (never the global default, so tests get isolated copies).
//
// Event-driven families are exposed as narrow typed handles (label values the spec enumerates
// are literal unions). The per-VM `cocoon_vk_vm_*` and node `cocoon_vk_node_*` families are
// filled at scrape time by a collect hook (see src/stats/collect.ts) from the shared stats
// sample; every one of those families triggers the same in-flight hook, so one scrape runs it
// once.

import type { PostCloneKind } from '../contract/vm.ts';
import type { Logger } from '../log.ts';
import { Counter, Gauge, Histogram, Registry } from './prom.ts';

/** Prometheus text exposition content type (`text/plain; version=0.0.4; charset=utf-8`). */
export const PROMETHEUS_CONTENT_TYPE = Registry.PROMETHEUS_CONTENT_TYPE;

// ---------------------------------------------------------------------------------------------
// Label value types (spec-enumerated values are literal unions; the rest are free strings).

export type LifecycleOp = 'create' | 'update' | 'delete';
export type LifecycleResult = 'ok' | 'failed' | 'skipped';
export type VerifyResult = 'ok' | 'stale' | 'error';
export type StartupResumeOp = 'hibernate' | 'post_clone' | 'ready_wait' | 'classify_drop_nic';
export type HibernateEvidenceVerdict = 'restored' | 'image_conflict' | 'source_conflict' | 'unavailable';
export type HibernatePhase = 'dhcp_release' | 'netresize' | 'snapshot' | 'push' | 'remove';
export type WakeIpWaitResult = 'ok' | 'timeout';
export type DeferredPushResult = 'deferred' | 'pushed' | 'dropped' | 'failed';
export type { PostCloneKind };

// ---------------------------------------------------------------------------------------------
// Typed handles. prom-client's Counter/Histogram satisfy these structurally.

export interface LabeledCounter<L extends object> {
  inc(labels: L, value?: number): void;
}
export interface PlainCounter {
  inc(value?: number): void;
}
export interface LabeledHistogram<L extends object> {
  observe(labels: L, value: number): void;
  /** Starts a timer; calling the result observes the elapsed seconds (and returns them). */
  startTimer(labels?: L): (labels?: Partial<L>) => number;
}
export interface PlainHistogram {
  observe(value: number): void;
  startTimer(): () => number;
}

export type VmLabel = 'vm' | 'pod' | 'namespace' | 'backend';
export const VM_LABELS: readonly VmLabel[] = ['vm', 'pod', 'namespace', 'backend'];
/** The labels of the per-VM families with VK_METRICS_VM_LABELS=false: no VM or pod name
 * reaches the (unauthenticated) metrics listener; values are summed per namespace and backend. */
export const AGGREGATE_VM_LABELS: readonly VmLabel[] = ['namespace', 'backend'];

/** Per-VM families, set from the stats sample at scrape time (src/stats/collect.ts). */
export interface VmMetrics {
  /** True: one series per VM (`vm`, `pod`, `namespace`, `backend`); false: one per
   * (`namespace`, `backend`), the sum of its VMs. */
  perVm: boolean;
  cpuSeconds: Counter<VmLabel>;
  cpuThrottledSeconds: Counter<VmLabel>;
  cpuThrottledPeriods: Counter<VmLabel>;
  memoryRssBytes: Gauge<VmLabel>;
  diskCowBytes: Gauge<VmLabel>;
  networkRxBytes: Counter<VmLabel>;
  networkTxBytes: Counter<VmLabel>;
  /** VMs by where their CPU figure came from at the last sample (`cgroup`, `proc`, `none`). */
  cpuSource: Gauge<'source'>;
}

/** Node families, set from the stats sample at scrape time (src/stats/collect.ts). */
export interface NodeMetrics {
  cpuSeconds: Counter<never>;
  memoryUsedBytes: Gauge<never>;
  storageAvailableBytes: Gauge<never>;
  storageTotalBytes: Gauge<never>;
}

/** A hook run (once per scrape) before the per-VM and node families are rendered. */
export interface PeerMetrics {
  serverStreams: { set(value: number): void };
  serverBytes: PlainCounter;
  serverRequests: LabeledCounter<{ route: string; result: string }>;
  serverRefusals: LabeledCounter<{ reason: string }>;
  restoresActive: { inc(): void; dec(): void };
  restoreBytes: PlainCounter;
}

export type CollectHook = () => Promise<void> | void;

export interface Metrics {
  registry: Registry;
  /** Renders the whole registry as Prometheus text (runs the collect hook). */
  render(): Promise<string>;
  contentType: string;
  /** Installs (or, with `undefined`, removes) the hook that fills `vm` and `node`. */
  setCollectHook(hook: CollectHook | undefined): void;

  podLifecycle: LabeledCounter<{ op: LifecycleOp; result: LifecycleResult; reason: string }>;
  snapshotPull: LabeledCounter<{ result: string }>;
  snapshotSave: LabeledCounter<{ result: string }>;
  snapshotPush: LabeledCounter<{ result: string }>;
  deferredPush: LabeledCounter<{ result: DeferredPushResult }>;
  deferredPushesPending: { set(value: number): void };
  snapshotVerify: LabeledCounter<{ result: VerifyResult }>;
  snapshotPeerRestore: LabeledCounter<{ result: string }>;
  cloneFromDir: LabeledCounter<{ result: string }>;
  orphanVm: PlainCounter;
  vmInspectTransientFail: PlainCounter;
  podEvictFailure: PlainCounter;
  reconcileAdoptByName: PlainCounter;
  staleCreateReconcile: LabeledCounter<{ outcome: string }>;
  startupResume: LabeledCounter<{ op: StartupResumeOp }>;
  hibernateEvidence: LabeledCounter<{ verdict: HibernateEvidenceVerdict }>;
  /** `mode` is `clone` or `run`; a restore is labelled `clone` (docs/contracts/pod-to-vm.md "CreatePod" step 8). */
  vmBootDuration: LabeledHistogram<{ namespace: string; mode: string; backend: string }>;
  snapshotSaveDuration: LabeledHistogram<{ namespace: string }>;
  snapshotPushDuration: LabeledHistogram<{ namespace: string }>;
  snapshotPeerRestoreDuration: LabeledHistogram<{ namespace: string }>;
  probeDuration: LabeledHistogram<{ namespace: string }>;
  snapshotPullDuration: PlainHistogram;
  hibernate: LabeledCounter<{ namespace: string; phase: HibernatePhase; result: string }>;
  leaseRelease: LabeledCounter<{ result: string }>;
  wake: LabeledCounter<{ result: string }>;
  wakeRenewNudge: LabeledCounter<{ result: string }>;
  wakeIpWait: LabeledCounter<{ namespace: string; result: WakeIpWaitResult }>;
  postclone: LabeledCounter<{ kind: PostCloneKind; result: string }>;
  /** Observed value = number of attempts. */
  postcloneRetryAttempts: LabeledHistogram<{ result: string }>;
  readyDeadlineExceeded: PlainCounter;
  readinessReconcile: LabeledCounter<{ step: string }>;
  /** The peer server (docs/peer-restore.md): slices being sent, bytes sent, requests by route
   * and result, refusals by reason; the peer client: restores in flight and bytes fetched. */
  peer: PeerMetrics;

  vm: VmMetrics;
  node: NodeMetrics;
}

// ---------------------------------------------------------------------------------------------
// Buckets. The spec fixes the boot histogram ("0.5 … 300") and the retry-attempts histogram;
// the others are not specified: probes (3 s timeout) use the Prometheus defaults, snapshot
// transfers (seconds to minutes) a wider range.

export const BOOT_DURATION_BUCKETS: readonly number[] = [0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300];
export const POSTCLONE_RETRY_ATTEMPT_BUCKETS: readonly number[] = [1, 2, 5, 10, 20, 40, 60];
export const PROBE_DURATION_BUCKETS: readonly number[] = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];
/** The Go daemon's buckets of `cocoon_vk_snapshot_peer_restore_duration_seconds` (dashboards compare). */
export const PEER_RESTORE_DURATION_BUCKETS: readonly number[] = [1, 2.5, 5, 7.5, 10, 15, 30, 60, 120];
export const SNAPSHOT_DURATION_BUCKETS: readonly number[] = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200];

export interface CreateMetricsOptions {
  /** Logs a failing collect hook (the scrape still answers, with the previous values). */
  log?: Logger;
  /** VK_METRICS_VM_LABELS (default true): label the per-VM families with VM and pod names. */
  vmLabels?: boolean;
}

/** Creates a fresh registry with every docs/metrics.md "`cocoon_vk_*` families" family. */
export function createMetrics(options: CreateMetricsOptions = {}): Metrics {
  const registry = new Registry();
  const registers = [registry];

  let hook: CollectHook | undefined;
  let inflight: Promise<void> | undefined;
  // Every sample-fed family calls this from its prom-client `collect`. prom-client renders all
  // families concurrently, so they join one in-flight run of the hook.
  const refresh = async (): Promise<void> => {
    if (!hook) return;
    if (!inflight) {
      const h = hook;
      inflight = (async () => {
        try {
          await h();
        } catch (err) {
          options.log?.warn({ err: String(err) }, 'metrics collect hook failed');
        } finally {
          inflight = undefined;
        }
      })();
    }
    await inflight;
  };

  const counter = <L extends string>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> =>
    new Counter<L>({ name, help, labelNames, registers });
  const histogram = <L extends string>(
    name: string,
    help: string,
    buckets: readonly number[],
    labelNames: readonly L[] = [],
  ): Histogram<L> => new Histogram<L>({ name, help, labelNames, buckets: [...buckets], registers });
  const sampledCounter = <L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[],
  ): Counter<L> => new Counter<L>({ name, help, labelNames, registers, collect: refresh });
  const sampledGauge = <L extends string>(name: string, help: string, labelNames: readonly L[]): Gauge<L> =>
    new Gauge<L>({ name, help, labelNames, registers, collect: refresh });

  const none: readonly never[] = [];
  const perVm = options.vmLabels ?? true;
  const vmLabels = perVm ? VM_LABELS : AGGREGATE_VM_LABELS;

  return {
    registry,
    render: () => registry.metrics(),
    contentType: registry.contentType,
    setCollectHook(h) {
      hook = h;
    },

    podLifecycle: counter(
      'cocoon_vk_pod_lifecycle_total',
      'Pod lifecycle operations by op, result and reason.',
      ['op', 'result', 'reason'],
    ),
    snapshotPull: counter('cocoon_vk_snapshot_pull_total', 'Snapshot pulls from the registry by result.', [
      'result',
    ]),
    snapshotSave: counter('cocoon_vk_snapshot_save_total', 'Local snapshot saves by result.', ['result']),
    snapshotPush: counter('cocoon_vk_snapshot_push_total', 'Snapshot pushes to the registry by result.', [
      'result',
    ]),
    deferredPush: counter(
      'cocoon_vk_snapshot_deferred_push_total',
      'Delete-time pushes deferred past a registry outage or the grace period, and what became of each try (deferred, pushed, dropped, failed).',
      ['result'],
    ),
    deferredPushesPending: new Gauge({
      name: 'cocoon_vk_snapshot_deferred_pushes',
      help: 'Deferred delete-time pushes not yet in the registry (their local snapshots are kept).',
      registers,
    }),
    snapshotVerify: counter(
      'cocoon_vk_snapshot_verify_total',
      'Local snapshot verifications against the registry tag by result (ok, stale, error).',
      ['result'],
    ),
    snapshotPeerRestore: counter(
      'cocoon_vk_snapshot_peer_restore_total',
      'Snapshot restores pulled from a peer node by result.',
      ['result'],
    ),
    cloneFromDir: counter('cocoon_vk_clone_from_dir_total', 'Clones from a snapshot directory by result.', [
      'result',
    ]),
    orphanVm: counter(
      'cocoon_vk_orphan_vm_total',
      'VMs matched by no pod at startup and kept (orphan policy alert).',
    ),
    vmInspectTransientFail: counter(
      'cocoon_vk_vm_inspect_transient_fail_total',
      'Inconclusive VM inspections deferred to a recheck.',
    ),
    podEvictFailure: counter(
      'cocoon_vk_pod_evict_failure_total',
      'Failed pod evictions after a VM vanished.',
    ),
    reconcileAdoptByName: counter(
      'cocoon_vk_reconcile_adopt_by_name_total',
      'VMs adopted by name during the startup reconcile.',
    ),
    staleCreateReconcile: counter(
      'cocoon_vk_stale_create_reconcile_total',
      'Reconciliations of stale creating VM records by outcome.',
      ['outcome'],
    ),
    startupResume: counter(
      'cocoon_vk_startup_resume_total',
      'Operations resumed after a provider restart by op.',
      ['op'],
    ),
    hibernateEvidence: counter(
      'cocoon_vk_hibernate_evidence_total',
      'Hibernate evidence checks on create by verdict.',
      ['verdict'],
    ),
    vmBootDuration: histogram(
      'cocoon_vk_vm_boot_duration_seconds',
      'Time from bring-up start to a running VM, by namespace, mode and backend.',
      BOOT_DURATION_BUCKETS,
      ['namespace', 'mode', 'backend'],
    ),
    snapshotSaveDuration: histogram(
      'cocoon_vk_snapshot_save_duration_seconds',
      'Duration of local snapshot saves by namespace.',
      SNAPSHOT_DURATION_BUCKETS,
      ['namespace'],
    ),
    snapshotPushDuration: histogram(
      'cocoon_vk_snapshot_push_duration_seconds',
      'Duration of snapshot pushes to the registry by namespace.',
      SNAPSHOT_DURATION_BUCKETS,
      ['namespace'],
    ),
    snapshotPeerRestoreDuration: histogram(
      'cocoon_vk_snapshot_peer_restore_duration_seconds',
      'Duration of snapshot restores from a peer node by namespace.',
      PEER_RESTORE_DURATION_BUCKETS,
      ['namespace'],
    ),
    peer: {
      serverStreams: new Gauge({
        name: 'cocoon_vk_peer_server_streams',
        help: 'Snapshot slices the peer server is sending now (bounded by VK_PEER_MAX_STREAMS).',
        registers,
      }),
      serverBytes: counter('cocoon_vk_peer_server_bytes_total', 'Snapshot bytes the peer server sent.'),
      serverRequests: counter(
        'cocoon_vk_peer_server_requests_total',
        'Peer server requests by route and result.',
        ['route', 'result'],
      ),
      serverRefusals: counter(
        'cocoon_vk_peer_server_refusals_total',
        'Peer server refusals by reason (unauthorized, forbidden, plain_http, saturated, caller_saturated, too_long, write_stall, ...).',
        ['reason'],
      ),
      restoresActive: new Gauge({
        name: 'cocoon_vk_peer_restores_active',
        help: 'Peer restores in flight on this host (at most 2).',
        registers,
      }),
      restoreBytes: counter('cocoon_vk_peer_restore_bytes_total', 'Snapshot bytes fetched from peers.'),
    },
    probeDuration: histogram(
      'cocoon_vk_probe_duration_seconds',
      'Duration of guest probes by namespace.',
      PROBE_DURATION_BUCKETS,
      ['namespace'],
    ),
    snapshotPullDuration: histogram(
      'cocoon_vk_snapshot_pull_duration_seconds',
      'Duration of snapshot pulls from the registry.',
      SNAPSHOT_DURATION_BUCKETS,
    ),
    hibernate: counter('cocoon_vk_hibernate_total', 'Hibernate steps by namespace, phase and result.', [
      'namespace',
      'phase',
      'result',
    ]),
    leaseRelease: counter('cocoon_vk_lease_release_total', 'DHCP lease releases by result.', ['result']),
    wake: counter('cocoon_vk_wake_total', 'Wakes from hibernation by result.', ['result']),
    wakeRenewNudge: counter(
      'cocoon_vk_wake_renew_nudge_total',
      'DHCP renew nudges sent to woken guests by result.',
      ['result'],
    ),
    wakeIpWait: counter('cocoon_vk_wake_ip_wait_total', 'IP waits after a wake by namespace and result.', [
      'namespace',
      'result',
    ]),
    postclone: counter('cocoon_vk_postclone_total', 'Post-clone guest fixups by kind and result.', [
      'kind',
      'result',
    ]),
    postcloneRetryAttempts: histogram(
      'cocoon_vk_postclone_retry_attempts',
      'Attempts used by a post-clone fixup, by result.',
      POSTCLONE_RETRY_ATTEMPT_BUCKETS,
      ['result'],
    ),
    readyDeadlineExceeded: counter(
      'cocoon_vk_ready_deadline_exceeded_total',
      'Pods that missed the readiness deadline (VK_READY_DEADLINE_SECONDS).',
    ),
    readinessReconcile: counter(
      'cocoon_vk_readiness_reconcile_total',
      'Readiness reconcile steps run, by step.',
      ['step'],
    ),

    vm: {
      perVm,
      cpuSeconds: sampledCounter('cocoon_vk_vm_cpu_seconds_total', 'CPU time consumed by the VM.', vmLabels),
      cpuThrottledSeconds: sampledCounter(
        'cocoon_vk_vm_cpu_throttled_seconds_total',
        'Time the VM was CPU throttled by its cgroup.',
        vmLabels,
      ),
      cpuThrottledPeriods: sampledCounter(
        'cocoon_vk_vm_cpu_throttled_periods_total',
        'CFS periods in which the VM was CPU throttled.',
        vmLabels,
      ),
      memoryRssBytes: sampledGauge(
        'cocoon_vk_vm_memory_rss_bytes',
        'Resident memory of the VM process.',
        vmLabels,
      ),
      diskCowBytes: sampledGauge(
        'cocoon_vk_vm_disk_cow_bytes',
        'Bytes allocated by the VM copy-on-write disk (overlay.qcow2 or cow.raw).',
        vmLabels,
      ),
      networkRxBytes: sampledCounter(
        'cocoon_vk_vm_network_rx_bytes_total',
        'Bytes received by the VM on its TAP devices (best effort).',
        vmLabels,
      ),
      networkTxBytes: sampledCounter(
        'cocoon_vk_vm_network_tx_bytes_total',
        'Bytes sent by the VM on its TAP devices (best effort).',
        vmLabels,
      ),
      cpuSource: sampledGauge(
        'cocoon_vk_vm_cpu_source',
        "VMs by the source of their CPU figure: cgroup (the VM's scope cpu.stat), proc (its scope is missing: /proc of its process), none.",
        ['source'],
      ),
    },
    node: {
      cpuSeconds: sampledCounter(
        'cocoon_vk_node_cpu_seconds_total',
        'CPU time consumed by the node (busy time).',
        none,
      ),
      memoryUsedBytes: sampledGauge(
        'cocoon_vk_node_memory_used_bytes',
        'Node memory in use (MemTotal - MemAvailable).',
        none,
      ),
      storageAvailableBytes: sampledGauge(
        'cocoon_vk_node_storage_available_bytes',
        'Bytes available to unprivileged users on the cocoon root filesystem.',
        none,
      ),
      storageTotalBytes: sampledGauge(
        'cocoon_vk_node_storage_total_bytes',
        'Size of the cocoon root filesystem.',
        none,
      ),
    },
  };
}
