// The pull's read-ahead buffer (src/registry/read-ahead.ts SpillBlob, docs/registry.md "Pull flow"
// step 5): a small window in memory, older bytes spilled to a file while the blob waits for its
// turn, no spilling (backpressure instead) once the tar writer reads it, bytes always in order,
// and the spill file removed however it ends.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { SpillBlob } from '../../../src/registry/read-ahead.ts';

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
});
