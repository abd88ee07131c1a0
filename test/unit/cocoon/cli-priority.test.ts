// The `cocoon` call pool serves waiters by rank (issue 9): a call of a pod admitted earlier
// gets the next free slot before a call of a pod admitted later, whatever their arrival order;
// calls without a priority context (health check, kubelet API) are never starved by pods.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Semaphore } from '../../../src/cocoon/runner.ts';
import { KeyedQueue } from '../../../src/util/keyed-queue.ts';
import { AdmissionOrder, runWithPriority } from '../../../src/util/priority.ts';

/** Queues `name` for a slot; on grant records it and releases the slot at once. */
function waiter(
  sem: Semaphore,
  order: string[],
  name: string,
  priority: 'high' | 'normal' = 'normal',
): Promise<void> {
  return sem.acquire(undefined, priority).then((release) => {
    order.push(name);
    release();
  });
}

/** Frees the held slot: the waiters get it one after another, in rank order. */
async function drain(holder: () => void, slots: Promise<void>[], order: string[]): Promise<string[]> {
  holder();
  await Promise.all(slots);
  return order;
}

test('a later-admitted pod’s call waits behind an earlier-admitted pod’s, whatever the arrival', async () => {
  const sem = new Semaphore(1);
  const holder = await sem.acquire();
  const admission = new AdmissionOrder();
  const queue = new KeyedQueue({ around: (key, task) => admission.run(key, task, () => true) });
  const order: string[] = [];
  // Admission: a, then b. Calls arrive b first (b's clone), then a's (a's inspect).
  admission.seq('ns/a');
  admission.seq('ns/b');
  const slots: Promise<void>[] = [];
  await queue.run('ns/b', () => void slots.push(waiter(sem, order, 'b:clone')));
  await queue.run('ns/b', () => void slots.push(waiter(sem, order, 'b:inspect')));
  await queue.run('ns/a', () => void slots.push(waiter(sem, order, 'a:inspect')));
  assert.equal(sem.waiting, 3);
  assert.deepEqual(await drain(holder, slots, order), ['a:inspect', 'b:clone', 'b:inspect']);
});

test('high first, then calls without a priority context, then by admission, FIFO among equals', async () => {
  const sem = new Semaphore(1);
  const holder = await sem.acquire();
  const order: string[] = [];
  const slots = [
    runWithPriority(2, () => waiter(sem, order, 'pod2')),
    runWithPriority(1, () => waiter(sem, order, 'pod1')),
    waiter(sem, order, 'health-check'),
    runWithPriority(3, () => waiter(sem, order, 'pod3-exec', 'high')),
    runWithPriority(1, () => waiter(sem, order, 'pod1-again')),
  ];
  assert.deepEqual(await drain(holder, slots, order), [
    'pod3-exec',
    'health-check',
    'pod1',
    'pod1-again',
    'pod2',
  ]);
});

test('no starvation: an unprioritized call is served next even behind a long queue of pods', async () => {
  const sem = new Semaphore(2);
  const a = await sem.acquire();
  const b = await sem.acquire();
  const order: string[] = [];
  const slots: Promise<void>[] = [];
  for (let seq = 100; seq >= 1; seq--)
    slots.push(runWithPriority(seq, () => waiter(sem, order, `pod${seq}`)));
  const ping = waiter(sem, order, 'health-check');
  a();
  b();
  await Promise.all([ping, ...slots]);
  assert.equal(order[0], 'health-check', 'the first free slot goes to the unprioritized call');
  assert.deepEqual(
    order.slice(1),
    Array.from({ length: 100 }, (_, i) => `pod${i + 1}`),
    'then the pods, oldest admission first',
  );
});

test('an aborted waiter leaves the ranked queue at once', async () => {
  const sem = new Semaphore(1);
  const holder = await sem.acquire();
  const order: string[] = [];
  const ac = new AbortController();
  const first = runWithPriority(1, () => sem.acquire(ac.signal));
  const second = runWithPriority(2, () => waiter(sem, order, 'pod2'));
  ac.abort(new Error('deadline'));
  await assert.rejects(first, /deadline/);
  assert.equal(sem.waiting, 1);
  holder();
  await second;
  assert.deepEqual(order, ['pod2']);
});
