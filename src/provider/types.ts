// The narrow interface between the virtual-kubelet framework half (node, pod controller,
// kubelet API) and the VM provider, after virtual-kubelet's PodLifecycleHandler split.
// The framework owns Kubernetes plumbing; the provider owns VMs and the lifecycle contract.
import type { Readable } from 'node:stream';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import type { ExecOutcome, ExecStreams } from '../kubelet/streams/exec-session.ts';

/** Thrown by a provider when it does not know the pod (the framework maps it to 404). */
export class NotFoundError extends Error {
  override name = 'NotFoundError';
}

/** Thrown for invalid input from a client (the kubelet API maps it to 400). */
export class InvalidInputError extends Error {
  override name = 'InvalidInputError';
}

export interface LogOptions {
  tailLines?: number;
  limitBytes?: number;
  follow: boolean;
  timestamps: boolean;
  previous: boolean;
  sinceSeconds?: number;
  sinceTime?: Date;
}

export interface PodProvider {
  /** Creates the VM for a pod. Idempotent for a pod whose VM already exists. */
  createPod(pod: V1Pod): Promise<void>;
  /** Handles any change of a tracked pod. Cheap; never cancels work in flight. */
  updatePod(pod: V1Pod): Promise<void>;
  /** Removes the pod's VM. Throws NotFoundError when the provider does not know the pod. */
  deletePod(pod: V1Pod): Promise<void>;
  /** The provider's copy of the pod (with provider-written annotations), if tracked. */
  getPod(namespace: string, name: string): V1Pod | undefined;
  /** Current status of a tracked pod. */
  getPodStatus(namespace: string, name: string): V1PodStatus | undefined;
  /** Every pod the provider tracks (this node only). */
  getPods(): V1Pod[];
  /** Registers the callback through which the provider publishes status changes. */
  notifyPods(cb: (pod: V1Pod) => void): void;
}

export interface ContainerApiProvider {
  getContainerLogs(
    namespace: string,
    pod: string,
    container: string,
    opts: LogOptions,
    signal: AbortSignal,
  ): Promise<Readable>;
  runInContainer(
    namespace: string,
    pod: string,
    container: string,
    cmd: string[],
    streams: ExecStreams,
  ): Promise<ExecOutcome>;
}

/** Host facts the node object needs; the provider reports runtime health. */
export interface NodeHealth {
  /** Resolves when the runtime answers (cocoon `vm list` within 10 s); rejects otherwise. */
  ping(signal: AbortSignal): Promise<void>;
}

export type Provider = PodProvider & ContainerApiProvider & NodeHealth;
