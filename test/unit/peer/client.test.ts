// The peer restore client against our server and against a raw-socket peer speaking Go's exact
// wire bytes (shared/spec/peer-restore.md §3–§5, §8).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import {
  existsSync,
  promises as fsp,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  PeerClient,
  type PeerRestoreError,
  type PeerRestoreOptions,
  sweepStaging,
} from '../../../src/peer/client.ts';
import { writeSkippingZeros } from '../../../src/peer/fetch.ts';
import { crc32cHex, crc32cUpdate, encodePlanJson, MiB, type PeerPlan } from '../../../src/peer/wire.ts';
import {
  goFixed,
  goSlice,
  httpGet,
  params,
  type RawRequest,
  rawPeer,
  snapshotConfig,
  startPeer,
  tempDir,
  until,
  writeSparse,
  writeSpecSparse,
} from './helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('peer/client', () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());
  const client = new PeerClient();
  let roots = 0;
  /** A staging root of its own for each restore (not created: the client makes it). */
  const newRoot = () => join(tmp.dir, `staging-${++roots}`);
  const entries = (root: string) => (existsSync(root) ? readdirSync(root) : []);

  function restore(o: Partial<PeerRestoreOptions> & Pick<PeerRestoreOptions, 'baseUrl'>) {
    return client.restore({
      vmName: 'vm-a',
      config: snapshotConfig('SNAP-1'),
      stagingRoot: newRoot(),
      ...o,
    });
  }

  async function failure(p: Promise<unknown>): Promise<PeerRestoreError> {
    try {
      await p;
    } catch (err) {
      assert.equal((err as Error).name, 'PeerRestoreError', (err as Error).stack);
      return err as PeerRestoreError;
    }
    assert.fail('the restore succeeded');
  }

  describe('restore from our PeerServer', () => {
    const store = join(tmp.dir, 'store');
    const src = join(store, 'SNAP-1');
    let base = '';
    let stop: () => Promise<void>;
    before(async () => {
      mkdirSync(src, { recursive: true });
      writeSpecSparse(join(src, 'overlay.qcow2'));
      writeSparse(join(src, 'far'), 64 * MiB, [
        [0, randomBytes(5000)],
        [40 * MiB, randomBytes(3 * MiB)],
      ]);
      writeFileSync(join(src, 'dense'), randomBytes(3 * MiB + 17));
      writeFileSync(join(src, 'empty'), '');
      writeSparse(join(src, 'holes'), 8 * MiB, []);
      const p = await startPeer({
        storeDir: store,
        resolve: async (name) => (name === 'vm-a' ? { id: 'SNAP-1' } : 'absent'),
      });
      base = p.base;
      stop = p.stop;
    });
    after(() => stop());

    it('stages byte-identical files with their holes, and the Go envelope', async () => {
      let counted = 0;
      const stagingRoot = newRoot();
      const config = snapshotConfig('SNAP-1', { image: 'img', cpu: 2 });
      const r = await client.restore({
        baseUrl: base,
        vmName: 'vm-a',
        config,
        stagingRoot,
        onBytes: (n) => {
          counted += n;
        },
        limits: { streamsPerFile: 2, concurrency: 3 },
      });
      assert.equal(r.files, 5);
      assert.equal(r.bytes, counted);
      const plan = JSON.parse(
        (await httpGet(`${base}/v1/snapshot-plan?name=vm-a`)).body.toString(),
      ) as PeerPlan;
      const planned = plan.files.flatMap((f) => f.slices ?? []).reduce((sum, s) => sum + s.length, 0);
      assert.equal(r.bytes, planned);
      assert.ok(planned >= 3178496 + 5000 + 3 * MiB + 3 * MiB + 17);
      assert.match(r.dir, /\/vm-a-[^/]+$/);
      assert.equal(statSync(r.dir).mode & 0o777, 0o700);
      assert.equal(statSync(stagingRoot).mode & 0o777, 0o750 & ~process.umask());
      for (const name of ['overlay.qcow2', 'far', 'dense', 'empty', 'holes']) {
        assert.ok(readFileSync(join(r.dir, name)).equals(readFileSync(join(src, name))), name);
        assert.equal(statSync(join(r.dir, name)).mode & 0o777, 0o640 & ~process.umask(), name);
      }
      const allocated = (name: string) => statSync(join(r.dir, name)).blocks * 512;
      assert.equal(allocated('holes'), 0, 'an all-hole file stays a hole');
      assert.ok(allocated('far') < 8 * MiB, `far: ${allocated('far')} bytes allocated of 64 MiB`);
      assert.ok(allocated('overlay.qcow2') <= 2 * MiB, 'the zero MiBs of the slice were not written');
      const envelope = readFileSync(join(r.dir, 'snapshot.json'), 'utf8');
      assert.match(envelope, /"id": "SNAP-1"/);
      assert.match(envelope, /"name": "vm-a"/);
      assert.equal(statSync(join(r.dir, 'snapshot.json')).mode & 0o777, 0o644 & ~process.umask());
      await r.release();
      assert.equal(existsSync(r.dir), false);
      await r.release(); // idempotent
    });

    it('refuses a plan of another snapshot before any staging directory exists', async () => {
      const stagingRoot = newRoot();
      const err = await failure(
        client.restore({ baseUrl: base, vmName: 'vm-a', config: snapshotConfig('SNAP-2'), stagingRoot }),
      );
      assert.equal(err.reason, 'identity');
      assert.match(err.message, /peer has snapshot SNAP-1, registry says SNAP-2/);
      assert.equal(existsSync(stagingRoot), false);
    });

    it('fails on a plan the peer does not have, quoting the status', async () => {
      const err = await failure(restore({ baseUrl: base, vmName: 'vm-b' }));
      assert.equal(err.reason, 'plan');
      assert.match(err.message, /HTTP 404 Not Found: snapshot vm-b not found/);
    });

    it('fails on plans over our bounds, leaving nothing staged', async () => {
      const stagingRoot = newRoot();
      const err = await failure(
        client.restore({
          baseUrl: base,
          vmName: 'vm-a',
          config: snapshotConfig('SNAP-1'),
          stagingRoot,
          limits: { maxTotalBytes: MiB },
        }),
      );
      assert.equal(err.reason, 'validation');
      assert.equal(existsSync(stagingRoot), false);
      assert.equal((await failure(restore({ baseUrl: base, limits: { maxFiles: 4 } }))).reason, 'validation');
    });
  });

  /** A raw peer serving `plan` and slices of `files` in Go's exact bytes; `slice` may replace an answer. */
  async function goPeer(
    plan: PeerPlan,
    files: Record<string, Buffer>,
    slice?: (req: RawRequest, body: Buffer) => string | Buffer | 'hang' | undefined,
  ) {
    return await rawPeer((req) => {
      if (req.path === '/v1/snapshot-plan')
        return goFixed('200 OK', 'application/json', encodePlanJson(plan));
      const q = params(req);
      const data = files[q.get('file') ?? ''] ?? Buffer.alloc(0);
      const offset = Number(q.get('offset'));
      const body = data.subarray(offset, offset + Number(q.get('length')));
      const custom = slice?.(req, body);
      if (custom !== undefined) return custom;
      return goSlice(body, [`X-Slice-Crc32c: ${crc32cHex(crc32cUpdate(0, body))}`]);
    });
  }

  const helloPlan: PeerPlan = {
    snapshotId: 'SNAP-GO',
    files: [{ name: 'f', size: 5, slices: [{ offset: 0, length: 5 }] }],
  };

  describe('restore from a Go peer (raw wire bytes)', () => {
    it('accepts the captured Go response and sends Go’s query in Go’s order', async () => {
      const exact =
        'HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTrailer: X-Slice-Crc32c\r\n' +
        'Date: Tue, 02 Dec 2025 16:00:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n' +
        '5\r\nhello\r\n0\r\nX-Slice-Crc32c: 9a71bb4c\r\n\r\n';
      const peer = await goPeer(helloPlan, {}, () => exact);
      try {
        const r = await restore({ baseUrl: peer.base, vmName: 'vm go', config: snapshotConfig('SNAP-GO') });
        assert.equal(readFileSync(join(r.dir, 'f'), 'utf8'), 'hello');
        await r.release();
        assert.deepEqual(
          peer.requests.map((q) => q.target),
          ['/v1/snapshot-plan?name=vm+go', '/v1/snapshot-slice?id=SNAP-GO&file=f&offset=0&length=5'],
        );
        assert.ok(peer.requests.every((q) => q.headers.includes('Accept-Encoding: identity')));
      } finally {
        await peer.stop();
      }
    });

    it('accepts the trailer in any name case and undeclared', async () => {
      for (const [line, declare] of [
        ['x-slice-crc32c: 9a71bb4c', true],
        ['X-SLICE-CRC32C: 9a71bb4c', false],
      ] as const) {
        const peer = await goPeer(helloPlan, {}, (_req, _body) => goSlice('hello', [line], declare));
        try {
          const r = await restore({ baseUrl: peer.base, config: snapshotConfig('SNAP-GO') });
          assert.equal(readFileSync(join(r.dir, 'f'), 'utf8'), 'hello');
          await r.release();
        } finally {
          await peer.stop();
        }
      }
    });

    const refused: [string, (body: Buffer) => string | Buffer, string, string][] = [
      [
        'an uppercase value',
        (b) => goSlice(b, ['X-Slice-Crc32c: 9A71BB4C']),
        'checksum',
        'checksum mismatch',
      ],
      ['no trailer', (b) => goSlice(b, []), 'checksum', 'server sent no checksum trailer'],
      [
        'a non-chunked body',
        (b) => goFixed('200 OK', 'application/octet-stream', b.toString('latin1')),
        'checksum',
        'server sent no checksum trailer',
      ],
      [
        'byte 0 flipped, trailer kept',
        (b) => goSlice(Buffer.from([b[0]! ^ 1, ...b.subarray(1)]), [`X-Slice-Crc32c: 9a71bb4c`]),
        'checksum',
        'checksum mismatch',
      ],
      ['a short body', (b) => goSlice(b.subarray(0, 3), []), 'transfer', 'got 3 bytes, want 5'],
      [
        'a long body',
        (b) => goSlice(Buffer.concat([b, b]), ['X-Slice-Crc32c: 9a71bb4c']),
        'transfer',
        'want 5',
      ],
      [
        'a 503',
        () => goFixed('503 Service Unavailable', 'text/plain; charset=utf-8', 'slice streams saturated\n'),
        'transfer',
        'HTTP 503 Service Unavailable: slice streams saturated',
      ],
    ];
    for (const [what, answer, reason, text] of refused) {
      it(`refuses ${what} and removes the staging directory`, async () => {
        const peer = await goPeer(helloPlan, {}, (_req, body) =>
          answer(Buffer.from(body.length ? body : 'hello')),
        );
        const stagingRoot = newRoot();
        try {
          const err = await failure(
            client.restore({
              baseUrl: peer.base,
              vmName: 'vm-a',
              config: snapshotConfig('SNAP-GO'),
              stagingRoot,
            }),
          );
          assert.equal(err.reason, reason);
          assert.ok(err.message.includes(text), err.message);
          assert.deepEqual(entries(stagingRoot), []);
        } finally {
          await peer.stop();
        }
      });
    }

    it('refuses a zero-padded trailer value', async () => {
      const plan: PeerPlan = {
        snapshotId: 'SNAP-GO',
        files: [{ name: 'f', size: 2, slices: [{ offset: 0, length: 2 }] }],
      };
      assert.equal(crc32cHex(crc32cUpdate(0, Buffer.from('x2'))), '2f459ab');
      const peer = await goPeer(plan, { f: Buffer.from('x2') }, (_req, body) =>
        goSlice(body, ['X-Slice-Crc32c: 02f459ab']),
      );
      try {
        const err = await failure(restore({ baseUrl: peer.base, config: snapshotConfig('SNAP-GO') }));
        assert.match(err.message, /checksum mismatch/);
      } finally {
        await peer.stop();
      }
    });

    it('quotes at most 512 bytes of a refused plan body', async () => {
      const peer = await rawPeer(() => goFixed('500 Internal Server Error', 'text/plain', 'x'.repeat(2000)));
      try {
        const err = await failure(restore({ baseUrl: peer.base }));
        assert.equal(err.reason, 'plan');
        assert.match(err.message, /^peer plan: HTTP 500 Internal Server Error: x{512}$/);
      } finally {
        await peer.stop();
      }
    });

    it('stages only the envelope for an empty file list', async () => {
      const peer = await goPeer({ snapshotId: 'SNAP-GO', files: [] }, {});
      try {
        const r = await restore({ baseUrl: peer.base, config: snapshotConfig('SNAP-GO') });
        assert.deepEqual(readdirSync(r.dir), ['snapshot.json']);
        assert.equal(r.bytes, 0);
        await r.release();
      } finally {
        await peer.stop();
      }
    });

    it('cuts a slice whose body stalls', async () => {
      // The head and two body bytes go out, then nothing (the connection stays open).
      const partial =
        'HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTrailer: X-Slice-Crc32c\r\n' +
        'Transfer-Encoding: chunked\r\n\r\n5\r\nhe';
      const peer = await goPeer(helloPlan, {}, () => partial);
      const stagingRoot = newRoot();
      try {
        const err = await failure(
          client.restore({
            baseUrl: peer.base,
            vmName: 'vm-a',
            config: snapshotConfig('SNAP-GO'),
            stagingRoot,
            limits: { stallMs: 50 },
          }),
        );
        assert.equal(err.reason, 'stall');
        assert.match(err.message, /no body bytes for 50 ms/);
        assert.deepEqual(entries(stagingRoot), []);
      } finally {
        await peer.stop();
      }
    });

    it('bounds the wait for response headers', async () => {
      const peer = await rawPeer(() => 'hang');
      try {
        const err = await failure(restore({ baseUrl: peer.base, limits: { headerMs: 50 } }));
        assert.equal(err.reason, 'timeout');
      } finally {
        await peer.stop();
      }
    });

    it('stops on abort, removing what it staged', async () => {
      const peer = await goPeer(helloPlan, {}, () => 'hang');
      const stagingRoot = newRoot();
      const ac = new AbortController();
      try {
        const p = client.restore({
          baseUrl: peer.base,
          vmName: 'vm-a',
          config: snapshotConfig('SNAP-GO'),
          stagingRoot,
          signal: ac.signal,
        });
        await until(() => peer.requests.length === 2);
        assert.equal(
          entries(stagingRoot).length,
          1,
          'the staging directory exists while the slice is in flight',
        );
        ac.abort();
        const err = await failure(p);
        assert.equal(err.reason, 'aborted');
        assert.deepEqual(entries(stagingRoot), []);
      } finally {
        await peer.stop();
      }
    });

    it('fails at once on a dead port', async () => {
      const peer = await rawPeer(() => 'hang');
      const base = peer.base;
      await peer.stop();
      const err = await failure(restore({ baseUrl: base }));
      assert.equal(err.reason, 'plan');
      assert.match(err.message, /ECONNREFUSED/);
    });

    it('holds restores at the gate; a waiting one can be aborted', async () => {
      const gated = new PeerClient({ maxRestores: 1 });
      const peer = await rawPeer(() => 'hang');
      const first = new AbortController();
      try {
        const one = gated.restore({
          baseUrl: peer.base,
          vmName: 'a',
          config: snapshotConfig('S'),
          stagingRoot: newRoot(),
          signal: first.signal,
        });
        await until(() => peer.requests.length === 1);
        const second = new AbortController();
        const two = gated.restore({
          baseUrl: peer.base,
          vmName: 'b',
          config: snapshotConfig('S'),
          stagingRoot: newRoot(),
          signal: second.signal,
        });
        await new Promise((r) => setTimeout(r, 20));
        assert.equal(peer.requests.length, 1, 'the second restore waits at the gate');
        second.abort();
        const err = await failure(two);
        assert.equal(err.reason, 'aborted');
        assert.match(err.message, /restore gate/);
        first.abort();
        assert.equal((await failure(one)).reason, 'aborted');
      } finally {
        await peer.stop();
      }
    });
  });

  describe('staging helpers', () => {
    it('sweepStaging empties the root, nested entries included, and tolerates a missing root', async () => {
      const root = newRoot();
      mkdirSync(join(root, 'vm-a-1', 'deep'), { recursive: true });
      writeFileSync(join(root, 'vm-a-1', 'deep', 'f'), 'x');
      writeFileSync(join(root, 'stray'), 'x');
      await sweepStaging(root);
      assert.deepEqual(readdirSync(root), []);
      await sweepStaging(join(tmp.dir, 'no-such-root'));
    });

    it('writeSkippingZeros keeps the content and leaves zero MiBs as holes', async () => {
      const path = join(tmp.dir, 'skip');
      const data = Buffer.concat([randomBytes(MiB), Buffer.alloc(2 * MiB), randomBytes(10)]);
      const fh = await fsp.open(path, 'w');
      try {
        await fh.truncate(5 * MiB);
        await writeSkippingZeros(fh, data, MiB);
      } finally {
        await fh.close();
      }
      const back = readFileSync(path);
      assert.ok(back.subarray(MiB, MiB + data.length).equals(data));
      assert.ok(back.subarray(0, MiB).equals(Buffer.alloc(MiB)));
      assert.ok(statSync(path).blocks * 512 <= MiB + 64 * 1024, 'only the data MiBs were written');
    });
  });
});
