import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import zlib from 'node:zlib';
import fc from 'fast-check';
import {
  decodeHeaderBlock,
  encodeFrame,
  encodeHeaderBlock,
  FrameParser,
  headerValue,
  SPDY3_DICTIONARY,
  type SpdyFrame,
  SpdyProtocolError,
} from '../../../src/kubelet/streams/spdy-frames.ts';
import { HeaderCompressor, HeaderDecompressor } from '../../../src/kubelet/streams/spdy-zlib.ts';

const u31 = fc.integer({ min: 0, max: 0x7fffffff });
const u32 = fc.integer({ min: 0, max: 0xffffffff });
const u8 = fc.integer({ min: 0, max: 0xff });
const bytes = (max = 300) => fc.uint8Array({ maxLength: max }).map((a) => Buffer.from(a));

const frameArb: fc.Arbitrary<SpdyFrame> = fc.oneof(
  fc.record({ type: fc.constant('DATA' as const), streamId: u31, flags: u8, data: bytes(2000) }),
  fc.record({
    type: fc.constant('SYN_STREAM' as const),
    flags: u8,
    streamId: u31,
    associatedStreamId: u31,
    priority: fc.integer({ min: 0, max: 7 }),
    slot: u8,
    headerBlock: bytes(),
  }),
  fc.record({ type: fc.constant('SYN_REPLY' as const), flags: u8, streamId: u31, headerBlock: bytes() }),
  fc.record({ type: fc.constant('HEADERS' as const), flags: u8, streamId: u31, headerBlock: bytes() }),
  fc.record({ type: fc.constant('RST_STREAM' as const), flags: u8, streamId: u31, status: u32 }),
  fc.record({
    type: fc.constant('SETTINGS' as const),
    flags: u8,
    entries: fc.array(fc.record({ flags: u8, id: fc.integer({ min: 0, max: 0xffffff }), value: u32 }), {
      maxLength: 8,
    }),
  }),
  fc.record({ type: fc.constant('PING' as const), flags: u8, id: u32 }),
  fc.record({ type: fc.constant('GOAWAY' as const), flags: u8, lastGoodStreamId: u31, status: u32 }),
  fc.record({ type: fc.constant('WINDOW_UPDATE' as const), flags: u8, streamId: u31, deltaWindowSize: u31 }),
  fc.record({
    type: fc.constant('UNKNOWN' as const),
    version: fc.integer({ min: 0, max: 0x7fff }),
    controlType: fc.integer({ min: 10, max: 0xffff }),
    flags: u8,
    payload: bytes(),
  }),
);

/** Splits a buffer at the given (sorted, de-duplicated) cut points. */
function split(buf: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let prev = 0;
  for (const p of points) {
    out.push(buf.subarray(prev, p));
    prev = p;
  }
  out.push(buf.subarray(prev));
  return out;
}

function normalise(f: SpdyFrame): unknown {
  // Buffers compare by content; version-3 UNKNOWN frames of known types would decode as those types.
  return JSON.parse(JSON.stringify(f));
}

describe('SPDY frame codec', () => {
  it('round-trips random frame sequences across random chunk boundaries', () => {
    fc.assert(
      fc.property(
        fc
          .array(frameArb, { minLength: 1, maxLength: 12 })
          .map((fs) => fs.filter((f) => f.type !== 'UNKNOWN' || f.version !== 3)),
        fc.array(fc.nat(), { maxLength: 20 }),
        (frames, cuts) => {
          const wire = Buffer.concat(frames.map(encodeFrame));
          const parser = new FrameParser();
          const got = split(wire, cuts).flatMap((c) => parser.push(c));
          assert.deepEqual(got.map(normalise), frames.map(normalise));
          assert.equal(parser.pendingBytes, 0);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('parses byte by byte', () => {
    const frames: SpdyFrame[] = [
      { type: 'PING', flags: 0, id: 7 },
      { type: 'DATA', streamId: 3, flags: 1, data: Buffer.from('hello') },
      { type: 'WINDOW_UPDATE', flags: 0, streamId: 0, deltaWindowSize: 1234 },
    ];
    const wire = Buffer.concat(frames.map(encodeFrame));
    const parser = new FrameParser();
    const got: SpdyFrame[] = [];
    for (let i = 0; i < wire.length; i++) got.push(...parser.push(wire.subarray(i, i + 1)));
    assert.deepEqual(got.map(normalise), frames.map(normalise));
  });

  it('matches the SPDY/3 wire layout', () => {
    assert.deepEqual(
      encodeFrame({ type: 'PING', flags: 0, id: 1 }),
      Buffer.from('800300060000000400000001', 'hex'),
    );
    assert.deepEqual(
      encodeFrame({ type: 'DATA', streamId: 5, flags: 1, data: Buffer.from('ab') }),
      Buffer.from('0000000501000002' + '6162', 'hex'),
    );
    assert.deepEqual(
      encodeFrame({ type: 'RST_STREAM', flags: 0, streamId: 3, status: 5 }),
      Buffer.from('80030003000000080000000300000005', 'hex'),
    );
    assert.deepEqual(
      encodeFrame({ type: 'WINDOW_UPDATE', flags: 0, streamId: 1, deltaWindowSize: 65536 }),
      Buffer.from('80030009000000080000000100010000', 'hex'),
    );
    const syn = encodeFrame({
      type: 'SYN_STREAM',
      flags: 1,
      streamId: 1,
      associatedStreamId: 0,
      priority: 7,
      slot: 0,
      headerBlock: Buffer.from('xyz'),
    });
    assert.equal(syn.toString('hex'), '800300010100000d' + '00000001' + '00000000' + 'e000' + '78797a');
  });

  it('rejects truncated fixed-size control frames and oversize frames', () => {
    const shortRst = Buffer.from('800300030000000400000001', 'hex');
    assert.throws(() => new FrameParser().push(shortRst), SpdyProtocolError);
    const badSettings = Buffer.from('800300040000000800000005' + '00000000', 'hex');
    assert.throws(() => new FrameParser().push(badSettings), SpdyProtocolError);
    const big = encodeFrame({ type: 'DATA', streamId: 1, flags: 0, data: Buffer.alloc(100) });
    assert.throws(() => new FrameParser({ maxFramePayload: 99 }).push(big), SpdyProtocolError);
  });

  it('accepts trailing bytes in fixed-size frames and unknown control types', () => {
    const rst = Buffer.from('800300030000000c' + '00000001' + '00000005' + 'ffffffff', 'hex');
    const [f] = new FrameParser().push(rst);
    assert.deepEqual(f, { type: 'RST_STREAM', flags: 0, streamId: 1, status: 5 });
    const credential = Buffer.from('8003000a00000002abcd', 'hex');
    const [u] = new FrameParser().push(credential);
    assert.equal(u?.type, 'UNKNOWN');
  });
});

describe('SPDY header blocks', () => {
  it('round-trips lower-cased names and multi-values', () => {
    const name = fc.stringMatching(/^[a-z][a-z0-9-]{0,20}$/);
    const value = fc.string({ maxLength: 40 }).filter((s) => !s.includes('\0') && /^[\x20-\xff]*$/.test(s));
    fc.assert(
      fc.property(
        fc.dictionary(name, fc.array(value, { minLength: 1, maxLength: 3 }), {
          maxKeys: 8,
          noNullPrototype: true,
        }),
        (h) => {
          const decoded = decodeHeaderBlock(encodeHeaderBlock(h));
          assert.deepEqual(Object.fromEntries(decoded), h);
        },
      ),
    );
  });

  it('lower-cases names on the way out and on the way in', () => {
    const block = encodeHeaderBlock({ StreamType: 'error' });
    assert.ok(block.includes(Buffer.from('streamtype')));
    const decoded = decodeHeaderBlock(block);
    assert.equal(headerValue(decoded, 'streamType'), 'error');
    // A peer that sends upper-case names is still understood.
    const raw = Buffer.from(
      '00000001' +
        '0000000a' +
        Buffer.from('StreamType').toString('hex') +
        '00000005' +
        Buffer.from('stdin').toString('hex'),
      'hex',
    );
    assert.equal(headerValue(decodeHeaderBlock(raw), 'streamtype'), 'stdin');
  });

  it('rejects truncated blocks and oversize counts', () => {
    assert.throws(() => decodeHeaderBlock(Buffer.from('0000000100000005616263', 'hex')), SpdyProtocolError);
    assert.throws(() => decodeHeaderBlock(Buffer.from('000003e9', 'hex')), SpdyProtocolError);
  });
});

describe('SPDY header compression', () => {
  it('uses the 1423-byte SPDY/3 dictionary (zlib dictid 0xe3c6a7c2)', async () => {
    assert.equal(SPDY3_DICTIONARY.length, 1423);
    assert.ok(SPDY3_DICTIONARY.subarray(0, 11).equals(Buffer.from('\x00\x00\x00\x07options', 'latin1')));
    assert.ok(SPDY3_DICTIONARY.toString('latin1').endsWith(',*,enq=0.'));
    const c = new HeaderCompressor();
    const first = await c.compress(encodeHeaderBlock({ streamtype: 'error' }));
    c.close();
    assert.equal(first[0], 0x78);
    assert.equal(first[1]! & 0x20, 0x20, 'FDICT set');
    assert.equal(first.readUInt32BE(2), 0xe3c6a7c2);
  });

  it('shares one zlib context across header blocks in each direction', async () => {
    const blocks = ['error', 'stdin', 'stdout', 'stderr', 'resize', 'stdout'].map((t) =>
      encodeHeaderBlock({ streamtype: t, 'x-extra': ['a', 'b'] }),
    );
    const c = new HeaderCompressor();
    const d = new HeaderDecompressor();
    const compressed: Buffer[] = [];
    for (const b of blocks) compressed.push(await c.compress(b));
    // The later blocks back-reference the earlier ones, so they are much smaller than a fresh stream.
    assert.ok(
      compressed[5]!.length < compressed[0]!.length / 2,
      `${compressed[5]!.length} vs ${compressed[0]!.length}`,
    );
    for (const [i, b] of compressed.entries()) assert.deepEqual(await d.decompress(b), blocks[i]);
    // Each block ends with a sync flush, so the concatenation is one standard zlib stream.
    const joined = zlib.inflateSync(Buffer.concat(compressed), {
      dictionary: SPDY3_DICTIONARY,
      finishFlush: zlib.constants.Z_SYNC_FLUSH,
    });
    assert.deepEqual(joined, Buffer.concat(blocks));
    c.close();
    d.close();
  });

  it('inflates what an independent zlib deflater produced, over random block sequences', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.dictionary(fc.stringMatching(/^[a-z]{1,8}$/), fc.stringMatching(/^[ -~]{0,30}$/), {
            noNullPrototype: true,
          }),
          {
            minLength: 1,
            maxLength: 6,
          },
        ),
        async (headerSets) => {
          const blocks = headerSets.map((h) => encodeHeaderBlock(h));
          // Reference: one zlib stream with a sync flush after each block, as Go's compress/zlib Flush does.
          const ref = zlib.createDeflate({ dictionary: SPDY3_DICTIONARY });
          const wire: Buffer[] = [];
          for (const b of blocks) {
            ref.write(b);
            await new Promise<void>((r) => ref.flush(zlib.constants.Z_SYNC_FLUSH, () => r()));
            const chunks: Buffer[] = [];
            for (let c = ref.read() as Buffer | null; c; c = ref.read() as Buffer | null) chunks.push(c);
            wire.push(Buffer.concat(chunks));
          }
          ref.destroy();
          const d = new HeaderDecompressor();
          for (const [i, w] of wire.entries()) assert.deepEqual(await d.decompress(w), blocks[i]);
          d.close();
        },
      ),
      { numRuns: 30 },
    );
  });

  it('refuses a header block that inflates past the limit', async () => {
    const bomb = zlib.deflateSync(Buffer.alloc(4 << 20), { dictionary: SPDY3_DICTIONARY });
    const d = new HeaderDecompressor(1 << 20);
    await assert.rejects(d.decompress(bomb), /inflates to more than/);
    d.close();
  });

  it('reports corrupt input as a rejection, not a crash', async () => {
    const d = new HeaderDecompressor();
    await assert.rejects(d.decompress(Buffer.from('not zlib at all')));
    await assert.rejects(d.decompress(Buffer.from('still not')));
    d.close();
  });
});
