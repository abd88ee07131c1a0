// Pod admission (docs/contracts/pod-to-vm.md, "Admission"): the kubelet's resource check at
// CreatePod, done on the size of the VMs rather than on container requests, because a VM
// takes the memory and vCPUs it was booted (or saved) with whatever the pod spec asks. Pure:
// the provider gathers the facts (src/provider/cocoon/admit.ts) and publishes the verdict.
//
// What counts, per tracked pod:
// - terminal pods (deleted, evicted, rejected) and pods being deleted: nothing;
// - a pod holding a VM: one pod and the VM's size (its record's cpu/memory; the estimate
//   below when cocoon does not print them);
// - a pod with no VM yet whose bring-up is owed (creating, a transient retry, a wake): one pod
//   and the estimate of the VM it will get;
// - a pod with no VM and none owed (hibernated, a failed create): one pod, no cpu or memory.
//   A hibernated pod keeps its pod object and its name on the node like any pod the kubelet
//   admitted, but its VM is gone: the memory and vCPUs are free for others until it wakes.
//   (A wake is not re-admitted: the pod was admitted once, as the kubelet admits a pod once.)
import { cpuPolicy } from '../vmspec/cpu-policy.ts';
import { runMemoryBytes, type VMSpec } from '../vmspec/decode.ts';

/** The size of one VM: millicores and bytes. */
export interface Footprint {
  readonly cpuMilli: bigint;
  readonly memoryBytes: bigint;
}

export interface Usage extends Footprint {
  readonly pods: number;
}

/** What the node offers to pods (the node object's allocatable; undefined = not checked). */
export interface Allocatable {
  readonly pods: number;
  readonly cpuMilli: bigint | undefined;
  readonly memoryBytes: bigint | undefined;
}

/** Where a tracked pod stands for admission (see the header). */
export interface PodFacts {
  readonly state: 'gone' | 'vm' | 'owed' | 'idle';
  /** The bound VM's size from its record, when cocoon printed it. */
  readonly vmSize: Footprint | undefined;
  /** The size its VM has or will have (vmEstimate). */
  readonly estimate: Footprint;
}

export type AdmissionReason = 'OutOfpods' | 'OutOfcpu' | 'OutOfmemory';

export type Admission =
  | { readonly ok: true }
  | { readonly ok: false; readonly reason: AdmissionReason; readonly message: string };

const ZERO: Footprint = { cpuMilli: 0n, memoryBytes: 0n };

/** The size a pod's VM will have:
 * - run mode (no clone source): `--cpu` whole cores (ceil of limit, else request) and
 *   `--memory` (request, else limit), the flags the VM is booted with;
 * - a clone: the clone source's saved size when known (`source`), else the pod's container
 *   requests (the best the pod tells before the source is on the node). */
export function vmEstimate(
  spec: Pick<
    VMSpec,
    | 'mode'
    | 'forkFrom'
    | 'cloneFromDir'
    | 'cpuRequestMilli'
    | 'cpuLimitMilli'
    | 'memoryRequestBytes'
    | 'memoryLimitBytes'
  >,
  source: Footprint | undefined,
): Footprint {
  if (spec.mode === 'run' && spec.forkFrom === '' && spec.cloneFromDir === '') {
    const cpus = cpuPolicy(spec.cpuRequestMilli, spec.cpuLimitMilli).cpus;
    return { cpuMilli: (cpus ?? 0n) * 1000n, memoryBytes: runMemoryBytes(spec) ?? 0n };
  }
  if (source) return source;
  return { cpuMilli: spec.cpuRequestMilli ?? 0n, memoryBytes: spec.memoryRequestBytes ?? 0n };
}

/** A size from a cocoon record (vCPUs, bytes); undefined unless both are known. */
export function recordFootprint(
  cpus: number | undefined,
  memoryBytes: number | undefined,
): Footprint | undefined {
  if (cpus === undefined || memoryBytes === undefined) return undefined;
  return { cpuMilli: BigInt(Math.ceil(cpus * 1000)), memoryBytes: BigInt(Math.ceil(memoryBytes)) };
}

/** What one tracked pod takes from the node. */
export function counted(f: PodFacts): Usage {
  switch (f.state) {
    case 'gone':
      return { pods: 0, ...ZERO };
    case 'idle':
      return { pods: 1, ...ZERO };
    case 'vm':
      return { pods: 1, ...(f.vmSize ?? f.estimate) };
    default:
      return { pods: 1, ...f.estimate };
  }
}

/** The sum over the node's tracked pods. */
export function usage(pods: Iterable<PodFacts>): Usage {
  // Sums in locals: every CreatePod sums over every tracked pod, so a burst of N pods runs this
  // N² times, and a new total object per pod was most of what it allocated.
  let n = 0;
  let cpuMilli = 0n;
  let memoryBytes = 0n;
  for (const f of pods) {
    const c = counted(f);
    n += c.pods;
    cpuMilli += c.cpuMilli;
    memoryBytes += c.memoryBytes;
  }
  return { pods: n, cpuMilli, memoryBytes };
}

/** The kubelet's message for an insufficient resource (pkg/scheduler noderesources
 * InsufficientResourceError, as the kubelet's admission reports it). */
export function insufficientMessage(
  resource: string,
  requested: bigint,
  used: bigint,
  capacity: bigint,
): string {
  return `Node didn't have enough resource: ${resource}, requested: ${requested}, used: ${used}, capacity: ${capacity}`;
}

/** Does a new pod of size `request` fit? Checked in the kubelet's order (pods, cpu, memory);
 * the first shortfall is the verdict. A zero request never fails its resource (as in the
 * kubelet: a BestEffort pod is only bounded by the pod count). */
export function admit(request: Footprint, used: Usage, alloc: Allocatable): Admission {
  if (used.pods + 1 > alloc.pods) {
    return {
      ok: false,
      reason: 'OutOfpods',
      message: insufficientMessage('pods', 1n, BigInt(used.pods), BigInt(alloc.pods)),
    };
  }
  if (
    alloc.cpuMilli !== undefined &&
    request.cpuMilli > 0n &&
    request.cpuMilli > alloc.cpuMilli - used.cpuMilli
  ) {
    return {
      ok: false,
      reason: 'OutOfcpu',
      message: insufficientMessage('cpu', request.cpuMilli, used.cpuMilli, alloc.cpuMilli),
    };
  }
  if (
    alloc.memoryBytes !== undefined &&
    request.memoryBytes > 0n &&
    request.memoryBytes > alloc.memoryBytes - used.memoryBytes
  ) {
    return {
      ok: false,
      reason: 'OutOfmemory',
      message: insufficientMessage('memory', request.memoryBytes, used.memoryBytes, alloc.memoryBytes),
    };
  }
  return { ok: true };
}

/** The status the kubelet writes for a pod it rejects (kubelet `rejectPod`): phase `Failed`,
 * the reason, `Pod was rejected: <message>`; the pod never ran, so no container state. */
export function rejectedStatus(reason: string, message: string, hostIP: string, now: Date) {
  return {
    phase: 'Failed' as const,
    reason,
    message: `Pod was rejected: ${message}`,
    ...(hostIP !== '' ? { hostIP } : {}),
    conditions: [{ type: 'PodScheduled', status: 'True', lastTransitionTime: now }],
  };
}
