// Configuration from environment variables (README.md "Configuration"), compatible with the Go
// implementation's variable names and defaults. Unlike the Go implementation, every value
// is validated at startup and a bad one stops startup with an error naming the variable
// and what it accepts (the issue overrides the spec's "lenient" wording: a typo in a
// deployment unit should fail loudly, not silently fall back to a default).
import { existsSync, readFileSync } from 'node:fs';
import { isIPv4 } from 'node:net';
import { FIXUP_BUDGET_MS } from '../guest/postclone.ts';
import {
  DEFAULT_READY_DEADLINE_SECONDS,
  DEFAULT_RECONCILE_INTERVAL_SECONDS,
  MIN_READY_DEADLINE_SECONDS,
} from '../lifecycle/owed.ts';
import { type GoogleAdcMode, isGoogleRegistryHost } from '../registry/credentials.ts';
import { isLoopbackAddress, isLoopbackHost } from '../util/loopback.ts';
import { parseCloneDirRoots } from '../vmspec/clone-dir-roots.ts';
import { type NetworkPolicy, parseNetworkPolicy } from '../vmspec/network-policy.ts';
import { parseQuantity, quantityValue } from '../vmspec/quantity.ts';
import { PEER_ENV_DOCS, type PeerConfig, parsePeerConfig } from './peer.ts';

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
  googleApplicationCredentials: string | undefined;
  /** `VK_REGISTRY_GOOGLE_ADC` (docs/registry.md "Authentication"). */
  registryGoogleAdc: GoogleAdcMode;
  leasesPath: string;
  /** Empty string disables lease release over the control socket. */
  netControlSocket: string;
  cocoonBin: string;
  cocoonRootDir: string;
  cgroupParent: string;
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
  /** Later-tier variables that were set: accepted and ignored, logged once at startup. */
  ignoredLaterTier: string[];
}

/** One row of the configuration table; drives parsing, `--help` and the README table. */
export interface EnvVarDoc {
  name: string;
  default: string;
  meaning: string;
}

export const ENV_DOCS: readonly EnvVarDoc[] = [
  {
    name: 'KUBECONFIG',
    default: '(in-cluster)',
    meaning:
      'kubeconfig of the daemon identity, its node: system:node:<VK_NODE_NAME>; else ~/.kube/config, else in-cluster',
  },
  {
    name: 'VK_NODE_NAME',
    default: 'cocoon-pool',
    meaning: 'virtual node name (DNS subdomain); also the cocoon-net pool node name',
  },
  {
    name: 'VK_NODE_IP',
    default: '(first non-loopback IPv4)',
    meaning: 'node InternalIP advertised to the apiserver',
  },
  { name: 'VK_NODE_POOL', default: 'default', meaning: 'value of the cocoonstack.io/pool node label' },
  { name: 'VK_PROVIDER_ID', default: '(unset)', meaning: 'spec.providerID of the node' },
  { name: 'VK_LOG_LEVEL', default: 'info', meaning: 'trace, debug, info, warn, error or fatal' },
  {
    name: 'OCI_REGISTRY',
    default: '(unset)',
    meaning: 'snapshot registry base host[:port][/path]; unset disables clone-source pulls',
  },
  {
    name: 'OCI_REGISTRY_CA_FILE',
    default: '(unset)',
    meaning: 'PEM CA bundle trusted for the registry and its token realm, besides the system CAs',
  },
  {
    name: 'VK_REGISTRY_PLAIN_HTTP',
    default: 'false',
    meaning:
      'plain HTTP to the registry (tests only; loopback is always plain); credentials are never sent over it to a non-loopback host',
  },
  {
    name: 'GOOGLE_APPLICATION_CREDENTIALS',
    default: '(unset)',
    meaning:
      'service-account key for Google application default credentials: used for gcr.io / *.pkg.dev registries (see VK_REGISTRY_GOOGLE_ADC)',
  },
  {
    name: 'VK_REGISTRY_GOOGLE_ADC',
    default: 'auto',
    meaning:
      'auto: Google ADC for gcr.io / *.pkg.dev when GOOGLE_APPLICATION_CREDENTIALS is set; true: for OCI_REGISTRY whatever its host (metadata server included); false: never',
  },
  {
    name: 'VK_LEASES_PATH',
    default: '/var/lib/cocoon/net/leases.json',
    meaning: 'cocoon-net DHCP lease file',
  },
  {
    name: 'VK_COCOON_NET_CONTROL_SOCKET',
    default: '/run/cocoon-net/control.sock',
    meaning: 'cocoon-net lease release socket; empty disables',
  },
  { name: 'VK_COCOON_BIN', default: '/usr/local/bin/cocoon', meaning: 'the cocoon CLI' },
  {
    name: 'COCOON_ROOT_DIR',
    default: '/var/lib/cocoon',
    meaning: 'cocoon data dir (run dirs, storage capacity)',
  },
  { name: 'COCOON_CGROUP_PARENT', default: 'cocoon.slice', meaning: 'cgroup parent of the per-VM scopes' },
  {
    name: 'VK_ORPHAN_POLICY',
    default: 'destroy',
    meaning:
      'VMs no pod claims at startup: destroy, alert or keep (destroy removes only VMs the provenance ledger says vk-cocoon made)',
  },
  {
    name: 'VK_STATE_DIR',
    default: DEFAULT_STATE_DIR,
    meaning:
      "the daemon's own state: the provenance ledger (ledger.json, mode 0600) of the VMs and snapshots it made, and the delete-time pushes still waiting for the registry",
  },
  {
    name: 'VK_ACCEPT_UNSTAMPED_STATE',
    default: 'true',
    meaning:
      'wake or restore hibernated state that carries no owner stamp (pushed by Go hosts) for the pod whose VM name is its repository; false refuses it',
  },
  {
    name: 'VK_RESTORE_MODE',
    default: 'ondemand',
    meaning: 'CH clone memory restore: copy, ondemand or mmap (Windows always copy)',
  },
  {
    name: 'VK_TLS_CERT',
    default: '/etc/cocoon/vk/tls/vk-kubelet.crt',
    meaning: 'kubelet API serving certificate (self-signed when missing)',
  },
  { name: 'VK_TLS_KEY', default: '/etc/cocoon/vk/tls/vk-kubelet.key', meaning: 'kubelet API serving key' },
  {
    name: 'VK_TLS_CLIENT_CA',
    default: '(cluster CA)',
    meaning: 'CA bundle that verifies client certificates (the apiserver kubelet client)',
  },
  { name: 'VK_KUBELET_PORT', default: '10250', meaning: 'kubelet API port, advertised in daemonEndpoints' },
  {
    name: 'VK_KUBELET_AUTH',
    default: 'webhook',
    meaning:
      'webhook (client certs, TokenReview, SubjectAccessReview) or none (tests only: needs a loopback VK_NODE_IP, the only address the API then listens on)',
  },
  {
    name: 'VK_KUBELET_MAX_CONNECTIONS',
    default: '256',
    meaning: 'open kubelet API connections at most (exec streams included); more are closed at once',
  },
  {
    name: 'VK_METRICS_ADDR',
    default: ':9091',
    meaning: 'Prometheus /metrics listener host:port; empty disables',
  },
  {
    name: 'VK_DEBUG_ENDPOINTS',
    default: 'false',
    meaning:
      'true serves a CPU profile and a heap snapshot on the metrics listener (/debug/pprof/profile, /debug/pprof/heap); needs a loopback VK_METRICS_ADDR host',
  },
  {
    name: 'VK_METRICS_VM_LABELS',
    default: 'true',
    meaning:
      'label the per-VM cocoon_vk_vm_* families with vm and pod names; false sums them per namespace and backend',
  },
  {
    name: 'VK_RESERVE_PERCENT',
    default: '20',
    meaning: 'share of capacity withheld from allocatable (0-100)',
  },
  { name: 'VK_NODE_CPU', default: '(host cores)', meaning: 'CPU capacity override (quantity)' },
  { name: 'VK_NODE_MEM', default: '(MemTotal)', meaning: 'memory capacity override (quantity)' },
  {
    name: 'VK_NODE_STORAGE',
    default: '(statfs of COCOON_ROOT_DIR)',
    meaning: 'ephemeral-storage capacity override (quantity)',
  },
  { name: 'VK_NODE_HUGEPAGES', default: '(host)', meaning: 'hugepages capacity override (quantity)' },
  {
    name: 'VK_NODE_PODS',
    default: '256',
    meaning: 'pod capacity; CreatePod rejects a pod past it (OutOfpods), as the kubelet does',
  },
  {
    name: 'VK_MAX_VM_STORAGE',
    default: '1Ti',
    meaning:
      'largest cocoonset.cocoonstack.io/storage a pod may ask for (quantity); a pod asking for more fails; 0 disables the cap',
  },
  {
    name: 'VK_TRANSFER_SLOTS',
    default: '8',
    meaning:
      'concurrent transfers (registry pulls and pushes, snapshot/image import and export, image pull), a pool apart from the other cocoon calls',
  },
  {
    name: 'VK_FIXUP_BUDGET_SECONDS',
    default: '180',
    meaning:
      'how long the post-clone guest network fixup retries before the pod fails (30-180: only shorter, to fail fast)',
  },
  {
    name: 'VK_READY_DEADLINE_SECONDS',
    default: String(DEFAULT_READY_DEADLINE_SECONDS),
    meaning: `longest a managed pod with a live VM may stay creating (>= ${MIN_READY_DEADLINE_SECONDS})`,
  },
  {
    name: 'VK_RECONCILE_INTERVAL_SECONDS',
    default: String(DEFAULT_RECONCILE_INTERVAL_SECONDS),
    meaning: 'lifecycle tick: readiness reconcile and re-flush (1-60)',
  },
  {
    name: 'VK_EXEC_WEBSOCKET',
    default: 'true',
    meaning: 'declare ExtendWebSocketsToKubelet (false: apiservers translate exec to SPDY)',
  },
  { name: 'VK_STREAM_IDLE_TIMEOUT_SECONDS', default: '14400', meaning: 'exec/log stream idle timeout' },
  {
    name: 'VK_KUBE_QPS',
    default: '50',
    meaning:
      "client-side rate limit of pod writes: lifecycle, status, deletes (requests/s; kubelet's kubeAPIQPS)",
  },
  {
    name: 'VK_KUBE_BURST',
    default: '100',
    meaning: 'client-side pod write burst (>= VK_KUBE_QPS; unset: twice VK_KUBE_QPS)',
  },
  {
    name: 'VK_KUBE_EVENT_QPS',
    default: '25',
    meaning: 'client-side rate limit of event writes (requests/s), a budget apart from VK_KUBE_QPS',
  },
  {
    name: 'VK_KUBE_EVENT_BURST',
    default: '50',
    meaning: 'client-side event write burst (>= VK_KUBE_EVENT_QPS; unset: twice VK_KUBE_EVENT_QPS)',
  },
  {
    name: 'VK_KUBE_HEARTBEAT_QPS',
    default: '5',
    meaning:
      'client-side rate limit of node heartbeats: Lease, node status (requests/s), a budget of its own',
  },
  {
    name: 'VK_KUBE_HEARTBEAT_BURST',
    default: '10',
    meaning:
      'client-side heartbeat write burst (>= VK_KUBE_HEARTBEAT_QPS; unset: twice VK_KUBE_HEARTBEAT_QPS)',
  },
  { name: 'SNAPSHOT_TRANSFER_CONCURRENCY', default: '8', meaning: 'parallel registry blob transfers' },
  {
    name: 'SNAPSHOT_MEMORY_BUDGET_MIB',
    default: '9216',
    meaning: 'v2 push: compressed or cut blobs spooled and not yet uploaded, at most (MiB, 64-1048576)',
  },
  { name: 'SNAPSHOT_PULL_BUDGET_MIB', default: '2048', meaning: 'pull buffering cap' },
  {
    name: 'SNAPSHOT_ZSTD_LEVEL',
    default: '0',
    meaning:
      'v2 push: zstd level 1-22 for files of at least 1 MiB; 0 off (with SNAPSHOT_CHUNK_SIZE_MIB also 0: v1)',
  },
  {
    name: 'SNAPSHOT_CHUNK_SIZE_MIB',
    default: '0',
    meaning:
      'v2 push: cut files into chunks of this size (1-4096); 0 off (with SNAPSHOT_ZSTD_LEVEL also 0: v1)',
  },
  ...['EPOCH_URL', 'EPOCH_TOKEN', 'EPOCH_CA_CERT'].map((name) => ({
    name,
    default: '(unset)',
    meaning:
      'the Go daemon v0.2.9 registry setting: not read; set, it refuses the startup naming what to set instead',
  })),
  {
    name: 'VK_SNAPSHOT_CPU_CLASS',
    default: '(unset)',
    meaning:
      'snapshot CPU class of this node: the cocoonstack.io/snapshot-cpu-class node label; a pod whose nodeSelector names another class is refused',
  },
  {
    name: 'VK_CLONE_FROM_DIR_ROOTS',
    default: '(unset)',
    meaning:
      'comma-separated directories; a pod may clone-from-dir only a path that resolves (symlinks followed) under ROOT/NAMESPACE/ of one of them; unset refuses clone-from-dir',
  },
  {
    name: 'VK_ALLOWED_NETWORKS',
    default: '(unset)',
    meaning:
      'comma-separated networks a pod may name in cocoonset.cocoonstack.io/network (namespaces not in VK_NAMESPACE_NETWORKS); unset: any',
  },
  {
    name: 'VK_NAMESPACE_NETWORKS',
    default: '(unset)',
    meaning:
      'networks per namespace, e.g. ns-a=net1|net2;ns-b=net3 (ns-c= allows only the default network); a listed namespace may name only its own list',
  },
  {
    name: 'VK_COCOON_MACOS_BIN',
    default: '/usr/local/bin/cocoon-macos',
    meaning: 'later tier: accepted and ignored',
  },
  { name: 'COCOON_MACOS_VNC_PASSWORD', default: '(unset)', meaning: 'later tier: accepted and ignored' },
  ...PEER_ENV_DOCS,
];

const LATER_TIER = ['VK_COCOON_MACOS_BIN', 'COCOON_MACOS_VNC_PASSWORD'] as const;

/**
 * Settings a host may carry that this build cannot honour: set, each refuses the startup with
 * what to do instead (never a quiet fallback that loses a user's state or credentials).
 */
const REFUSED: readonly { name: string; refused: (value: string) => string | undefined }[] = [
  {
    name: 'EPOCH_URL',
    refused: () =>
      "is the Go daemon v0.2.9's registry setting and is not read: set OCI_REGISTRY=<host[:port][/path]> instead",
  },
  {
    name: 'EPOCH_TOKEN',
    refused: () =>
      "is the Go daemon v0.2.9's registry setting and is not read: put the registry's credentials in the docker config (DOCKER_CONFIG, `auths`) instead",
  },
  {
    name: 'EPOCH_CA_CERT',
    refused: () =>
      "is the Go daemon v0.2.9's registry setting and is not read: set OCI_REGISTRY_CA_FILE=<PEM file> instead",
  },
];

export class ConfigError extends Error {
  override name = 'ConfigError';
}

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const REGISTRY = /^[A-Za-z0-9.-]+(:[0-9]{1,5})?(\/[a-z0-9]+([._-][a-z0-9]+)*)*$/;

/** Parses and validates the environment; throws ConfigError listing every bad variable. */
export function loadConfig(env: NodeJS.ProcessEnv): Config {
  const problems: string[] = [];
  const get = (name: string): string | undefined => {
    const v = env[name];
    return v === undefined ? undefined : v.trim();
  };
  const str = (name: string, def: string): string => {
    const v = get(name);
    return v === undefined || v === '' ? def : v;
  };
  const optional = (name: string): string | undefined => {
    const v = get(name);
    return v === undefined || v === '' ? undefined : v;
  };
  const oneOf = <T extends string>(name: string, def: T, allowed: readonly T[]): T => {
    const v = get(name);
    if (v === undefined || v === '') return def;
    const lower = v.toLowerCase();
    if ((allowed as readonly string[]).includes(lower)) return lower as T;
    problems.push(`${name}=${JSON.stringify(v)}: expected one of ${allowed.join(', ')}`);
    return def;
  };
  const int = (name: string, def: number, min: number, max: number): number => {
    const v = get(name);
    if (v === undefined || v === '') return def;
    if (!/^[0-9]+$/.test(v) || Number(v) < min || Number(v) > max) {
      problems.push(`${name}=${JSON.stringify(v)}: expected an integer from ${min} to ${max}`);
      return def;
    }
    return Number(v);
  };
  const bool = (name: string, def: boolean): boolean => {
    const v = get(name);
    if (v === undefined || v === '') return def;
    if (v === 'true' || v === '1') return true;
    if (v === 'false' || v === '0') return false;
    problems.push(`${name}=${JSON.stringify(v)}: expected true or false`);
    return def;
  };
  const quantity = (name: string): string | undefined => {
    const v = optional(name);
    const q = v === undefined ? undefined : parseQuantity(v);
    if (v !== undefined && (q === undefined || q.negative)) {
      problems.push(`${name}=${JSON.stringify(v)}: expected a Kubernetes quantity such as 32, 64Gi or 1Ti`);
      return undefined;
    }
    return v;
  };

  const nodeName = str('VK_NODE_NAME', 'cocoon-pool');
  if (nodeName.length > 253 || !DNS_SUBDOMAIN.test(nodeName)) {
    problems.push(
      `VK_NODE_NAME=${JSON.stringify(nodeName)}: expected a DNS subdomain (lower-case letters, digits, '-', '.')`,
    );
  }
  const nodeIP = optional('VK_NODE_IP');
  if (nodeIP !== undefined && !isIPv4(nodeIP)) {
    problems.push(`VK_NODE_IP=${JSON.stringify(nodeIP)}: expected an IPv4 address`);
  }
  const nodePool = str('VK_NODE_POOL', 'default');
  if (nodePool.length > 63 || !LABEL_VALUE.test(nodePool)) {
    problems.push(
      `VK_NODE_POOL=${JSON.stringify(nodePool)}: expected a label value (<= 63 of [A-Za-z0-9-_.])`,
    );
  }
  const snapshotCpuClass = optional('VK_SNAPSHOT_CPU_CLASS');
  if (
    snapshotCpuClass !== undefined &&
    (snapshotCpuClass.length > 63 || !LABEL_VALUE.test(snapshotCpuClass))
  ) {
    problems.push(`VK_SNAPSHOT_CPU_CLASS=${JSON.stringify(snapshotCpuClass)}: expected a label value`);
  }
  const ociRegistry = optional('OCI_REGISTRY')?.replace(/\/+$/, '');
  if (ociRegistry !== undefined && !REGISTRY.test(ociRegistry.replace(/^https?:\/\//, ''))) {
    problems.push(
      `OCI_REGISTRY=${JSON.stringify(ociRegistry)}: expected host[:port][/path], e.g. europe-docker.pkg.dev/acme/cocoon`,
    );
  }
  const googleApplicationCredentials = optional('GOOGLE_APPLICATION_CREDENTIALS');
  const registryGoogleAdc = oneOf<GoogleAdcMode>('VK_REGISTRY_GOOGLE_ADC', 'auto', ['auto', 'true', 'false']);
  if (googleApplicationCredentials !== undefined) {
    if (!existsSync(googleApplicationCredentials))
      problems.push(`GOOGLE_APPLICATION_CREDENTIALS=${googleApplicationCredentials}: no such file`);
    const host = ociRegistry?.replace(/^https?:\/\//, '').split('/')[0];
    // A Google credential never goes to another registry by accident.
    if (registryGoogleAdc === 'auto' && host !== undefined && !isGoogleRegistryHost(host))
      problems.push(
        `GOOGLE_APPLICATION_CREDENTIALS is set but OCI_REGISTRY ${host} is not a Google registry (gcr.io, *.pkg.dev): set VK_REGISTRY_GOOGLE_ADC=true to use it there, or unset it`,
      );
  }
  const caFile = optional('OCI_REGISTRY_CA_FILE');
  let registryCa: string | undefined;
  if (caFile !== undefined) {
    try {
      registryCa = readFileSync(caFile, 'utf8');
      if (!registryCa.includes('-----BEGIN CERTIFICATE-----'))
        problems.push(`OCI_REGISTRY_CA_FILE=${caFile}: no PEM certificate in it`);
    } catch (error) {
      problems.push(`OCI_REGISTRY_CA_FILE=${caFile}: ${(error as Error).message}`);
    }
  }
  const metricsAddr = get('VK_METRICS_ADDR') ?? ':9091';
  if (metricsAddr !== '' && !/^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}$/.test(metricsAddr)) {
    problems.push(
      `VK_METRICS_ADDR=${JSON.stringify(metricsAddr)}: expected host:port or :port (empty disables)`,
    );
  }
  // The profile and heap endpoints hand out the daemon's memory (tokens, pod specs) to
  // whoever can reach them, and the metrics listener has no authentication: they are served
  // on a loopback listener only. An empty host (`:9091`) is every interface.
  const debugEndpoints = bool('VK_DEBUG_ENDPOINTS', false);
  if (debugEndpoints && metricsAddr !== '' && !isLoopbackHost(metricsAddr)) {
    problems.push(
      `VK_DEBUG_ENDPOINTS=true needs VK_METRICS_ADDR on a loopback host (127.0.0.1:port, [::1]:port or localhost:port), not ${JSON.stringify(metricsAddr)}: the debug endpoints hand out the daemon's memory without authentication`,
    );
  }
  // Without authentication the kubelet API runs anything in any VM for anyone who reaches
  // it: `none` is allowed only when the node IP the apiserver dials is loopback, and then
  // the API listens on that address alone (src/main.ts) instead of every interface.
  const kubeletAuth = oneOf<KubeletAuthMode>('VK_KUBELET_AUTH', 'webhook', ['webhook', 'none']);
  if (kubeletAuth === 'none' && (nodeIP === undefined || !isLoopbackAddress(nodeIP))) {
    problems.push(
      `VK_KUBELET_AUTH=none needs VK_NODE_IP to be a loopback address (e.g. 127.0.0.1), not ${nodeIP === undefined ? '(unset: the first non-loopback IPv4)' : JSON.stringify(nodeIP)}: an unauthenticated kubelet API lets anyone who reaches it exec into every VM`,
    );
  }
  const cloneDirRoots = parseCloneDirRoots(get('VK_CLONE_FROM_DIR_ROOTS'));
  problems.push(...cloneDirRoots.problems);
  const networks = parseNetworkPolicy(get('VK_ALLOWED_NETWORKS'), get('VK_NAMESPACE_NETWORKS'));
  problems.push(...networks.problems);
  const readyDeadlineSeconds = int(
    'VK_READY_DEADLINE_SECONDS',
    DEFAULT_READY_DEADLINE_SECONDS,
    MIN_READY_DEADLINE_SECONDS,
    86_400,
  );
  // Client-side write budgets (docs/decisions.md "Client rate limits"): an unset burst is
  // twice the rate (kubelet's 50/100); a burst below its rate is refused.
  const budget = (prefix: string, defQps: number): [number, number] => {
    const qps = int(`${prefix}_QPS`, defQps, 1, 10_000);
    const burst = int(`${prefix}_BURST`, Math.min(10_000, 2 * qps), 1, 10_000);
    if (burst < qps) problems.push(`${prefix}_BURST=${burst}: expected at least ${prefix}_QPS (${qps})`);
    return [qps, burst];
  };
  const [kubeQps, kubeBurst] = budget('VK_KUBE', 50);
  const [kubeEventQps, kubeEventBurst] = budget('VK_KUBE_EVENT', 25);
  const [kubeHeartbeatQps, kubeHeartbeatBurst] = budget('VK_KUBE_HEARTBEAT', 5);

  const peer = parsePeerConfig(get, problems);
  // A pod's clone-from-dir reads under its roots; the daemon's own staged peer restores and
  // cocoon's snapshot data must never be among them (another tenant's state).
  for (const root of cloneDirRoots.roots) {
    for (const [name, dir] of [
      ['VK_STAGING_DIR', peer.stagingDir],
      ['VK_COCOON_SNAPSHOT_DIR', peer.snapshotDir],
    ] as const) {
      const within = (a: string, b: string) => a === b || a.startsWith(`${b.replace(/\/+$/, '')}/`);
      if (within(root, dir) || within(dir, root))
        problems.push(
          `VK_CLONE_FROM_DIR_ROOTS: root ${root} overlaps ${name}=${dir}: a pod's clone-from-dir would reach the daemon's own snapshot state`,
        );
    }
  }
  const config: Config = {
    kubeconfig: optional('KUBECONFIG'),
    nodeName,
    nodeIP,
    nodePool,
    providerID: optional('VK_PROVIDER_ID'),
    logLevel: oneOf<LogLevel>('VK_LOG_LEVEL', 'info', ['trace', 'debug', 'info', 'warn', 'error', 'fatal']),
    ociRegistry,
    registryPlainHttp: bool('VK_REGISTRY_PLAIN_HTTP', false),
    registryCa,
    execWebSocket: bool('VK_EXEC_WEBSOCKET', true),
    googleApplicationCredentials,
    registryGoogleAdc,
    leasesPath: str('VK_LEASES_PATH', '/var/lib/cocoon/net/leases.json'),
    // Unset means the default socket; an explicitly empty value disables release.
    netControlSocket: get('VK_COCOON_NET_CONTROL_SOCKET') ?? '/run/cocoon-net/control.sock',
    cocoonBin: str('VK_COCOON_BIN', '/usr/local/bin/cocoon'),
    cocoonRootDir: str('COCOON_ROOT_DIR', '/var/lib/cocoon'),
    cgroupParent: str('COCOON_CGROUP_PARENT', 'cocoon.slice'),
    orphanPolicy: oneOf<OrphanPolicy>('VK_ORPHAN_POLICY', 'destroy', ['destroy', 'alert', 'keep']),
    stateDir: str('VK_STATE_DIR', DEFAULT_STATE_DIR),
    acceptUnstampedState: bool('VK_ACCEPT_UNSTAMPED_STATE', true),
    restoreMode: oneOf<RestoreMode>('VK_RESTORE_MODE', 'ondemand', ['copy', 'ondemand', 'mmap']),
    tlsCert: str('VK_TLS_CERT', '/etc/cocoon/vk/tls/vk-kubelet.crt'),
    tlsKey: str('VK_TLS_KEY', '/etc/cocoon/vk/tls/vk-kubelet.key'),
    tlsClientCA: optional('VK_TLS_CLIENT_CA'),
    kubeletPort: int('VK_KUBELET_PORT', 10250, 1, 65535),
    kubeletAuth,
    kubeletMaxConnections: int('VK_KUBELET_MAX_CONNECTIONS', 256, 1, 65_535),
    metricsAddr,
    debugEndpoints,
    metricsVmLabels: bool('VK_METRICS_VM_LABELS', true),
    reservePercent: int('VK_RESERVE_PERCENT', 20, 0, 100),
    nodeCpu: quantity('VK_NODE_CPU'),
    nodeMem: quantity('VK_NODE_MEM'),
    nodeStorage: quantity('VK_NODE_STORAGE'),
    nodeHugepages: quantity('VK_NODE_HUGEPAGES'),
    nodePods: int('VK_NODE_PODS', 256, 1, 1_000_000),
    maxVmStorageBytes: storageCap(quantity('VK_MAX_VM_STORAGE') ?? '1Ti'),
    transferSlots: int('VK_TRANSFER_SLOTS', 8, 1, 256),
    readyDeadlineSeconds,
    fixupBudgetSeconds: int('VK_FIXUP_BUDGET_SECONDS', FIXUP_BUDGET_MS / 1000, 30, FIXUP_BUDGET_MS / 1000),
    reconcileIntervalSeconds: int('VK_RECONCILE_INTERVAL_SECONDS', DEFAULT_RECONCILE_INTERVAL_SECONDS, 1, 60),
    streamIdleTimeoutSeconds: int('VK_STREAM_IDLE_TIMEOUT_SECONDS', 14_400, 1, 604_800),
    kubeQps,
    kubeBurst,
    kubeEventQps,
    kubeEventBurst,
    kubeHeartbeatQps,
    kubeHeartbeatBurst,
    snapshotTransferConcurrency: int('SNAPSHOT_TRANSFER_CONCURRENCY', 8, 1, 256),
    snapshotMemoryBudgetMiB: int('SNAPSHOT_MEMORY_BUDGET_MIB', 9216, 64, 1_048_576),
    snapshotPullBudgetMiB: int('SNAPSHOT_PULL_BUDGET_MIB', 2048, 64, 1_048_576),
    snapshotZstdLevel: int('SNAPSHOT_ZSTD_LEVEL', 0, 0, 22),
    // cocoon-common v0.3.0 refuses chunks above 4 GiB.
    snapshotChunkSizeMiB: int('SNAPSHOT_CHUNK_SIZE_MIB', 0, 0, 4096),
    snapshotCpuClass,
    cloneFromDirRoots: cloneDirRoots.roots,
    networkPolicy: networks.policy,
    peer,
    ignoredLaterTier: LATER_TIER.filter((n) => optional(n) !== undefined),
  };
  for (const r of REFUSED) {
    const value = env[r.name];
    const why = value === undefined || value === '' ? undefined : r.refused(value);
    if (why) problems.push(`${r.name}: ${why}`);
  }
  if (problems.length > 0) {
    throw new ConfigError(`invalid configuration:\n  ${problems.join('\n  ')}`);
  }
  return config;
}

/** A validated storage cap quantity in bytes; `0` means no cap. */
function storageCap(value: string): bigint | undefined {
  const q = parseQuantity(value);
  if (!q || q.negative) return undefined;
  const bytes = quantityValue(q);
  return bytes === 0n ? undefined : bytes;
}

/** `vk-cocoon --help` text, generated from the same table as the parser. */
export function helpText(): string {
  const width = Math.max(...ENV_DOCS.map((d) => d.name.length));
  const rows = ENV_DOCS.map((d) => `  ${d.name.padEnd(width)}  ${d.meaning} [default: ${d.default}]`);
  return [
    'vk-cocoon: a Virtual Kubelet that turns pods into Cocoon microVMs.',
    '',
    'Usage: vk-cocoon [run]       start the daemon (configured by the environment below)',
    '       vk-cocoon --help      this text',
    '       vk-cocoon --version   print the version',
    '',
    'Environment:',
    ...rows,
    '',
  ].join('\n');
}
