// What the provider remembers per pod key. Everything here is either re-derivable from the
// apiserver, `cocoon vm list` and the lease file (pod, VM, intent seeded from annotations),
// or progress keyed by VM ID that may be lost on restart without changing any outcome
// (lifecycle.md §10.8): after a restart a fixup simply runs again (its guest steps are
// idempotent) and an IP wait starts over.
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../cocoon/records.ts';
import {
  GENERATION,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  MANAGED,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
  VM_IP,
} from '../../contract/annotations.ts';
import type { IntentRecord } from '../../lifecycle/intent.ts';
import type { PodStatus, PodTermination } from '../../lifecycle/status.ts';
import type { VMSpec } from '../../vmspec/decode.ts';

/** In-memory progress of the readiness steps, keyed by the VM ID it was recorded for. */
export interface Progress {
  vmId: string;
  fixupSucceeded: boolean;
  fixupAttempts: number;
  sacDone: boolean;
  ipWaitStartedAt: number | undefined;
  renewNudgeSent: boolean;
  /** (reason) of Warning events already emitted for this VM: each is emitted once. */
  warned: Set<string>;
}

export type JobKind = 'fixup' | 'ipwait';

/** A long step running outside the pod queue (lifecycle.md §10.7). It records its outcome
 * and enqueues a reconcile when it settles; it never writes the lifecycle. */
export interface Job {
  uid: string;
  vmId: string;
  kind: JobKind;
  startedAt: number;
  hardDeadline: number;
  abort: AbortController;
  done: Promise<void>;
}

export interface PodRecord {
  readonly key: string;
  readonly uid: string;
  /** The tracked copy: the last pod from the watch plus the provider-owned annotations. */
  pod: V1Pod;
  /** Decoded VMSpec; `undefined` when the annotations are invalid (the pod is parked failed). */
  spec: VMSpec | undefined;
  vm: VmRecord | undefined;
  /** Last resolved IP (lifecycle.md §7.1). */
  ip: string;
  startTime: Date | undefined;
  /** When a VM was bound in this process (t0 candidate, §10.1). */
  boundAt: number | undefined;
  /** Clone, fork, clone-from-dir or restore: fixup and IP wait apply (§6.1). */
  clonedBoot: boolean;
  /** The clone source snapshot's image (cloudimg vs OCI, §6.2); '' when unknown. */
  sourceImage: string;
  intent: IntentRecord | undefined;
  progress: Progress | undefined;
  job: Job | undefined;
  probeReady: boolean;
  lastStatus: PodStatus | undefined;
  /** Event reason of a post-clone failure seen by this process (row 5 override). */
  postCloneFailureReason: string | undefined;
  deleting: boolean;
  termination: PodTermination | undefined;
  /** resourceVersion returned by our last annotation patch (R6 watch-lag filter). */
  lastWriteRV: string | undefined;
  /** Current readiness step, shown in the pod's readiness condition. */
  step: { name: string; since: number } | undefined;
  /** The bound VM is ours to remove on delete: latched when a managed pod binds it, so
   * turning `managed` off on a live pod does not leak the VM (docs/decisions.md). */
  ownsVm: boolean;
  /** A bring-up for this record is queued or running: it claims the VM name. */
  bringingUp: boolean;
  /** The last create attempt failed and no VM is bound (docs/decisions.md, create failures). */
  createFailure: CreateFailure | undefined;
  /** The pod's generation went below the published one (logged once). */
  generationWentDown: boolean;
}

/** Why and when the last create failed; decides whether and when it is retried. */
export interface CreateFailure {
  /** {@link createInputsKey} of the pod the failed attempt ran for. */
  inputsKey: string;
  /** Effective generation of the failed attempt. */
  generation: bigint;
  /** Transient failures are retried on a backoff schedule; permanent ones wait for a change. */
  transient: boolean;
  attempts: number;
  /** Monotonic ms of the first failure of this streak (transient give-up bound). */
  firstAt: number;
  /** Monotonic ms of the next automatic retry (transient only). */
  retryAt: number | undefined;
  message: string;
}

export function newRecord(key: string, pod: V1Pod, spec: VMSpec | undefined): PodRecord {
  return {
    key,
    uid: pod.metadata?.uid ?? '',
    pod,
    spec,
    vm: undefined,
    ip: '',
    startTime: undefined,
    boundAt: undefined,
    clonedBoot: false,
    sourceImage: '',
    intent: undefined,
    progress: undefined,
    job: undefined,
    probeReady: false,
    lastStatus: undefined,
    postCloneFailureReason: undefined,
    deleting: false,
    termination: undefined,
    lastWriteRV: undefined,
    step: undefined,
    ownsVm: false,
    bringingUp: false,
    createFailure: undefined,
    generationWentDown: false,
  };
}

/** The progress record for the bound VM, created on first use; a replaced VM starts clean. */
export function progressFor(rec: PodRecord, vmId: string): Progress {
  if (rec.progress?.vmId !== vmId) {
    rec.progress = {
      vmId,
      fixupSucceeded: false,
      fixupAttempts: 0,
      sacDone: false,
      ipWaitStartedAt: undefined,
      renewNudgeSent: false,
      warned: new Set(),
    };
  }
  return rec.progress;
}

/** Annotation keys the provider writes; never part of a pod's create inputs. */
export const PROVIDER_OWNED_KEYS: readonly string[] = [
  LIFECYCLE_STATE,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE_MESSAGE,
  VM_ID,
  VM_IP,
  POST_CLONE_STATE,
  POST_CLONE_HINT,
  POST_CLONE_ERRORS,
];

/** What a create attempt reads from the pod: every annotation but the provider-owned ones
 * and the generation (a bump re-runs a create on its own, a drop does not), the owner
 * references and the containers (resources). Our own writes and status-only updates never
 * change it, so they never re-run a failed create. An unmanaged pod's `id`/`ip` are inputs
 * written by its operator. */
export function createInputsKey(pod: V1Pod): string {
  const ann = { ...(pod.metadata?.annotations ?? {}) };
  const managed = ann[MANAGED] === 'true';
  for (const k of PROVIDER_OWNED_KEYS) {
    if (managed || (k !== VM_ID && k !== VM_IP)) delete ann[k];
  }
  delete ann[GENERATION];
  return JSON.stringify([
    Object.entries(ann).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
    (pod.metadata?.ownerReferences ?? []).map((o) => [o.kind, o.name, o.uid, o.controller ?? false]),
    (pod.spec?.containers ?? []).map((c) => [c.name, c.image ?? '', c.resources ?? {}]),
  ]);
}

export function annotationsOf(rec: PodRecord): Record<string, string> {
  return rec.pod.metadata?.annotations ?? {};
}

/** Applies provider-owned annotation changes to the tracked copy (null removes). */
export function applyAnnotations(rec: PodRecord, changes: Record<string, string | null>): void {
  const ann = { ...(rec.pod.metadata?.annotations ?? {}) };
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === '') delete ann[k];
    else ann[k] = v;
  }
  rec.pod = { ...rec.pod, metadata: { ...rec.pod.metadata, annotations: ann } };
}

const LIFECYCLE_KEYS = [LIFECYCLE_STATE, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE_MESSAGE];
const RUNTIME_KEYS = [VM_ID, VM_IP, POST_CLONE_STATE, POST_CLONE_HINT, POST_CLONE_ERRORS];

/** Tracks a newer copy of the pod from the watch while keeping the annotations the
 * provider owns (R6: the intent is written onto every re-tracked copy). Runtime keys of
 * unmanaged pods belong to the operator and come from the new copy. */
export function retrack(rec: PodRecord, pod: V1Pod): void {
  const keys = rec.spec?.managed === false ? LIFECYCLE_KEYS : [...LIFECYCLE_KEYS, ...RUNTIME_KEYS];
  const previous = annotationsOf(rec);
  const owned: Record<string, string | null> = {};
  for (const k of keys) owned[k] = previous[k] ?? null;
  rec.pod = pod;
  applyAnnotations(rec, owned);
}
