// A small in-process fake of an OCI distribution registry for the write path (one repository,
// `cocoon/x`): blob HEAD, upload sessions (POST, PATCH with Content-Range, PUT ?digest=, DELETE),
// manifests (PUT, HEAD, DELETE), a Bearer token endpoint, and switches for what it does wrong.
import { createHash } from 'node:crypto';
import http from 'node:http';

export const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  bodyLength: number;
  /** When the request had been read (Date.now()). */
  at: number;
  /** When the first byte of its body arrived (`at` without a body). */
  firstByteAt: number;
}

/** The registry: blobs, manifests, upload sessions, and switches for what it does. */
export class Fake {
  server!: http.Server;
  port = 0;
  readonly blobs = new Map<string, Buffer>();
  readonly manifests = new Map<string, Buffer>();
  readonly sessions = new Map<string, Buffer[]>();
  readonly seen: Seen[] = [];
  readonly tokenScopes: string[] = [];
  /** Upload sessions cancelled with DELETE: the bytes each had received. */
  readonly cancelled: number[] = [];
  /** Location style of upload answers. */
  location: 'relative' | 'absolute' = 'relative';
  /** Answer 416 to this many PATCH requests (each on a fresh session). */
  patch416 = 0;
  /** Report a wrong Range once. */
  wrongRange = 0;
  /** DELETE by tag answers this status (distribution: 400; others 405). */
  tagDelete: 202 | 400 | 405 = 202;
  bearer = false;
  /** Answer this many PATCH requests 401 with a Bearer challenge (a token gone stale mid-upload). */
  patch401 = 0;
  /** Answer the next `count` requests (after the token endpoint) `status`, with `retryAfter`. */
  busy: { count: number; status: 429 | 503; retryAfter?: string } = { count: 0, status: 503 };
  #sessionSeq = 0;

  get host(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      let first = 0;
      req.on('data', (c: Buffer) => {
        first ||= Date.now();
        chunks.push(c);
      });
      req.on('end', () => this.#serve(req, res, Buffer.concat(chunks), first));
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
    this.cancelled.length = 0;
    this.location = 'relative';
    this.patch416 = 0;
    this.wrongRange = 0;
    this.tagDelete = 202;
    this.bearer = false;
    this.patch401 = 0;
    this.busy = { count: 0, status: 503 };
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

  #serve(req: http.IncomingMessage, res: http.ServerResponse, body: Buffer, firstByteAt = 0): void {
    const url = new URL(req.url ?? '/', `http://${this.host}`);
    const method = req.method ?? '';
    if (url.pathname === '/token') {
      this.tokenScopes.push(url.searchParams.get('scope') ?? '');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ token: `tok-${this.tokenScopes.length}`, expires_in: 300 }));
      return;
    }
    this.seen.push({
      method,
      url: req.url ?? '',
      headers: req.headers,
      bodyLength: body.length,
      at: Date.now(),
      firstByteAt: firstByteAt || Date.now(),
    });
    if (this.busy.count > 0) {
      this.busy.count--;
      res.writeHead(
        this.busy.status,
        this.busy.retryAfter === undefined ? {} : { 'retry-after': this.busy.retryAfter },
      );
      res.end('busy');
      return;
    }
    if (this.bearer && !req.headers.authorization?.startsWith('Bearer ')) {
      res.writeHead(401, {
        'www-authenticate': `Bearer realm="http://${this.host}/token",service="fake"`,
      });
      res.end();
      return;
    }
    if (method === 'PATCH' && this.patch401 > 0) {
      this.patch401--;
      res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${this.host}/token",service="fake"` });
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
      if (method === 'DELETE') {
        this.sessions.delete(id);
        this.cancelled.push(have);
        res.writeHead(204).end();
        return;
      }
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
