// The value types a PodRecord is made of (state.ts) and the annotation keys the provider
// owns. Pure declarations: records are created and changed only by the mutators of state.ts.
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../cocoon/records.ts';
import {
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
  VM_IP,
} from '../../contract/annotations.ts';
import type { IntentRecord } from '../../lifecycle/intent.ts';
import type { PodStatus, PodTermination } from '../../lifecycle/status.ts';
import type { VMSpec } from '../../vmspec/decode.ts';

/** What the provider remembers per pod key. Every field is readonly: records are created and
 * changed only by the mutators of state.ts. */
export interface PodRecord {
  readonly key: string;
  readonly uid: string;
  /** The tracked copy: the last pod from the watch plus the provider-owned annotations. */
  readonly pod: V1Pod;
  /** Decoded VMSpec; `undefined` when the annotations are invalid. */
  readonly spec: VMSpec | undefined;
  readonly vm: VmRecord | undefined;
  /** The bound VM is ours to remove on delete: latched when a managed pod binds it, so
   * turning `managed` off on a live pod does not leak the VM (docs/decisions.md). */
  readonly ownsVm: boolean;
  /** Last resolved IP. */
  readonly ip: string;
  readonly startTime: Date | undefined;
  /** When a VM was bound in this process (monotonic ms; t0 candidate of the ready deadline). */
  readonly boundAt: number | undefined;
  /** Clone, fork, clone-from-dir or restore: fixup and IP wait apply. */
  readonly clonedBoot: boolean;
  /** The clone source snapshot's image (cloudimg vs OCI); '' when unknown. */
  readonly sourceImage: string;
  readonly intent: IntentRecord | undefined;
  readonly progress: Progress | undefined;
  readonly job: Job | undefined;
  readonly probeReady: boolean;
  readonly lastStatus: PodStatus | undefined;
  /** Event reason of a post-clone failure seen by this process (row 5 override). */
  readonly postCloneFailureReason: string | undefined;
  readonly deleting: boolean;
  readonly termination: PodTermination | undefined;
  /** resourceVersion returned by our last annotation patch (R6 watch-lag filter). */
  readonly lastWriteRV: string | undefined;
  /** Current step, shown in the pod's readiness condition (since: monotonic ms). */
  readonly step: { readonly name: string; readonly since: number } | undefined;
  /** A bring-up for this record is queued or running: it claims the VM name. */
  readonly bringingUp: boolean;
  /** The last create attempt failed and no VM is bound (docs/decisions.md, create failures). */
  readonly createFailure: CreateFailure | undefined;
  /** The pod's generation went below the published one (logged once). */
  readonly generationWentDown: boolean;
  /** Changes held back for the next write (bring-up coalescing). */
  readonly held: HeldWrite | undefined;
  /** JSON of the last status the provider wrote itself (merged writes), for de-duplication. */
  readonly writtenStatus: string | undefined;
  /** How the bound VM was booted (a wake or restore fails its IP wait as `wake`). */
  readonly bootOp: BootOp;
  /** The bound VM is a Cloud Hypervisor Windows restore: no PnP fixup, straight to the IP wait. */
  readonly chWindowsRestore: boolean;
  /** The next bring-up restores hibernated state (a wake, or restore-from-hibernate). */
  readonly waking: boolean;
  /** A hibernate in flight. */
  readonly hibernate: HibernateOp | undefined;
  /** The next automatic attempt of a failed hibernate, wake or lift. */
  readonly opRetry: OpRetry | undefined;
  /** The VM died and the pod is to be evicted with this reason (the delete is retried). */
  readonly evicting: { readonly reason: string; readonly message: string } | undefined;
}

/** In-memory progress of the readiness steps, keyed by the VM ID it was recorded for. */
export interface Progress {
  readonly vmId: string;
  readonly fixupSucceeded: boolean;
  readonly fixupAttempts: number;
  readonly sacDone: boolean;
  readonly ipWaitStartedAt: number | undefined;
  readonly renewNudgeSent: boolean;
  /** (reason) of Warning events already emitted for this VM: each is emitted once. */
  readonly warned: ReadonlySet<string>;
}

export type JobKind = 'fixup' | 'sac' | 'ipwait';

/** A long step running outside the pod queue (docs/contracts/lifecycle.md, "Cancellation"). It
 * records its outcome and enqueues a reconcile when it settles; it never writes the
 * lifecycle. */
export interface Job {
  readonly uid: string;
  readonly vmId: string;
  readonly kind: JobKind;
  /** Monotonic ms. */
  readonly startedAt: number;
  readonly hardDeadline: number;
  readonly abort: AbortController;
}

/** Why and when the last create failed; decides whether and when it is retried. */
export interface CreateFailure {
  /** {@link createInputsKey} of the pod the failed attempt ran for. */
  readonly inputsKey: string;
  /** Effective generation of the failed attempt. */
  readonly generation: bigint;
  /** Transient failures are retried on a backoff schedule; permanent ones wait for a change. */
  readonly transient: boolean;
  readonly attempts: number;
  /** Monotonic ms of the first failure of this streak (transient give-up bound). */
  readonly firstAt: number;
  /** Monotonic ms of the next automatic retry (transient only). */
  readonly retryAt: number | undefined;
  readonly message: string;
}

/** Intermediate state of a bring-up not written yet (docs/decisions.md, "Writes per
 * bring-up"): the next write of the pod carries it, or the grace timer writes it. */
export interface HeldWrite {
  /** Provider-owned annotation changes (already on the tracked copy; `null` removes). */
  readonly annotations: Readonly<Record<string, string | null>>;
  /** A status change waits too. */
  readonly status: boolean;
  /** Monotonic ms of the first held change: the grace counts from here. */
  readonly since: number;
  readonly timer: NodeJS.Timeout | undefined;
}

/** A phase of a hibernate (docs/contracts/pod-to-vm.md, "Hibernate"); also the `phase`
 * label of `cocoon_vk_hibernate_total`. */
export type HibernatePhase = 'dhcp_release' | 'netresize' | 'snapshot' | 'push' | 'remove';

/** A hibernate in flight: its slow phases (NIC drop, save, push) run outside the pod's queue,
 * its commit (clear the id, remove the VM, `hibernated`) and its rollback inside it. */
export interface HibernateOp {
  readonly uid: string;
  readonly vmId: string;
  readonly phase: HibernatePhase;
  /** Monotonic ms past which each phase is abandoned, fixed when the hibernate starts and
   * shown in the readiness condition. */
  readonly deadlines: Readonly<Partial<Record<HibernatePhase, number>>>;
  readonly abort: AbortController;
}

/** The lifecycle operations that are retried on their own schedule (docs/contracts/
 * pod-to-vm.md, "Op retry"). */
export type RetryOp = 'hibernate' | 'wake' | 'lift';

/** The next automatic attempt of a failed hibernate, wake or lift. */
export interface OpRetry {
  readonly op: RetryOp;
  readonly delayMs: number;
  /** Monotonic ms. */
  readonly due: number;
  readonly timer: NodeJS.Timeout | undefined;
}

/** How the bound VM was booted: `wake` for a wake or restore (IP-wait reason and message). */
export type BootOp = 'create' | 'wake';

/** The lifecycle triple's keys (docs/contracts/annotations.md). */
export const LIFECYCLE_KEYS: readonly string[] = [
  LIFECYCLE_STATE,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE_MESSAGE,
];
/** The runtime keys: the VM's id and ip, the post-clone marker (docs/contracts/annotations.md). */
export const RUNTIME_KEYS: readonly string[] = [
  VM_ID,
  VM_IP,
  POST_CLONE_STATE,
  POST_CLONE_HINT,
  POST_CLONE_ERRORS,
];

/** The runtime keys all removed: a hibernated VM's or a wake's pod shows no id, ip or fixup. */
export function clearedRuntime(): Record<string, null> {
  return Object.fromEntries(RUNTIME_KEYS.map((k) => [k, null]));
}

/** Annotation keys the provider writes; never part of a pod's create inputs. */
export const PROVIDER_OWNED_KEYS: readonly string[] = [...LIFECYCLE_KEYS, ...RUNTIME_KEYS];
