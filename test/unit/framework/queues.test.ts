import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { TokenBucket } from '../../../src/kube/client.ts';
import { KeyedQueue } from '../../../src/util/keyed-queue.ts';
import { WorkQueue } from '../../../src/util/work-queue.ts';

test('KeyedQueue serializes one key and runs different keys concurrently', async () => {
  const q = new KeyedQueue();
  const log: string[] = [];
  const task = (name: string, ms: number) => async () => {
    log.push(`${name}:start`);
    await sleep(ms);
    log.push(`${name}:end`);
  };
  await Promise.all([q.run('a', task('a1', 30)), q.run('a', task('a2', 1)), q.run('b', task('b1', 5))]);
  assert.ok(log.indexOf('a1:end') < log.indexOf('a2:start'), log.join(' '));
  assert.ok(log.indexOf('b1:start') < log.indexOf('a1:end'), log.join(' '));
});

test('KeyedQueue keeps going after a task throws', async () => {
  const q = new KeyedQueue();
  await assert.rejects(
    q.run('k', () => Promise.reject(new Error('boom'))),
    /boom/,
  );
  assert.equal(await q.run('k', () => 42), 42);
  await sleep(1);
  assert.equal(q.busy('k'), false);
});

test('WorkQueue coalesces events for a busy key into one re-run', async () => {
  let runs = 0;
  let release!: () => void;
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const q = new WorkQueue(
    async () => {
      runs++;
      if (runs === 1) await gate;
    },
    { concurrency: 4 },
  );
  q.add('k');
  await sleep(5);
  for (let i = 0; i < 50; i++) q.add('k');
  release();
  await q.idle();
  await sleep(5);
  await q.idle();
  assert.equal(runs, 2);
});

test('WorkQueue retries failures with backoff and resets after success', async () => {
  let calls = 0;
  const q = new WorkQueue(
    async () => {
      calls++;
      if (calls < 3) throw new Error('transient');
    },
    { concurrency: 1, baseDelayMs: 5 },
  );
  q.add('k');
  for (let i = 0; i < 100 && calls < 3; i++) await sleep(5);
  await q.idle();
  assert.equal(calls, 3);
  assert.equal(q.retries('k'), 0);
});

test('TokenBucket allows the burst then paces at qps', async (t) => {
  // On mock timers and the mocked Date clock: the burst is served before any time passes,
  // then each token comes exactly 10 ms after the one before (100 qps), never sooner.
  mock.timers.enable({ apis: ['setTimeout', 'Date'], now: 0 });
  t.after(() => mock.timers.reset());
  const flush = async () => {
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  };
  const b = new TokenBucket(100, 5, { now: () => Date.now() });
  let burst = 0;
  for (let i = 0; i < 5; i++)
    void b.take().then(() => {
      burst++;
    });
  await flush();
  assert.equal(burst, 5, 'the burst of 5 without waiting');
  for (let i = 1; i <= 5; i++) {
    let got = false;
    void b.take().then(() => {
      got = true;
    });
    mock.timers.tick(9);
    await flush();
    assert.equal(got, false, `paced token ${i} before its 10 ms`);
    mock.timers.tick(1);
    await flush();
    assert.equal(got, true, `paced token ${i} at 10 ms`);
  }
});
