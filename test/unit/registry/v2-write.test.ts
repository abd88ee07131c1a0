import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { zstdDecompressSync } from 'node:zlib';
import { fileLayout, SpoolBudget, type V2Blob, writeV2File } from '../../../src/registry/v2-write.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('registry/v2-write', () => {
  const MiB = 1024 * 1024;
  const dir = mkdtempSync(join(tmpdir(), 'vk-v2w-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  describe('fileLayout (registry.md §4.4: what cocoon-common v0.3.0 compresses and cuts)', () => {
    it('compresses files of at least 1 MiB when a level is set; smaller ones stay raw', () => {
      assert.deepEqual(fileLayout(MiB - 1, { zstdLevel: 3, chunkBytes: 0 }), {
        compress: false,
        ranges: [[0, MiB - 1]],
      });
      assert.deepEqual(fileLayout(MiB, { zstdLevel: 3, chunkBytes: 0 }), {
        compress: true,
        ranges: [[0, MiB]],
      });
    });

    it('cuts at fixed offsets a file that is compressed or larger than a chunk; the last chunk is the rest', () => {
      assert.deepEqual(fileLayout(5 * MiB + 3, { zstdLevel: 0, chunkBytes: 2 * MiB }), {
        compress: false,
        ranges: [
          [0, 2 * MiB],
          [2 * MiB, 4 * MiB],
          [4 * MiB, 5 * MiB + 3],
        ],
      });
      // Not compressed and within one chunk: one raw blob, as v1.
      assert.deepEqual(fileLayout(2 * MiB, { zstdLevel: 0, chunkBytes: 2 * MiB }), {
        compress: false,
        ranges: [[0, 2 * MiB]],
      });
      // Compressed and within one chunk: one blob (a file in one blob has no chunks list).
      assert.deepEqual(fileLayout(MiB, { zstdLevel: 1, chunkBytes: 2 * MiB }), {
        compress: true,
        ranges: [[0, MiB]],
      });
      assert.deepEqual(fileLayout(0, { zstdLevel: 1, chunkBytes: 1 }), { compress: false, ranges: [[0, 0]] });
    });
  });

  async function* pieces(b: Buffer, piece: number): AsyncIterable<Buffer> {
    for (let i = 0; i < b.length; i += piece) yield b.subarray(i, i + piece);
  }

  const data = Buffer.from(Array.from({ length: 3 * MiB + 4321 }, (_, i) => (i % 253) ^ (i >> 14)));
  let seq = 0;

  function write(
    bytes: Buffer,
    layout: ReturnType<typeof fileLayout>,
    budget = new SpoolBudget(64 * MiB),
    size = bytes.length,
  ) {
    const handed: V2Blob[] = [];
    let read = 0;
    const done = writeV2File(pieces(bytes, 100_000), {
      title: 'memory-ranges',
      size,
      mediaType: 'application/vnd.cocoonstack.vm.memory',
      layout,
      zstdLevel: 3,
      spoolFile: () => join(dir, String(seq++)),
      budget,
      signal: new AbortController().signal,
      onBytes: (n) => {
        read += n;
      },
      onBlob: (b) => handed.push(b),
    });
    return { done, handed, read: () => read };
  }

  describe('writeV2File', () => {
    it('compressed chunks: one zstd frame each, annotated, that decompress to the ranges in order', async () => {
      const w = write(data, fileLayout(data.length, { zstdLevel: 3, chunkBytes: MiB }));
      const blobs = await w.done;
      assert.equal(blobs.length, 4);
      assert.deepEqual(w.handed, blobs, 'each blob handed over as soon as it is spooled');
      assert.equal(w.read(), data.length);
      const back = Buffer.concat(
        blobs.map((b, k) => {
          assert.equal(b.mediaType, 'application/vnd.cocoonstack.vm.memory+zstd');
          assert.deepEqual(b.annotations, {
            'cocoonstack.chunk.index': String(k),
            'cocoonstack.chunk.count': '4',
          });
          const bytes = readFileSync(b.file);
          assert.equal(bytes.length, b.size);
          assert.ok(b.size < MiB / 2, 'compressed');
          return zstdDecompressSync(bytes);
        }),
      );
      assert.ok(back.equals(data));
    });

    it('raw chunks and one compressed blob', async () => {
      const raw = await write(data, fileLayout(data.length, { zstdLevel: 0, chunkBytes: 2 * MiB })).done;
      assert.deepEqual(
        raw.map((b) => [b.size, b.mediaType]),
        [
          [2 * MiB, 'application/vnd.cocoonstack.vm.memory'],
          [data.length - 2 * MiB, 'application/vnd.cocoonstack.vm.memory'],
        ],
      );
      assert.ok(Buffer.concat(raw.map((b) => readFileSync(b.file))).equals(data));
      const one = await write(data, fileLayout(data.length, { zstdLevel: 3, chunkBytes: 0 })).done;
      assert.equal(one.length, 1);
      assert.equal(one[0]!.annotations, undefined, 'one blob: no chunk annotations');
      assert.ok(zstdDecompressSync(readFileSync(one[0]!.file)).equals(data));
    });

    it('a file shorter than its header says fails', async () => {
      const w = write(data.subarray(0, 100), { compress: true, ranges: [[0, 200]] }, undefined, 200);
      await assert.rejects(w.done, /memory-ranges: 100 of 200 bytes/);
    });

    it('the spool budget: a new blob waits while the blobs not yet uploaded hold it', async () => {
      const budget = new SpoolBudget(1);
      const w = write(data, fileLayout(data.length, { zstdLevel: 3, chunkBytes: MiB }), budget);
      // Nothing uploads: the first blob is spooled, then the writer waits for room.
      const until = async (what: string, ok: () => boolean) => {
        for (let i = 0; i < 100_000 && !ok(); i++) await new Promise((r) => setImmediate(r));
        assert.ok(ok(), what);
      };
      await until('the writer waits for room', () => budget.waiting === 1);
      assert.equal(w.handed.length, 1, 'one blob, then a wait');
      assert.equal(budget.held, w.handed[0]!.size);
      // Each release ("uploaded") lets the next one through.
      for (let k = 1; k < 4; k++) {
        budget.release(w.handed[k - 1]!.size);
        await until(`blob ${k}`, () => w.handed.length === k + 1);
      }
      assert.equal((await w.done).length, 4);
    });
  });
});
