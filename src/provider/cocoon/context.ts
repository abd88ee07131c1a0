// The provider's context: its dependencies and the shared tables every operation works on
// (tracked records, per-pod queue, orphan index, probes, retry timers), plus the read-only
// helpers all of them use. The write paths live in publication/; records change only
// through the mutators of state.ts.
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../cocoon/records.ts';
import type { CocoonCli } from '../../cocoon/runner.ts';
import type { Config } from '../../config/env.ts';
import { GENERATION, parseGeneration } from '../../contract/annotations.ts';
import type { Kube } from '../../kube/client.ts';
import type { EventSink } from '../../kube/events.ts';
import type { Logger } from '../../log.ts';
import type { LeaseFile } from '../../net/leases.ts';
import type { PodStatusSink } from '../../pods/ports.ts';
import type { KeyedQueue } from '../../util/keyed-queue.ts';
import { decodeVMSpec } from '../../vmspec/decode.ts';
import type { LifecycleMetrics } from './metrics.ts';
import type { ProbeAgent } from './probe-agent.ts';
import type { PodRecord } from './state.ts';

/** Pulls a clone-source snapshot from the registry into its local name (docs/registry.md "Pull flow"),
 * de-duplicated per local name; `src/registry/pull.ts` implements it. */
export interface SnapshotPuller {
  ensure(image: string, opts: { log?: Logger }): Promise<unknown>;
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
}

export interface ProviderContext extends ProviderDeps {
  pods: Map<string, PodRecord>;
  queue: KeyedQueue;
  /** Enqueues a readiness reconcile for the key (never runs it inline). */
  reconcileSoon: (key: string) => void;
  /** Starts (or restarts) the probe of a pod with a VM (`ready`: from a ready probe). */
  startProbe: (rec: PodRecord, opts?: { ready?: boolean }) => void;
  /** Starts a new bring-up of a record whose transient create failure is due for a retry. */
  retryCreate: (rec: PodRecord) => void;
  /** When startup reconcile finished (t0 lower bound of the ready deadline), monotonic ms. */
  startupDoneAt: number;
  /** VMs no pod holds, by VM name, for adoption by the next CreatePod with that name. */
  orphansByName: Map<string, VmRecord>;
  probes: Map<string, ProbeAgent>;
  /** Automatic retries of transient create failures, by pod key. */
  retryTimers: Map<string, NodeJS.Timeout>;
}

export function generationOf(pod: V1Pod): bigint {
  return parseGeneration(pod.metadata?.annotations?.[GENERATION]);
}

export function logFor(ctx: ProviderContext, rec: PodRecord): Logger {
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
export function isCurrent(ctx: ProviderContext, rec: PodRecord): boolean {
  return ctx.pods.get(rec.key) === rec && !rec.deleting;
}
