// The pure wire format of the peer restore (shared/spec/peer-restore.md §3–§5, §8 vectors).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Gate, runPool, TokenBucket } from '../../../src/peer/gate.ts';
import { goParseInt64, goParseQuery, goQueryEscape, goQuote } from '../../../src/peer/gojson.ts';
import {
  coalesceExtents,
  crc32cHex,
  crc32cUpdate,
  encodePlanJson,
  isPlainName,
  MAX_SLICE,
  MiB,
  parsePlanJson,
  peerEnvelope,
  planUrl,
  STAGING_SLACK,
  sliceUrl,
  splitExtents,
  stagedBytesBound,
  stagingPrefix,
  streamGroups,
  validatePlan,
} from '../../../src/peer/wire.ts';
import { snapshotConfig } from './helpers.ts';

const crcOf = (data: string | Buffer) =>
  crc32cHex(crc32cUpdate(0, typeof data === 'string' ? Buffer.from(data) : data));

describe('extents → slices (§8 vectors)', () => {
  it('splitExtents({0,10Mi}, 4Mi) = {0,4Mi},{4Mi,4Mi},{8Mi,2Mi}', () => {
    assert.deepEqual(splitExtents([{ offset: 0, length: 10 * MiB }], 4 * MiB), [
      { offset: 0, length: 4 * MiB },
      { offset: 4 * MiB, length: 4 * MiB },
      { offset: 8 * MiB, length: 2 * MiB },
    ]);
  });

  it('splitExtents cuts each extent from its own start, 256 MiB by default', () => {
    assert.deepEqual(
      splitExtents([
        { offset: 100, length: MAX_SLICE + 1 },
        { offset: 2 * MAX_SLICE, length: 5 },
      ]),
      [
        { offset: 100, length: MAX_SLICE },
        { offset: 100 + MAX_SLICE, length: 1 },
        { offset: 2 * MAX_SLICE, length: 5 },
      ],
    );
  });

  it('coalesceExtents({0,100},{200,100},{10Mi,100},{20Mi,100}; 4Mi) = {0,300},{10Mi,100},{20Mi,100}', () => {
    const input = [
      { offset: 0, length: 100 },
      { offset: 200, length: 100 },
      { offset: 10 * MiB, length: 100 },
      { offset: 20 * MiB, length: 100 },
    ];
    assert.deepEqual(coalesceExtents(input, 4 * MiB), [
      { offset: 0, length: 300 },
      { offset: 10 * MiB, length: 100 },
      { offset: 20 * MiB, length: 100 },
    ]);
    assert.equal(input[0]?.length, 100, 'the input is not changed');
  });

  it('a gap of exactly 4 MiB merges, one byte more does not', () => {
    const at = (gap: number) =>
      coalesceExtents([
        { offset: 0, length: 10 },
        { offset: 10 + gap, length: 10 },
      ]).length;
    assert.equal(at(4 * MiB), 1);
    assert.equal(at(4 * MiB + 1), 2);
  });
});

describe('CRC-32C trailer value (§4)', () => {
  it('matches the spec vectors: lowercase hex without padding', () => {
    assert.equal(crcOf('123456789'), 'e3069283');
    assert.equal(crcOf('hello'), '9a71bb4c');
    assert.equal(crcOf('x2'), '2f459ab');
    assert.equal(crcOf(Buffer.alloc(MiB)), '14298c12');
  });

  it('continues across chunks', () => {
    assert.equal(crc32cHex(crc32cUpdate(crc32cUpdate(0, Buffer.from('hel')), Buffer.from('lo'))), '9a71bb4c');
  });

  it('formats small and high values as Go FormatUint(v, 16)', () => {
    assert.equal(crc32cHex(0), '0');
    assert.equal(crc32cHex(0xab), 'ab');
    assert.equal(crc32cHex(0xffffffff), 'ffffffff');
    assert.equal(crc32cHex(-1), 'ffffffff');
  });
});

describe('names and query strings', () => {
  it('isPlainName has Go semantics', () => {
    for (const ok of ['a', 'overlay.qcow2', 'a\\b', '...', ' ', 'a b'])
      assert.equal(isPlainName(ok), true, ok);
    for (const bad of ['', '.', '..', 'a/b', '/a', 'a/', '../f']) assert.equal(isPlainName(bad), false, bad);
  });

  it('goQueryEscape matches url.QueryEscape', () => {
    assert.equal(goQueryEscape('a b/c?d=e&f+g~h_i.j-k'), 'a+b%2Fc%3Fd%3De%26f%2Bg~h_i.j-k');
    assert.equal(goQueryEscape("ü*!()'"), '%C3%BC%2A%21%28%29%27');
  });

  it('plan and slice URLs keep Go parameter order', () => {
    assert.equal(
      planUrl('http://10.0.0.1:12501/', 'vm a'),
      'http://10.0.0.1:12501/v1/snapshot-plan?name=vm+a',
    );
    assert.equal(
      sliceUrl('http://[::1]:12501', 'SNAP 1', 'a/b', { offset: 4096, length: 10 }),
      'http://[::1]:12501/v1/snapshot-slice?id=SNAP+1&file=a%2Fb&offset=4096&length=10',
    );
  });

  it('goParseQuery decodes like url.ParseQuery and drops malformed pairs', () => {
    const q = goParseQuery('file=..%2Ff&id=a+b&id=second&bad=%zz&x;y=1&flag&=v');
    assert.deepEqual(q.get('file'), ['../f']);
    assert.deepEqual(q.get('id'), ['a b', 'second']);
    assert.equal(q.has('bad'), false);
    assert.equal(q.has('x;y'), false);
    assert.deepEqual(q.get('flag'), ['']);
    assert.deepEqual(q.get(''), ['v']);
  });

  it('goParseInt64 takes a sign and leading zeros, refuses the rest', () => {
    assert.equal(goParseInt64('+0010'), 10n);
    assert.equal(goParseInt64('-5'), -5n);
    assert.equal(goParseInt64('9223372036854775807'), 9223372036854775807n);
    for (const bad of ['', '1.0', '0x10', ' 1', '9223372036854775808', '1e3'])
      assert.equal(goParseInt64(bad), undefined);
  });

  it('goQuote follows strconv.Quote', () => {
    assert.equal(goQuote('..'), '".."');
    assert.equal(goQuote('a"b\\c\n\x01\x7f'), '"a\\"b\\\\c\\n\\x01\\x7f"');
    assert.equal(goQuote('ü\u200b'), '"ü\\u200b"');
  });

  it('stagingPrefix keeps [A-Za-z0-9.-] and replaces the rest per character', () => {
    assert.equal(stagingPrefix('vm-a.1'), 'vm-a.1');
    assert.equal(stagingPrefix('ns/vm_ü x'), 'ns_vm___x');
  });
});

describe('plan JSON', () => {
  it('is Go json.Encoder output: compact, HTML-escaped, null slices, a newline', () => {
    const text = encodePlanJson({
      snapshotId: 'S<&>',
      files: [
        { name: 'a', size: 0, slices: null },
        { name: 'b', size: 10, slices: [{ offset: 0, length: 10 }] },
        { name: 'c', size: 5, slices: [] },
      ],
    });
    assert.equal(
      text,
      '{"snapshotId":"S\\u003c\\u0026\\u003e","files":[{"name":"a","size":0,"slices":null},' +
        '{"name":"b","size":10,"slices":[{"offset":0,"length":10}]},{"name":"c","size":5,"slices":null}]}\n',
    );
  });

  it('parsePlanJson reads Go output back and fills missing fields with zero values', () => {
    const plan = { snapshotId: 'SNAP', files: [{ name: 'f', size: 9, slices: [{ offset: 1, length: 2 }] }] };
    assert.deepEqual(parsePlanJson(encodePlanJson(plan)), plan);
    assert.deepEqual(parsePlanJson('{"files":null,"extra":1}'), { snapshotId: '', files: [] });
    assert.deepEqual(parsePlanJson('{"snapshotId":"x","files":[{"name":"f"}]}'), {
      snapshotId: 'x',
      files: [{ name: 'f', size: 0, slices: null }],
    });
  });

  it('parsePlanJson refuses wrong types and inexact integers', () => {
    for (const bad of [
      'nope',
      '[]',
      '{"snapshotId":1}',
      '{"files":{}}',
      '{"files":[{"name":1}]}',
      '{"files":[{"size":1.5}]}',
      '{"files":[{"size":9007199254740993}]}',
      '{"files":[{"slices":[{"offset":"0","length":1}]}]}',
      '{"files":[{"slices":[null]}]}',
    ]) {
      assert.equal(typeof parsePlanJson(bad), 'string', bad);
    }
  });
});

describe('validatePlan', () => {
  const limits = { maxTotalBytes: 1000, maxFiles: 3 };
  const file = (name: string, size: number, slices: [number, number][] | null) => ({
    name,
    size,
    slices: slices?.map(([offset, length]) => ({ offset, length })) ?? null,
  });
  const check = (files: ReturnType<typeof file>[]) => validatePlan({ snapshotId: 'S', files }, limits);

  it('accepts a well-formed plan, an empty one and unordered slices', () => {
    assert.equal(
      check([
        file('a', 100, [
          [50, 50],
          [0, 10],
        ]),
        file('b', 0, null),
      ]),
      undefined,
    );
    assert.equal(check([]), undefined);
  });

  it('refuses what Go refuses: names that are not plain, slices outside the file', () => {
    assert.match(check([file('..', 1, null)]) ?? '', /plain name/);
    assert.match(check([file('a/b', 1, null)]) ?? '', /plain name/);
    assert.match(check([file('a', 10, [[-1, 2]])]) ?? '', /outside/);
    assert.match(check([file('a', 10, [[0, 0]])]) ?? '', /outside/);
    assert.match(check([file('a', 10, [[5, 6]])]) ?? '', /outside/);
  });

  it('refuses what we add: overlaps, duplicates, the envelope name, NUL, too many files or bytes', () => {
    assert.match(
      check([
        file('a', 100, [
          [0, 10],
          [5, 10],
        ]),
      ]) ?? '',
      /overlaps/,
    );
    assert.match(check([file('a', 1, null), file('a', 1, null)]) ?? '', /twice/);
    assert.match(check([file('snapshot.json', 1, null)]) ?? '', /envelope/);
    assert.match(check([file('a\0', 1, null)]) ?? '', /plain name/);
    assert.match(
      check([file('a', 1, null), file('b', 1, null), file('c', 1, null), file('d', 1, null)]) ?? '',
      /4 files/,
    );
    assert.match(check([file('a', 2000, [[0, 600]]), file('b', 2000, [[0, 401]])]) ?? '', /1000 bytes/);
    assert.equal(check([file('a', 2000, [[0, 600]]), file('b', 2000, [[0, 400]])]), undefined);
    assert.match(
      validatePlan(
        { snapshotId: 'S', files: [file('a', 2 * MAX_SLICE, [[0, MAX_SLICE + 1]])] },
        {
          maxTotalBytes: 4 * MAX_SLICE,
          maxFiles: 1,
        },
      ) ?? '',
      /longer than/,
    );
  });
});

describe('streamGroups', () => {
  it('makes at most 8 contiguous groups of ⌈n/8⌉', () => {
    const n = (k: number) => Array.from({ length: k }, (_, i) => i);
    assert.deepEqual(streamGroups([]), []);
    assert.deepEqual(streamGroups(n(3)), [[0], [1], [2]]);
    assert.deepEqual(streamGroups(n(9)), [[0, 1], [2, 3], [4, 5], [6, 7], [8]]);
    const g = streamGroups(n(17));
    assert.equal(g.length, 6);
    assert.deepEqual(g.flat(), n(17));
    assert.ok(g.every((x) => x.length <= 3));
  });
});

describe('peerEnvelope (Go MarshalEnvelope)', () => {
  it('writes the keys in Go order, omits zero values but the name, sorts the blob map, escapes HTML', () => {
    const config = snapshotConfig('SNAP-1', {
      description: 'd',
      image: 'img<1>',
      imageDigest: 'sha256:ab',
      imageType: '',
      imageBlobIds: { b: {}, '10': {}, '9': {} },
      hypervisor: 'ch',
      cpu: 2,
      memory: 1073741824,
      storage: 0,
      nics: 1,
      windows: false,
    });
    assert.equal(
      peerEnvelope(config, 'vm-a'),
      `{
  "version": 1,
  "config": {
    "id": "SNAP-1",
    "name": "vm-a",
    "description": "d",
    "image": "img\\u003c1\\u003e",
    "image_digest": "sha256:ab",
    "image_blob_ids": {
      "10": {},
      "9": {},
      "b": {}
    },
    "hypervisor": "ch",
    "cpu": 2,
    "memory": 1073741824,
    "nics": 1
  }
}
`,
    );
  });

  it('keeps an empty name and adds network and windows when set', () => {
    assert.equal(
      peerEnvelope(snapshotConfig('S', { network: 'n', windows: true }), ''),
      '{\n  "version": 1,\n  "config": {\n    "id": "S",\n    "name": "",\n    "network": "n",\n    "windows": true\n  }\n}\n',
    );
  });
});

describe('gates', () => {
  it('Gate: tryTake refuses when full; take waits in order and can be aborted', async () => {
    const g = new Gate(1);
    assert.equal(g.tryTake(), true);
    assert.equal(g.tryTake(), false);
    const order: string[] = [];
    const ac = new AbortController();
    const a = g.take().then(() => order.push('a'));
    const b = g.take(ac.signal).then(
      () => order.push('b'),
      () => order.push('b aborted'),
    );
    const c = g.take().then(() => order.push('c'));
    ac.abort();
    await b;
    g.release();
    await a;
    g.release();
    await c;
    assert.deepEqual(order, ['b aborted', 'a', 'c']);
    assert.equal(g.used, 1);
  });

  it('TokenBucket: one second of burst, then waits in proportion to the bytes', () => {
    const bucket = new TokenBucket(1000);
    assert.equal(bucket.reserve(1000, 10_000), 0);
    assert.equal(bucket.reserve(500, 10_000), 500);
    assert.equal(bucket.reserve(500, 10_000), 1000);
    assert.equal(bucket.reserve(100, 20_000), 0, 'idle time refills the burst');
    assert.equal(new TokenBucket(0).reserve(1e12, 0), 0, '0 is unbounded');
  });

  it('runPool: at most `limit` at once, sums the results; the first failure aborts the rest', async () => {
    let running = 0;
    let most = 0;
    const work = async (n: number) => {
      running++;
      most = Math.max(most, running);
      await new Promise((r) => setImmediate(r));
      running--;
      if (n === 3) throw new Error('task 3 failed');
      return n;
    };
    assert.equal(await runPool([1, 2, 4, 5, 6], 2, new AbortController(), work), 18);
    assert.equal(most, 2);
    const ac = new AbortController();
    const started: number[] = [];
    await assert.rejects(
      runPool([1, 3, 5, 7, 9, 11], 2, ac, (n) => {
        started.push(n);
        return work(n);
      }),
      /task 3 failed/,
    );
    assert.equal(ac.signal.aborted, true);
    assert.ok(!started.includes(11), `started ${started}`);
  });
});

describe('stagedBytesBound', () => {
  it("is the registry config's apparent file sizes plus the slack, below the host's bound", () => {
    const config = snapshotConfig('S', {
      files: {
        'memory-range-0': { size: 1000, sparseSize: '4096' },
        'overlay.qcow2': { size: 2000, sparseSize: 1500 },
        'config.json': { size: 10 },
      },
    });
    assert.equal(stagedBytesBound(config, 2 ** 40), 4096 + 2000 + 10 + STAGING_SLACK);
    assert.equal(stagedBytesBound(config, 100), 100, 'never above the host bound');
  });
  it("a config without file sizes (an older writer) gets the host's bound", () => {
    assert.equal(stagedBytesBound(snapshotConfig('S'), 12345), 12345);
    assert.equal(stagedBytesBound(snapshotConfig('S', { files: { x: { mode: 420 } } }), 777), 777);
  });
});
