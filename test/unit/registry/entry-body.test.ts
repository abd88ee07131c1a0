import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { describe, it } from 'node:test';
import { constants, createZstdCompress, zstdCompressSync } from 'node:zlib';
import { EntryBodyError, entryBody, unzstd } from '../../../src/registry/entry-body.ts';
import type { TarLayerEntry } from '../../../src/registry/import-plan.ts';

const digest = (n: number) => `sha256:${n.toString(16).padStart(64, '0')}`;

/** A file's bytes: distinct per offset, so a reordering shows. */
const file = (size: number) =>
  Buffer.from(Array.from({ length: size }, (_, i) => (i * 7 + (i >> 10)) & 0xff));

async function* pieces(b: Buffer, piece = 4096): AsyncIterable<Buffer> {
  for (let i = 0; i < b.length; i += piece) yield b.subarray(i, i + piece);
}

/** An entry of `blobs` (zstd or raw) and a `take` serving them; the whole body collected. */
async function read(name: string, size: number, blobs: { bytes: Buffer; zstd: boolean }[]): Promise<Buffer> {
  const entry: TarLayerEntry = {
    name,
    size,
    mode: 0o640,
    parts: blobs.map((b, i) => ({
      zstd: b.zstd,
      layer: { mediaType: 'x', digest: digest(i + 1), size: b.bytes.length, annotations: {}, title: name },
    })),
  };
  const out: Buffer[] = [];
  for await (const c of entryBody(entry, (k) => pieces(blobs[k]!.bytes))) out.push(c);
  return Buffer.concat(out);
}

describe('entryBody (registry.md §4.4: chunks decompressed and concatenated in order)', () => {
  const CHUNK = 64 * 1024;
  const data = file(3 * CHUNK + 1234);
  const chunks = [0, 1, 2, 3].map((k) => data.subarray(k * CHUNK, (k + 1) * CHUNK));
  const z = chunks.map((c) => ({ bytes: zstdCompressSync(c), zstd: true }));

  it('chunked and compressed: the file again; one raw blob: its bytes', async () => {
    assert.ok((await read('memory-ranges', data.length, z)).equals(data));
    assert.ok((await read('state.json', data.length, [{ bytes: data, zstd: false }])).equals(data));
    assert.ok(
      (await read('m', data.length, [{ bytes: zstdCompressSync(data), zstd: true }])).equals(data),
      'one frame, no chunks',
    );
  });

  it('a truncated zstd chunk names the file and the chunk', async () => {
    const cut = [...z];
    cut[1] = { bytes: z[1]!.bytes.subarray(0, z[1]!.bytes.length - 9), zstd: true };
    await assert.rejects(read('memory-ranges', data.length, cut), (e: Error) => {
      assert.ok(e instanceof EntryBodyError);
      assert.match(e.message, /^memory-ranges chunk 1 \(sha256:0+2\): the zstd stream is truncated$/);
      return true;
    });
  });

  it('a chunk that is not zstd at all', async () => {
    const bad = [...z];
    bad[2] = { bytes: Buffer.from('this is not a zstd frame'), zstd: true };
    await assert.rejects(
      read('memory-ranges', data.length, bad),
      /chunk 2 \(sha256:0+3\): not a valid zstd stream/,
    );
  });

  it('chunks in the wrong order: the short last chunk where a full one belongs', async () => {
    await assert.rejects(
      read('memory-ranges', data.length, [z[0]!, z[3]!, z[1]!, z[2]!]),
      /chunk 1 \(sha256:0+2\): 1234 bytes where the chunks before it hold 65536: the chunks are out of order/,
    );
  });

  it('a file shorter or longer than the config says', async () => {
    await assert.rejects(
      read('memory-ranges', data.length + 1, z),
      /memory-ranges: 197842 bytes where the config says 197843/,
    );
    await assert.rejects(read('memory-ranges', data.length - 1, z), /more bytes than the file's size 197841/);
  });

  it('unzstd: several frames in one stream decode back to back', async () => {
    const out: Buffer[] = [];
    for await (const c of unzstd(pieces(Buffer.concat([z[0]!.bytes, z[1]!.bytes]), 100))) out.push(c);
    assert.ok(Buffer.concat(out).equals(data.subarray(0, 2 * CHUNK)));
  });

  it('unzstd: every input chunk is handed back (recycle) once the decompressor took it, frame cuts included', async () => {
    const stream = Buffer.concat([z[0]!.bytes, z[1]!.bytes]);
    const chunks = [
      ...(function* () {
        for (let i = 0; i < stream.length; i += 1000) yield stream.subarray(i, i + 1000);
      })(),
    ];
    const back: Buffer[] = [];
    async function* source() {
      for (const [i, c] of chunks.entries()) {
        // A chunk is handed back only after it was read from the source: never before.
        assert.ok(back.length <= i, `chunk ${back.length} back before chunk ${i} was read`);
        yield c;
      }
    }
    const out: Buffer[] = [];
    for await (const c of unzstd(source(), (chunk) => back.push(chunk))) out.push(c);
    assert.ok(Buffer.concat(out).equals(data.subarray(0, 2 * CHUNK)));
    assert.equal(back.length, chunks.length);
    assert.ok(
      back.every((c, i) => c === chunks[i]),
      'the very chunks, in order',
    );
  });

  describe('unzstd: frames of any size back to back (Node ends its zstd stream after a frame whose output does not fill its buffer)', () => {
    /** A frame of `data` written as a stream: no content size, a window descriptor, a checksum. */
    async function streamedFrame(data: Buffer): Promise<Buffer> {
      const z = createZstdCompress({ params: { [constants.ZSTD_c_checksumFlag]: 1 } });
      const out: Buffer[] = [];
      z.on('data', (c: Buffer) => out.push(c));
      z.end(data);
      await once(z, 'end');
      return Buffer.concat(out);
    }
    const skippable = (n: number) => {
      const b = randomBytes(8 + n);
      b.writeUInt32LE(0x184d2a53, 0);
      b.writeUInt32LE(n, 4);
      return b;
    };
    async function decode(stream: Buffer, piece: number): Promise<Buffer> {
      const out: Buffer[] = [];
      for await (const c of unzstd(pieces(stream, piece))) out.push(c);
      return Buffer.concat(out);
    }

    it('raw, RLE and compressed blocks; with and without content size and checksum; a skippable frame between', async () => {
      const parts = [
        randomBytes(1000),
        Buffer.alloc(300_000, 7),
        file(2000),
        randomBytes(66_770),
        file(200_001),
        Buffer.alloc(0),
        randomBytes(20_000),
      ];
      const frames = [
        zstdCompressSync(parts[0]!),
        await streamedFrame(parts[1]!),
        zstdCompressSync(parts[2]!, { params: { [constants.ZSTD_c_checksumFlag]: 1 } }),
        skippable(10),
        zstdCompressSync(parts[3]!),
        await streamedFrame(parts[4]!),
        zstdCompressSync(parts[5]!),
        skippable(0),
        zstdCompressSync(parts[6]!, { params: { [constants.ZSTD_c_compressionLevel]: 19 } }),
      ];
      const stream = Buffer.concat(frames);
      const want = Buffer.concat(parts);
      for (const piece of [13, 4096, 65_536, stream.length]) {
        const got = await decode(stream, piece);
        assert.equal(got.length, want.length, `pieces of ${piece}`);
        assert.ok(got.equals(want), `pieces of ${piece}`);
      }
    });

    it('the second frame cut short: truncated; bytes after a frame that are not one: not zstd; nothing: truncated', async () => {
      const a = zstdCompressSync(randomBytes(5000));
      const b = zstdCompressSync(randomBytes(70_000));
      await assert.rejects(decode(Buffer.concat([a, b.subarray(0, b.length - 10)]), 4096), {
        code: 'Z_BUF_ERROR',
      });
      await assert.rejects(
        decode(Buffer.concat([a, Buffer.from('not a zstd frame at all')]), 4096),
        (e: Error) => /Unknown frame descriptor/.test(e.message),
      );
      await assert.rejects(decode(Buffer.alloc(0), 4096), { code: 'Z_BUF_ERROR' });
    });
  });
});
