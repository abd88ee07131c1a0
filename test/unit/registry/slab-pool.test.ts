import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MAX_IDLE_SLABS, SLAB_BYTES, SlabPool } from '../../../src/registry/slab-pool.ts';

describe('SlabPool (reused read buffers, slab-pool.ts)', () => {
  it('a slab is read into again only once it is retired and every piece of it has come back', () => {
    const pool = new SlabPool();
    pool.open();
    const slab = pool.take();
    assert.equal(slab.buf.length, SLAB_BYTES);
    const a = pool.own(slab.buf.subarray(0, 10), slab);
    const b = pool.own(slab.buf.subarray(10, 20), slab);
    pool.retire(slab);
    pool.release(a);
    assert.notEqual(pool.take(), slab, 'one piece is still out');
    pool.release(b);
    assert.equal(pool.take(), slab);
    assert.deepEqual([pool.made, pool.reused], [2, 1]);
  });

  it('a slab still being read into is not reused, however many pieces came back', () => {
    const pool = new SlabPool();
    pool.open();
    const slab = pool.take();
    pool.release(pool.own(slab.buf.subarray(0, 5), slab));
    assert.notEqual(pool.take(), slab);
  });

  it('a taken slab starts empty', () => {
    const pool = new SlabPool();
    pool.open();
    const slab = pool.take();
    slab.used = 4096;
    pool.retire(slab);
    const again = pool.take();
    assert.equal(again, slab);
    assert.deepEqual([again.used, again.out, again.retired], [0, 0, false]);
  });

  it('a piece released twice, and a buffer that is no piece, change nothing', () => {
    const pool = new SlabPool();
    pool.open();
    const slab = pool.take();
    const a = pool.own(slab.buf.subarray(0, 10), slab);
    pool.own(slab.buf.subarray(10, 20), slab);
    pool.retire(slab);
    pool.release(a);
    pool.release(a);
    pool.release(Buffer.alloc(10));
    pool.release(slab.buf.subarray(0, 10)); // the same bytes, another view: not a piece handed out
    assert.equal(slab.out, 1);
    assert.notEqual(pool.take(), slab);
  });

  it('idle slabs are kept only while a read is open, and at most MAX_IDLE_SLABS', () => {
    const pool = new SlabPool();
    pool.open();
    const slabs = Array.from({ length: MAX_IDLE_SLABS + 3 }, () => pool.take());
    for (const s of slabs) pool.retire(s);
    const kept = new Set(slabs);
    for (let i = 0; i < MAX_IDLE_SLABS; i++) assert.ok(kept.has(pool.take()), `idle slab ${i}`);
    assert.ok(!kept.has(pool.take()), 'no more than the cap was kept');

    const quiet = new SlabPool();
    quiet.open();
    const s = quiet.take();
    quiet.close();
    quiet.retire(s);
    quiet.open();
    assert.notEqual(quiet.take(), s, 'retired with no read open: dropped');

    const closing = new SlabPool();
    closing.open();
    const t = closing.take();
    closing.retire(t);
    closing.close();
    closing.open();
    assert.notEqual(closing.take(), t, 'the last read closing drops the idle slabs');
  });
});
