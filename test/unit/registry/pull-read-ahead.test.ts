// The pull's read-ahead buffer (src/registry/read-ahead.ts SpillBlob, docs/registry.md "Pull flow"
// step 5): a small window in memory, older bytes spilled to a file while the blob waits for its
// turn, no spilling (backpressure instead) once the tar writer reads it, bytes always in order,
// and the spill file removed however it ends.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { READ_AHEAD_PARK_MS, ReadAhead, SpillBlob, SpillGate } from '../../../src/registry/read-ahead.ts';

const KiB = 1024;

describe('SpillBlob (pull read-ahead)', () => {
  let dir: string;
  let seq = 0;
  const made: string[] = [];
  const spillFile = async () => {
    const p = path.join(dir, `spill-${seq++}`);
    made.push(p);
    return p;
  };

  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-spill-'));
  });
  after(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  async function collect(blob: SpillBlob, counted: number[] = []): Promise<Buffer> {
    const out: Buffer[] = [];
    for await (const piece of blob.drain((n) => counted.push(n))) out.push(Buffer.from(piece));
    return Buffer.concat(out);
  }

  it('waiting for its turn: at most the window (plus a chunk) in memory, the rest in a file; read back in order; file removed', async () => {
    const window = 256 * KiB;
    const blob = new SpillBlob({ window, spillFile });
    const chunks = Array.from({ length: 40 }, (_, i) => randomBytes(50 * KiB + i * 997));
    for (const c of chunks) {
      await blob.push(c);
      assert.ok(blob.memoryBytes <= window + c.length, `${blob.memoryBytes} in memory`);
    }
    blob.end();
    const all = Buffer.concat(chunks);
    assert.ok(blob.spilledBytes >= all.length - window - 70 * KiB, `${blob.spilledBytes} spilled`);
    const spill = made.at(-1)!;
    assert.ok(fs.existsSync(spill));
    const counted: number[] = [];
    assert.deepEqual(await collect(blob, counted), all);
    assert.equal(
      counted.reduce((a, b) => a + b, 0),
      all.length,
      'every byte counted once (the read-ahead budget)',
    );
    assert.equal(fs.existsSync(spill), false, 'spill file removed after the read');
  });

  it('being read (the head): nothing spills, each chunk waits until the reader has taken what is held', async () => {
    const window = 100 * KiB;
    const blob = new SpillBlob({ window, spillFile });
    const reader = blob.drain(() => {})[Symbol.asyncIterator]();
    const first = reader.next(); // the reader is on, waiting
    await blob.push(randomBytes(60 * KiB)); // taken at once
    assert.equal((await first).value.length, 60 * KiB);
    let resolved = false;
    const blocked = blob.push(randomBytes(60 * KiB)).then(() => {
      resolved = true;
    });
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(resolved, false, 'under the window, but the reader has not taken it: the producer waits');
    assert.equal(blob.spilledBytes, 0);
    assert.equal(blob.memoryBytes, 60 * KiB);
    assert.equal((await reader.next()).value.length, 60 * KiB);
    await blocked;
    blob.end();
    assert.equal((await reader.next()).done, true);
  });

  it('a blob that turns head with its window full: the window drains first, then one chunk at a time', async () => {
    const blob = new SpillBlob({ window: 200 * KiB, spillFile });
    const chunks = Array.from({ length: 3 }, () => randomBytes(60 * KiB));
    for (const c of chunks) await blob.push(c); // 180 KiB held, nothing spilled
    assert.equal(blob.spilledBytes, 0);
    const reader = blob.drain(() => {})[Symbol.asyncIterator]();
    const firstRead = reader.next(); // the reader is on: nothing spills from here
    let resolved = false;
    const late = randomBytes(60 * KiB);
    const blocked = blob.push(late).then(() => {
      resolved = true;
    });
    assert.deepEqual((await firstRead).value, chunks[0]);
    for (const c of chunks.slice(1)) {
      assert.deepEqual((await reader.next()).value, c);
      assert.equal(resolved, false, 'the late chunk waits until the window has drained');
    }
    assert.deepEqual((await reader.next()).value, late);
    await blocked;
    assert.equal(blob.spilledBytes, 0);
    blob.end();
    assert.equal((await reader.next()).done, true);
  });

  it('spilling while it is being read: bytes stay in order across file, batch and memory', async () => {
    for (let round = 0; round < 5; round++) {
      const window = (16 + round * 40) * KiB;
      const blob = new SpillBlob({ window, spillFile });
      const chunks = Array.from({ length: 60 }, () => randomBytes(1 + Math.floor(Math.random() * 64 * KiB)));
      const producing = (async () => {
        for (const [i, c] of chunks.entries()) {
          await blob.push(c);
          if (i % 7 === 0) await new Promise((r) => setImmediate(r));
        }
        blob.end();
      })();
      // Start reading part-way through, while batches are being written.
      await new Promise((r) => setTimeout(r, round));
      const got = await collect(blob);
      await producing;
      assert.deepEqual(got, Buffer.concat(chunks), `round ${round}`);
    }
  });

  it('a failed download: the bytes before it, then the error; close() drops the spill file', async () => {
    const blob = new SpillBlob({ window: 10 * KiB, spillFile });
    const data = randomBytes(64 * KiB);
    await blob.push(data);
    blob.end(new Error('digest mismatch'));
    const got: Buffer[] = [];
    await assert.rejects(
      (async () => {
        for await (const piece of blob.drain(() => {})) got.push(Buffer.from(piece));
      })(),
      /digest mismatch/,
    );
    assert.deepEqual(Buffer.concat(got), data);

    const dropped = new SpillBlob({ window: 10 * KiB, spillFile });
    await dropped.push(randomBytes(64 * KiB));
    const spill = made.at(-1)!;
    assert.ok(fs.existsSync(spill));
    await dropped.close();
    assert.equal(fs.existsSync(spill), false);
    await assert.rejects(dropped.push(Buffer.from('late')), /closed/);
  });

  it('a spill that cannot be written fails the download', async () => {
    const blob = new SpillBlob({
      window: 10 * KiB,
      spillFile: async () => path.join(dir, 'no-such-dir', 'spill'),
    });
    await assert.rejects(blob.push(randomBytes(64 * KiB)), /read-ahead spill: .*ENOENT/);
  });

  describe('with a SpillGate: bytes past the window spill only while the tar writer starves', () => {
    const turns = async (n = 5) => {
      for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
    };

    it('the writer busy: a download past its window waits and spills nothing; the writer starving lets it spill', async () => {
      const gate = new SpillGate();
      const blob = new SpillBlob({ window: 64 * KiB, spillFile, gate });
      const chunks = [randomBytes(60 * KiB), randomBytes(60 * KiB), randomBytes(60 * KiB)];
      await blob.push(chunks[0]!);
      let pushed = false;
      const second = blob.push(chunks[1]!).then(() => {
        pushed = true;
      });
      await turns();
      assert.equal(pushed, false, 'past the window while the writer is busy: the download waits');
      assert.equal(blob.spilledBytes, 0);
      gate.starve(true);
      await second;
      assert.ok(blob.spilledBytes > 0, 'the writer starves: the window spills');
      await blob.push(chunks[2]!); // still starved: spills without waiting
      blob.end();
      gate.starve(false);
      assert.deepEqual(await collect(blob), Buffer.concat(chunks));
    });

    it('its turn coming wakes it: the reader takes the window, nothing spills', async () => {
      const gate = new SpillGate();
      const blob = new SpillBlob({ window: 64 * KiB, spillFile, gate });
      const chunks = [randomBytes(60 * KiB), randomBytes(60 * KiB)];
      await blob.push(chunks[0]!);
      const second = blob.push(chunks[1]!);
      await turns();
      const reading = collect(blob);
      await second;
      blob.end();
      assert.deepEqual(await reading, Buffer.concat(chunks));
      assert.equal(blob.spilledBytes, 0);
    });

    it('the reader waiting for bytes starves the gate, and bytes arriving end it', async () => {
      const gate = new SpillGate();
      const blob = new SpillBlob({ window: 64 * KiB, spillFile, gate });
      const reader = blob.drain(() => {})[Symbol.asyncIterator]();
      const first = reader.next();
      await turns();
      assert.equal(gate.starved, true);
      await blob.push(randomBytes(10));
      await first;
      assert.equal(gate.starved, false);
      blob.end();
      assert.equal((await reader.next()).done, true);
    });

    it(`after ${READ_AHEAD_PARK_MS} ms at its window the download spills freely, the writer busy or not`, async (t) => {
      t.mock.timers.enable({ apis: ['setTimeout'] });
      const gate = new SpillGate();
      const blob = new SpillBlob({ window: 64 * KiB, spillFile, gate });
      const chunks = Array.from({ length: 4 }, () => randomBytes(60 * KiB));
      await blob.push(chunks[0]!);
      let pushed = false;
      const second = blob.push(chunks[1]!).then(() => {
        pushed = true;
      });
      await turns();
      t.mock.timers.tick(READ_AHEAD_PARK_MS - 1);
      await turns();
      assert.equal(pushed, false);
      t.mock.timers.tick(1);
      await second;
      for (const c of chunks.slice(2)) await blob.push(c); // no more waiting, no timer
      assert.ok(blob.spilledBytes >= 3 * 60 * KiB - 64 * KiB, `${blob.spilledBytes} spilled`);
      blob.end();
      assert.deepEqual(await collect(blob), Buffer.concat(chunks));
    });

    it('ReadAhead: a download ahead spills while the writer waits for the head, and waits while the writer is busy', async () => {
      const spills: string[] = [];
      const streams = [new PassThrough(), new PassThrough()];
      const part = (size: number, n: number) => ({
        zstd: false,
        layer: {
          mediaType: 'x',
          digest: `sha256:${String(n).repeat(64)}`,
          size,
          annotations: {},
          title: `f${n}`,
        },
      });
      const readAhead = new ReadAhead({
        blobs: [part(20, 1), part(400 * KiB, 2)],
        fetch: async (p) => streams[p.layer.title === 'f1' ? 0 : 1]!,
        budgetBytes: 1024 * KiB,
        concurrency: 2,
        windowBytes: 64 * KiB,
        spillFile: async () => {
          const f = await spillFile();
          spills.push(f);
          return f;
        },
        onError: (e) => assert.fail(String(e)),
        progress: { downloaded: () => {} },
      });
      const head = readAhead.take(0)[Symbol.asyncIterator]();
      // The head has bytes waiting and the writer has not asked: it is busy. The blob ahead fills
      // its window and waits.
      streams[0]!.write(Buffer.alloc(10, 1));
      const first = await head.next();
      assert.equal(first.value.length, 10);
      streams[1]!.write(randomBytes(200 * KiB));
      await turns();
      assert.equal(spills.length, 0, 'the writer is busy: nothing spills');
      // The writer asks for the head's next bytes and none are there: it starves; the blob spills.
      const second = head.next();
      for (let i = 0; i < 50 && spills.length === 0; i++) await turns();
      assert.equal(spills.length, 1, 'the writer starves: the blob ahead spills');
      streams[0]!.end(Buffer.alloc(10, 2));
      assert.equal((await second).value.length, 10);
      assert.equal((await head.next()).done, true);
      streams[1]!.end(randomBytes(200 * KiB));
      let got = 0;
      for await (const piece of readAhead.take(1)) got += piece.length;
      assert.equal(got, 400 * KiB);
      await readAhead.dispose();
    });
  });
});
