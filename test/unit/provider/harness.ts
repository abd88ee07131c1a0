// An in-process cocoon provider for unit tests: the real CocoonProvider wired to a fake
// Kubernetes client (test/unit/fakes/kube.ts), a fake cocoon runner
// (test/unit/fakes/cocoon.ts), a real lease file in a temp directory, and recording event,
// status and notification sinks. No apiserver, no simulator processes.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { Ledger } from '../../../src/authority/ledger.ts';
import { ownerOf } from '../../../src/authority/owner.ts';
import { loadConfig } from '../../../src/config/env.ts';
import { EventRecorder, type EventSink } from '../../../src/kube/events.ts';
import { CONTENT_TYPE_MERGE_PATCH } from '../../../src/kube/rest.ts';
import type { Allocatable } from '../../../src/lifecycle/admission.ts';
import { silentLogger } from '../../../src/log.ts';
import { LeaseFile } from '../../../src/net/leases.ts';
import type { PodStatusSink, StatusWriteOptions } from '../../../src/pods/ports.ts';
import { PodStatusWriter } from '../../../src/pods/status-writer.ts';
import type { PeerRestorer, SnapshotPuller, SnapshotStore } from '../../../src/provider/cocoon/context.ts';
import { type LifecycleMetrics, noMetrics } from '../../../src/provider/cocoon/metrics.ts';
import { CocoonProvider } from '../../../src/provider/cocoon/provider.ts';
import { FakeCocoon } from '../fakes/cocoon.ts';
import { type FakeCall, fakeKube } from '../fakes/kube.ts';

export interface RecordedEvent {
  pod: string;
  type: string;
  reason: string;
  message: string;
}

/** One write the provider made to a pod that the apiserver accepted: an annotation patch,
 * or a status write (`writeNow`, with the annotations it carried). Asynchronous status
 * notifications are in `statuses` only, unless the harness runs the real status writer
 * (option `realStatusWriter`): then every pods/status patch it made is a `status` write. */
export interface PodWrite {
  kind: 'annotations' | 'status';
  annotations: Record<string, string | null> | undefined;
  status: V1PodStatus | undefined;
  at: number;
}

export interface Harness {
  provider: CocoonProvider;
  ledger: Ledger;
  /** Records in the ledger that the daemon wrote snapshot `name` for `pod`'s identity (as a
   * hibernate or a delete-time save would have). */
  own(name: string, pod?: V1Pod): Promise<void>;
  cocoon: FakeCocoon;
  kube: ReturnType<typeof fakeKube>;
  /** The real event recorder (option `recorder`). */
  recorder: EventRecorder | undefined;
  /** The real status writer (option `realStatusWriter`), writing to the fake client; call
   * `start(live)` with the pods' API copies to let it write. */
  statusWriter: PodStatusWriter | undefined;
  events: RecordedEvent[];
  /** Every status the provider handed to its status sink (notify and writeNow), in order. */
  statuses: V1Pod[];
  leasesPath: string;
  /** Writes a lease for a MAC (cocoon-net's file format). */
  lease(mac: string, ip: string): void;
  /** Annotation changes the provider wrote for a pod, oldest first: annotation patches and
   * the annotations carried by status writes. */
  patches(name: string): Record<string, string | null>[];
  /** Every accepted write of the provider to a pod, oldest first. */
  writes(name: string): PodWrite[];
  close(): void;
}

export function harness(
  opts: {
    env?: Record<string, string>;
    puller?: SnapshotPuller;
    /** Replaces the sink's writeNow (throw to fail the write). */
    statusWriter?: (pod: V1Pod, opts: StatusWriteOptions) => Promise<void>;
    /** Also hand every event to a real EventRecorder writing to the fake Kubernetes client
     * (`h.recorder`), to observe the Event API writes. */
    recorder?: boolean;
    /** Give the provider the framework's real PodStatusWriter on the fake client (the
     * de-duplication against the API copy, pending until `start`) instead of recording
     * sinks. */
    realStatusWriter?: boolean;
    /** The registry side of hibernate and wake (unset: no registry configured). */
    store?: (cocoon: FakeCocoon) => SnapshotStore;
    /** The peer restore of wakes (unset: none). */
    peer?: (cocoon: FakeCocoon) => PeerRestorer;
    /** The provider's metrics (default: none recorded). */
    metrics?: LifecycleMetrics;
    /** The node's allocatable for admission (unset: only VK_NODE_PODS is checked). */
    allocatable?: Allocatable;
    /** The ICMP echo of probes without a probe port (unset: a host without ICMP, where a
     * resolved IP counts as reachable). */
    icmp?: (ip: string, withinMs?: number) => Promise<boolean>;
    /** The provenance ledger (default: a fresh in-memory one, a first start). Pass the ledger of
     * a previous harness to model a restart that keeps its ledger file. */
    ledger?: Ledger;
  } = {},
): Harness {
  const dir = mkdtempSync(join(tmpdir(), 'vk-unit-'));
  const leasesPath = join(dir, 'leases.json');
  const leases: Record<string, { ip: string; expiry: string }> = {};
  const cocoon = new FakeCocoon();
  const kube = fakeKube();
  const events: RecordedEvent[] = [];
  const statuses: V1Pod[] = [];
  const statusWrites: { name: string; write: PodWrite }[] = [];
  const recorder = opts.recorder ? new EventRecorder(kube.kube, 'node', silentLogger) : undefined;
  const sink: EventSink = {
    event: (pod, type, reason, message) => {
      events.push({ pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, type, reason, message });
      recorder?.event(pod, type, reason, message);
    },
  };
  const lifetime = new AbortController();
  let rv = 100_000;
  const config = loadConfig({ VK_NODE_IP: '127.0.0.1', VK_LEASES_PATH: leasesPath, ...opts.env });
  const statusWriter = opts.realStatusWriter
    ? new PodStatusWriter({ kube: kube.kube, log: silentLogger })
    : undefined;
  const realSink: PodStatusSink | undefined = statusWriter && {
    notify: (pod) => {
      statuses.push(pod);
      statusWriter.notify(pod);
    },
    writeNow: (pod, o) => {
      statuses.push(pod);
      return statusWriter.writeNow(pod, o);
    },
  };
  const ledger = opts.ledger ?? Ledger.memory('node', silentLogger);
  const provider = new CocoonProvider({
    icmp: opts.icmp,
    ledger,
    status: realSink ?? {
      notify: (pod) => void statuses.push(pod),
      writeNow: async (pod, o = {}) => {
        if (opts.statusWriter) await opts.statusWriter(pod, o);
        statuses.push(pod);
        statusWrites.push({
          name: pod.metadata?.name ?? '',
          write: {
            kind: 'status',
            annotations: o.annotations ? { ...o.annotations } : undefined,
            status: pod.status,
            at: performance.now(),
          },
        });
        return String(++rv);
      },
    },
    config,
    kube: kube.kube,
    cli: cocoon.cli,
    events: sink,
    metrics: opts.metrics ?? noMetrics,
    leases: new LeaseFile(leasesPath),
    log: silentLogger,
    nodeIP: '127.0.0.1',
    lifetime: lifetime.signal,
    puller: opts.puller,
    store: opts.store?.(cocoon),
    peer: opts.peer?.(cocoon),
    allocatable: opts.allocatable,
  });
  return {
    ledger,
    own: async (name, pod) => {
      const vmName = pod?.metadata?.annotations?.['vm.cocoonstack.io/name'] ?? name;
      const owner = pod ? ownerOf(pod, vmName) : { namespace: 'ns', vmName, controllerUid: '' };
      const ref = {
        key: `${pod?.metadata?.namespace}/${pod?.metadata?.name}`,
        uid: pod?.metadata?.uid ?? '',
      };
      await ledger.intend('snapshot', name, owner, ref);
      await ledger.confirm('snapshot', name, '', owner, ref);
    },
    provider,
    cocoon,
    kube,
    recorder,
    statusWriter,
    events,
    statuses,
    leasesPath,
    lease(mac, ip) {
      leases[mac] = { ip, expiry: new Date(Date.now() + 3_600_000).toISOString() };
      writeFileSync(
        leasesPath,
        JSON.stringify(Object.entries(leases).map(([m, l]) => ({ mac: m, ip: l.ip, expiry: l.expiry }))),
      );
    },
    patches(name) {
      return this.writes(name).flatMap((w) => (w.annotations ? [w.annotations] : []));
    },
    writes(name) {
      // Annotation-only writes are JSON merge patches of pods/status (write.ts); status
      // writes are strategic merge patches of it.
      const annotationOnly = (c: FakeCall) => c.headers['Content-Type'] === CONTENT_TYPE_MERGE_PATCH;
      const patches: PodWrite[] = kube.core
        .callsOf('patchNamespacedPodStatus')
        .filter((c) => c.params.name === name && annotationOnly(c))
        .map((c) => ({
          kind: 'annotations',
          annotations: c.params.body.metadata.annotations,
          status: undefined,
          at: c.at,
        }));
      const sink = statusWrites.filter((w) => w.name === name).map((w) => w.write);
      const real: PodWrite[] = kube.core
        .callsOf('patchNamespacedPodStatus')
        .filter((c) => c.params.name === name && !annotationOnly(c))
        .map((c) => ({
          kind: 'status',
          annotations: c.params.body.metadata?.annotations,
          status: c.params.body.status,
          at: c.at,
        }));
      return [...patches, ...sink, ...real].sort((a, b) => a.at - b.at);
    },
    close() {
      recorder?.stop();
      statusWriter?.stop();
      provider.stopLoops();
      lifetime.abort();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

let uid = 0;

/** A managed clone pod as cocoon-operator writes it. */
export function clonePod(name: string, extra: Record<string, string> = {}, ns = 'ns'): V1Pod {
  return {
    metadata: {
      namespace: ns,
      name,
      uid: `uid-${name}-${++uid}`,
      resourceVersion: '1',
      creationTimestamp: new Date(),
      annotations: {
        'vm.cocoonstack.io/name': `vk-${name}`,
        'cocoonset.cocoonstack.io/image': 'acme/agent',
        'cocoonset.cocoonstack.io/managed': 'true',
        ...extra,
      },
    },
    spec: { nodeName: 'node', containers: [{ name: 'agent', image: 'acme/agent' }] },
  };
}

/** The pod as the API would hold it after the provider's patches (for UpdatePod). */
export function withAnnotations(pod: V1Pod, changes: Record<string, string | null>, rv?: string): V1Pod {
  const ann = { ...(pod.metadata?.annotations ?? {}) };
  for (const [k, v] of Object.entries(changes)) {
    if (v === null) delete ann[k];
    else ann[k] = v;
  }
  return {
    ...pod,
    metadata: { ...pod.metadata, annotations: ann, resourceVersion: rv ?? pod.metadata?.resourceVersion },
  };
}

/** Polls until `check` holds (in-process: short). Polls on setImmediate, so it also works
 * while a test mocks setTimeout. */
export async function until(what: string, check: () => boolean, timeoutMs = 3000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}
