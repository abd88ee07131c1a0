// The peer server's routes on a real socket (shared/spec/peer-restore.md §3): plan and slice
// bytes, every refusal with its status and text, the gates and the write-stall cut.
import assert from 'node:assert/strict';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { crc32cHex, crc32cUpdate, MiB } from '../../../src/peer/wire.ts';
import {
  httpGet,
  rawExchange,
  recordingMetrics,
  startPeer,
  tempDir,
  until,
  writeSparse,
  writeSpecSparse,
} from './helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('peer/server', () => {
  const tmp = tempDir();
  const store = join(tmp.dir, 'store');
  const ids: Record<string, string> = {
    'vm-sp': 'SNAP-SP',
    'vm-many': 'SNAP-MANY',
    'vm-empty': 'SNAP-EMPTY',
  };

  before(() => {
    mkdirSync(join(store, 'SNAP-SP'), { recursive: true });
    writeSpecSparse(join(store, 'SNAP-SP', 'overlay.qcow2'));
    const many = join(store, 'SNAP-MANY');
    mkdirSync(join(many, 'subdir'), { recursive: true });
    writeFileSync(join(many, 'b.json'), '{"x":1}');
    writeFileSync(join(many, 'a<&>'), '');
    writeSparse(join(many, 'holes'), 8 * MiB, []);
    writeFileSync(join(many, 'hello'), 'hello');
    writeSparse(join(many, 'big'), 64 * MiB, [[0, Buffer.alloc(1, 1)]]);
    symlinkSync(join(many, 'hello'), join(many, 'link'));
    mkdirSync(join(store, 'SNAP-EMPTY', 'only-a-dir'), { recursive: true });
  });
  after(() => tmp.cleanup());

  const resolve = async (name: string) => {
    if (name === 'vm-broken')
      throw new Error('cocoon: exit 1: open /var/lib/cocoon/secret: permission denied');
    const id = ids[name];
    return id ? { id } : ('absent' as const);
  };

  describe('PeerServer routes', () => {
    let base = '';
    let port = 0;
    let stop: () => Promise<void>;
    const metrics = recordingMetrics();
    before(async () => {
      const p = await startPeer({ storeDir: store, resolve, metrics });
      base = p.base;
      port = p.server.port;
      stop = p.stop;
    });
    after(() => stop());

    it('serves the plan of the §8 sparse file exactly as the spec example', async () => {
      const got = await httpGet(`${base}/v1/snapshot-plan?name=vm-sp`);
      assert.equal(got.status, 200);
      assert.equal(got.headers['content-type'], 'application/json');
      assert.equal(
        got.body.toString(),
        '{"snapshotId":"SNAP-SP","files":[{"name":"overlay.qcow2","size":4194304,"slices":[{"offset":0,"length":3178496}]}]}\n',
      );
    });

    it('lists regular files only, sorted, with null slices for empty and all-hole files', async () => {
      const got = await httpGet(`${base}/v1/snapshot-plan?name=vm-many`);
      assert.equal(got.status, 200);
      const plan = JSON.parse(got.body.toString());
      assert.deepEqual(
        plan.files.map((f: { name: string; size: number; slices: unknown }) => [f.name, f.size, f.slices]),
        [
          ['a<&>', 0, null],
          ['b.json', 7, [{ offset: 0, length: 7 }]],
          ['big', 64 * MiB, [{ offset: 0, length: 4096 }]],
          ['hello', 5, [{ offset: 0, length: 5 }]],
          ['holes', 8 * MiB, null],
        ],
      );
      assert.match(got.body.toString(), /"a\\u003c\\u0026\\u003e"/, 'HTML characters escaped as Go does');
    });

    it('answers plan errors with Go http.Error text, leaking no path or CLI output', async () => {
      const missing = await httpGet(`${base}/v1/snapshot-plan`);
      assert.equal(missing.status, 400);
      assert.equal(missing.body.toString(), 'name is required\n');
      assert.equal(missing.headers['content-type'], 'text/plain; charset=utf-8');
      assert.equal(missing.headers['x-content-type-options'], 'nosniff');
      const unknown = await httpGet(`${base}/v1/snapshot-plan?name=nope`);
      assert.equal(unknown.status, 404);
      const broken = await httpGet(`${base}/v1/snapshot-plan?name=vm-broken`);
      assert.equal(broken.status, 500);
      assert.equal(broken.body.toString(), 'resolve snapshot vm-broken: failed\n');
      const empty = await httpGet(`${base}/v1/snapshot-plan?name=vm-empty`);
      assert.equal(empty.status, 500);
      assert.equal(empty.body.toString(), 'plan snapshot vm-empty: snapshot has no files\n');
      assert.ok(!empty.body.toString().includes(tmp.dir));
    });

    it('streams a slice chunked with the CRC-32C trailer, in Go wire form', async () => {
      const raw = await rawExchange(
        port,
        'GET /v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n',
      );
      const text = raw.toString('latin1');
      const at = text.indexOf('\r\n\r\n');
      const head = text.slice(0, at);
      const body = text.slice(at + 4);
      assert.match(head, /^HTTP\/1\.1 200 OK\r\n/);
      assert.match(head, /\r\nContent-Type: application\/octet-stream\r\n/);
      assert.match(head, /\r\nTrailer: X-Slice-Crc32c\r\n/);
      assert.match(head, /\r\nTransfer-Encoding: chunked(\r\n|$)/);
      assert.doesNotMatch(head, /Content-Length|Content-Encoding/i);
      assert.equal(body, '5\r\nhello\r\n0\r\nX-Slice-Crc32c: 9a71bb4c\r\n\r\n');
    });

    it('serves any range inside the file; a short one ends without a trailer', async () => {
      const mid = await httpGet(`${base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=%2B01&length=3`);
      assert.equal(mid.status, 200);
      assert.equal(mid.body.toString(), 'ell');
      assert.equal(mid.trailers['x-slice-crc32c'], crc32cHex(crc32cUpdate(0, Buffer.from('ell'))));
      const short = await httpGet(`${base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=3&length=10`);
      assert.equal(short.status, 200);
      assert.equal(short.body.toString(), 'lo');
      assert.equal(short.trailers['x-slice-crc32c'], undefined);
    });

    it('never compresses, whatever the client accepts', async () => {
      const got = await httpGet(`${base}/v1/snapshot-slice?id=SNAP-MANY&file=b.json&offset=0&length=7`, {
        headers: { 'Accept-Encoding': 'gzip, br' },
      });
      assert.equal(got.headers['content-encoding'], undefined);
      assert.equal(got.body.toString(), '{"x":1}');
    });

    it('refuses bad slice requests with Go statuses and texts', async () => {
      const cases: [string, number, string][] = [
        ['id=..&file=hello&offset=0&length=5', 400, 'invalid snapshot id ".."\n'],
        ['id=SNAP-MANY&file=..%2Ff&offset=0&length=5', 400, 'file must be a plain name\n'],
        ['id=SNAP-MANY&file=hello&offset=0', 400, 'id, file, offset, length are required\n'],
        ['id=SNAP-MANY&file=hello&offset=-1&length=5', 400, 'id, file, offset, length are required\n'],
        ['id=SNAP-MANY&file=hello&offset=0&length=0', 400, 'id, file, offset, length are required\n'],
        ['id=SNAP-MANY&file=hello&offset=0x0&length=5', 400, 'id, file, offset, length are required\n'],
        [
          'id=SNAP-MANY&file=hello&offset=0&length=268435457',
          400,
          'length must not exceed 268435456 bytes\n',
        ],
        ['id=SNAP-MANY&file=nothere&offset=0&length=5', 404, 'snapshot file not found\n'],
        ['id=SNAP-MANY&file=link&offset=0&length=5', 404, 'snapshot file not found\n'],
        ['id=SNAP-MANY&file=subdir&offset=0&length=5', 404, 'snapshot file not found\n'],
      ];
      for (const [query, status, body] of cases) {
        const got = await httpGet(`${base}/v1/snapshot-slice?${query}`);
        assert.equal(got.status, status, query);
        assert.equal(got.body.toString(), body, query);
      }
      const ok = await httpGet(`${base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=268435456`);
      assert.equal(ok.status, 200, 'exactly 256 MiB is allowed');
      assert.ok(metrics.refusals.includes('too_long'));
    });

    it('answers other methods 405 with Allow, other paths 404, and HEAD without a body', async () => {
      const post = await httpGet(`${base}/v1/snapshot-plan?name=vm-sp`, { method: 'POST' });
      assert.equal(post.status, 405);
      assert.equal(post.headers.allow, 'GET, HEAD');
      assert.equal(post.body.toString(), 'Method Not Allowed\n');
      const other = await httpGet(`${base}/v1/other`);
      assert.equal(other.status, 404);
      assert.equal(other.body.toString(), '404 page not found\n');
      const head = await httpGet(`${base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=5`, {
        method: 'HEAD',
      });
      assert.equal(head.status, 200);
      assert.equal(head.headers['content-type'], 'application/octet-stream');
      assert.equal(head.body.length, 0);
      const headPlan = await httpGet(`${base}/v1/snapshot-plan?name=vm-sp`, { method: 'HEAD' });
      assert.equal(headPlan.status, 200);
      assert.equal(headPlan.body.length, 0);
    });

    it('reports requests and bytes to the metrics', () => {
      assert.ok(metrics.requests.includes('plan:ok'));
      assert.ok(metrics.requests.includes('slice:ok'));
      assert.ok(metrics.requests.includes('slice:bad_request'));
      assert.ok(metrics.requests.includes('slice:not_found'));
      assert.ok(metrics.bytes >= 5);
      assert.equal(metrics.streams.at(-1), 0, 'every stream slot was returned');
    });
  });

  /**
   * Opens a slice of the 64 MiB file and does not read it: the server blocks on the socket.
   * `drain()` reads on to the end and resolves once the connection is closed (a paused socket
   * does not see the server's close).
   */
  function holdStream(
    port: number,
    localAddress = '127.0.0.1',
  ): Promise<{ socket: net.Socket; drain: () => Promise<void> }> {
    return new Promise((resolve, reject) => {
      const req = http.request({
        host: '127.0.0.1',
        port,
        localAddress,
        agent: false,
        path: `/v1/snapshot-slice?id=SNAP-MANY&file=big&offset=0&length=${64 * MiB}`,
      });
      req.on('error', reject);
      req.on('response', (res) => {
        res.pause();
        const socket = req.socket as net.Socket;
        const closed = new Promise<void>((r) => socket.once('close', () => r()));
        res.on('error', () => {});
        resolve({
          socket,
          drain: () => {
            res.resume();
            return closed;
          },
        });
      });
      req.end();
    });
  }

  describe('PeerServer bounds', () => {
    it('refuses a slice with 503 once the stream gate is full, and per caller', async () => {
      const metrics = recordingMetrics();
      const p = await startPeer({
        storeDir: store,
        maxStreams: 2,
        maxStreamsPerCaller: 1,
        metrics,
        authorize: async (who) => ({ ok: true, node: who.remoteAddress }),
      });
      try {
        const held = await holdStream(p.server.port, '127.0.0.1');
        await until(() => metrics.streams.at(-1) === 1);
        const sameCaller = await httpGet(
          `${p.base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=5`,
        );
        assert.equal(sameCaller.status, 503);
        assert.equal(sameCaller.body.toString(), 'slice streams saturated\n');
        assert.deepEqual(metrics.refusals, ['caller_saturated']);
        const held2 = await holdStream(p.server.port, '127.0.0.2');
        await until(() => metrics.streams.at(-1) === 2);
        const third = await httpGet(`${p.base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=5`, {
          localAddress: '127.0.0.3',
        });
        assert.equal(third.status, 503);
        assert.deepEqual(metrics.refusals, ['caller_saturated', 'saturated']);
        held.socket.destroy();
        held2.socket.destroy();
        await until(() => metrics.streams.at(-1) === 0);
        const again = await httpGet(`${p.base}/v1/snapshot-slice?id=SNAP-MANY&file=hello&offset=0&length=5`);
        assert.equal(again.status, 200, 'slots come back when the streams end');
      } finally {
        await p.stop();
      }
    });

    it('refuses a plan with 503 while the plan gate is full', async () => {
      let release = () => {};
      const blocked = new Promise<void>((r) => {
        release = r;
      });
      let resolving = 0;
      const p = await startPeer({
        storeDir: store,
        maxPlans: 1,
        resolve: async (name) => {
          resolving++;
          await blocked;
          return resolve(name);
        },
      });
      try {
        const first = httpGet(`${p.base}/v1/snapshot-plan?name=vm-sp`);
        await until(() => resolving === 1);
        const second = await httpGet(`${p.base}/v1/snapshot-plan?name=vm-sp`);
        assert.equal(second.status, 503);
        assert.equal(second.body.toString(), 'plan requests saturated\n');
        release();
        assert.equal((await first).status, 200);
      } finally {
        await p.stop();
      }
    });

    it('cuts a reader that drains nothing for writeStallMs', async () => {
      const metrics = recordingMetrics();
      const p = await startPeer({ storeDir: store, writeStallMs: 50, metrics });
      try {
        const held = await holdStream(p.server.port);
        await until(() => metrics.requests.includes('slice:incomplete'));
        await held.drain();
        assert.deepEqual(metrics.refusals, ['write_stall']);
        assert.ok(metrics.bytes < 64 * MiB, 'the stream stopped before the end');
      } finally {
        await p.stop();
      }
    });

    it('close() ends open streams and connections', async () => {
      const p = await startPeer({ storeDir: store });
      const held = await holdStream(p.server.port);
      await p.stop();
      await held.drain();
      await assert.rejects(httpGet(`${p.base}/v1/snapshot-plan?name=vm-sp`), /ECONNREFUSED/);
    });

    it('closes a connection whose first byte or headers do not come within headersTimeoutMs', async () => {
      const p = await startPeer({ storeDir: store, headersTimeoutMs: 100 });
      try {
        const silent = await rawExchange(p.server.port, '');
        assert.equal(silent.length, 0, 'a silent connection is closed unanswered');
        const partial = await rawExchange(
          p.server.port,
          'GET /v1/snapshot-plan?name=vm-sp HTTP/1.1\r\nHost: x\r\n',
        );
        assert.match(partial.toString(), /^HTTP\/1\.1 408 /);
      } finally {
        await p.stop();
      }
    });

    it('closes plain-HTTP connections when plain HTTP is not allowed', async () => {
      const metrics = recordingMetrics();
      let asked = 0;
      const p = await startPeer({
        storeDir: store,
        allowPlainHttp: false,
        metrics,
        resolve: async (name) => {
          asked++;
          return resolve(name);
        },
      });
      try {
        const raw = await rawExchange(
          p.server.port,
          'GET /v1/snapshot-plan?name=vm-sp HTTP/1.1\r\nHost: x\r\n\r\n',
        );
        assert.equal(raw.length, 0, 'not a byte answered');
        assert.deepEqual(metrics.refusals, ['plain_http']);
        assert.equal(asked, 0);
      } finally {
        await p.stop();
      }
    });

    it('answers what authorize decides, before any route runs', async () => {
      const seen: unknown[] = [];
      let asked = 0;
      const p = await startPeer({
        storeDir: store,
        authorize: async (who) => {
          seen.push(who);
          return { ok: false, status: 403, message: 'node n9 may not read snapshots' };
        },
        resolve: async (name) => {
          asked++;
          return resolve(name);
        },
      });
      try {
        const got = await httpGet(`${p.base}/v1/snapshot-plan?name=vm-sp`);
        assert.equal(got.status, 403);
        assert.equal(got.body.toString(), 'node n9 may not read snapshots\n');
        assert.equal(asked, 0);
        assert.deepEqual(seen, [{ transport: 'plain', remoteAddress: '127.0.0.1' }]);
      } finally {
        await p.stop();
      }
    });
  });
});
