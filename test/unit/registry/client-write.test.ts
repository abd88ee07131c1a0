// RegistryClient write verbs against a small in-process fake registry (docs/registry.md
// "Distribution API subset", "Authentication"): blob HEAD, single-PUT and chunked uploads,
// 416 restart, relative and absolute Locations with a query, manifest PUT, manifest DELETE
// with the tag ⇒ digest fallback, Bearer tokens with the push (and delete) scope.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import { RegistryClient, RegistryError } from '../../../src/registry/client.ts';
import type { CredentialSource } from '../../../src/registry/credentials.ts';
import { parseReference } from '../../../src/registry/reference.ts';

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  bodyLength: number;
}

/** The registry: blobs, manifests, upload sessions, and switches for what it does. */
class Fake {
  server!: http.Server;
  port = 0;
  readonly blobs = new Map<string, Buffer>();
  readonly manifests = new Map<string, Buffer>();
  readonly sessions = new Map<string, Buffer[]>();
  readonly seen: Seen[] = [];
  readonly tokenScopes: string[] = [];
  /** Location style of upload answers. */
  location: 'relative' | 'absolute' = 'relative';
  /** Answer 416 to this many PATCH requests (each on a fresh session). */
  patch416 = 0;
  /** Report a wrong Range once. */
  wrongRange = 0;
  /** DELETE by tag answers this status (distribution: 400; others 405). */
  tagDelete: 202 | 400 | 405 = 202;
  bearer = false;
  #sessionSeq = 0;

  get host(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => this.#serve(req, res, Buffer.concat(chunks)));
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this;
  }

  stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  reset(): void {
    this.blobs.clear();
    this.manifests.clear();
    this.sessions.clear();
    this.seen.length = 0;
    this.tokenScopes.length = 0;
    this.location = 'relative';
    this.patch416 = 0;
    this.wrongRange = 0;
    this.tagDelete = 202;
    this.bearer = false;
    this.#sessionSeq = 0;
  }

  #loc(id: string): string {
    const rel = `/v2/cocoon/x/blobs/uploads/${id}?_state=${encodeURIComponent(`st+${id}==`)}`;
    return this.location === 'absolute' ? `http://${this.host}${rel}` : rel;
  }

  #error(res: http.ServerResponse, status: number, code: string): void {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ errors: [{ code, message: code.toLowerCase() }] }));
  }

  #serve(req: http.IncomingMessage, res: http.ServerResponse, body: Buffer): void {
    const url = new URL(req.url ?? '/', `http://${this.host}`);
    const method = req.method ?? '';
    if (url.pathname === '/token') {
      this.tokenScopes.push(url.searchParams.get('scope') ?? '');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ token: `tok-${this.tokenScopes.length}`, expires_in: 300 }));
      return;
    }
    this.seen.push({ method, url: req.url ?? '', headers: req.headers, bodyLength: body.length });
    if (this.bearer && !req.headers.authorization?.startsWith('Bearer ')) {
      res.writeHead(401, {
        'www-authenticate': `Bearer realm="http://${this.host}/token",service="fake"`,
      });
      res.end();
      return;
    }
    const blob = /^\/v2\/(.+)\/blobs\/(sha256:[a-f0-9]{64})$/.exec(url.pathname);
    if (blob && method === 'HEAD') {
      res.writeHead(this.blobs.has(blob[2]!) ? 200 : 404).end();
      return;
    }
    if (method === 'POST' && url.pathname === '/v2/cocoon/x/blobs/uploads/') {
      const id = `s${++this.#sessionSeq}`;
      this.sessions.set(id, []);
      res.writeHead(202, { location: this.#loc(id), 'docker-upload-uuid': id, range: '0-0' }).end();
      return;
    }
    const upload = /^\/v2\/cocoon\/x\/blobs\/uploads\/([^/]+)$/.exec(url.pathname);
    if (upload) {
      const id = upload[1]!;
      const parts = this.sessions.get(id);
      if (!parts) {
        this.#error(res, 404, 'BLOB_UPLOAD_UNKNOWN');
        return;
      }
      if (url.searchParams.get('_state') !== `st+${id}==`) {
        this.#error(res, 400, 'BLOB_UPLOAD_INVALID');
        return;
      }
      const have = parts.reduce((s, p) => s + p.length, 0);
      if (method === 'PATCH') {
        if (this.patch416 > 0) {
          this.patch416--;
          this.sessions.delete(id);
          res.writeHead(416, { range: `0-${have - 1}` }).end();
          return;
        }
        const m = /^(\d+)-(\d+)$/.exec(String(req.headers['content-range'] ?? ''));
        if (!m || Number(m[1]) !== have || Number(m[2]) - Number(m[1]) + 1 !== body.length) {
          this.#error(res, 416, 'BLOB_UPLOAD_INVALID');
          return;
        }
        parts.push(body);
        const next = `s${++this.#sessionSeq}`; // distribution hands out a new state per chunk
        this.sessions.set(next, parts);
        this.sessions.delete(id);
        let end = have + body.length - 1;
        if (this.wrongRange > 0) {
          this.wrongRange--;
          end -= 1;
        }
        res.writeHead(202, { location: this.#loc(next), range: `0-${end}` }).end();
        return;
      }
      if (method === 'PUT') {
        const all = Buffer.concat([...parts, body]);
        const want = url.searchParams.get('digest') ?? '';
        if (sha(all) !== want) {
          this.#error(res, 400, 'DIGEST_INVALID');
          return;
        }
        this.blobs.set(want, all);
        this.sessions.delete(id);
        res.writeHead(201, { 'docker-content-digest': want, location: `/v2/cocoon/x/blobs/${want}` }).end();
        return;
      }
    }
    const manifest = /^\/v2\/cocoon\/x\/manifests\/([^/]+)$/.exec(url.pathname);
    if (manifest) {
      const ref = manifest[1]!;
      const isDigest = ref.startsWith('sha256:');
      if (method === 'PUT') {
        this.manifests.set(ref, body);
        this.manifests.set(sha(body), body);
        res.writeHead(201, { 'docker-content-digest': sha(body) }).end();
        return;
      }
      const stored = this.manifests.get(ref);
      if (method === 'HEAD') {
        if (!stored) {
          res.writeHead(404).end();
          return;
        }
        res.writeHead(200, { 'docker-content-digest': sha(stored), 'content-length': stored.length }).end();
        return;
      }
      if (method === 'DELETE') {
        if (!isDigest && this.tagDelete !== 202) {
          this.#error(res, this.tagDelete, this.tagDelete === 400 ? 'DIGEST_INVALID' : 'UNSUPPORTED');
          return;
        }
        if (!stored) {
          this.#error(res, 404, 'MANIFEST_UNKNOWN');
          return;
        }
        const digest = sha(stored);
        for (const [k, v] of [...this.manifests]) if (sha(v) === digest) this.manifests.delete(k);
        res.writeHead(202).end();
        return;
      }
    }
    this.#error(res, 404, 'NOT_FOUND');
  }
}

describe('RegistryClient write verbs (fake registry)', () => {
  const fake = new Fake();
  let dir: string;
  let client: RegistryClient;
  const noCredentials: CredentialSource[] = [];

  before(async () => {
    await fake.start();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-client-write-'));
  });
  after(async () => {
    client?.close();
    await fake.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(() => {
    client?.close();
    fake.reset();
    client = new RegistryClient({ base: `${fake.host}/cocoon`, credentials: noCredentials });
  });

  const file = (name: string, data: Buffer) => {
    const p = path.join(dir, name);
    fs.writeFileSync(p, data);
    return p;
  };
  const requests = () => fake.seen.map((s) => `${s.method} ${s.url.split('?')[0]}`);

  it('headBlob: true when present, false on 404, an error otherwise', async () => {
    const data = Buffer.from('hello');
    assert.equal(await client.headBlob('cocoon/x', sha(data)), false);
    fake.blobs.set(sha(data), data);
    assert.equal(await client.headBlob('cocoon/x', sha(data)), true);
    await assert.rejects(
      client.headBlob('cocoon/y', sha(data)).then(() => client.headBlob('cocoon/x', 'nope')),
    );
  });

  it('a blob up to the chunk size: POST, then one PUT with the body (from memory or streamed from a file)', async () => {
    const data = randomBytes(10_000);
    await client.uploadBlob('cocoon/x', { digest: sha(data), size: data.length, bytes: data });
    assert.deepEqual(requests(), ['POST /v2/cocoon/x/blobs/uploads/', 'PUT /v2/cocoon/x/blobs/uploads/s1']);
    assert.deepEqual(fake.blobs.get(sha(data)), data);
    const put = fake.seen[1]!;
    assert.equal(put.headers['content-type'], 'application/octet-stream');
    assert.equal(put.headers['content-length'], '10000');
    assert.equal(put.headers['transfer-encoding'], undefined);
    // The Location's own query is kept; digest= is added.
    assert.equal(
      put.url,
      `/v2/cocoon/x/blobs/uploads/s1?_state=${encodeURIComponent('st+s1==')}&digest=${sha(data)}`,
    );
    assert.equal(fake.seen[0]!.headers['content-length'], '0', 'POST without a body: no chunked encoding');

    const other = randomBytes(4096);
    const bytes: number[] = [];
    await client.uploadBlob(
      'cocoon/x',
      { digest: sha(other), size: other.length, file: file('small', other) },
      { chunkBytes: 4096, onBytes: (n) => bytes.push(n) },
    );
    assert.deepEqual(fake.blobs.get(sha(other)), other);
    assert.deepEqual(bytes, [4096]);
    // The empty blob.
    const empty = Buffer.alloc(0);
    await client.uploadBlob('cocoon/x', { digest: sha(empty), size: 0, file: file('empty', empty) });
    assert.deepEqual(fake.blobs.get(sha(empty)), empty);
  });

  for (const location of ['relative', 'absolute'] as const) {
    it(`a larger file: PATCH chunks with Content-Range, then a body-less PUT (${location} Location)`, async () => {
      fake.location = location;
      const data = randomBytes(2500);
      const bytes: number[] = [];
      await client.uploadBlob(
        'cocoon/x',
        { digest: sha(data), size: data.length, file: file('big', data) },
        { chunkBytes: 1000, onBytes: (n) => bytes.push(n) },
      );
      assert.deepEqual(requests(), [
        'POST /v2/cocoon/x/blobs/uploads/',
        'PATCH /v2/cocoon/x/blobs/uploads/s1',
        'PATCH /v2/cocoon/x/blobs/uploads/s2',
        'PATCH /v2/cocoon/x/blobs/uploads/s3',
        'PUT /v2/cocoon/x/blobs/uploads/s4',
      ]);
      const patches = fake.seen.filter((s) => s.method === 'PATCH');
      assert.deepEqual(
        patches.map((p) => [p.headers['content-range'], p.headers['content-type'], p.bodyLength]),
        [
          ['0-999', 'application/octet-stream', 1000],
          ['1000-1999', 'application/octet-stream', 1000],
          ['2000-2499', 'application/octet-stream', 500],
        ],
      );
      const put = fake.seen.at(-1)!;
      assert.equal(put.bodyLength, 0);
      assert.equal(put.headers['content-length'], '0');
      assert.match(put.url, /\?_state=[^&]+&digest=sha256:[0-9a-f]{64}$/);
      assert.deepEqual(fake.blobs.get(sha(data)), data);
      assert.deepEqual(bytes, [1000, 1000, 500]);
      // keep-alive: one connection does it all
      assert.ok(new Set(fake.seen.map((s) => s.headers.connection)).has('keep-alive'));
    });
  }

  it('416 on a PATCH starts the upload over; a wrong Range too; progress nets out', async () => {
    const data = randomBytes(3000);
    fake.patch416 = 1;
    let net = 0;
    const big = file('restart', data);
    await client.uploadBlob(
      'cocoon/x',
      { digest: sha(data), size: data.length, file: big },
      { chunkBytes: 1000, onBytes: (n) => (net += n) },
    );
    assert.deepEqual(requests().slice(0, 3), [
      'POST /v2/cocoon/x/blobs/uploads/',
      'PATCH /v2/cocoon/x/blobs/uploads/s1',
      'POST /v2/cocoon/x/blobs/uploads/',
    ]);
    assert.deepEqual(fake.blobs.get(sha(data)), data);
    assert.equal(net, 3000);

    fake.reset();
    fake.wrongRange = 1;
    net = 0;
    await client.uploadBlob(
      'cocoon/x',
      { digest: sha(data), size: data.length, file: big },
      { chunkBytes: 1000, onBytes: (n) => (net += n) },
    );
    assert.equal(requests().filter((r) => r.startsWith('POST')).length, 2);
    assert.deepEqual(fake.blobs.get(sha(data)), data);
    assert.equal(net, 3000);

    fake.reset();
    fake.patch416 = 10;
    await assert.rejects(
      client.uploadBlob(
        'cocoon/x',
        { digest: sha(data), size: data.length, file: big },
        { chunkBytes: 1000 },
      ),
      (e: unknown) => {
        assert.ok(e instanceof RegistryError);
        assert.match(e.message, /gave up after 4 attempts/);
        return true;
      },
    );
  });

  it('a digest the registry disagrees with is an error (400 DIGEST_INVALID)', async () => {
    const data = randomBytes(100);
    await assert.rejects(
      client.uploadBlob('cocoon/x', { digest: sha(Buffer.from('other')), size: 100, bytes: data }),
      (e: unknown) => {
        assert.ok(e instanceof RegistryError);
        assert.equal(e.status, 400);
        assert.equal(e.code, 'DIGEST_INVALID');
        return true;
      },
    );
  });

  it('putManifest: the media type as Content-Type, resolves with the digest of the bytes', async () => {
    const body = Buffer.from('{\n  "schemaVersion": 2\n}');
    const d = await client.putManifest(
      'cocoon/x',
      'hibernate',
      body,
      'application/vnd.oci.image.manifest.v1+json',
    );
    assert.equal(d, sha(body));
    assert.equal(fake.seen[0]!.headers['content-type'], 'application/vnd.oci.image.manifest.v1+json');
    assert.deepEqual(fake.manifests.get('hibernate'), body);
  });

  for (const status of [400, 405] as const) {
    it(`deleteManifest: a registry answering ${status} to a tag DELETE ⇒ HEAD the tag, delete by digest`, async () => {
      fake.tagDelete = status;
      const body = Buffer.from('{"schemaVersion":2}');
      fake.manifests.set('hibernate', body);
      fake.manifests.set(sha(body), body);
      const tag = parseReference('hibernate');
      assert.equal(await client.deleteManifest('cocoon/x', tag), 'deleted');
      assert.deepEqual(requests(), [
        'DELETE /v2/cocoon/x/manifests/hibernate',
        'HEAD /v2/cocoon/x/manifests/hibernate',
        `DELETE /v2/cocoon/x/manifests/${sha(body)}`,
      ]);
      assert.equal(fake.manifests.size, 0);
      fake.seen.length = 0;
      assert.equal(await client.deleteManifest('cocoon/x', tag), 'absent');
      assert.deepEqual(requests(), [
        'DELETE /v2/cocoon/x/manifests/hibernate',
        'HEAD /v2/cocoon/x/manifests/hibernate',
      ]);
    });
  }

  it('deleteManifest: 202 ⇒ deleted, 404 ⇒ absent, by tag or by digest', async () => {
    const body = Buffer.from('{"schemaVersion":2}');
    fake.manifests.set('latest', body);
    fake.manifests.set(sha(body), body);
    assert.equal(await client.deleteManifest('cocoon/x', parseReference('latest')), 'deleted');
    assert.equal(await client.deleteManifest('cocoon/x', parseReference('latest')), 'absent');
    assert.equal(await client.deleteManifest('cocoon/x', parseReference(sha(body))), 'absent');
  });

  it('Bearer: uploads and manifest PUT ask pull,push; DELETE asks pull,push,delete; one token per action set', async () => {
    fake.bearer = true;
    const data = randomBytes(2500);
    await client.uploadBlob(
      'cocoon/x',
      { digest: sha(data), size: data.length, file: file('auth', data) },
      { chunkBytes: 1000 },
    );
    assert.equal(await client.headBlob('cocoon/x', sha(data)), true);
    await client.putManifest(
      'cocoon/x',
      'v1',
      Buffer.from('{}'),
      'application/vnd.oci.image.manifest.v1+json',
    );
    assert.deepEqual(fake.tokenScopes, ['repository:cocoon/x:pull,push']);
    // Anonymous first, then every request (the PATCH bodies included) carries the token.
    assert.equal(fake.seen[0]!.headers.authorization, undefined);
    for (const s of fake.seen.slice(1)) assert.equal(s.headers.authorization, 'Bearer tok-1', s.url);
    assert.deepEqual(fake.blobs.get(sha(data)), data);
    await client.deleteManifest('cocoon/x', parseReference('v1'));
    assert.deepEqual(fake.tokenScopes, [
      'repository:cocoon/x:pull,push',
      'repository:cocoon/x:pull,push,delete',
    ]);
    assert.equal(fake.seen.at(-1)!.headers.authorization, 'Bearer tok-2');
  });

  it('an upload Location on another host is refused', async () => {
    const other = http.createServer((_req, res) => {
      res.writeHead(202, { location: 'http://example.invalid/v2/cocoon/x/blobs/uploads/s1' }).end();
    });
    await new Promise<void>((resolve) => other.listen(0, '127.0.0.1', resolve));
    const port = (other.address() as { port: number }).port;
    const c = new RegistryClient({ base: `127.0.0.1:${port}/cocoon`, credentials: noCredentials });
    try {
      await assert.rejects(
        c.uploadBlob('cocoon/x', { digest: sha(Buffer.from('a')), size: 1, bytes: Buffer.from('a') }),
        /upload location http:\/\/example.invalid is not the registry/,
      );
    } finally {
      c.close();
      other.closeAllConnections();
      await new Promise((resolve) => other.close(resolve));
    }
  });
});
