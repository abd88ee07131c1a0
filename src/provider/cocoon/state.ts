// The only module that changes a PodRecord (declared in record-types.ts): every other module
// reads a record and changes it through the named mutators below.
//
// Everything here is re-derivable from the apiserver, `cocoon vm list` and the lease file, or
// progress keyed by VM ID that may be lost on restart without changing any outcome
// (docs/contracts/lifecycle.md, "Never stranded").
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../cocoon/records.ts';
import type { IntentRecord } from '../../lifecycle/intent.ts';
import type { PodStatus, PodTermination } from '../../lifecycle/status.ts';
import { monoNow } from '../../util/mono-clock.ts';
import type { VMSpec } from '../../vmspec/decode.ts';
import {
  type BootOp,
  type CreateFailure,
  type HeldWrite,
  type HibernateOp,
  type Job,
  LIFECYCLE_KEYS,
  type OpRetry,
  type PodRecord,
  type Progress,
  RUNTIME_KEYS,
} from './record-types.ts';

export type { PodRecord };

type Mutable<T> = { -readonly [K in keyof T]: T[K] };
const m = (rec: PodRecord) => rec as Mutable<PodRecord>;

export function newRecord(key: string, pod: V1Pod, spec: VMSpec | undefined): PodRecord {
  return {
    key,
    uid: pod.metadata?.uid ?? '',
    pod,
    spec,
    vm: undefined,
    ownsVm: false,
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
    bringingUp: false,
    createFailure: undefined,
    generationWentDown: false,
    held: undefined,
    writtenStatus: undefined,
    bootOp: 'create',
    chWindowsRestore: false,
    waking: false,
    hibernate: undefined,
    opRetry: undefined,
    evicting: undefined,
  };
}

// ---- the VM ---------------------------------------------------------------------------

/** Binds a VM: a new VM ID starts clean progress and a new ready-deadline t0. */
export function bindVm(
  rec: PodRecord,
  vm: VmRecord,
  opts: {
    owns: boolean;
    clonedBoot?: boolean;
    sourceImage?: string;
    startTime?: Date;
    bootOp?: BootOp;
    chWindowsRestore?: boolean;
  },
): void {
  const r = m(rec);
  r.vm = vm;
  r.bootOp = opts.bootOp ?? 'create';
  r.chWindowsRestore = opts.chWindowsRestore ?? false;
  r.ownsVm = opts.owns;
  if (opts.clonedBoot !== undefined) r.clonedBoot = opts.clonedBoot;
  if (opts.sourceImage !== undefined) r.sourceImage = opts.sourceImage;
  r.startTime = opts.startTime ?? rec.startTime ?? new Date();
  r.boundAt = monoNow();
  r.createFailure = undefined;
  progressFor(rec, vm.id);
}

/** The ready deadline counts again from now (a lifted hibernate failure). */
export function restartReadyClock(rec: PodRecord): void {
  m(rec).boundAt = monoNow();
}

/** Forgets the bound VM (an unmanaged pod re-pointed to another ID, a hibernated VM). */
export function unbindVm(rec: PodRecord): void {
  m(rec).vm = undefined;
  m(rec).ip = '';
}

/** A newer record of the same VM (its NICs changed: a hibernate rollback re-added one). */
export function refreshVm(rec: PodRecord, vm: VmRecord): void {
  if (rec.vm?.id === vm.id) m(rec).vm = vm;
}

export function setIp(rec: PodRecord, ip: string): void {
  m(rec).ip = ip;
}

export function setProbeReady(rec: PodRecord, ready: boolean): void {
  m(rec).probeReady = ready;
}

// ---- the pod copy ---------------------------------------------------------------------

export function setSpec(rec: PodRecord, spec: VMSpec | undefined): void {
  m(rec).spec = spec;
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
  m(rec).pod = { ...rec.pod, metadata: { ...rec.pod.metadata, annotations: ann } };
}

/** Tracks a newer copy of the pod, keeping the annotations the provider owns (R6); runtime
 * keys of unmanaged pods belong to the operator and come from the new copy. */
export function retrack(rec: PodRecord, pod: V1Pod): void {
  const keys = rec.spec?.managed === false ? LIFECYCLE_KEYS : [...LIFECYCLE_KEYS, ...RUNTIME_KEYS];
  const previous = annotationsOf(rec);
  const owned: Record<string, string | null> = {};
  for (const k of keys) owned[k] = previous[k] ?? null;
  m(rec).pod = pod;
  applyAnnotations(rec, owned);
}

// ---- lifecycle ------------------------------------------------------------------------

export function setIntent(rec: PodRecord, intent: IntentRecord | undefined): void {
  m(rec).intent = intent;
}

export function setLastWriteRV(rec: PodRecord, rv: string | undefined): void {
  m(rec).lastWriteRV = rv;
}

export function setLastStatus(rec: PodRecord, status: PodStatus): void {
  m(rec).lastStatus = status;
}

export function setWrittenStatus(rec: PodRecord, json: string | undefined): void {
  m(rec).writtenStatus = json;
}

// ---- held writes ----------------------------------------------------------------------

/** Adds changes to the held write (later changes of a key win); returns it. The caller
 * arms the timer ({@link setHeldTimer}) when there is none. */
export function holdChanges(
  rec: PodRecord,
  changes: { annotations?: Readonly<Record<string, string | null>>; status?: boolean },
  now: number,
): HeldWrite {
  const held: HeldWrite = {
    annotations: { ...(rec.held?.annotations ?? {}), ...(changes.annotations ?? {}) },
    status: (rec.held?.status ?? false) || (changes.status ?? false),
    since: rec.held?.since ?? now,
    timer: rec.held?.timer,
  };
  m(rec).held = held;
  return held;
}

export function setHeldTimer(rec: PodRecord, timer: NodeJS.Timeout | undefined): void {
  if (rec.held) m(rec).held = { ...rec.held, timer };
}

/** The held status was written another way: only held annotations (if any) keep waiting. */
export function dropHeldStatus(rec: PodRecord): void {
  if (!rec.held?.status) return;
  if (Object.keys(rec.held.annotations).length === 0) takeHeld(rec);
  else m(rec).held = { ...rec.held, status: false };
}

/** Takes the held write off the record (its timer cleared): the caller writes it. */
export function takeHeld(rec: PodRecord): HeldWrite | undefined {
  const held = rec.held;
  if (held?.timer) clearTimeout(held.timer);
  m(rec).held = undefined;
  return held;
}

export function setStep(rec: PodRecord, name: string): void {
  m(rec).step = { name, since: monoNow() };
}

export function markGenerationWentDown(rec: PodRecord): void {
  m(rec).generationWentDown = true;
}

export function setPostCloneFailureReason(rec: PodRecord, reason: string | undefined): void {
  m(rec).postCloneFailureReason = reason;
}

// ---- create and delete ----------------------------------------------------------------

export function setBringingUp(rec: PodRecord, on: boolean): void {
  m(rec).bringingUp = on;
}

export function setCreateFailure(rec: PodRecord, failure: CreateFailure | undefined): void {
  m(rec).createFailure = failure;
}

export function setDeleting(rec: PodRecord, on: boolean): void {
  m(rec).deleting = on;
}

export function markDeleted(rec: PodRecord, termination: PodTermination = { kind: 'deleted' }): void {
  m(rec).termination = termination;
}

/** An eviction decided and not done yet (re-driven on the next tick until it is). */
export function setEvicting(rec: PodRecord, evicting: PodRecord['evicting']): void {
  m(rec).evicting = evicting;
}

// ---- readiness progress and jobs ------------------------------------------------------

/** The progress record for the bound VM, created on first use; a replaced VM starts clean. */
export function progressFor(rec: PodRecord, vmId: string): Progress {
  if (rec.progress?.vmId !== vmId) {
    m(rec).progress = {
      vmId,
      fixupSucceeded: false,
      fixupAttempts: 0,
      sacDone: false,
      ipWaitStartedAt: undefined,
      renewNudgeSent: false,
      warned: new Set(),
    };
  }
  return rec.progress as Progress;
}

/** Records progress for a VM ID (ignored when the pod's VM changed meanwhile). */
export function recordProgress(
  rec: PodRecord,
  vmId: string,
  changes: Partial<
    Pick<Progress, 'fixupSucceeded' | 'fixupAttempts' | 'sacDone' | 'ipWaitStartedAt' | 'renewNudgeSent'>
  >,
): void {
  if (rec.vm?.id !== vmId) return;
  m(rec).progress = { ...progressFor(rec, vmId), ...changes };
}

/** Marks a Warning reason as emitted for the bound VM; false when it already was. */
export function markWarned(rec: PodRecord, reason: string): boolean {
  const vmId = rec.vm?.id ?? '';
  if (!rec.progress || rec.progress.vmId !== vmId) return true;
  if (rec.progress.warned.has(reason)) return false;
  (rec.progress.warned as Set<string>).add(reason);
  return true;
}

export function setJob(rec: PodRecord, job: Job | undefined): void {
  m(rec).job = job;
}

// ---- hibernate, wake and op retry -----------------------------------------------------

export function setWaking(rec: PodRecord, on: boolean): void {
  m(rec).waking = on;
}

export function setHibernateOp(rec: PodRecord, op: HibernateOp | undefined): void {
  m(rec).hibernate = op;
}

/** Replaces the op retry (its previous timer cleared). */
export function setOpRetry(rec: PodRecord, retry: OpRetry | undefined): void {
  if (rec.opRetry?.timer && rec.opRetry.timer !== retry?.timer) clearTimeout(rec.opRetry.timer);
  m(rec).opRetry = retry;
}
