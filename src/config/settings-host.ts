// The settings table, part two: cocoon on this host, pods and their VMs, the snapshot registry,
// and the Go daemon's settings kept only for compatibility (src/config/settings.ts puts the
// parts together).
import { FIXUP_BUDGET_MS } from '../guest/postclone.ts';
import {
  DEFAULT_READY_DEADLINE_SECONDS,
  DEFAULT_RECONCILE_INTERVAL_SECONDS,
  MIN_READY_DEADLINE_SECONDS,
} from '../lifecycle/owed.ts';
import { parseCloneDirRoots } from '../vmspec/clone-dir-roots.ts';
import { parseNetworkPolicy } from '../vmspec/network-policy.ts';
import {
  absolutePath,
  bool,
  existingFile,
  ignored,
  int,
  oneOf,
  pemBundle,
  refused,
  registryBase,
  storageCap,
  text,
  withProblems,
} from './parsers.ts';
import { type CompatSetting, type EnvSetting, setting } from './setting.ts';
import { DEFAULT_STATE_DIR } from './types.ts';

/** Why the Go daemon's registry settings stay in the table though nothing reads them. */
const goRegistry = (instead: string) =>
  `kept so that a host that still sets it fails at startup naming what to set instead (${instead}), rather than running without its registry`;
const LATER_TIER =
  "macOS guests are a later tier: set, it is ignored and logged at startup, so a Go host's configuration still starts";

export const HOST_SETTINGS = [
  setting({
    name: 'VK_COCOON_BIN',
    group: 'host',
    field: 'cocoonBin',
    default: '/usr/local/bin/cocoon',
    parse: text,
    doc: 'the cocoon CLI',
  }),
  setting({
    name: 'COCOON_ROOT_DIR',
    group: 'host',
    field: 'cocoonRootDir',
    default: '/var/lib/cocoon',
    parse: text,
    doc: 'cocoon data dir (run dirs, storage capacity)',
  }),
  setting({
    name: 'COCOON_CGROUP_PARENT',
    group: 'host',
    field: 'cgroupParent',
    default: 'cocoon.slice',
    parse: text,
    doc: 'cgroup parent of the per-VM scopes',
  }),
  setting({
    name: 'VK_CGROUP_ROOT',
    group: 'host',
    field: 'cgroupRoot',
    default: '/sys/fs/cgroup',
    parse: absolutePath,
    doc: 'cgroup v2 mount the per-VM scopes (COCOON_CGROUP_PARENT) are read under, for VM CPU',
  }),
  setting({
    name: 'VK_LEASES_PATH',
    group: 'host',
    field: 'leasesPath',
    default: '/var/lib/cocoon/net/leases.json',
    parse: text,
    doc: 'cocoon-net DHCP lease file',
  }),
  setting({
    name: 'VK_COCOON_NET_CONTROL_SOCKET',
    group: 'host',
    field: 'netControlSocket',
    default: '/run/cocoon-net/control.sock',
    emptyIsValue: true,
    parse: text,
    doc: 'cocoon-net lease release socket; empty disables',
  }),
  setting({
    name: 'VK_STATE_DIR',
    group: 'host',
    field: 'stateDir',
    default: DEFAULT_STATE_DIR,
    parse: text,
    doc: "the daemon's own state: the provenance ledger (ledger.json, mode 0600) of the VMs and snapshots it made, and the delete-time pushes still waiting for the registry",
  }),
  setting({
    name: 'VK_ORPHAN_POLICY',
    group: 'host',
    field: 'orphanPolicy',
    default: 'destroy',
    parse: oneOf(['destroy', 'alert', 'keep']),
    doc: 'VMs no pod claims at startup: destroy, alert or keep (destroy removes only VMs the provenance ledger says vk-cocoon made)',
  }),
  setting({
    name: 'VK_TRANSFER_SLOTS',
    group: 'host',
    field: 'transferSlots',
    default: 8,
    parse: int(1, 256),
    doc: 'concurrent transfers (registry pulls and pushes, snapshot/image import and export, image pull), a pool apart from the other cocoon calls',
  }),
  setting({
    name: 'VK_RESTORE_MODE',
    group: 'host',
    field: 'restoreMode',
    default: 'ondemand',
    parse: oneOf(['copy', 'ondemand', 'mmap']),
    doc: 'CH clone memory restore: copy, ondemand or mmap (Windows always copy)',
  }),
  {
    name: 'VK_COCOON_MACOS_BIN',
    group: 'host',
    shown: '/usr/local/bin/cocoon-macos',
    parse: ignored,
    doc: "the Go daemon's macOS guest CLI",
    compat: LATER_TIER,
  } satisfies CompatSetting,
  {
    name: 'COCOON_MACOS_VNC_PASSWORD',
    group: 'host',
    parse: ignored,
    doc: "the Go daemon's macOS guest VNC password",
    compat: LATER_TIER,
  } satisfies CompatSetting,

  setting({
    name: 'VK_MAX_VM_STORAGE',
    group: 'pods',
    field: 'maxVmStorageBytes',
    default: 2n ** 40n,
    shown: '1Ti',
    parse: storageCap,
    doc: 'largest cocoonset.cocoonstack.io/storage a pod may ask for (quantity); a pod asking for more fails; 0 disables the cap',
  }),
  setting({
    name: 'VK_FIXUP_BUDGET_SECONDS',
    group: 'pods',
    field: 'fixupBudgetSeconds',
    default: FIXUP_BUDGET_MS / 1000,
    parse: int(30, FIXUP_BUDGET_MS / 1000),
    doc: `how long the post-clone guest network fixup retries before the pod fails (30-${FIXUP_BUDGET_MS / 1000}: only shorter, to fail fast)`,
  }),
  setting({
    name: 'VK_READY_DEADLINE_SECONDS',
    group: 'pods',
    field: 'readyDeadlineSeconds',
    default: DEFAULT_READY_DEADLINE_SECONDS,
    parse: int(MIN_READY_DEADLINE_SECONDS, 86_400),
    doc: `longest a managed pod with a live VM may stay creating (>= ${MIN_READY_DEADLINE_SECONDS})`,
  }),
  setting({
    name: 'VK_RECONCILE_INTERVAL_SECONDS',
    group: 'pods',
    field: 'reconcileIntervalSeconds',
    default: DEFAULT_RECONCILE_INTERVAL_SECONDS,
    parse: int(1, 60),
    doc: 'lifecycle tick: readiness reconcile and re-flush (1-60)',
  }),
  setting({
    name: 'VK_ACCEPT_UNSTAMPED_STATE',
    group: 'pods',
    field: 'acceptUnstampedState',
    default: true,
    parse: bool,
    doc: 'wake or restore hibernated state that carries no owner stamp (pushed by Go hosts) for the pod whose VM name is its repository; false refuses it',
  }),
  setting({
    name: 'VK_CLONE_FROM_DIR_ROOTS',
    group: 'pods',
    field: 'cloneFromDirRoots',
    default: [],
    shown: '(unset)',
    parse: withProblems((raw) => {
      const { roots, problems } = parseCloneDirRoots(raw);
      return { value: roots, problems };
    }),
    doc: 'comma-separated directories; a pod may clone-from-dir only a path that resolves (symlinks followed) under ROOT/NAMESPACE/ of one of them; unset refuses clone-from-dir',
  }),
  setting({
    name: 'VK_ALLOWED_NETWORKS',
    group: 'pods',
    field: 'networkPolicy.allowed',
    default: undefined,
    parse: withProblems((raw) => {
      const { policy, problems } = parseNetworkPolicy(raw, undefined);
      return { value: policy.allowed, problems };
    }),
    doc: 'comma-separated networks a pod may name in cocoonset.cocoonstack.io/network (namespaces not in VK_NAMESPACE_NETWORKS); unset: any',
  }),
  setting({
    name: 'VK_NAMESPACE_NETWORKS',
    group: 'pods',
    field: 'networkPolicy.perNamespace',
    default: new Map(),
    shown: '(unset)',
    parse: withProblems((raw) => {
      const { policy, problems } = parseNetworkPolicy(undefined, raw);
      return { value: policy.perNamespace, problems };
    }),
    doc: 'networks per namespace, e.g. ns-a=net1|net2;ns-b=net3 (ns-c= allows only the default network); a listed namespace may name only its own list',
  }),

  setting({
    name: 'OCI_REGISTRY',
    group: 'registry',
    field: 'ociRegistry',
    default: undefined,
    parse: registryBase,
    doc: 'snapshot registry base host[:port][/path]; unset disables clone-source pulls',
  }),
  setting({
    name: 'OCI_REGISTRY_CA_FILE',
    group: 'registry',
    field: 'registryCa',
    default: undefined,
    parse: pemBundle,
    doc: 'PEM CA bundle trusted for the registry and its token realm, besides the system CAs',
  }),
  setting({
    name: 'VK_REGISTRY_PLAIN_HTTP',
    group: 'registry',
    field: 'registryPlainHttp',
    default: false,
    parse: bool,
    doc: 'plain HTTP to the registry (tests only; loopback is always plain); credentials are never sent over it to a non-loopback host',
  }),
  {
    name: 'GOOGLE_APPLICATION_CREDENTIALS',
    group: 'registry',
    parse: existingFile,
    readFromEnv: 'src/registry/credentials.ts (usesGoogleAdc) and google-auth-library',
    doc: 'service-account key for Google application default credentials: used for gcr.io / *.pkg.dev registries (see VK_REGISTRY_GOOGLE_ADC)',
  } satisfies EnvSetting,
  setting({
    name: 'VK_REGISTRY_GOOGLE_ADC',
    group: 'registry',
    field: 'registryGoogleAdc',
    default: 'auto',
    parse: oneOf(['auto', 'true', 'false']),
    doc: 'auto: Google ADC for gcr.io / *.pkg.dev when GOOGLE_APPLICATION_CREDENTIALS is set; true: for OCI_REGISTRY whatever its host (metadata server included); false: never',
  }),
  setting({
    name: 'SNAPSHOT_TRANSFER_CONCURRENCY',
    group: 'registry',
    field: 'snapshotTransferConcurrency',
    default: 8,
    parse: int(1, 256),
    doc: 'parallel registry blob transfers',
  }),
  setting({
    name: 'SNAPSHOT_MEMORY_BUDGET_MIB',
    group: 'registry',
    field: 'snapshotMemoryBudgetMiB',
    default: 9216,
    parse: int(64, 1_048_576),
    doc: 'v2 push: compressed or cut blobs spooled and not yet uploaded, at most (MiB, 64-1048576)',
  }),
  setting({
    name: 'SNAPSHOT_PULL_BUDGET_MIB',
    group: 'registry',
    field: 'snapshotPullBudgetMiB',
    default: 2048,
    parse: int(64, 1_048_576),
    doc: 'pull buffering cap',
  }),
  setting({
    name: 'SNAPSHOT_ZSTD_LEVEL',
    group: 'registry',
    field: 'snapshotZstdLevel',
    default: 0,
    parse: int(0, 22),
    doc: 'v2 push: zstd level 1-22 for files of at least 1 MiB; 0 off (with SNAPSHOT_CHUNK_SIZE_MIB also 0: v1)',
  }),
  setting({
    name: 'SNAPSHOT_CHUNK_SIZE_MIB',
    group: 'registry',
    field: 'snapshotChunkSizeMiB',
    default: 0,
    // cocoon-common v0.3.0 refuses chunks above 4 GiB.
    parse: int(0, 4096),
    doc: 'v2 push: cut files into chunks of this size (1-4096); 0 off (with SNAPSHOT_ZSTD_LEVEL also 0: v1)',
  }),
  {
    name: 'EPOCH_URL',
    group: 'registry',
    parse: refused(
      "is the Go daemon v0.2.9's registry setting and is not read: set OCI_REGISTRY=<host[:port][/path]> instead",
    ),
    doc: "the Go daemon v0.2.9's registry URL",
    compat: goRegistry('OCI_REGISTRY'),
  } satisfies CompatSetting,
  {
    name: 'EPOCH_TOKEN',
    group: 'registry',
    parse: refused(
      "is the Go daemon v0.2.9's registry setting and is not read: put the registry's credentials in the docker config (DOCKER_CONFIG, `auths`) instead",
    ),
    doc: "the Go daemon v0.2.9's registry token",
    compat: goRegistry("the docker config's auths"),
  } satisfies CompatSetting,
  {
    name: 'EPOCH_CA_CERT',
    group: 'registry',
    parse: refused(
      "is the Go daemon v0.2.9's registry setting and is not read: set OCI_REGISTRY_CA_FILE=<PEM file> instead",
    ),
    doc: "the Go daemon v0.2.9's registry CA",
    compat: goRegistry('OCI_REGISTRY_CA_FILE'),
  } satisfies CompatSetting,
];
