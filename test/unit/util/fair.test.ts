// The fair pool (src/util/fair.ts) with fake tasks: namespaces are served in turn, none holds
// more than its cap while the slots it holds are busy, calls without a namespace go first,
// ranks order a namespace's own calls, and aborted waiters leave at once.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { FairSlots, runAsTenant, tenantCap } from '../../../src/util/fair.ts';
import { rankNow, runWithPriority } from '../../../src/util/priority.ts';

/** A fake task: asks for a slot as `tenant`, records its name when granted, and holds the slot
 * until `finish()` (or at once with `quick`). */
function task(pool: FairSlots, order: string[], tenant: string | undefined, name: string, quick = true) {
  let release: () => void = () => {};
  const granted = pool.acquire(rankNow(), tenant).then((r) => {
    order.push(name);
    release = r;
    if (quick) r();
  });
  return { granted, finish: () => release() };
}

const flush = () => new Promise((r) => setImmediate(r));

describe('FairSlots', () => {
  test('tenantCap keeps a quarter of the pool (at least one slot) for others; a pool of one is all one', () => {
    assert.deepEqual([1, 2, 4, 8, 24].map(tenantCap), [1, 1, 3, 6, 18]);
  });

  test('a namespace holding its cap with slow calls cannot take the rest: another namespace starts at once', async () => {
    const pool = new FairSlots(8);
    const order: string[] = [];
    const slow = Array.from({ length: 64 }, (_, i) => task(pool, order, 'a', `a${i}`, false));
    await flush();
    assert.equal(pool.heldBy('a'), 6, 'a holds its cap (8 - 2)');
    assert.equal(pool.waiting, 58);
    const b = Array.from({ length: 20 }, (_, i) => task(pool, order, 'b', `b${i}`));
    await Promise.all(b.map((x) => x.granted));
    assert.deepEqual(
      order.filter((n) => n.startsWith('b')),
      Array.from({ length: 20 }, (_, i) => `b${i}`),
      'all 20 of b ran while a’s 6 slow calls still hold their slots',
    );
    assert.equal(pool.heldBy('a'), 6);
    for (const s of slow) s.finish();
  });

  test('waiting namespaces are served in turn, one grant each', async () => {
    const pool = new FairSlots(1);
    const order: string[] = [];
    const holder = await pool.acquire(rankNow(), undefined);
    const all = [
      ...['a1', 'a2', 'a3', 'a4'].map((n) => task(pool, order, 'a', n)),
      ...['b1', 'b2'].map((n) => task(pool, order, 'b', n)),
      ...['c1'].map((n) => task(pool, order, 'c', n)),
    ];
    holder();
    await Promise.all(all.map((x) => x.granted));
    assert.deepEqual(order, ['a1', 'b1', 'c1', 'a2', 'b2', 'a3', 'a4']);
  });

  test('calls without a namespace are served first', async () => {
    const pool = new FairSlots(1);
    const order: string[] = [];
    const holder = await pool.acquire(rankNow(), 'a');
    const all = [
      task(pool, order, 'a', 'a1'),
      task(pool, order, 'b', 'b1'),
      task(pool, order, undefined, 'health'),
    ];
    holder();
    await Promise.all(all.map((x) => x.granted));
    assert.deepEqual(order, ['health', 'a1', 'b1']);
  });

  test('within a namespace: high first, then admission order', async () => {
    const pool = new FairSlots(1);
    const order: string[] = [];
    const holder = await pool.acquire(rankNow(), undefined);
    const ask = (seq: number, name: string, high = false) =>
      runWithPriority(seq, () => pool.acquire(rankNow(high), 'a')).then((r) => {
        order.push(name);
        r();
      });
    const all = [ask(3, 'pod3'), ask(1, 'pod1'), ask(2, 'pod2-inspect', true)];
    holder();
    await Promise.all(all);
    assert.deepEqual(order, ['pod2-inspect', 'pod1', 'pod3']);
  });

  test('an aborted waiter leaves at once; its namespace leaves the turn when it has no more', async () => {
    const pool = new FairSlots(1);
    const order: string[] = [];
    const holder = await pool.acquire(rankNow(), undefined);
    const ac = new AbortController();
    const gone = pool.acquire(rankNow(), 'a', ac.signal);
    const b = task(pool, order, 'b', 'b1');
    ac.abort(new Error('pod deleted'));
    await assert.rejects(gone, /pod deleted/);
    assert.equal(pool.waiting, 1);
    holder();
    await b.granted;
    assert.deepEqual(order, ['b1']);
    assert.equal(pool.waiting, 0);
  });

  test('the tenant travels with the async context (runAsTenant)', async () => {
    const pool = new FairSlots(4);
    const held: (() => void)[] = [];
    await runAsTenant('a', async () => {
      // What the runner does: the tenant of the current context.
      const { currentTenant } = await import('../../../src/util/fair.ts');
      for (let i = 0; i < 3; i++) held.push(await pool.acquire(rankNow(), currentTenant()));
    });
    assert.equal(pool.heldBy('a'), 3);
    for (const r of held) r();
    assert.equal(pool.heldBy('a'), 0);
  });
});
