/**
 * Pod status computation (docs/contracts/lifecycle.md "Pod status fields"): phase, the four conditions,
 * `podIP`/`podIPs`, `hostIP`, `startTime` and the single `agent` container status. The result
 * is a plain object assignable to `V1PodStatus` (dates are `Date`s, arrays are mutable types).
 */
import type { LifecycleState } from '../contract/annotations.ts';
import { podReady } from './probe.ts';

/** The single container every VM pod reports. */
export const AGENT_CONTAINER = 'agent';

export type PodPhase = 'Pending' | 'Running' | 'Succeeded' | 'Failed';
export type ConditionType = 'Initialized' | 'Ready' | 'ContainersReady' | 'PodScheduled';

export interface PodCondition {
  readonly type: ConditionType;
  readonly status: 'True' | 'False';
  readonly lastTransitionTime: Date;
}

export interface ContainerState {
  readonly running?: { readonly startedAt?: Date };
  readonly terminated?: {
    readonly exitCode: number;
    readonly reason?: string;
    readonly message?: string;
    readonly startedAt?: Date;
    readonly finishedAt?: Date;
  };
  readonly waiting?: { readonly reason?: string; readonly message?: string };
}

export interface ContainerStatus {
  readonly name: string;
  readonly image: string;
  readonly imageID: string;
  readonly ready: boolean;
  readonly restartCount: number;
  readonly started?: boolean;
  readonly state: ContainerState;
}

export interface PodStatus {
  readonly phase: PodPhase;
  readonly conditions: PodCondition[];
  readonly hostIP?: string;
  readonly podIP?: string;
  readonly podIPs?: { readonly ip: string }[];
  readonly startTime?: Date;
  readonly containerStatuses: ContainerStatus[];
}

/** How the pod ended, when it did. */
export type PodTermination =
  /** The VM died and the pod is evicted: `Failed`, `agent` terminated with exit code 1. */
  | { readonly kind: 'evicted'; readonly reason: string; readonly message: string }
  /** DeletePod completed: `Succeeded`, `agent` terminated with exit code 0. */
  | { readonly kind: 'deleted' };

export interface PodStatusInput {
  /** The tracked VM with its resolved IP (docs/contracts/lifecycle.md "IP resolution"; `''` when none); `undefined` when no VM is tracked. */
  readonly vm: { readonly ip: string } | undefined;
  /** Lifecycle intent; during ready publication (R8) pass the staged, unflushed `ready`. */
  readonly lifecycle: LifecycleState | '';
  readonly probeReady: boolean;
  /** Node InternalIP. */
  readonly hostIP: string;
  /** Set when the VM was bound (docs/contracts/pod-to-vm.md "Binding" step 12) and kept afterwards. */
  readonly startTime: Date | undefined;
  /** The container image from the pod spec. */
  readonly image: string;
  readonly termination?: PodTermination;
  /** Without a VM: report `waiting` with this reason (e.g. `ContainerCreating`) instead of no state. */
  readonly waitingReason?: string;
  /** The last computed status: unchanged conditions keep their transition times. */
  readonly previous?: PodStatus;
  readonly now: Date;
}

function condition(
  type: ConditionType,
  value: boolean,
  previous: PodStatus | undefined,
  now: Date,
): PodCondition {
  const status = value ? 'True' : 'False';
  const before = previous?.conditions.find((c) => c.type === type);
  return { type, status, lastTransitionTime: before?.status === status ? before.lastTransitionTime : now };
}

/**
 * Computes the pod status (docs/contracts/lifecycle.md "Pod status fields"):
 *
 * - terminated by eviction ⇒ `Failed`, `agent` terminated (exit code 1, reason, message);
 *   by deletion ⇒ `Succeeded`, `agent` terminated (exit code 0, reason `Completed`);
 * - no tracked VM ⇒ `Pending`, no podIP, start time kept, no container state (or `waiting`
 *   with `waitingReason`), `Initialized=False`;
 * - tracked VM ⇒ `Running`, podIP = resolved IP when non-empty, `Initialized=True`, `agent`
 *   running; `Ready` = `ContainersReady` = agent `ready` = probe ready ∧ lifecycle `ready`.
 *
 * `PodScheduled` is always `True` (the pod is bound to this node).
 */
export function computePodStatus(input: PodStatusInput): PodStatus {
  const { previous, now } = input;
  const terminated = input.termination !== undefined;
  const running = !terminated && input.vm !== undefined;
  const ready = running && podReady(input.probeReady, input.lifecycle);
  const initialized = terminated || running;

  let phase: PodPhase = 'Pending';
  let state: ContainerState = {};
  if (input.termination !== undefined) {
    const evicted = input.termination.kind === 'evicted';
    phase = evicted ? 'Failed' : 'Succeeded';
    const finishedAt = previous?.containerStatuses[0]?.state.terminated?.finishedAt ?? now;
    state = {
      terminated: {
        exitCode: evicted ? 1 : 0,
        reason: input.termination.kind === 'evicted' ? input.termination.reason : 'Completed',
        ...(input.termination.kind === 'evicted' ? { message: input.termination.message } : {}),
        ...(input.startTime !== undefined ? { startedAt: input.startTime } : {}),
        finishedAt,
      },
    };
  } else if (running) {
    phase = 'Running';
    state = { running: input.startTime !== undefined ? { startedAt: input.startTime } : {} };
  } else if (input.waitingReason !== undefined) {
    state = { waiting: { reason: input.waitingReason } };
  }

  const ip = running ? (input.vm?.ip ?? '') : '';
  return {
    phase,
    conditions: [
      condition('Initialized', initialized, previous, now),
      condition('Ready', ready, previous, now),
      condition('ContainersReady', ready, previous, now),
      condition('PodScheduled', true, previous, now),
    ],
    ...(input.hostIP !== '' ? { hostIP: input.hostIP } : {}),
    ...(ip !== '' ? { podIP: ip, podIPs: [{ ip }] } : {}),
    ...(input.startTime !== undefined ? { startTime: input.startTime } : {}),
    containerStatuses: [
      {
        name: AGENT_CONTAINER,
        image: input.image,
        imageID: '',
        ready,
        restartCount: 0,
        ...(running ? { started: true } : {}),
        state,
      },
    ],
  };
}

/** A time of an API object: a `Date`, or the RFC 3339 string of the wire format. */
type ApiTime = Date | string | null | undefined;

/** The fields of a pod status as the API holds it that {@link statusFromApi} reads. */
export interface ApiPodStatus {
  readonly phase?: string;
  readonly conditions?: readonly {
    readonly type: string;
    readonly status: string;
    readonly lastTransitionTime?: ApiTime;
  }[];
  readonly hostIP?: string;
  readonly podIP?: string;
  readonly podIPs?: readonly { readonly ip?: string }[];
  readonly startTime?: ApiTime;
  readonly containerStatuses?: readonly {
    readonly name: string;
    readonly image?: string;
    readonly imageID?: string;
    readonly ready?: boolean;
    readonly restartCount?: number;
    readonly started?: boolean;
    readonly state?: {
      readonly running?: { readonly startedAt?: ApiTime } | null;
      readonly terminated?: {
        readonly exitCode?: number;
        readonly reason?: string;
        readonly message?: string;
        readonly startedAt?: ApiTime;
        readonly finishedAt?: ApiTime;
      } | null;
      readonly waiting?: { readonly reason?: string; readonly message?: string } | null;
    };
  }[];
}

function apiTime(t: ApiTime): Date | undefined {
  if (t === null || t === undefined) return undefined;
  const d = t instanceof Date ? t : new Date(t);
  return Number.isNaN(d.getTime()) ? undefined : d;
}

const CONDITION_TYPES: readonly ConditionType[] = ['Initialized', 'Ready', 'ContainersReady', 'PodScheduled'];
const PHASES: readonly PodPhase[] = ['Pending', 'Running', 'Succeeded', 'Failed'];

/**
 * The pod status the API holds, as a {@link PodStatus} to pass as `previous` (the status a
 * restarted process starts from, docs/contracts/lifecycle.md R7): conditions whose status
 * does not change keep the lastTransitionTime already published, so re-publishing a pod
 * whose status is right changes nothing. Conditions of other types and fields this module
 * does not compute are left out; `undefined` without a phase.
 */
export function statusFromApi(api: ApiPodStatus | undefined): PodStatus | undefined {
  const phase = PHASES.find((p) => p === api?.phase);
  if (!api || !phase) return undefined;
  const conditions: PodCondition[] = [];
  for (const c of api.conditions ?? []) {
    const type = CONDITION_TYPES.find((t) => t === c.type);
    const at = apiTime(c.lastTransitionTime);
    if (type && at && (c.status === 'True' || c.status === 'False'))
      conditions.push({ type, status: c.status, lastTransitionTime: at });
  }
  const startTime = apiTime(api.startTime);
  const containerStatuses: ContainerStatus[] = (api.containerStatuses ?? []).map((cs) => {
    const s = cs.state ?? {};
    const state: ContainerState = s.terminated
      ? {
          terminated: {
            exitCode: s.terminated.exitCode ?? 0,
            reason: s.terminated.reason,
            message: s.terminated.message,
            startedAt: apiTime(s.terminated.startedAt),
            finishedAt: apiTime(s.terminated.finishedAt),
          },
        }
      : s.running
        ? { running: { startedAt: apiTime(s.running.startedAt) } }
        : s.waiting
          ? { waiting: { reason: s.waiting.reason, message: s.waiting.message } }
          : {};
    return {
      name: cs.name,
      image: cs.image ?? '',
      imageID: cs.imageID ?? '',
      ready: cs.ready ?? false,
      restartCount: cs.restartCount ?? 0,
      ...(cs.started !== undefined ? { started: cs.started } : {}),
      state,
    };
  });
  const podIPs = (api.podIPs ?? []).flatMap((p) => (p.ip ? [{ ip: p.ip }] : []));
  return {
    phase,
    conditions,
    ...(api.hostIP ? { hostIP: api.hostIP } : {}),
    ...(api.podIP ? { podIP: api.podIP } : {}),
    ...(podIPs.length > 0 ? { podIPs } : {}),
    ...(startTime ? { startTime } : {}),
    containerStatuses,
  };
}

/** When the VM of a pod started, as the API shows it: `startTime`, else the container's
 * `running.startedAt` (kept across restarts: the same VM has the same start). */
export function startTimeFromApi(api: ApiPodStatus | undefined): Date | undefined {
  return apiTime(api?.startTime) ?? apiTime(api?.containerStatuses?.[0]?.state?.running?.startedAt);
}
