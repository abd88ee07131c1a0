/**
 * The owed-step derivation of the level-triggered readiness reconcile (docs/contracts/lifecycle.md "Owed steps")
 * and the ready deadline (docs/contracts/lifecycle.md "Ready deadline").
 *
 * {@link deriveOwedStep} re-derives, from observable facts only, what a pod is owed right now.
 * It is called on every reconcile run (UpdatePod, job settled, probe transition, VM event,
 * lease change, startup, periodic tick). Jobs execute steps; they never own the decision.
 */

import type { LifecycleState, PostCloneState } from '../contract/annotations.ts';
import type { Backend, GuestOS } from '../contract/vm.ts';
import { type FixupKind, type FixupNic, fixupKind, isStaticNic } from '../guest/postclone.ts';
import { guestProfile } from '../guest/profiles.ts';

/** IP-wait budget after a cloned boot (docs/contracts/lifecycle.md "IP wait"). */
export const IP_WAIT_BUDGET_MS = 45_000;
/** IP-wait lease poll interval (docs/contracts/lifecycle.md "IP wait"). */
export const IP_WAIT_POLL_MS = 200;
/** When the single Windows `ipconfig /renew` nudge is sent, into the wait (docs/contracts/lifecycle.md "IP wait"). */
export const WINDOWS_RENEW_NUDGE_AFTER_MS = 30_000;
/** Exec timeout of the renew nudge (docs/contracts/lifecycle.md "IP wait"). */
export const WINDOWS_RENEW_NUDGE_TIMEOUT_MS = 20_000;
/** `VK_READY_DEADLINE_SECONDS` default and lower bound (docs/contracts/lifecycle.md "Ready deadline"). */
export const DEFAULT_READY_DEADLINE_SECONDS = 600;
export const MIN_READY_DEADLINE_SECONDS = 480;
/** Default `VK_RECONCILE_INTERVAL_SECONDS` (docs/contracts/lifecycle.md "Owed steps"). */
export const DEFAULT_RECONCILE_INTERVAL_SECONDS = 15;

/** The VM bound to the pod (tracked VM record). */
export interface BoundVm {
  readonly id: string;
  readonly backend: Backend;
  /** In `network_configs` order; NIC 0 carries the VM's MAC and IP. */
  readonly nics: readonly FixupNic[];
}

/** The registered background job of the pod key, if any (docs/contracts/lifecycle.md "Single writer"). */
export interface InFlightJob {
  readonly uid: string;
  readonly vmId: string;
  /** Monotonic ms after which the job no longer blocks a decision (row 4). */
  readonly hardDeadline: number;
}

/** In-memory progress records (docs/contracts/lifecycle.md "Idempotency keyed by VM ID"). Ignored unless keyed by the bound VM's ID. */
export interface StepProgress {
  readonly vmId: string;
  /** A fixup succeeded for this VM ID. */
  readonly fixupSucceeded?: boolean;
  /** The SAC pass succeeded for this VM ID. */
  readonly sacDone?: boolean;
  /** When the IP wait started for this VM ID (monotonic ms). */
  readonly ipWaitStartedAt?: number;
}

/** Every observable fact the docs/contracts/lifecycle.md "Owed steps" table and the docs/contracts/lifecycle.md "Ready deadline" deadline read. */
export interface ReadinessFacts {
  /** The provider tracks the pod key (with this incarnation). */
  readonly tracked: boolean;
  /** `metadata.uid` of the tracked incarnation. */
  readonly uid: string;
  readonly vmName: string;
  readonly deleting: boolean;
  readonly managed: boolean;
  readonly os: GuestOS;
  readonly hibernateRequested: boolean;
  /** The tracked VM record; `undefined` when no VM is bound. */
  readonly vm: BoundVm | undefined;
  /** Lifecycle intent; `''` (a lost `creating` patch, or no intent) reads as `creating`. */
  readonly intent: LifecycleState | '';
  /** The intent record has not reached the apiserver (row 3 re-flush). */
  readonly intentUnflushed: boolean;
  readonly postCloneState: PostCloneState;
  /** `vm.cocoonstack.io/post-clone-errors`. */
  readonly postCloneErrors: string;
  /**
   * Event reason of a recorded post-clone failure (`PostCloneExecExhausted`,
   * `WindowsStaticIPFailed`), when this process saw it happen. Default `PostCloneExecExhausted`.
   */
  readonly postCloneFailureReason?: string;
  readonly job: InFlightJob | undefined;
  /** Clone, fork-from, clone-from-dir, wake/restore (docs/contracts/post-clone.md "When a fixup is owed"). */
  readonly clonedBoot: boolean;
  /** The boot is a CH+Windows restore: no PnP fixup, straight to the IP wait (docs/contracts/pod-to-vm.md "Restore"). */
  readonly chWindowsRestore: boolean;
  /** `wake` for wake/restore boots (IP-wait message and reason), else `create`. */
  readonly bootOp: 'create' | 'wake';
  readonly progress: StepProgress | undefined;
  /** Resolved IP (docs/contracts/lifecycle.md "IP resolution"); `''` when none. */
  readonly ip: string;
  /** Monotonic ms: later of "tracked with a VM bound" and "startup reconcile finished" (docs/contracts/lifecycle.md "The invariant"). */
  readonly t0: number;
  readonly readyDeadlineSeconds: number;
}

/** Why nothing is owed. */
export type NoneReason =
  | 'not_tracked'
  | 'deleting'
  | 'unmanaged'
  | 'unsupported_guest'
  | 'hibernate_requested'
  | 'no_vm'
  | 'terminal_intent'
  | 'job_in_flight';

/** Table row (1–11) that produced a step, or `deadline` (docs/contracts/lifecycle.md "Ready deadline"). */
export type OwedRow = 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 'deadline';

/** What the reconcile must do now. Every VM-related step carries the VM ID it was derived for. */
export type OwedStep =
  | { readonly kind: 'none'; readonly row: OwedRow; readonly reason: NoneReason }
  | { readonly kind: 'reflush'; readonly row: 3 }
  | {
      readonly kind: 'startFixup';
      readonly row: 6;
      readonly vmId: string;
      readonly fixupKind: FixupKind;
      readonly abortJob: boolean;
    }
  | { readonly kind: 'startSac'; readonly row: 7; readonly vmId: string; readonly abortJob: boolean }
  | {
      readonly kind: 'publishReady';
      readonly row: OwedRow;
      readonly vmId: string;
      /** Resolved IP; non-empty for every cloned boot. */
      readonly ip: string;
      /**
       * A registered job does not own this decision (another UID or VM ID, past its hard
       * deadline, or the ready deadline passed) and must be aborted first (docs/contracts/lifecycle.md "Cancellation", docs/contracts/lifecycle.md "Single writer").
       */
      readonly abortJob: boolean;
    }
  | {
      readonly kind: 'decideFailed';
      readonly row: OwedRow;
      readonly vmId: string;
      /** Warning event reason. */
      readonly reason: string;
      /** Lifecycle message (truncated to 4096 bytes when staged). */
      readonly message: string;
      readonly abortJob: boolean;
    }
  | {
      readonly kind: 'startIpWait' | 'ensureIpWait';
      readonly row: 11;
      readonly vmId: string;
      /** Record this as the IP-wait start when `startIpWait`. */
      readonly startedAt: number;
      /** `startedAt + 45 s`. */
      readonly deadline: number;
      /** Windows: when the single renew nudge is due; `undefined` otherwise. */
      readonly renewNudgeAt: number | undefined;
      readonly abortJob: boolean;
    };

/** The default lifecycle message of a `post-clone-state=failed` without recorded errors (row 5). */
export const POST_CLONE_FAILED_MESSAGE = 'post-clone setup failed';

/** `<clone|wake> <vmName>: dhcp lease not observed within 45s` (docs/contracts/lifecycle.md "IP wait"). */
export function ipWaitTimeoutMessage(bootOp: 'create' | 'wake', vmName: string): string {
  return `${bootOp === 'wake' ? 'wake' : 'clone'} ${vmName}: dhcp lease not observed within ${IP_WAIT_BUDGET_MS / 1000}s`;
}

/** `PostCloneIPWaitTimeout` (clone) or `WakeIPWaitTimeout` (wake) (docs/contracts/lifecycle.md "IP wait"). */
export function ipWaitTimeoutReason(bootOp: 'create' | 'wake'): string {
  return bootOp === 'wake' ? 'WakeIPWaitTimeout' : 'PostCloneIPWaitTimeout';
}

/** `creating <vmName>: no ready decision within <N>s` (docs/contracts/lifecycle.md "Ready deadline"). */
export function readyDeadlineMessage(vmName: string, seconds: number): string {
  return `creating ${vmName}: no ready decision within ${seconds}s`;
}

export const READY_DEADLINE_REASON = 'ReadyDeadlineExceeded';
export const POST_CLONE_EXHAUSTED_REASON = 'PostCloneExecExhausted';

/** SAC is owed for Windows VMs with at least one static NIC (docs/contracts/post-clone.md "Windows static IP"). */
export function sacOwed(os: GuestOS, nics: readonly FixupNic[]): boolean {
  return guestProfile(os).staticIpOverSerialConsole && nics.some(isStaticNic);
}

const TERMINAL_OR_HIBERNATING: readonly string[] = ['ready', 'hibernating', 'hibernated', 'failed'];

/**
 * Derives the owed step (docs/contracts/lifecycle.md "Owed steps", first match wins) with the ready deadline
 * (docs/contracts/lifecycle.md "Ready deadline") checked once the pod is known to be eligible and still `creating`:
 *
 * 1. not tracked, deleting, unmanaged, macOS, hibernate requested ⇒ none;
 * 2. no VM bound ⇒ none;
 * 3. intent `ready`/`hibernating`/`hibernated`/`failed` ⇒ re-flush if unflushed, else none;
 *    — deadline: at or after `t0 + N s`, rows 5–11 are evaluated without row 4; a terminal
 *      decision they yield (`publishReady`, `decideFailed`) is taken, anything else becomes
 *      `decideFailed` `ReadyDeadlineExceeded`; either way a registered job is aborted;
 * 4. a job for (UID, VM ID) in flight within its hard deadline ⇒ none;
 * 5. `post-clone-state=failed` ⇒ decide failed (message = `post-clone-errors` or
 *    `post-clone setup failed`);
 * 6. cloned boot, fixup needed (docs/contracts/post-clone.md "When a fixup is owed"), not a CH+Windows restore, marker absent or `running`,
 *    no fixup success for this VM ID ⇒ start the fixup;
 * 7. SAC owed (Windows, static NIC) and not done for this VM ID ⇒ start SAC;
 * 8. not a cloned boot ⇒ publish ready (run mode does not wait for an IP);
 * 9. IP resolved ⇒ publish ready;
 * 10. IP-wait start recorded more than 45 s ago ⇒ decide failed (docs/contracts/lifecycle.md "IP wait" timeout);
 * 11. otherwise ⇒ record the IP-wait start if absent and ensure the IP-wait job runs.
 *
 * Progress records of another VM ID are ignored (docs/contracts/lifecycle.md "Idempotency keyed by VM ID"): a replaced VM starts clean.
 */
export function deriveOwedStep(facts: ReadinessFacts, now: number): OwedStep {
  if (!facts.tracked) return { kind: 'none', row: 1, reason: 'not_tracked' };
  if (facts.deleting) return { kind: 'none', row: 1, reason: 'deleting' };
  if (!facts.managed) return { kind: 'none', row: 1, reason: 'unmanaged' };
  if (!guestProfile(facts.os).supported.ok) return { kind: 'none', row: 1, reason: 'unsupported_guest' };
  if (facts.hibernateRequested) return { kind: 'none', row: 1, reason: 'hibernate_requested' };

  const vm = facts.vm;
  if (vm === undefined) return { kind: 'none', row: 2, reason: 'no_vm' };

  if (TERMINAL_OR_HIBERNATING.includes(facts.intent)) {
    return facts.intentUnflushed
      ? { kind: 'reflush', row: 3 }
      : { kind: 'none', row: 3, reason: 'terminal_intent' };
  }

  if (now >= facts.t0 + facts.readyDeadlineSeconds * 1000) {
    const step = deriveCreatingStep(facts, vm, now);
    if (step.kind === 'publishReady' || step.kind === 'decideFailed') return step;
    return {
      kind: 'decideFailed',
      row: 'deadline',
      vmId: vm.id,
      reason: READY_DEADLINE_REASON,
      message: readyDeadlineMessage(facts.vmName, facts.readyDeadlineSeconds),
      abortJob: facts.job !== undefined,
    };
  }

  const job = facts.job;
  if (job !== undefined && job.uid === facts.uid && job.vmId === vm.id && now <= job.hardDeadline) {
    return { kind: 'none', row: 4, reason: 'job_in_flight' };
  }
  return deriveCreatingStep(facts, vm, now);
}

/**
 * Rows 5–11 for an eligible pod still `creating` with a VM bound. Reaching them with a job
 * registered means that job does not own the decision (row 4 did not match, or the deadline
 * passed), so every step asks for it to be aborted.
 */
function deriveCreatingStep(facts: ReadinessFacts, vm: BoundVm, now: number): OwedStep {
  const progress = facts.progress?.vmId === vm.id ? facts.progress : undefined;
  const abortJob = facts.job !== undefined;

  if (facts.postCloneState === 'failed') {
    return {
      kind: 'decideFailed',
      row: 5,
      vmId: vm.id,
      reason: facts.postCloneFailureReason ?? POST_CLONE_EXHAUSTED_REASON,
      message: facts.postCloneErrors !== '' ? facts.postCloneErrors : POST_CLONE_FAILED_MESSAGE,
      abortJob,
    };
  }

  const kind = fixupKind({ clonedBoot: facts.clonedBoot, os: facts.os, backend: vm.backend, nics: vm.nics });
  if (
    kind !== undefined &&
    !facts.chWindowsRestore &&
    (facts.postCloneState === '' || facts.postCloneState === 'running') &&
    progress?.fixupSucceeded !== true
  ) {
    return { kind: 'startFixup', row: 6, vmId: vm.id, fixupKind: kind, abortJob };
  }

  if (sacOwed(facts.os, vm.nics) && progress?.sacDone !== true) {
    return { kind: 'startSac', row: 7, vmId: vm.id, abortJob };
  }

  if (!facts.clonedBoot) return { kind: 'publishReady', row: 8, vmId: vm.id, ip: facts.ip, abortJob };
  if (facts.ip !== '') return { kind: 'publishReady', row: 9, vmId: vm.id, ip: facts.ip, abortJob };

  const startedAt = progress?.ipWaitStartedAt;
  if (startedAt !== undefined && now - startedAt > IP_WAIT_BUDGET_MS) {
    return {
      kind: 'decideFailed',
      row: 10,
      vmId: vm.id,
      reason: ipWaitTimeoutReason(facts.bootOp),
      message: ipWaitTimeoutMessage(facts.bootOp, facts.vmName),
      abortJob,
    };
  }

  const start = startedAt ?? now;
  return {
    kind: startedAt === undefined ? 'startIpWait' : 'ensureIpWait',
    row: 11,
    vmId: vm.id,
    startedAt: start,
    deadline: start + IP_WAIT_BUDGET_MS,
    renewNudgeAt: guestProfile(facts.os).renewNudge ? start + WINDOWS_RENEW_NUDGE_AFTER_MS : undefined,
    abortJob,
  };
}
