// The pod controller's sync decisions (docs/contracts/virtual-node.md "Sync decisions",
// "Queues and retries", "Status writes"), in process: a real PodController and a real
// PodStatusWriter on a fake Kubernetes client whose pod list/watch comes from a fake watch
// server, driving a recording PodLifecycleHandler. Every test checks what the controller
// called on the provider and what it wrote to the API.
import assert from 'node:assert/strict';
import { mock, type TestContext, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { silentLogger } from '../../../src/log.ts';
import { dependencyRecheckMs, PodController } from '../../../src/pods/controller.ts';
import { NotFoundError, type PodLifecycleHandler } from '../../../src/pods/ports.ts';
import { PodStatusWriter } from '../../../src/pods/status-writer.ts';
import { advanceMonoClockForTests, freezeMonoClockForTests } from '../../../src/util/mono-clock.ts';
import {
  type FakeKube,
  type FakeWatchServer,
  fakeKube,
  startFakeWatchServer,
  type WatchEventType,
} from '../fakes/kube.ts';

const NODE = 'node-a';
const PODS = '/api/v1/pods';
/** An annotation only the provider writes: its echo must not look like a pod change. */
const OWN = 'vm.cocoonstack.io/lifecycle-state';

const keyOf = (pod: V1Pod) => `${pod.metadata?.namespace}/${pod.metadata?.name}`;

interface Call {
  op: 'create' | 'update' | 'delete';
  pod: V1Pod;
}

/** A PodLifecycleHandler that records every call and tracks pods like a provider does:
 * its copy carries a provider-written annotation the API copy does not have yet. */
class RecordingProvider implements PodLifecycleHandler {
  readonly calls: Call[] = [];
  readonly tracked = new Map<string, V1Pod>();
  createError: Error | undefined;
  deleteError: Error | undefined;

  of(op: Call['op']): V1Pod[] {
    return this.calls.filter((c) => c.op === op).map((c) => c.pod);
  }

  #own(pod: V1Pod): V1Pod {
    return {
      ...pod,
      metadata: { ...pod.metadata, annotations: { ...pod.metadata?.annotations, [OWN]: 'creating' } },
    };
  }

  async createPod(pod: V1Pod): Promise<void> {
    this.calls.push({ op: 'create', pod });
    if (this.createError) throw this.createError;
    this.tracked.set(keyOf(pod), this.#own(pod));
  }

  async updatePod(pod: V1Pod): Promise<void> {
    this.calls.push({ op: 'update', pod });
    this.tracked.set(keyOf(pod), this.#own(pod));
  }

  async deletePod(pod: V1Pod): Promise<void> {
    this.calls.push({ op: 'delete', pod });
    if (this.deleteError) throw this.deleteError;
    if (!this.tracked.delete(keyOf(pod))) throw new NotFoundError(`${keyOf(pod)} unknown`);
  }

  getPod(namespace: string, name: string): V1Pod | undefined {
    return this.tracked.get(`${namespace}/${name}`);
  }

  getPodStatus(namespace: string, name: string) {
    return this.tracked.get(`${namespace}/${name}`)?.status;
  }

  getPods(): V1Pod[] {
    return [...this.tracked.values()];
  }
}

interface Rig {
  ws: FakeWatchServer;
  fake: FakeKube;
  status: PodStatusWriter;
  provider: RecordingProvider;
  events: { pod: string; type: string; reason: string; message: string }[];
  controller: PodController;
  /** Starts the controller (lists `list`) and waits for the pod watch. */
  start(): Promise<void>;
  /** Sends a watch event and waits until the controller and the status queue are idle. */
  send(type: WatchEventType, pod: V1Pod): Promise<void>;
}

let rv = 100;

function apiPod(name: string, extra: Partial<V1Pod['spec']> = {}): V1Pod {
  return {
    metadata: {
      namespace: 'ns',
      name,
      uid: `uid-${name}`,
      resourceVersion: String(++rv),
      annotations: { 'vm.cocoonstack.io/name': `vk-${name}` },
    },
    spec: { nodeName: NODE, containers: [{ name: 'agent', image: 'acme/agent' }], ...extra },
    status: { phase: 'Pending' },
  };
}

/** The next version of a pod as the API would send it (new resourceVersion). */
function next(pod: V1Pod, change: (p: V1Pod) => void): V1Pod {
  const copy = structuredClone(pod);
  change(copy);
  copy.metadata!.resourceVersion = String(++rv);
  return copy;
}

async function until(what: string, check: () => boolean, timeoutMs = 3000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}

/** A few turns of the event loop (lets queued syncs start). */
async function turns(n = 20): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

async function rig(t: TestContext, list: V1Pod[] = []): Promise<Rig> {
  const ws = await startFakeWatchServer();
  const fake = fakeKube({ server: ws.url });
  fake.core.on('listPodForAllNamespaces', () => ({ items: list, metadata: { resourceVersion: '100' } }));
  const status = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
  const provider = new RecordingProvider();
  const events: Rig['events'] = [];
  const controller = new PodController({
    kube: fake.kube,
    nodeName: NODE,
    provider,
    status,
    events: {
      event: (pod, type, reason, message) => void events.push({ pod: keyOf(pod), type, reason, message }),
    },
    log: silentLogger,
  });
  t.after(async () => {
    await controller.stop();
    await ws.close();
  });
  return {
    ws,
    fake,
    status,
    provider,
    events,
    controller,
    async start() {
      await controller.start();
      await ws.waitForWatch(PODS);
      await controller.idle();
    },
    async send(type, pod) {
      ws.emit(PODS, type, pod);
      const key = keyOf(pod);
      if (type === 'DELETED') await until(`${key} gone`, () => controller.cached(key) === undefined);
      else
        await until(
          `${key}@${pod.metadata?.resourceVersion}`,
          () => controller.cached(key)?.metadata?.resourceVersion === pod.metadata?.resourceVersion,
        );
      await controller.idle();
    },
  };
}

const statusPatches = (r: Rig, name: string) =>
  r.fake.core.callsOf('patchNamespacedPodStatus').filter((c) => c.params.name === name);

/** Virtual time: mocked timers and the monotonic clock move together. */
function advance(ms: number): void {
  advanceMonoClockForTests(ms);
  mock.timers.tick(ms);
}

test('a new pod is created once; its own ProviderCreateSuccess event, no update', async (t) => {
  const r = await rig(t);
  await r.start();
  const pod = apiPod('new-0');
  await r.send('ADDED', pod);
  assert.equal(r.provider.of('create').length, 1);
  assert.equal(r.provider.of('create')[0]?.metadata?.uid, 'uid-new-0');
  assert.equal(r.provider.of('update').length, 0);
  assert.deepEqual(
    r.events.map((e) => `${e.type}/${e.reason}`),
    ['Normal/ProviderCreateSuccess'],
  );
  // A re-list or resync of the same version changes nothing.
  r.controller.enqueue(keyOf(pod));
  await r.controller.idle();
  assert.equal(r.provider.calls.length, 1);
});

test('an update of provider-relevant fields calls UpdatePod; a status-only change and the echo of our own annotation do not', async (t) => {
  const r = await rig(t);
  await r.start();
  const pod = apiPod('upd-0');
  await r.send('ADDED', pod);
  // The provider's own lifecycle annotation comes back through the watch: the tracked copy
  // already holds it, so the pods are semantically equal.
  const echo = next(pod, (p) => {
    p.metadata!.annotations![OWN] = 'creating';
  });
  await r.send('MODIFIED', echo);
  // A status-only change (our status write coming back).
  const statusOnly = next(echo, (p) => {
    p.status = { phase: 'Running', podIP: '10.0.0.5' };
  });
  await r.send('MODIFIED', statusOnly);
  assert.deepEqual(
    r.provider.calls.map((c) => c.op),
    ['create'],
    'no UpdatePod for our own writes',
  );
  // A label edit and an annotation edit are provider-relevant.
  const labelled = next(statusOnly, (p) => {
    p.metadata!.labels = { tier: 'gold' };
  });
  await r.send('MODIFIED', labelled);
  assert.deepEqual(
    r.provider.calls.map((c) => c.op),
    ['create', 'update'],
  );
  assert.deepEqual(r.provider.of('update')[0]?.metadata?.labels, { tier: 'gold' });
  const bumped = next(labelled, (p) => {
    p.metadata!.annotations!['cocoonset.cocoonstack.io/generation'] = '2';
  });
  await r.send('MODIFIED', bumped);
  assert.equal(r.provider.of('update').length, 2);
  assert.equal(
    r.provider.of('update')[1]?.metadata?.annotations?.['cocoonset.cocoonstack.io/generation'],
    '2',
  );
});

test('deletionTimestamp: DeletePod, the terminal status, then a force delete fenced by the UID', async (t) => {
  const r = await rig(t);
  await r.start();
  const pod = apiPod('del-0');
  await r.send('ADDED', pod);
  const terminating = next(pod, (p) => {
    p.metadata!.deletionTimestamp = new Date().toISOString() as unknown as Date;
    p.metadata!.deletionGracePeriodSeconds = 30;
    p.status = { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] };
  });
  await r.send('MODIFIED', terminating);
  const deletes = r.provider.of('delete');
  assert.equal(deletes.length, 1);
  assert.equal(deletes[0]?.metadata?.resourceVersion, terminating.metadata?.resourceVersion, 'the API copy');
  assert.equal(r.provider.tracked.size, 0);

  const status = statusPatches(r, 'del-0');
  assert.equal(status.length, 1, 'one terminal status write');
  const body = status[0]!.params.body;
  assert.equal(body.metadata.uid, 'uid-del-0');
  assert.equal(body.status.phase, 'Succeeded');
  assert.equal(body.status.conditions.find((c: { type: string }) => c.type === 'Ready')?.status, 'False');
  assert.equal(body.status.containerStatuses[0].state.terminated.reason, 'Completed');
  assert.equal(body.status.containerStatuses[0].state.running, null, 'other states nulled');

  const forced = r.fake.core.callsOf('deleteNamespacedPod');
  assert.equal(forced.length, 1);
  assert.deepEqual(forced[0]!.params, {
    name: 'del-0',
    namespace: 'ns',
    gracePeriodSeconds: 0,
    body: { gracePeriodSeconds: 0, preconditions: { uid: 'uid-del-0' } },
  });
  const order = r.fake.core.calls.map((c) => c.method);
  assert.ok(
    order.indexOf('patchNamespacedPodStatus') < order.indexOf('deleteNamespacedPod'),
    `status before the force delete: ${order.join(', ')}`,
  );
});

test('deletionTimestamp: a failing DeletePod keeps the pod (Warning ProviderDeleteFailed, no force delete), retried', async (t) => {
  const r = await rig(t);
  await r.start();
  const pod = apiPod('del-1');
  await r.send('ADDED', pod);
  r.provider.deleteError = new Error('kept VM X: cocoon vm rm: boom');
  const terminating = next(pod, (p) => {
    p.metadata!.deletionTimestamp = new Date().toISOString() as unknown as Date;
  });
  await r.send('MODIFIED', terminating);
  assert.ok(
    r.events.some(
      (e) => e.type === 'Warning' && e.reason === 'ProviderDeleteFailed' && /boom/.test(e.message),
    ),
  );
  assert.equal(r.fake.core.callsOf('deleteNamespacedPod').length, 0, 'no force delete');
  assert.equal(statusPatches(r, 'del-1').length, 0, 'no terminal status');
  r.provider.deleteError = undefined;
  // The backoff retry (5 ms after the first failure) removes it.
  await until('force delete after the retry', () => r.fake.core.callsOf('deleteNamespacedPod').length === 1);
  assert.equal(r.provider.of('delete').length, 2);
});

test('deletionTimestamp on a pod the provider does not track: force-deleted directly', async (t) => {
  const r = await rig(t);
  const pod = apiPod('del-2');
  pod.metadata!.deletionTimestamp = new Date().toISOString() as unknown as Date;
  // The provider never saw it (listed already terminating).
  r.fake.core.on('listPodForAllNamespaces', () => ({ items: [pod], metadata: { resourceVersion: '100' } }));
  await r.start();
  await until('force delete', () => r.fake.core.callsOf('deleteNamespacedPod').length >= 1);
  assert.equal(r.provider.calls.length, 0);
  assert.equal(statusPatches(r, 'del-2').length, 0);
});

test('a pod gone from the watch is deleted in the provider with the provider copy; nothing is written', async (t) => {
  const r = await rig(t);
  await r.start();
  const pod = apiPod('gone-0');
  await r.send('ADDED', pod);
  const providerCopy = r.provider.getPod('ns', 'gone-0');
  await r.send(
    'DELETED',
    next(pod, () => {}),
  );
  const deletes = r.provider.of('delete');
  assert.equal(deletes.length, 1);
  assert.equal(deletes[0], providerCopy, 'the provider copy, with its own annotations');
  assert.equal(deletes[0]?.metadata?.annotations?.[OWN], 'creating');
  assert.equal(r.fake.core.callsOf('deleteNamespacedPod').length, 0);
  assert.equal(r.fake.core.callsOf('patchNamespacedPodStatus').length, 0);
});

test('the dangling sweep: a provider pod missing from the first list is deleted in the provider once', async (t) => {
  const r = await rig(t);
  const stale = apiPod('dangling-0');
  r.provider.tracked.set(keyOf(stale), stale);
  await r.start();
  assert.deepEqual(
    r.provider.calls.map((c) => `${c.op}:${c.pod.metadata?.name}`),
    ['delete:dangling-0'],
  );
  assert.equal(r.fake.core.callsOf('deleteNamespacedPod').length, 0, 'nothing to force-delete');
});

test('CreatePod throwing: Warning ProviderCreateFailed and one ProviderFailed status; retried on backoff, not by the echo of an unchanged pod', async (t) => {
  const r = await rig(t);
  await r.start();
  // Mocked timers and a frozen monotonic clock: only advance() moves time, however slow the machine.
  mock.timers.enable({ apis: ['setTimeout'] });
  freezeMonoClockForTests(true);
  t.after(() => {
    mock.timers.reset();
    freezeMonoClockForTests(false);
  });
  const message = 'missing annotation vm.cocoonstack.io/name';
  r.provider.createError = new Error(message);
  const pod = apiPod('bad-0');
  // Our status write comes back through the watch while the failed sync is still running:
  // the controller sees a watch event for the unchanged pod right after the failure.
  r.fake.core.on('patchNamespacedPodStatus', async (params) => {
    const echoed = next(pod, (p) => {
      p.status = params.body.status;
    });
    r.ws.emit(PODS, 'MODIFIED', echoed);
    await until(
      'status echo',
      () => r.controller.cached('ns/bad-0')?.metadata?.resourceVersion === echoed.metadata?.resourceVersion,
    );
    return {};
  });
  r.ws.emit(PODS, 'ADDED', pod);
  await until(
    'first attempt and its status echo',
    () => r.controller.cached('ns/bad-0')?.status?.reason === 'ProviderFailed',
  );
  await turns();
  await r.controller.idle();
  assert.equal(r.provider.of('create').length, 1, 'the echo did not re-run the create');
  const writes = statusPatches(r, 'bad-0');
  assert.equal(writes.length, 1);
  assert.equal(writes[0]!.params.body.status.phase, 'Pending');
  assert.equal(writes[0]!.params.body.status.reason, 'ProviderFailed');
  assert.equal(writes[0]!.params.body.status.message, message);
  assert.equal(writes[0]!.params.body.metadata.uid, 'uid-bad-0');
  assert.deepEqual(
    r.events.map((e) => `${e.type}/${e.reason}/${e.message}`),
    [`Warning/ProviderCreateFailed/${message}`],
  );

  // The backoff (5 ms after the first failure) re-runs it.
  advance(4);
  await turns();
  await r.controller.idle();
  assert.equal(r.provider.of('create').length, 1, 'not before 5 ms');
  advance(1);
  await until('retry 1', () => r.provider.of('create').length === 2);
  await r.controller.idle();
  // The next gap is 10 ms, though the echo of our own status write resolved a sync in between.
  advance(9);
  await turns();
  await r.controller.idle();
  assert.equal(r.provider.of('create').length, 2, 'not before 10 ms');
  advance(1);
  let gap = 10;
  await until('retry 2', () => r.provider.of('create').length === 3);
  await r.controller.idle();
  for (let n = 3; n <= 7; n++) {
    gap *= 2;
    const before = r.provider.of('create').length;
    advance(gap - 1);
    await turns();
    await r.controller.idle();
    assert.equal(r.provider.of('create').length, before, `retry ${n}: not before ${gap} ms`);
    advance(1);
    await until(`retry ${n}`, () => r.provider.of('create').length === before + 1);
    await r.controller.idle();
  }
  assert.equal(r.provider.of('create').length, 8);
  assert.equal(statusPatches(r, 'bad-0').length, 1, 'an identical ProviderFailed status is not rewritten');
  assert.equal(r.events.filter((e) => e.reason === 'ProviderCreateFailed').length, 8);

  // A status-only watch event in the middle of the next backoff does not cut it short.
  gap *= 2;
  const before = r.provider.of('create').length;
  await r.send(
    'MODIFIED',
    next(r.controller.cached('ns/bad-0')!, (p) => {
      p.status = { ...p.status, conditions: [{ type: 'PodScheduled', status: 'True' }] };
    }),
  );
  await turns();
  await r.controller.idle();
  assert.equal(r.provider.of('create').length, before, 'the watch event did not re-run the create');
  advance(gap);
  await until('the retry on its timer', () => r.provider.of('create').length === before + 1);
  await r.controller.idle();

  // The input is fixed: a changed pod is created at once, without waiting for the backoff.
  r.provider.createError = undefined;
  await r.send(
    'MODIFIED',
    next(r.controller.cached('ns/bad-0')!, (p) => {
      p.metadata!.annotations!['vm.cocoonstack.io/name'] = 'vk-bad-0b';
    }),
  );
  await until('created', () => r.provider.tracked.has('ns/bad-0'));
  assert.ok(r.events.some((e) => e.reason === 'ProviderCreateSuccess'));
});

test('a status-only watch event during a backoff does not reset the backoff of the next failure', async (t) => {
  const r = await rig(t);
  await r.start();
  // Mocked timers and a frozen monotonic clock: only advance() moves time, however slow the machine.
  mock.timers.enable({ apis: ['setTimeout'] });
  freezeMonoClockForTests(true);
  t.after(() => {
    mock.timers.reset();
    freezeMonoClockForTests(false);
  });
  r.provider.createError = new Error('missing annotation vm.cocoonstack.io/name');
  const pod = apiPod('reset-0');
  await r.send('ADDED', pod);
  // Five failures: 5, 10, 20, 40 ms apart; the fifth backs off 80 ms.
  for (const delay of [5, 10, 20, 40]) {
    const before = r.provider.of('create').length;
    advance(delay);
    await until('retry', () => r.provider.of('create').length === before + 1);
    await r.controller.idle();
  }
  assert.equal(r.provider.of('create').length, 5);
  // An unrelated status-only change arrives during the 80 ms backoff.
  await r.send(
    'MODIFIED',
    next(pod, (p) => {
      p.status = { phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'True' }] };
    }),
  );
  advance(80);
  await until('sixth attempt', () => r.provider.of('create').length === 6);
  await r.controller.idle();
  // The sixth failure must back off 160 ms, not 5 ms.
  advance(5);
  await turns();
  await r.controller.idle();
  assert.equal(r.provider.of('create').length, 6, 'the backoff was reset to 5 ms by the watch event');
});

test('a pod whose mandatory ConfigMap is missing is held back, re-read by name with backoff and created once it appears', async (t) => {
  const r = await rig(t);
  await r.start();
  // Mocked timers and a frozen monotonic clock: only advance() moves time, however slow the machine.
  mock.timers.enable({ apis: ['setTimeout'] });
  freezeMonoClockForTests(true);
  t.after(() => {
    mock.timers.reset();
    freezeMonoClockForTests(false);
  });
  const reads = () => r.fake.core.callsOf('readNamespacedConfigMap').length;
  const pod = apiPod('cfg-0', {
    containers: [{ name: 'agent', image: 'acme/agent', envFrom: [{ configMapRef: { name: 'agent-env' } }] }],
  });
  await r.send('ADDED', pod);
  assert.equal(r.provider.calls.length, 0, 'held back: no CreatePod');
  assert.ok(
    r.events.some((e) => e.type === 'Warning' && e.reason === 'MandatoryConfigMapNotFound'),
    JSON.stringify(r.events),
  );
  assert.equal(reads(), 1);
  assert.deepEqual(r.fake.core.callsOf('readNamespacedConfigMap')[0]?.params, {
    namespace: 'ns',
    name: 'agent-env',
  });
  // Re-read after 1 s, then 2 s: still missing, still held back.
  advance(999);
  await turns();
  await r.controller.idle();
  assert.equal(reads(), 1, 'no re-read before 1 s');
  advance(1);
  await until('the first re-read', () => reads() === 2);
  await r.controller.idle();
  advance(2000);
  await until('the second re-read', () => reads() === 3);
  await r.controller.idle();
  assert.equal(r.provider.calls.length, 0);
  // The missing one appears: the next re-read (4 s later) creates the pod.
  r.fake.core.on('readNamespacedConfigMap', (p) =>
    p.name === 'agent-env' ? { data: { MODE: 'fast' } } : Promise.reject(new Error('unexpected')),
  );
  advance(4000);
  await until('created', () => r.provider.of('create').length === 1);
  await r.controller.idle();
  assert.equal(r.provider.of('create')[0]?.metadata?.uid, 'uid-cfg-0');
  // Nothing but the pods was ever listed or watched: ConfigMaps are only read by name.
  assert.deepEqual(
    [...new Set(r.fake.core.calls.map((c) => c.method).filter((m) => m.startsWith('list')))],
    ['listPodForAllNamespaces'],
  );
  // Created: no more re-reads.
  advance(60_000);
  await turns();
  await r.controller.idle();
  assert.equal(reads(), 4);
});

test('the re-get delay of a held-back pod doubles from 1 s to 30 s and stays there', () => {
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6, 7, 50].map((n) => dependencyRecheckMs(n)),
    [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000],
  );
});

test('pods in a terminal phase are ignored: no create, no update, no status write', async (t) => {
  const done = apiPod('term-0');
  done.status = { phase: 'Succeeded' };
  const failed = apiPod('term-1');
  failed.status = { phase: 'Failed' };
  const r = await rig(t, [done, failed]);
  await r.start();
  await r.send(
    'MODIFIED',
    next(done, (p) => {
      p.metadata!.labels = { x: 'y' };
    }),
  );
  assert.equal(r.provider.calls.length, 0);
  // Even a status the provider publishes for it is not written.
  r.status.notify({ ...failed, status: { phase: 'Running' } });
  await r.controller.idle();
  assert.equal(r.fake.core.callsOf('patchNamespacedPodStatus').length, 0);
});

test('a status published before the controller started is written once the pod is in the cache', async (t) => {
  const listed = apiPod('early-0');
  const r = await rig(t, [listed]);
  // The startup reconcile tracked the listed pod and published its status before start().
  r.provider.tracked.set(keyOf(listed), listed);
  r.status.notify({ ...listed, status: { phase: 'Running', podIP: '10.0.0.5', hostIP: '127.0.0.1' } });
  // …and published a status for a pod the watch has not delivered yet.
  const later = apiPod('early-1');
  r.status.notify({ ...later, status: { phase: 'Running', podIP: '10.0.0.6' } });
  assert.equal(r.fake.core.callsOf('patchNamespacedPodStatus').length, 0, 'nothing before start');
  await r.start();
  await until('listed pod written', () => statusPatches(r, 'early-0').length === 1);
  const body = statusPatches(r, 'early-0')[0]!.params.body;
  assert.equal(body.metadata.uid, 'uid-early-0');
  assert.equal(body.status.podIP, '10.0.0.5');
  assert.equal(body.status.phase, 'Running');
  assert.equal(statusPatches(r, 'early-1').length, 0, 'kept pending: not in the cache yet');
  assert.equal(r.provider.calls.length, 0, 'the tracked listed pod needs no provider call');
  // The watch delivers it: the pending status is written.
  await r.send('ADDED', later);
  await until('late pod written', () => statusPatches(r, 'early-1').length === 1);
  assert.equal(statusPatches(r, 'early-1')[0]!.params.body.status.podIP, '10.0.0.6');
  await r.controller.idle();
  assert.equal(statusPatches(r, 'early-0').length, 1, 'written once');
});
