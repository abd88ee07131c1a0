// The status write that must precede `ready` (PodStatusWriter.writeNow): bounded per
// attempt, retried like the lifecycle patch, and ahead of waiting normal writes; and the
// asynchronous status queue the pod controller drives.
import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { apiStatus, WriteAttemptsError } from '../../../src/kube/client.ts';
import { silentLogger } from '../../../src/log.ts';
import { PodController } from '../../../src/pods/controller.ts';
import type { PodLifecycleHandler } from '../../../src/pods/ports.ts';
import { PodStatusWriter } from '../../../src/pods/status-writer.ts';
import {
  apiError,
  blackHole,
  type FakeKube,
  fakeKube,
  hangUntilAborted,
  startFakeWatchServer,
} from '../fakes/kube.ts';

const provider = {
  getPods: () => [],
  getPod: () => undefined,
  getPodStatus: () => undefined,
} as unknown as PodLifecycleHandler;

/** The status writer a provider is given at construction. */
function controller(fake: FakeKube): { writeStatusNow: (pod: V1Pod) => Promise<void> } {
  const status = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
  return {
    writeStatusNow: async (pod) => {
      await status.writeNow(pod);
    },
  };
}

const readyPod: V1Pod = {
  metadata: { namespace: 'ns', name: 'clone-0', uid: 'uid-0' },
  status: { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] },
};

/** Advances mocked timers in 100 ms steps until `p` settles; returns the mocked time spent. */
async function runMocked(
  p: Promise<unknown>,
  limitMs: number,
): Promise<{ error: unknown; elapsedMs: number }> {
  let settled = false;
  let error: unknown;
  p.then(
    () => {
      settled = true;
    },
    (e: unknown) => {
      settled = true;
      error = e;
    },
  );
  let elapsedMs = 0;
  while (!settled && elapsedMs < limitMs) {
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    if (settled) break;
    mock.timers.tick(100);
    elapsedMs += 100;
  }
  assert.ok(settled, `not settled after ${limitMs} ms of mocked time`);
  return { error, elapsedMs };
}

for (const [what, hang] of [
  ['a black-holed request (even one that ignores its signal)', () => blackHole()],
  ['a request that hangs until aborted', hangUntilAborted],
] as const) {
  test(`writeStatusNow gives up on ${what} after 3 attempts of 5 s, 500 ms apart`, async (t) => {
    mock.timers.enable({ apis: ['setTimeout'] });
    t.after(() => mock.timers.reset());
    const fake = fakeKube();
    fake.core.on('patchNamespacedPodStatus', (_p, call) => hang(call));
    const c = controller(fake);
    const { error, elapsedMs } = await runMocked(c.writeStatusNow(readyPod), 60_000);
    const calls = fake.core.callsOf('patchNamespacedPodStatus');
    assert.equal(calls.length, 3, 'three attempts');
    // 3 × 5 s + 2 × 500 ms, in 100 ms steps.
    assert.ok(elapsedMs >= 16_000 && elapsedMs <= 16_300, `gave up after ${elapsedMs} ms`);
    assert.ok(error instanceof WriteAttemptsError, String(error));
    assert.equal(apiStatus(error), 0);
    assert.match(String(error.message), /API request timed out after 5000 ms \(3 attempts\)/);
    // Every attempt's HTTP request was aborted, and each one was a UID-fenced status patch.
    for (const call of calls) {
      assert.equal(call.signal?.aborted, true);
      assert.equal(call.params.body.metadata.uid, 'uid-0');
      assert.equal(call.headers['Content-Type'], 'application/strategic-merge-patch+json');
    }
  });
}

test('writeStatusNow retries a transient failure and does not retry 404/409/422', async () => {
  const fake = fakeKube();
  const c = controller(fake);
  let n = 0;
  fake.core.on('patchNamespacedPodStatus', () => {
    if (++n === 1) throw apiError(503, 'unavailable');
    return readyPod;
  });
  await c.writeStatusNow(readyPod);
  assert.equal(n, 2);
  for (const code of [404, 409, 422]) {
    n = 0;
    fake.core.on('patchNamespacedPodStatus', () => {
      n++;
      throw apiError(code);
    });
    const err = await c.writeStatusNow(readyPod).catch((e: unknown) => e);
    assert.equal(apiStatus(err), code, 'the caller sees the status code (superseded)');
    assert.equal(n, 1);
  }
});

test('writeStatusNow goes ahead of pod writes already waiting for a token', async () => {
  const fake = fakeKube({ qps: 50, burst: 1 });
  const c = controller(fake);
  const order: string[] = [];
  fake.core.on('patchNamespacedPod', (p) => {
    order.push(p.name);
    return {};
  });
  fake.core.on('patchNamespacedPodStatus', (p) => {
    order.push(`status:${p.name}`);
    return {};
  });
  const writes = [];
  for (let i = 0; i < 5; i++) {
    writes.push(
      fake.kube.write(() => fake.kube.core.patchNamespacedPod({ name: `w${i}`, namespace: 'ns', body: {} })),
    );
  }
  const status = c.writeStatusNow(readyPod);
  await Promise.all([...writes, status]);
  // w0 took the only token at once; the status write is next, before w1..w4.
  assert.deepEqual(order.slice(0, 2), ['w0', 'status:clone-0']);
});

test('the status queue gives a black-holed write up at 5 s and retries it', async (t) => {
  const ws = await startFakeWatchServer();
  t.after(() => ws.close());
  const fake = fakeKube({ server: ws.url });
  const apiPod: V1Pod = {
    metadata: { namespace: 'ns', name: 'clone-0', uid: 'uid-0', resourceVersion: '5' },
    spec: { nodeName: 'node-a', containers: [{ name: 'agent', image: 'img' }] },
    status: { phase: 'Pending' },
  };
  fake.core.on('listPodForAllNamespaces', () => ({ items: [apiPod], metadata: { resourceVersion: '5' } }));
  fake.core.on('patchNamespacedPodStatus', (_p, call) => hangUntilAborted(call));
  const status = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
  const publish = (pod: V1Pod) => status.notify(pod);
  const c = new PodController({
    kube: fake.kube,
    nodeName: 'node-a',
    provider: { ...provider, createPod: async () => {} } as unknown as PodLifecycleHandler,
    status,
    events: { event: () => {} },
    log: silentLogger,
  });
  await c.start();
  t.after(() => c.stop());
  await ws.waitForWatch('/api/v1/pods');
  await c.idle();
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  publish({ ...apiPod, status: { phase: 'Running' } });
  const second = fake.core.waitForCalls('patchNamespacedPodStatus', 2, 60_000);
  const { elapsedMs } = await runMocked(second, 60_000);
  const [first] = fake.core.callsOf('patchNamespacedPodStatus');
  assert.equal(first?.signal?.aborted, true, 'the first request was aborted');
  // 5 s timeout + the status queue's 200 ms backoff, in 100 ms steps.
  assert.ok(elapsedMs >= 5000 && elapsedMs <= 5500, `retried after ${elapsedMs} ms`);
});
