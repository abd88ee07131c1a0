// The ports the pod controller owns (after virtual-kubelet's node/ package): what a
// provider implements to run pods (PodLifecycleHandler) and what the framework hands the
// provider at construction to publish statuses (PodStatusSink). Nothing here imports a
// provider; providers import this.
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';

/** Thrown by a provider when it does not know the pod (the framework maps it to 404). */
export class NotFoundError extends Error {
  override name = 'NotFoundError';
}

/** Thrown for invalid input from a client (the kubelet API maps it to 400). */
export class InvalidInputError extends Error {
  override name = 'InvalidInputError';
}

/** What the pod controller calls; one call per pod at a time, never cancelled. */
export interface PodLifecycleHandler {
  /** Creates the pod's workload. Idempotent for a pod that already has one. */
  createPod(pod: V1Pod): Promise<void>;
  /** Handles any change of a tracked pod. Cheap; never cancels work in flight. */
  updatePod(pod: V1Pod): Promise<void>;
  /** Removes the pod's workload. Throws NotFoundError when the provider does not know the pod. */
  deletePod(pod: V1Pod): Promise<void>;
  /** The provider's copy of the pod (with provider-written annotations), if tracked. */
  getPod(namespace: string, name: string): V1Pod | undefined;
  /** Current status of a tracked pod. */
  getPodStatus(namespace: string, name: string): V1PodStatus | undefined;
  /** Every pod the provider tracks (this node only). */
  getPods(): V1Pod[];
}

/** Options of {@link PodStatusSink.writeNow}. */
export interface StatusWriteOptions {
  /** Annotation changes that land in the same patch as the status (`null` removes a key):
   * one atomic write, so no version of the pod shows one without the other. */
  annotations?: Readonly<Record<string, string | null>>;
  /** `high` (default) goes ahead of waiting normal-priority writes. */
  priority?: 'high' | 'normal';
}

/** How a provider publishes pod statuses; given to it at construction. */
export interface PodStatusSink {
  /** A newer status (asynchronous, de-duplicated, retried; kept until the pod is known). */
  notify(pod: V1Pod): void;
  /** Writes the status now (with `annotations` in the same UID-fenced patch), bounded and
   * retried; resolves with the pod's new resourceVersion. 404/409/422 reject at once. */
  writeNow(pod: V1Pod, opts?: StatusWriteOptions): Promise<string | undefined>;
}
