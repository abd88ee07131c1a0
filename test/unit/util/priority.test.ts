// Work priority by admission order (issue 9, src/util/priority.ts): the async context carries a
// pod's admission sequence into everything its operation starts; waiters are ranked high →
// unprioritized → oldest admission → arrival; the per-pod KeyedQueue and the WorkQueue run
// each task under its own key's priority.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { KeyedQueue } from '../../../src/util/keyed-queue.ts';
import {
  AdmissionOrder,
  compareRank,
  currentPriority,
  type Rank,
  RankedList,
  rankNow,
  runWithPriority,
} from '../../../src/util/priority.ts';
import { WorkQueue } from '../../../src/util/work-queue.ts';

describe('runWithPriority / currentPriority', () => {
  it('travels through awaits, timers and promise callbacks started inside', async () => {
    assert.equal(currentPriority(), undefined);
    const seen: (number | undefined)[] = [];
    let timer: Promise<void> = Promise.resolve();
    await runWithPriority(7, async () => {
      seen.push(currentPriority());
      await sleep(1);
      seen.push(currentPriority());
      timer = new Promise<void>((resolve) =>
        setTimeout(() => {
          seen.push(currentPriority());
          resolve();
        }, 1),
      );
      void Promise.resolve().then(() => seen.push(currentPriority()));
    });
    await timer;
    assert.deepEqual(seen, [7, 7, 7, 7]);
    assert.equal(currentPriority(), undefined, 'nothing leaks out');
  });

  it('nests, and undefined runs work as unprioritized whatever the caller had', () => {
    runWithPriority(3, () => {
      assert.equal(currentPriority(), 3);
      runWithPriority(1, () => assert.equal(currentPriority(), 1));
      runWithPriority(undefined, () => assert.equal(currentPriority(), undefined));
      assert.equal(currentPriority(), 3);
    });
    assert.throws(() => runWithPriority(Number.NaN, () => {}), TypeError);
  });
});

describe('AdmissionOrder', () => {
  it('assigns increasing sequences, stable per key until forgotten', () => {
    const order = new AdmissionOrder();
    const a = order.seq('ns/a');
    const b = order.seq('ns/b');
    assert.ok(a < b);
    assert.equal(order.seq('ns/a'), a);
    order.forget('ns/a');
    const again = order.seq('ns/a');
    assert.ok(again > b, 'a re-admitted key is the newest');
  });

  it('run() sets the sequence and forgets the key when it is no longer kept', async () => {
    const order = new AdmissionOrder();
    const tracked = new Set(['ns/a']);
    const seen = await order.run(
      'ns/a',
      () => currentPriority(),
      () => tracked.has('ns/a'),
    );
    assert.equal(seen, order.seq('ns/a'));
    assert.equal(order.size, 1);
    tracked.delete('ns/a');
    await assert.rejects(
      order.run(
        'ns/a',
        () => {
          throw new Error('boom');
        },
        () => tracked.has('ns/a'),
      ),
      /boom/,
    );
    assert.equal(order.size, 0, 'an untracked key is forgotten however its task ended');
  });
});

describe('ranking', () => {
  it('high first, then unprioritized, then oldest admission, then arrival', () => {
    const list = new RankedList<{ rank: Rank; name: string }>();
    const add = (name: string, seq: number | undefined, high = false) =>
      list.insert({ name, rank: runWithPriority(seq, () => rankNow(high)) });
    add('pod2-first', 2);
    add('pod1', 1);
    add('none-1', undefined);
    add('pod2-second', 2);
    add('pod9-high', 9, true);
    add('none-2', undefined);
    add('pod1-high', 1, true);
    const names: string[] = [];
    for (let w = list.shift(); w; w = list.shift()) names.push(w.name);
    assert.deepEqual(names, [
      'pod1-high',
      'pod9-high',
      'none-1',
      'none-2',
      'pod1',
      'pod2-first',
      'pod2-second',
    ]);
  });

  it('ahead() counts the waiters a newcomer would stand behind', () => {
    const list = new RankedList<{ rank: Rank }>();
    for (const seq of [1, 2, 3]) list.insert({ rank: runWithPriority(seq, () => rankNow()) });
    assert.equal(list.ahead(runWithPriority(2, () => rankNow())), 2, 'behind 1 and the earlier 2');
    assert.equal(list.ahead(rankNow()), 0, 'unprioritized: before every pod');
    assert.equal(list.ahead(runWithPriority(99, () => rankNow(true))), 0, 'high: first');
    const a = rankNow();
    const b = rankNow();
    assert.ok(compareRank(a, b) < 0 && compareRank(b, a) > 0, 'FIFO among equals');
  });
});

describe('queues carry each key its own priority', () => {
  it('KeyedQueue runs every task of a key under that key’s admission sequence', async () => {
    const order = new AdmissionOrder();
    const q = new KeyedQueue({ around: (key, task) => order.run(key, task, () => true) });
    const seen: string[] = [];
    const task = (key: string) => async () => {
      await sleep(1);
      seen.push(`${key}=${currentPriority()}`);
    };
    // Enqueued from inside another key's task: the task still runs under its own key.
    await runWithPriority(42, () => Promise.all([q.run('ns/a', task('ns/a')), q.run('ns/b', task('ns/b'))]));
    await q.run('ns/a', task('ns/a'));
    assert.deepEqual(seen.sort(), ['ns/a=1', 'ns/a=1', 'ns/b=2']);
  });

  it('WorkQueue runs a key’s handler under the priority of the context that added it', async () => {
    const seen = new Map<string, number | undefined>();
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const q = new WorkQueue(
      async (key) => {
        if (key === 'first') await gate; // holds the only worker: the others are pumped later
        seen.set(key, currentPriority());
      },
      { concurrency: 1 },
    );
    runWithPriority(1, () => q.add('first'));
    runWithPriority(2, () => q.add('second'));
    q.add('none');
    runWithPriority(3, () => q.add('third'));
    q.add('third'); // a later add without a priority keeps the known one
    release();
    await q.idle();
    assert.deepEqual(Object.fromEntries(seen), { first: 1, second: 2, none: undefined, third: 3 });
  });
});
