// The value types a PodRecord is made of (state.ts) and the annotation keys the provider
// owns. Pure declarations: records are created and changed only by the mutators of state.ts.
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

export type JobKind = 'fixup' | 'ipwait';

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

/** Annotation keys the provider writes; never part of a pod's create inputs. */
export const PROVIDER_OWNED_KEYS: readonly string[] = [...LIFECYCLE_KEYS, ...RUNTIME_KEYS];
