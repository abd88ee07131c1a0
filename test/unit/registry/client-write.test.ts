// RegistryClient write verbs against a small in-process fake registry (docs/registry.md
// "Distribution API subset", "Authentication"): blob HEAD, single-PUT and chunked uploads,
// 416 restart, relative and absolute Locations with a query, manifest PUT, manifest DELETE
// with the tag ⇒ digest fallback, Bearer tokens with the push (and delete) scope.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, beforeEach, describe, it } from 'node:test';
import type { StreamedBlob } from '../../../src/registry/blob-upload.ts';
import { RegistryClient } from '../../../src/registry/client.ts';
import type { CredentialSource } from '../../../src/registry/credentials.ts';
import { RegistryError } from '../../../src/registry/errors.ts';
import { parseReference } from '../../../src/registry/reference.ts';
import { BUSY_ATTEMPTS, busyWaitMs } from '../../../src/registry/transport.ts';
import { Fake, sha } from './fake-registry.ts';

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

  it('a busy registry (429/503) is asked again after its Retry-After; the body goes again', async () => {
    fake.busy = { count: 2, status: 503, retryAfter: '0' };
    const data = Buffer.from('manifest-bytes');
    const digest = await client.putManifest(
      'cocoon/x',
      'v1',
      data,
      'application/vnd.oci.image.manifest.v1+json',
    );
    assert.equal(digest, sha(data));
    assert.deepEqual(requests(), [
      'PUT /v2/cocoon/x/manifests/v1',
      'PUT /v2/cocoon/x/manifests/v1',
      'PUT /v2/cocoon/x/manifests/v1',
    ]);
    assert.ok(
      fake.seen.every((s) => s.bodyLength === data.length),
      'the same body every time',
    );
  });

  it('a registry that stays busy fails after BUSY_ATTEMPTS tries, naming the status', async () => {
    fake.busy = { count: 100, status: 429, retryAfter: '0' };
    await assert.rejects(client.headBlob('cocoon/x', sha(Buffer.from('b'))), /429/);
    assert.equal(fake.seen.length, BUSY_ATTEMPTS);
  });

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

  describe('uploadStreamedBlob: a blob uploaded as it is read, once', () => {
    /** A source that hands out parts from a buffer; `digest` resolves when the test says. */
    class Source implements StreamedBlob {
      readonly label = 'disk.raw';
      readonly size: number;
      readonly taken: number[] = [];
      readonly #data: Buffer;
      #at = 0;
      #finish!: (d: string) => void;
      readonly #digest = new Promise<string>((resolve) => {
        this.#finish = resolve;
      });

      constructor(data: Buffer) {
        this.#data = data;
        this.size = data.length;
      }

      take(length: number): Readable {
        this.taken.push(length);
        const part = this.#data.subarray(this.#at, this.#at + length);
        this.#at += length;
        if (this.#at === this.size) this.#finish(sha(this.#data));
        return Readable.from([part]);
      }

      digest(): Promise<string> {
        return this.#digest;
      }
    }

    it('POST, PATCH chunks taken in order (the last one shorter), then PUT ?digest= once the digest is known', async () => {
      const data = randomBytes(2500);
      const src = new Source(data);
      const bytes: number[] = [];
      const digest = await client.uploadStreamedBlob('cocoon/x', src, {
        chunkBytes: 1000,
        onBytes: (n) => bytes.push(n),
      });
      assert.equal(digest, sha(data));
      assert.deepEqual(fake.blobs.get(sha(data)), data);
      assert.deepEqual(src.taken, [1000, 1000, 500]);
      assert.deepEqual(bytes, [1000, 1000, 500]);
      assert.deepEqual(
        fake.seen.filter((x) => x.method === 'PATCH').map((x) => x.headers['content-range']),
        ['0-999', '1000-1999', '2000-2499'],
      );
      assert.deepEqual(requests(), [
        'POST /v2/cocoon/x/blobs/uploads/',
        'PATCH /v2/cocoon/x/blobs/uploads/s1',
        'PATCH /v2/cocoon/x/blobs/uploads/s2',
        'PATCH /v2/cocoon/x/blobs/uploads/s3',
        'PUT /v2/cocoon/x/blobs/uploads/s4',
      ]);
      assert.equal(fake.seen.at(-1)!.bodyLength, 0);
    });

    it('a 416 cannot start over (nothing is kept to send again): the upload fails', async () => {
      fake.patch416 = 1;
      const src = new Source(randomBytes(2500));
      await assert.rejects(
        client.uploadStreamedBlob('cocoon/x', src, { chunkBytes: 1000 }),
        (e: unknown) => e instanceof RegistryError && e.status === 416 && /cannot start over/.test(e.message),
      );
      assert.deepEqual(src.taken, [1000]);
    });

    it('a Bearer challenge on a PATCH cannot re-send the part: the upload fails instead of sending short', async () => {
      const src = new Source(randomBytes(2500));
      fake.patch401 = 1;
      const uploading = client.uploadStreamedBlob('cocoon/x', src, { chunkBytes: 1000 });
      await assert.rejects(uploading, /cannot be sent twice/);
    });
  });
});

describe('busyWaitMs (a busy registry: how long until the next try)', () => {
  const now = Date.parse('2026-12-05T00:00:00Z');
  it('takes Retry-After as seconds or as an HTTP date, at most 30 s', () => {
    assert.equal(busyWaitMs('2', 0, now), 2000);
    assert.equal(busyWaitMs(' 0 ', 3, now), 0);
    assert.equal(busyWaitMs('Sat, 05 Dec 2026 00:00:05 GMT', 0, now), 5000);
    assert.equal(busyWaitMs('Fri, 04 Dec 2026 23:59:00 GMT', 0, now), 0, 'a date passed: at once');
    assert.equal(busyWaitMs('120', 0, now), 30_000);
  });
  it('without a usable Retry-After: 0.5 s doubling per try', () => {
    assert.deepEqual(
      [0, 1, 2].map((t) => busyWaitMs(undefined, t, now)),
      [500, 1000, 2000],
    );
    assert.equal(busyWaitMs('soon', 1, now), 1000);
    assert.equal(busyWaitMs('-3', 0, now), 500);
  });
});
