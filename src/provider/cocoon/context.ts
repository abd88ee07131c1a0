// The provider's context: its dependencies and the shared tables every operation works on
// (tracked records, per-pod queue, orphan index, probes, retry timers), plus the read-only
// helpers all of them use. The write paths live in publication/; records change only
// through the mutators of state.ts.
import type { V1Pod } from '@kubernetes/client-node';
import type { Ledger } from '../../authority/ledger.ts';
import type { SnapshotRecord, VmRecord } from '../../cocoon/records.ts';
import type { CocoonCli } from '../../cocoon/runner.ts';
import type { Config } from '../../config/env.ts';
import { GENERATION, parseGeneration } from '../../contract/annotations.ts';
import type { Kube } from '../../kube/client.ts';
import type { EventSink } from '../../kube/events.ts';
import type { AdmissionReason, Allocatable, Footprint } from '../../lifecycle/admission.ts';
import type { Logger } from '../../log.ts';
import type { LeaseFile } from '../../net/leases.ts';
import type { PodStatusSink } from '../../pods/ports.ts';
import type { SnapshotConfig } from '../../registry/artifact-config.ts';
import type { KeyedQueue } from '../../util/keyed-queue.ts';
import type { Singleflight } from '../../util/singleflight.ts';
import { decodeVMSpec } from '../../vmspec/decode.ts';
import type { LifecycleMetrics } from './metrics.ts';
import type { ProbeAgent } from './probe-agent.ts';
import type { PodRecord } from './state.ts';

/** Pulls a clone-source snapshot from the registry into its local name (docs/registry.md "Pull flow"),
 * de-duplicated per local name; `src/registry/snapshot-puller.ts` implements it. */
export interface SnapshotPuller {
  ensure(image: string, opts: { log?: Logger; signal?: AbortSignal }): Promise<unknown>;
}

/** The run-mode image step with a registry (docs/registry.md "Cloud-image artifacts (run mode)"):
 * a cloud-image artifact is imported and its local name booted, a snapshot artifact refused,
 * anything else pulled; a registry that does not answer throws. `src/registry/image-import.ts`
 * implements it. */
export interface RunImageImporter {
  ensure(
    image: string,
    opts: { force?: boolean; log?: Logger },
  ): Promise<
    | { readonly kind: 'imported'; readonly localName: string }
    | { readonly kind: 'refused'; readonly message: string }
    | { readonly kind: 'pull' }
  >;
}

/** What the registry holds for `<repo>:<tag>` (docs/registry.md, "Identity read"). */
export interface SnapshotIdentity {
  readonly digest: string;
  /** The config's `snapshotId`: the identity anchor a local copy is verified against. */
  readonly snapshotId: string;
  /** `cocoonstack.snapshot.baseimage`; `''` when absent. */
  readonly baseImage: string;
  /** `cocoonstack.snapshot.from-node`; `''` when absent. */
  readonly fromNode: string;
  /** The namespace of the pod that pushed it (`vm.cocoonstack.io/namespace`); `''` when absent. */
  readonly namespace?: string;
  /** The pushing pod's controller UID (`vm.cocoonstack.io/controller-uid`); `''` when absent. */
  readonly controllerUid?: string;
  /** `org.opencontainers.image.created` (RFC 3339); `''` or absent when the manifest has none. */
  readonly created?: string;
  /** The validated config blob (a peer restore's identity check and `snapshot.json`). */
  readonly config?: SnapshotConfig;
  /** Where the pushing host serves it (`ip:port`) and its certificate pin; `''`: a Go pusher. */
  readonly peerAddress?: string;
  readonly peerPin?: string;
}

/** The registry side of hibernate, wake and delete-time snapshots (docs/registry.md, "Push flow",
 * "Identity read", "Tag delete"); `src/registry/store.ts` implements it. Errors are thrown; an
 * absent tag is a result, never an error. */
export interface SnapshotStore {
  push(args: {
    localName: string;
    repo: string;
    tag: string;
    baseImage: string;
    fromNode?: string;
    /** Stamped on the manifest: only a pod of this namespace restores it. */
    namespace?: string;
    /** Owner stamps beside the namespace (docs/security.md): controller UID, pod, pod UID. */
    controllerUid?: string;
    pod?: string;
    podUid?: string;
    /** This host's peer server, stamped so a waking host can ask it (docs/peer-restore.md). */
    peer?: { address: string; pin: string };
    signal?: AbortSignal;
    log?: Logger;
  }): Promise<{ digest: string; snapshotId: string; bytes: number }>;
  identity(repo: string, tag: string, signal?: AbortSignal): Promise<SnapshotIdentity | 'absent'>;
  deleteTag(repo: string, tag: string, signal?: AbortSignal): Promise<'deleted' | 'absent'>;
  pull(args: {
    repo: string;
    tag: string;
    localName: string;
    signal?: AbortSignal;
    log?: Logger;
  }): Promise<SnapshotRecord>;
}

/** What a peer restore staged (docs/peer-restore.md): a directory `vm clone --from-dir` reads. */
export interface PeerStaged {
  readonly dir: string;
  readonly bytes: number;
  /** Removes the staging directory (after the clone, whatever its outcome). */
  release(): Promise<void>;
}

/** Peer restore (docs/peer-restore.md): the hibernated state of a VM name fetched from the host
 * that pushed it instead of the registry. src/peer/restorer.ts implements it. */
export interface PeerRestorer {
  /** This host's peer server as pushes stamp it; undefined when it runs none. */
  readonly stamp: { address: string; pin: string } | undefined;
  /** Stages `vmName`'s state from the node `fromNode`. `{ skip }` when that node cannot be asked
   * (no such node, no address: no attempt, no metric); throws when the restore ran and failed. */
  restore(args: {
    vmName: string;
    fromNode: string;
    /** The pusher's stamped peer server; absent: a Go pusher, found through its Node object. */
    stamp?: { address: string; pin: string };
    config: SnapshotConfig;
    signal?: AbortSignal;
    log: Logger;
  }): Promise<PeerStaged | { skip: string }>;
}

export interface ProviderDeps {
  config: Config;
  kube: Kube;
  cli: CocoonCli;
  events: EventSink;
  metrics: LifecycleMetrics;
  leases: LeaseFile;
  log: Logger;
  nodeIP: string;
  /** Provider-lifetime signal: shutdown aborts background jobs. */
  lifetime: AbortSignal;
  /** The framework's status writer, given at construction. */
  status: PodStatusSink;
  /** Clone-source pulls from the registry; unset without `OCI_REGISTRY`. */
  puller?: SnapshotPuller;
  /** Snapshot pushes, identity reads and hibernate pulls; unset without `OCI_REGISTRY`. */
  store?: SnapshotStore;
  /** Run-mode cloud-image artifacts from the registry; unset without `OCI_REGISTRY`. */
  imageImporter?: RunImageImporter;
  /** Wakes from the pushing host; unset when VK_PEER_ADDR is empty or there is no registry. */
  peer?: PeerRestorer;
  /** The node's allocatable pods, cpu and memory (the node object's figures): CreatePod
   * admission counts against it (admit.ts). Unset: only VK_NODE_PODS is checked. */
  allocatable?: Allocatable;
  /** The provenance ledger: who each VM and snapshot the daemon made belongs to. */
  ledger: Ledger;
  /** One ICMP echo for probes without a probe port (src/net/icmp.ts). Unset when the host
   * cannot send ICMP: a resolved IP then counts as reachable (docs/decisions.md, "ICMP probes"). */
  icmp?: (ip: string, withinMs?: number) => Promise<boolean>;
}

export interface ProviderContext extends ProviderDeps {
  pods: Map<string, PodRecord>;
  queue: KeyedQueue;
  /** Enqueues a readiness reconcile for the key (never runs it inline). */
  reconcileSoon: (key: string) => void;
  /** Starts (or restarts) the probe of a pod with a VM (`ready`: from a ready probe). */
  startProbe: (rec: PodRecord, opts?: { ready?: boolean }) => void;
  /** A delete-time push was deferred (deferred-push.ts): schedules its first try. */
  pushDeferred: (name: string) => void;
  /** Starts a new bring-up of a record whose transient create failure is due for a retry. */
  retryCreate: (rec: PodRecord) => void;
  /** When startup reconcile finished (t0 lower bound of the ready deadline), monotonic ms. */
  startupDoneAt: number;
  /** VMs no pod holds, by VM name, for adoption by the next CreatePod with that name. */
  orphansByName: Map<string, VmRecord>;
  /** VMs kept after their pod's taint eviction, by VM name (ops/evicted.ts). */
  keptEvicted: Map<string, { vmId: string; at: number }>;
  probes: Map<string, ProbeAgent>;
  /** Automatic retries of transient create failures, by pod key. */
  retryTimers: Map<string, NodeJS.Timeout>;
  /** Names of the local snapshots known to exist (listed at startup, kept by our own saves,
   * imports and removals): a bring-up drops `fork-<vmName>` only when it exists, so a clone
   * stays at two cocoon calls (docs/decisions.md, "Hibernate and wake"). */
  localSnapshots: Set<string>;
  /** When each VM was last restarted after a death (monotonic ms; the 30 s cooldown). */
  vmRestarts: Map<string, number>;
  /** Deferred re-checks of VMs whose inspect was inconclusive, by pod key. */
  vmRechecks: Map<string, { timer: NodeJS.Timeout; firstAt: number; delayMs: number }>;
  /** One `fork-<source>` save at a time, shared by concurrent forks of one source. */
  forkSaves: Singleflight<SnapshotRecord>;
  /** Pods rejected by admission, by key: their UID and the reason and message published, so
   * a repeated CreatePod of the same pod repeats the verdict (the kubelet never re-admits a
   * rejected pod). Bounded (admit.ts). */
  rejected: Map<string, { uid: string; reason: AdmissionReason; message: string }>;
  /** The saved size of clone sources seen by `snapshot inspect`, by local snapshot name:
   * admission counts a clone that has no VM yet at its source's size. */
  sourceSizes: Map<string, Footprint>;
  /** The bring-up queued or running per pod key, with its incarnation: DeletePod aborts it
   * (ops/abort.ts). */
  bringUps: Map<string, { uid: string; abort: AbortController }>;
}

// The parts of the context a function takes. The operations (ops/*.ts) and the helpers they
// call ask only for what they touch: an operation's type (next to it) is the intersection of
// its callees' types and a Pick of the members none of those gives; callers pass the whole
// context. The capabilities several modules share are here.

/** The pod-status write path (publication/): the framework's status writer and the apiserver,
 * the tracked records and the pod's queue, and what a status is computed from (config, node
 * IP, lease file). */
export type PublishCtx = Pick<
  ProviderContext,
  'config' | 'kube' | 'leases' | 'lifetime' | 'log' | 'nodeIP' | 'pods' | 'queue' | 'startupDoneAt' | 'status'
>;

/** A failed operation published (publication/lifecycle.ts, failOp): with an event and a metric. */
export type FailOpCtx = PublishCtx & Pick<ProviderContext, 'events' | 'metrics'>;

/** What a bring-up takes (ops/create.ts: claim, adoption, every source, bind, failure and
 * retry; ops/drive.ts and ops/update.ts start one): nearly the whole context, so it is said
 * that way. Only admission's figures and verdicts, the ICMP probe, the taint-eviction keep-list,
 * deferred pushes and the VM-death tables (ops/vm-events.ts) are out of its reach. */
export type BringUpCtx = Omit<
  ProviderContext,
  'allocatable' | 'icmp' | 'keptEvicted' | 'pushDeferred' | 'rejected' | 'vmRechecks' | 'vmRestarts'
>;

export function generationOf(pod: V1Pod): bigint {
  return parseGeneration(pod.metadata?.annotations?.[GENERATION]);
}

export function logFor(ctx: Pick<ProviderContext, 'log'>, rec: PodRecord): Logger {
  return ctx.log.child({ pod: rec.key, vm: rec.spec?.vmName ?? rec.vm?.name, vmId: rec.vm?.id });
}

/** The decoded VMSpec of a pod (errors name the annotation key). */
export function decodeSpec(pod: V1Pod) {
  return decodeVMSpec(pod.metadata?.annotations, {
    namespace: pod.metadata?.namespace,
    ownerReferences: pod.metadata?.ownerReferences,
    containers: pod.spec?.containers,
  });
}

/** True while `rec` is still the tracked incarnation (R2/R9 guard, part 1). */
export function isCurrent(ctx: Pick<ProviderContext, 'pods'>, rec: PodRecord): boolean {
  return ctx.pods.get(rec.key) === rec && !rec.deleting;
}
