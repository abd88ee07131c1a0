// The API write buckets serve waiters by rank (issue 9): a write of a pod admitted earlier gets
// the next token before a write of a pod admitted later, whatever their arrival order; writes
// without a priority context are never starved by pods; heartbeats keep their own bucket, so
// a queue of pod writes never holds them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Kube, TokenBucket } from '../../../src/kube/client.ts';
import { KeyedQueue } from '../../../src/util/keyed-queue.ts';
import { AdmissionOrder, runWithPriority } from '../../../src/util/priority.ts';
import { fakeKubeConfig } from '../fakes/kube.ts';

/** A bucket (20/s, burst 1) whose token is taken and whose next token is promised to a
 * high-priority blocker: every take queued from now on (until the blocker is served, 50 ms
 * away, and the token after it, 100 ms away) waits and is served in rank order. At 100/s a
 * loaded machine that stalled 20 ms before the test queued its takes handed the first of
 * them a free token out of rank (seen under CI load). */
async function drained(): Promise<TokenBucket> {
  const b = new TokenBucket(20, 1);
  await b.take();
  void b.take({ priority: 'high' });
  assert.equal(b.waiting, 1);
  return b;
}

test('a later-admitted pod’s write waits behind an earlier-admitted pod’s, whatever the arrival', async () => {
  const bucket = await drained();
  const admission = new AdmissionOrder();
  const queue = new KeyedQueue({ around: (key, task) => admission.run(key, task, () => true) });
  admission.seq('ns/a');
  admission.seq('ns/b');
  const order: string[] = [];
  const takes: Promise<unknown>[] = [];
  const write = (name: string) => () => {
    takes.push(bucket.take().then(() => order.push(name)));
  };
  // b (admitted second) queues its status and lifecycle writes before a's ready write.
  await queue.run('ns/b', write('b:status'));
  await queue.run('ns/b', write('b:lifecycle'));
  await queue.run('ns/a', write('a:ready'));
  await Promise.all(takes);
  assert.deepEqual(order, ['a:ready', 'b:status', 'b:lifecycle']);
});

test('high first, then writes without a priority context, then by admission, FIFO among equals', async () => {
  const bucket = await drained();
  const order: string[] = [];
  const take = (name: string, seq: number | undefined, priority: 'high' | 'normal' = 'normal') =>
    runWithPriority(seq, () => bucket.take({ priority }).then(() => order.push(name)));
  await Promise.all([
    take('pod2', 2),
    take('pod1', 1),
    take('force-delete', undefined),
    take('pod5-status-before-ready', 5, 'high'),
    take('pod1-again', 1),
  ]);
  assert.deepEqual(order, ['pod5-status-before-ready', 'force-delete', 'pod1', 'pod1-again', 'pod2']);
});

test('no starvation: an unprioritized write is served next even behind many pods', async () => {
  const bucket = await drained();
  const order: string[] = [];
  const takes: Promise<unknown>[] = [];
  for (let seq = 50; seq >= 1; seq--)
    takes.push(runWithPriority(seq, () => bucket.take().then(() => order.push(`pod${seq}`))));
  takes.push(bucket.take().then(() => order.push('controller')));
  await Promise.all(takes);
  assert.equal(order[0], 'controller');
  assert.deepEqual(
    order.slice(1),
    Array.from({ length: 50 }, (_, i) => `pod${i + 1}`),
  );
});

test('the wait estimate (and so the fail-fast bound) counts only the waiters ranked ahead', async () => {
  const bucket = new TokenBucket(1, 1);
  await bucket.take();
  const ac = new AbortController();
  const waits = [];
  for (let seq = 10; seq < 20; seq++)
    waits.push(runWithPriority(seq, () => bucket.take({ signal: ac.signal }).catch(() => {})));
  // An older pod stands before all ten; a newer one behind them (~11 s at 1/s).
  const older = runWithPriority(1, () => bucket.estimateWaitMs());
  const newer = runWithPriority(99, () => bucket.estimateWaitMs());
  assert.ok(older <= 1000, `older pod: ${older} ms`);
  assert.ok(newer >= 10_000, `newer pod: ${newer} ms`);
  ac.abort();
  await Promise.all(waits);
  assert.equal(bucket.waiting, 0);
});

test('heartbeats keep their own bucket: a queue of pod writes never holds them', async () => {
  const kube = new Kube(fakeKubeConfig(), 1, 1, { heartbeatQps: 7, heartbeatBurst: 14 });
  assert.equal(kube.heartbeatWrites.qps, 7);
  assert.equal(kube.heartbeatWrites.burst, 14);
  await kube.writes.take();
  const ac = new AbortController();
  const queued = Array.from({ length: 20 }, (_, i) =>
    runWithPriority(i + 1, () => kube.writes.take({ signal: ac.signal }).catch(() => {})),
  );
  assert.equal(kube.writes.waiting, 20);
  // The heartbeat bucket is untouched by the pod-write queue: its take is granted at once.
  let granted = false;
  const hb = kube.heartbeatWrites.take().then(() => {
    granted = true;
  });
  await Promise.resolve();
  assert.equal(granted, true);
  await hb;
  assert.equal(kube.heartbeatWrites.waiting, 0);
  ac.abort();
  await Promise.all(queued);
});
