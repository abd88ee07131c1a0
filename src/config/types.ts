// The daemon's configuration as loadConfig returns it (src/config/env.ts), one field per setting
// of the table (src/config/settings.ts), which says for each field the variable, its default
// and its parser.
import type { GoogleAdcMode } from '../registry/credentials.ts';
import type { NetworkPolicy } from '../vmspec/network-policy.ts';
import type { PeerConfig } from './peer.ts';

/** VK_STATE_DIR's default (the daemon and `vk-cocoon explain` read the ledger there). */
export const DEFAULT_STATE_DIR = '/var/lib/vk-cocoon';

export type OrphanPolicy = 'destroy' | 'alert' | 'keep';
export type RestoreMode = 'copy' | 'ondemand' | 'mmap';
export type KubeletAuthMode = 'webhook' | 'none';
export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal';

export interface Config {
  kubeconfig: string | undefined;
  nodeName: string;
  nodeIP: string | undefined;
  nodePool: string;
  providerID: string | undefined;
  logLevel: LogLevel;
  ociRegistry: string | undefined;
  registryPlainHttp: boolean;
  /** `OCI_REGISTRY_CA_FILE`: PEM certificates trusted for the registry (and its token realm) besides the system's. */
  registryCa: string | undefined;
  /** Declare ExtendWebSocketsToKubelet so 1.36+ apiservers proxy exec WebSockets to us. */
  execWebSocket: boolean;
  /** `VK_REGISTRY_GOOGLE_ADC` (docs/registry.md "Authentication"). */
  registryGoogleAdc: GoogleAdcMode;
  leasesPath: string;
  /** Empty string disables lease release over the control socket. */
  netControlSocket: string;
  cocoonBin: string;
  cocoonRootDir: string;
  cgroupParent: string;
  /** VK_CGROUP_ROOT: the cgroup v2 mount the per-VM scopes are read under. */
  cgroupRoot: string;
  orphanPolicy: OrphanPolicy;
  /** VK_STATE_DIR: the provenance ledger lives here (docs/security.md). */
  stateDir: string;
  /** VK_ACCEPT_UNSTAMPED_STATE: unstamped hibernate/latest state is the VM name's own. */
  acceptUnstampedState: boolean;
  restoreMode: RestoreMode;
  tlsCert: string;
  tlsKey: string;
  tlsClientCA: string | undefined;
  kubeletPort: number;
  kubeletAuth: KubeletAuthMode;
  /** Open kubelet API connections at most (VK_KUBELET_MAX_CONNECTIONS); more are closed. */
  kubeletMaxConnections: number;
  /** `host:port` or `:port`; empty disables the metrics listener. */
  metricsAddr: string;
  /** Serve /debug/pprof/profile and /debug/pprof/heap on the metrics listener (loopback only). */
  debugEndpoints: boolean;
  /** Label the per-VM families with `vm` and `pod` (false: summed per namespace and backend). */
  metricsVmLabels: boolean;
  reservePercent: number;
  nodeCpu: string | undefined;
  nodeMem: string | undefined;
  nodeStorage: string | undefined;
  nodeHugepages: string | undefined;
  nodePods: number;
  /** VK_MAX_VM_STORAGE in bytes; `undefined` = no cap (set to 0). */
  maxVmStorageBytes: bigint | undefined;
  /** VK_TRANSFER_SLOTS: concurrent transfer calls (registry pulls and pushes, `snapshot
   * import`/`export`, `image import`/`pull`), a pool apart from the short cocoon calls. */
  transferSlots: number;
  readyDeadlineSeconds: number;
  /** The post-clone fixup's budget (docs/contracts/post-clone.md "Execution"): 30–180 s. */
  fixupBudgetSeconds: number;
  reconcileIntervalSeconds: number;
  streamIdleTimeoutSeconds: number;
  /** Pod write budget: lifecycle annotations, pods/status, deletes (VK_KUBE_QPS / VK_KUBE_BURST). */
  kubeQps: number;
  kubeBurst: number;
  /** Event write budget, separate from kubeQps/kubeBurst (events never delay pod writes). */
  kubeEventQps: number;
  kubeEventBurst: number;
  /** Node heartbeat budget (Lease, node status), separate from both (never starved by pods). */
  kubeHeartbeatQps: number;
  kubeHeartbeatBurst: number;
  snapshotTransferConcurrency: number;
  snapshotMemoryBudgetMiB: number;
  snapshotPullBudgetMiB: number;
  snapshotZstdLevel: number;
  snapshotChunkSizeMiB: number;
  snapshotCpuClass: string | undefined;
  /** VK_CLONE_FROM_DIR_ROOTS: where a pod's clone-from-dir may point; empty refuses it. */
  cloneFromDirRoots: readonly string[];
  /** VK_ALLOWED_NETWORKS and VK_NAMESPACE_NETWORKS: the networks a pod may name. */
  networkPolicy: NetworkPolicy;
  /** Peer restore: the server of this host's snapshots and the wakes' peer client (docs/peer-restore.md). */
  peer: PeerConfig;
  /** The settings accepted only for compatibility (`compat` in the table, not refused) that
   * were set: ignored, logged once at startup. */
  ignoredLaterTier: string[];
}
