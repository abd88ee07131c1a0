// An in-process cocoon provider for unit tests: the real CocoonProvider wired to a fake
// Kubernetes client (test/unit/fakes/kube.ts), a fake cocoon runner
// (test/unit/fakes/cocoon.ts), a real lease file in a temp directory, and recording event,
// status and notification sinks. No apiserver, no simulator processes.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { loadConfig } from '../../../src/config/env.ts';
import type { EventSink } from '../../../src/kube/events.ts';
import { silentLogger } from '../../../src/log.ts';
import { LeaseFile } from '../../../src/net/leases.ts';
import type { SnapshotPuller } from '../../../src/provider/cocoon/context.ts';
import { noMetrics } from '../../../src/provider/cocoon/metrics.ts';
import { CocoonProvider } from '../../../src/provider/cocoon/provider.ts';
import { FakeCocoon } from '../fakes/cocoon.ts';
import { fakeKube } from '../fakes/kube.ts';

export interface RecordedEvent {
  pod: string;
  type: string;
  reason: string;
  message: string;
}

export interface Harness {
  provider: CocoonProvider;
  cocoon: FakeCocoon;
  kube: ReturnType<typeof fakeKube>;
  events: RecordedEvent[];
  statuses: V1Pod[];
  leasesPath: string;
  /** Writes a lease for a MAC (cocoon-net's file format). */
  lease(mac: string, ip: string): void;
  /** Annotation patches the provider sent for a pod, oldest first. */
  patches(name: string): Record<string, string | null>[];
  close(): void;
}

export function harness(
  opts: {
    env?: Record<string, string>;
    puller?: SnapshotPuller;
    statusWriter?: (pod: V1Pod) => Promise<void>;
  } = {},
): Harness {
  const dir = mkdtempSync(join(tmpdir(), 'vk-unit-'));
  const leasesPath = join(dir, 'leases.json');
  const leases: Record<string, { ip: string; expiry: string }> = {};
  const cocoon = new FakeCocoon();
  const kube = fakeKube();
  const events: RecordedEvent[] = [];
  const statuses: V1Pod[] = [];
  const sink: EventSink = {
    event: (pod, type, reason, message) =>
      events.push({ pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, type, reason, message }),
  };
  const lifetime = new AbortController();
  const config = loadConfig({ VK_NODE_IP: '127.0.0.1', VK_LEASES_PATH: leasesPath, ...opts.env });
  const provider = new CocoonProvider({
    status: {
      notify: (pod) => void statuses.push(pod),
      writeNow: async (pod) => {
        if (opts.statusWriter) await opts.statusWriter(pod);
        else statuses.push(pod);
      },
    },
    config,
    kube: kube.kube,
    cli: cocoon.cli,
    events: sink,
    metrics: noMetrics,
    leases: new LeaseFile(leasesPath),
    log: silentLogger,
    nodeIP: '127.0.0.1',
    lifetime: lifetime.signal,
    puller: opts.puller,
  });
  return {
    provider,
    cocoon,
    kube,
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
      return kube.core
        .callsOf('patchNamespacedPod')
        .filter((c) => c.params.name === name)
        .map((c) => c.params.body.metadata.annotations);
    },
    close() {
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
