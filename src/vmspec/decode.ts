/**
 * VMSpec decoding from pod annotations (docs/contracts/annotations.md "VMSpec keys").
 *
 * All values are strings and a missing key reads as `""`. Booleans are true only for the exact
 * string `"true"`. Reader defaults apply to pods that lack a key. Input errors name the
 * annotation key and what was expected; lenient fallbacks the spec prescribes (ignored probe
 * port, omitted storage, …) are reported as warnings, never as errors.
 */
import { posix } from 'node:path';
import {
  BACKEND,
  CLONE_FROM_DIR,
  CONN_TYPE,
  FORCE_PULL,
  FORK_FROM,
  GENERATION,
  HIBERNATE,
  IMAGE,
  isTrue,
  KEEP_SNAPSHOT_ON_DELETE,
  MANAGED,
  MODE,
  NETWORK,
  NO_DIRECT_IO,
  OS,
  PROBE_PORT,
  parseInt64,
  RESTORE_FROM_HIBERNATE,
  SNAPSHOT_POLICY,
  STORAGE,
  VM_NAME,
} from '../contract/annotations.ts';
import {
  BACKENDS,
  type Backend,
  GUEST_OSES,
  type GuestOS,
  isCloudImageUrl,
  type SnapshotPolicy,
  VM_MODES,
  VM_NAME_PATTERN,
  type VMMode,
  type VMRole,
} from '../contract/vm.ts';
import { parseByteSize, parseMillicores, type QuantityInput } from './quantity.ts';
import { deriveRole, type OwnerReferenceLike } from './role.ts';

/** Container resources as found in a pod spec (compatible with `V1ResourceRequirements`). */
export interface ResourcesLike {
  readonly requests?: Readonly<Record<string, QuantityInput>>;
  readonly limits?: Readonly<Record<string, QuantityInput>>;
}

/**
 * The parts of a pod, besides its annotations, that the VMSpec needs. Structurally compatible
 * with `V1Pod`: pass `{ namespace: pod.metadata?.namespace, ownerReferences:
 * pod.metadata?.ownerReferences, containers: pod.spec?.containers }`.
 */
export interface VMSpecPodInput {
  readonly namespace?: string;
  readonly ownerReferences?: readonly OwnerReferenceLike[];
  readonly containers?: readonly { readonly resources?: ResourcesLike }[];
}

/** The decoded VMSpec of one pod. */
export interface VMSpec {
  /** `vm.cocoonstack.io/name`; `''` only for an unmanaged pod without one. */
  readonly vmName: string;
  readonly image: string;
  readonly mode: VMMode;
  readonly os: GuestOS;
  /** `cocoonset.cocoonstack.io/storage` in bytes; `undefined` when absent, zero or unparsable. */
  readonly storageBytes: bigint | undefined;
  readonly network: string;
  readonly snapshotPolicy: SnapshotPolicy;
  readonly managed: boolean;
  readonly forcePull: boolean;
  readonly backend: Backend;
  /** Cloud Hypervisor only; the flag is never sent for Firecracker. */
  readonly noDirectIO: boolean;
  /** TCP probe port; `undefined` ⇒ ICMP probe. */
  readonly probePort: number | undefined;
  /** Informational only. */
  readonly connType: string;
  readonly forkFrom: string;
  readonly cloneFromDir: string;
  readonly hibernate: boolean;
  readonly restoreFromHibernate: boolean;
  readonly keepSnapshotOnDelete: boolean;
  /** `cocoonset.cocoonstack.io/generation` (int64, exact); `0n` when absent or unparsable. */
  readonly generation: bigint;
  readonly role: VMRole;
  /** Sum of the containers' CPU requests in millicores; `undefined` when none is set. */
  readonly cpuRequestMilli: bigint | undefined;
  /** Pod CPU limit in millicores; `undefined` unless every container sets one. */
  readonly cpuLimitMilli: bigint | undefined;
  readonly memoryRequestBytes: bigint | undefined;
  readonly memoryLimitBytes: bigint | undefined;
}

/** What went wrong with one annotation. */
export interface VMSpecIssue {
  /** The annotation key at fault. */
  readonly key: string;
  readonly message: string;
}

/** Error codes the caller maps to counters (`missing_vmname`) or exact messages. */
export type VMSpecErrorCode = 'missing_vmname' | 'unsupported_backend' | 'firecracker_constraint' | 'invalid';

export interface VMSpecError extends VMSpecIssue {
  readonly code: VMSpecErrorCode;
}

export type VMSpecDecodeResult =
  | { readonly ok: true; readonly spec: VMSpec; readonly warnings: readonly VMSpecIssue[] }
  | { readonly ok: false; readonly errors: readonly VMSpecError[] };

const quote = JSON.stringify;

/**
 * Decodes the VMSpec of a pod (docs/contracts/annotations.md "VMSpec keys"). Errors (every one found, not just the first):
 *
 * - managed pod without `vm.cocoonstack.io/name` (`missing_vmname`); a name not matching
 *   `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`;
 * - `vm.cocoonstack.io/backend` other than `cloud-hypervisor` / `firecracker`: exactly
 *   `unsupported backend "<v>"`;
 * - mode other than `clone`/`run`/`static` (case-insensitive), OS other than
 *   `linux`/`windows`/`android`/`macos`;
 * - Firecracker with `os=windows`, or with an `http(s)://` image in run mode;
 * - managed pods: missing image where one is needed, an image that starts with `-` or contains
 *   whitespace, a fork source that is not a VM name, a clone dir that is not an absolute clean
 *   path, or a clone dir combined with mode `run` or with `fork-from` (docs/contracts/annotations.md "VMSpec keys").
 */
export function decodeVMSpec(
  annotations: Readonly<Record<string, string>> | undefined,
  pod: VMSpecPodInput,
): VMSpecDecodeResult {
  const read = (key: string): string => annotations?.[key] ?? '';
  const errors: VMSpecError[] = [];
  const warnings: VMSpecIssue[] = [];
  const fail = (key: string, message: string, code: VMSpecErrorCode = 'invalid'): void => {
    errors.push({ key, message, code });
  };

  const managed = isTrue(read(MANAGED));

  const vmName = read(VM_NAME);
  if (vmName === '') {
    if (managed) fail(VM_NAME, `${VM_NAME}: required for managed pods`, 'missing_vmname');
  } else if (!VM_NAME_PATTERN.test(vmName)) {
    fail(VM_NAME, `${VM_NAME}: expected a VM name matching ${VM_NAME_PATTERN.source}, got ${quote(vmName)}`);
  }

  const rawMode = read(MODE);
  const lowerMode = rawMode.toLowerCase();
  let mode: VMMode = 'clone';
  if (lowerMode !== '') {
    if ((VM_MODES as readonly string[]).includes(lowerMode)) mode = lowerMode as VMMode;
    else fail(MODE, `${MODE}: expected clone, run or static (case-insensitive), got ${quote(rawMode)}`);
  }

  const rawOS = read(OS);
  let os: GuestOS = 'linux';
  if (rawOS !== '') {
    if ((GUEST_OSES as readonly string[]).includes(rawOS)) os = rawOS as GuestOS;
    else fail(OS, `${OS}: expected linux, windows, android or macos, got ${quote(rawOS)}`);
  }

  const rawBackend = read(BACKEND);
  let backend: Backend = 'cloud-hypervisor';
  if (rawBackend !== '') {
    if ((BACKENDS as readonly string[]).includes(rawBackend)) backend = rawBackend as Backend;
    else fail(BACKEND, `unsupported backend ${quote(rawBackend)}`, 'unsupported_backend');
  }

  const image = read(IMAGE);
  const forkFrom = read(FORK_FROM);
  const cloneFromDir = read(CLONE_FROM_DIR);

  if (backend === 'firecracker') {
    if (os === 'windows') {
      fail(
        OS,
        `${OS}: firecracker does not support os=windows (use cloud-hypervisor)`,
        'firecracker_constraint',
      );
    }
    if (mode === 'run' && isCloudImageUrl(image)) {
      fail(
        IMAGE,
        `${IMAGE}: firecracker needs an OCI image in run mode, got the cloud-image URL ${quote(image)}`,
        'firecracker_constraint',
      );
    }
  }

  if (managed) {
    if (image === '' && mode !== 'static' && forkFrom === '' && cloneFromDir === '') {
      fail(IMAGE, `${IMAGE}: required for mode=${mode}`);
    } else if (image.startsWith('-') || /[\s\p{Cc}]/u.test(image)) {
      fail(
        IMAGE,
        `${IMAGE}: expected an image reference (no leading "-", no whitespace), got ${quote(image)}`,
      );
    }
    if (forkFrom !== '' && !VM_NAME_PATTERN.test(forkFrom)) {
      fail(
        FORK_FROM,
        `${FORK_FROM}: expected a VM name matching ${VM_NAME_PATTERN.source}, got ${quote(forkFrom)}`,
      );
    }
    if (cloneFromDir !== '') {
      if (!isAbsoluteCleanPath(cloneFromDir)) {
        fail(
          CLONE_FROM_DIR,
          `${CLONE_FROM_DIR}: expected an absolute clean path, got ${quote(cloneFromDir)}`,
        );
      }
      if (mode === 'run') fail(CLONE_FROM_DIR, `${CLONE_FROM_DIR}: cannot be combined with mode=run`);
      if (forkFrom !== '') fail(CLONE_FROM_DIR, `${CLONE_FROM_DIR}: cannot be combined with ${FORK_FROM}`);
    }
  }

  const rawStorage = read(STORAGE);
  const storageBytes = parseByteSize(rawStorage === '' ? undefined : rawStorage);
  if (rawStorage !== '' && storageBytes === undefined) {
    warnings.push({
      key: STORAGE,
      message: `${STORAGE}: expected a positive Kubernetes quantity (e.g. 20Gi), got ${quote(rawStorage)}; omitted`,
    });
  }

  const rawPolicy = read(SNAPSHOT_POLICY);
  let snapshotPolicy: SnapshotPolicy = 'always';
  if (rawPolicy === 'main-only' || rawPolicy === 'never') snapshotPolicy = rawPolicy;
  else if (rawPolicy !== '' && rawPolicy !== 'always') {
    warnings.push({
      key: SNAPSHOT_POLICY,
      message: `${SNAPSHOT_POLICY}: expected always, main-only or never, got ${quote(rawPolicy)}; using always`,
    });
  }

  const rawProbePort = read(PROBE_PORT);
  const probePort = parseProbePort(rawProbePort);
  if (rawProbePort !== '' && probePort === undefined) {
    warnings.push({
      key: PROBE_PORT,
      message: `${PROBE_PORT}: expected a decimal port 1..65535, got ${quote(rawProbePort)}; using ICMP`,
    });
  }

  const rawGeneration = read(GENERATION);
  const generation = parseInt64(rawGeneration);
  if (rawGeneration !== '' && generation === undefined) {
    warnings.push({
      key: GENERATION,
      message: `${GENERATION}: expected a decimal int64, got ${quote(rawGeneration)}; using 0`,
    });
  }

  if (errors.length > 0) return { ok: false, errors };

  const resources = sumResources(pod.containers);
  const spec: VMSpec = {
    vmName,
    image,
    mode,
    os,
    storageBytes,
    network: read(NETWORK),
    snapshotPolicy,
    managed,
    forcePull: isTrue(read(FORCE_PULL)),
    backend,
    noDirectIO: isTrue(read(NO_DIRECT_IO)),
    probePort,
    connType: read(CONN_TYPE),
    forkFrom,
    cloneFromDir,
    hibernate: isTrue(read(HIBERNATE)),
    restoreFromHibernate: isTrue(read(RESTORE_FROM_HIBERNATE)),
    keepSnapshotOnDelete: isTrue(read(KEEP_SNAPSHOT_ON_DELETE)),
    generation: generation ?? 0n,
    role: deriveRole(vmName, pod.namespace ?? '', pod.ownerReferences),
    ...resources,
  };
  return { ok: true, spec, warnings };
}

/** `vm.cocoonstack.io/probe-port`: decimal 1..65535 (ASCII digits only), else `undefined`. */
export function parseProbePort(value: string): number | undefined {
  if (!/^[0-9]{1,5}$/.test(value)) return undefined;
  const port = Number(value);
  return port >= 1 && port <= 65535 ? port : undefined;
}

/** Go `filepath.IsAbs(p) && filepath.Clean(p) == p` for POSIX paths. */
function isAbsoluteCleanPath(path: string): boolean {
  if (!path.startsWith('/')) return false;
  let clean = posix.normalize(path);
  if (clean.length > 1 && clean.endsWith('/')) clean = clean.slice(0, -1);
  return clean === path;
}

interface PodResourceTotals {
  readonly cpuRequestMilli: bigint | undefined;
  readonly cpuLimitMilli: bigint | undefined;
  readonly memoryRequestBytes: bigint | undefined;
  readonly memoryLimitBytes: bigint | undefined;
}

/**
 * Pod-level resources: requests are summed over the containers that set one; a limit exists
 * only when every container sets it (otherwise the pod is unbounded, as in Kubernetes). An
 * unparsable quantity counts as not set.
 */
function sumResources(containers: VMSpecPodInput['containers']): PodResourceTotals {
  const list = containers ?? [];
  const total = (
    pick: (r: ResourcesLike | undefined) => Readonly<Record<string, QuantityInput>> | undefined,
    resource: 'cpu' | 'memory',
    requireAll: boolean,
  ): bigint | undefined => {
    let sum: bigint | undefined;
    for (const container of list) {
      const raw = pick(container.resources)?.[resource];
      const value = resource === 'cpu' ? parseMillicores(raw) : parseByteSize(raw);
      if (value === undefined) {
        if (requireAll) return undefined;
        continue;
      }
      sum = (sum ?? 0n) + value;
    }
    return sum;
  };
  return {
    cpuRequestMilli: total((r) => r?.requests, 'cpu', false),
    cpuLimitMilli: total((r) => r?.limits, 'cpu', true),
    memoryRequestBytes: total((r) => r?.requests, 'memory', false),
    memoryLimitBytes: total((r) => r?.limits, 'memory', true),
  };
}

/** Run mode `--memory` (docs/contracts/pod-to-vm.md "Bring-up: run"): the memory request in bytes, else the limit. */
export function runMemoryBytes(
  spec: Pick<VMSpec, 'memoryRequestBytes' | 'memoryLimitBytes'>,
): bigint | undefined {
  return spec.memoryRequestBytes ?? spec.memoryLimitBytes;
}

/**
 * Whether the boot is a cloned boot (docs/contracts/post-clone.md "When a fixup is owed"): every mode but `run`, and `run` with
 * a clone source (`fork-from` or `clone-from-dir`). Restore/wake boots are cloned boots too;
 * the caller knows those from the bring-up path.
 */
export function isClonedBootSpec(spec: Pick<VMSpec, 'mode' | 'forkFrom' | 'cloneFromDir'>): boolean {
  return spec.mode !== 'run' || spec.forkFrom !== '' || spec.cloneFromDir !== '';
}
