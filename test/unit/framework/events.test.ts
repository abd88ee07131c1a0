// The event recorder: its own budget, coalescing per (pod, type, reason), a bounded pending
// buffer that drops and counts, request timeouts, and a monotonic aggregation window.
import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { V1Pod } from '@kubernetes/client-node';
import { TokenBucket } from '../../../src/kube/client.ts';
import { EventRecorder } from '../../../src/kube/events.ts';
import { silentLogger } from '../../../src/log.ts';
import { apiError, blackHole, fakeKube } from '../fakes/kube.ts';

/** Lets promise callbacks run; no timer fires where timers are mocked. */
async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

function pod(i: number): V1Pod {
  return { metadata: { namespace: 'ns', name: `clone-${i}`, uid: `uid-${i}` } };
}

test('a lifecycle write does not wait behind hundreds of Warning events', async (t) => {
  // Pod writes 5/s (burst 5), events 2/s (burst 2): 300 Warnings saturate the event budget
  // for minutes. On a shared bucket the lifecycle write would queue behind all of them. Time
  // is mocked (timers and both buckets' clocks) and never advanced: the event budget never
  // refills, and the lifecycle write must go out all the same, before any time passes.
  mock.timers.enable({ apis: ['setTimeout', 'Date'], now: 0 });
  t.after(() => mock.timers.reset());
  const { kube, core } = fakeKube();
  const now = () => Date.now();
  Object.assign(kube, {
    writes: new TokenBucket(5, 5, { now }),
    eventWrites: new TokenBucket(2, 2, { now }),
  });
  const events = new EventRecorder(kube, 'node-a', silentLogger);
  t.after(() => events.stop());
  for (let i = 0; i < 300; i++) {
    events.event(pod(i), 'Warning', 'PostCloneExecFailed', `attempt 1 failed on clone-${i}`);
  }
  await flush();
  assert.equal(core.callsOf('createNamespacedEvent').length, 2, 'the event burst, then no token');
  let done = false;
  void kube
    .write(() => kube.core.patchNamespacedPod({ name: 'clone-7', namespace: 'ns', body: { metadata: {} } }))
    .then(() => {
      done = true;
    });
  await flush();
  assert.equal(done, true, 'the lifecycle write waited for a token');
  assert.equal(core.callsOf('patchNamespacedPod').length, 1);
  assert.equal(core.callsOf('createNamespacedEvent').length, 2);
  assert.equal(events.pending, 298);
  assert.equal(events.dropped, 0);
});

test('repeats of one reason for one pod are coalesced into one create and one count patch', async (t) => {
  const { kube, core } = fakeKube();
  const events = new EventRecorder(kube, 'node-a', silentLogger);
  t.after(() => events.stop());
  let release!: () => void;
  const gate = new Promise<void>((r) => {
    release = r;
  });
  core.on('createNamespacedEvent', async (params) => {
    await gate;
    return { ...params.body, metadata: { name: 'clone-1.abc', namespace: 'ns' } };
  });
  events.event(pod(1), 'Warning', 'PostCloneExecFailed', 'attempt 1: exit status 1');
  await core.waitForCalls('createNamespacedEvent');
  for (let i = 2; i <= 50; i++)
    events.event(pod(1), 'Warning', 'PostCloneExecFailed', `attempt ${i}: exit status 1`);
  events.event(pod(1), 'Normal', 'Pulled', 'snapshot pulled');
  release();
  await events.idle();
  const creates = core.callsOf('createNamespacedEvent');
  const patches = core.callsOf('patchNamespacedEvent');
  assert.equal(creates.length, 2, 'one create per (pod, type, reason)');
  const warning = creates.find((c) => c.params.body.reason === 'PostCloneExecFailed');
  assert.equal(warning?.params.body.count, 1);
  assert.equal(warning?.params.body.involvedObject.uid, 'uid-1');
  assert.equal(patches.length, 1, 'the 49 repeats are one patch');
  assert.equal(patches[0]?.params.name, 'clone-1.abc');
  assert.equal(patches[0]?.params.body.count, 50);
  assert.equal(patches[0]?.params.body.message, 'attempt 50: exit status 1');
  assert.ok(patches[0]?.params.body.lastTimestamp);
  assert.equal(patches[0]?.headers['Content-Type'], 'application/merge-patch+json');
  // A later repeat bumps the count again on the same event.
  events.event(pod(1), 'Warning', 'PostCloneExecFailed', 'attempt 51: exit status 1');
  await events.idle();
  assert.equal(core.callsOf('patchNamespacedEvent')[1]?.params.body.count, 51);
  assert.equal(core.callsOf('createNamespacedEvent').length, 2);
});

test('the pending buffer drops new keys beyond its bound and counts the drops', async (t) => {
  const { kube, core } = fakeKube({ eventQps: 1, eventBurst: 1 });
  const events = new EventRecorder(kube, 'node-a', silentLogger, { maxPending: 10 });
  t.after(() => events.stop());
  const drops: string[] = [];
  events.onDrop = (_type, reason) => drops.push(reason);
  for (let i = 0; i < 25; i++) events.event(pod(i), 'Warning', 'PostCloneExecFailed', 'boom');
  assert.equal(events.dropped, 15);
  assert.equal(drops.length, 15);
  assert.equal(events.pending, 10);
  // A repeat of a key already pending coalesces; it is never dropped.
  events.event(pod(3), 'Warning', 'PostCloneExecFailed', 'boom again');
  assert.equal(events.dropped, 15);
  await core.waitForCalls('createNamespacedEvent');
  assert.deepEqual(
    core.callsOf('createNamespacedEvent').map((c) => c.params.body.involvedObject.name),
    ['clone-0'],
  );
});

test('an event request that never answers times out and frees its key', async (t) => {
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  const { kube, core } = fakeKube();
  const events = new EventRecorder(kube, 'node-a', silentLogger, { requestTimeoutMs: 50 });
  t.after(() => events.stop());
  core.on('createNamespacedEvent', () => blackHole());
  events.event(pod(1), 'Warning', 'X', 'one');
  let idle = false;
  void events.idle().then(() => {
    idle = true;
  });
  await flush();
  assert.equal(core.callsOf('createNamespacedEvent').length, 1);
  mock.timers.tick(49);
  await flush();
  assert.equal(idle, false, 'not given up before its timeout');
  mock.timers.tick(1);
  await flush();
  assert.equal(idle, true, 'the black-holed write was given up at its timeout');
  core.on('createNamespacedEvent', (p) => ({ ...p.body, metadata: { name: 'e1' } }));
  events.event(pod(1), 'Warning', 'X', 'two');
  await events.idle();
  assert.equal(core.callsOf('createNamespacedEvent').length, 2);
});

test('an expired event (404 on the count patch) is created anew with the running count', async (t) => {
  const { kube, core } = fakeKube();
  const events = new EventRecorder(kube, 'node-a', silentLogger);
  t.after(() => events.stop());
  events.event(pod(1), 'Warning', 'X', 'one');
  await events.idle();
  core.on('patchNamespacedEvent', () => {
    throw apiError(404);
  });
  events.event(pod(1), 'Warning', 'X', 'two');
  await events.idle();
  const creates = core.callsOf('createNamespacedEvent');
  assert.equal(creates.length, 2);
  assert.equal(creates[1]?.params.body.count, 2);
});

test('the aggregation window is monotonic: a wall-clock step does not split an event', async (t) => {
  const { kube, core } = fakeKube();
  const events = new EventRecorder(kube, 'node-a', silentLogger);
  t.after(() => events.stop());
  mock.timers.enable({ apis: ['Date'], now: Date.parse('2026-01-01T00:00:00Z') });
  t.after(() => mock.timers.reset());
  events.event(pod(1), 'Warning', 'X', 'one');
  await events.idle();
  mock.timers.tick(11 * 60_000); // the wall clock jumps 11 minutes ahead
  events.event(pod(1), 'Warning', 'X', 'two');
  await events.idle();
  assert.equal(core.callsOf('createNamespacedEvent').length, 1);
  assert.equal(core.callsOf('patchNamespacedEvent')[0]?.params.body.count, 2);
});

test('a repeat after the aggregation window starts a new event', async (t) => {
  const { kube, core } = fakeKube();
  const events = new EventRecorder(kube, 'node-a', silentLogger, { aggregateWindowMs: 30 });
  t.after(() => events.stop());
  events.event(pod(1), 'Warning', 'X', 'one');
  await events.idle();
  await sleep(40);
  events.event(pod(1), 'Warning', 'X', 'two');
  await events.idle();
  assert.equal(core.callsOf('createNamespacedEvent').length, 2);
  assert.equal(core.callsOf('patchNamespacedEvent').length, 0);
});
