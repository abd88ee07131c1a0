// A fault-injecting HTTP proxy in front of a real registry (the ground's, or a standalone one), for
// tests of what a real registry will not do on demand: refuse a manifest PUT, go away (refuse
// or reset connections), go away in the middle of an upload, come back.
//
//   const proxy = await RegistryProxy.start(g.registry.hostPort);
//   const registry = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
//   proxy.refuseManifestPut(400);          // PUT .../manifests/<ref> ⇒ 400 MANIFEST_INVALID, not forwarded
//   await proxy.down();                    // connections refused (ECONNREFUSED); down('reset') accepts and resets
//   proxy.downAfterUploadBytes(1 << 20);   // goes down once 1 MiB of blob upload bodies went through
//   proxy.cutNextBlobDownloadAt(0.5);      // closes the next full blob GET's connection after half its bytes
//   await proxy.up();                      // back on the same port
//   proxy.clear();                         // no rules, proxy up state unchanged
//   proxy.requests                         // [{method, path, status}] in arrival order (status or 'refused'/'reset')
//   await proxy.stop();
//
// Requests are forwarded with their Host header unchanged, so the registry builds upload
// Locations that point back at the proxy.
import http from 'node:http';
import type { Socket } from 'node:net';
import { Transform } from 'node:stream';

export interface ProxyRequest {
  readonly method: string;
  /** Path and query as received. */
  readonly path: string;
  /** The status sent back, `'reset'` when the connection was cut, `'error'` when the registry failed. */
  status: number | 'reset' | 'error';
  /** The request's Range header, if any. */
  range?: string;
  /** A download cut by `cutNextBlobDownloadAt`: the bytes that went through before the cut. */
  cutAfter?: number;
}

type DownMode = 'refuse' | 'reset';

/**
 * Resets a connection (RST), or closes it when this side already ended it. libuv refuses a
 * reset after a shutdown (`uv_tcp_close_reset`: EINVAL), and Node then drops the socket's
 * handle without closing it: the test process spun at 100 % CPU in its exit
 * (`Environment::CleanupHandles`) waiting for that handle. The proxy's server ends a connection
 * after answering a `Connection: close` request (every blob GET of bulk-get.ts), so `stop()`
 * met such sockets (docs/test-ground.md "Fault proxy").
 */
export function cut(socket: Socket): void {
  if (socket.writableEnded) socket.destroy();
  else socket.resetAndDestroy();
}

export class RegistryProxy {
  /** `127.0.0.1:<port>` of the proxy (stable across down/up). */
  readonly hostPort: string;
  readonly url: string;
  readonly requests: ProxyRequest[] = [];
  readonly #target: string;
  readonly #server: http.Server;
  readonly #port: number;
  readonly #sockets = new Set<Socket>();
  readonly #agent = new http.Agent({ keepAlive: true });
  #manifestPut: { status: number; code: string } | undefined;
  #state: 'up' | DownMode = 'up';
  #uploadBudget: number | undefined;
  #cutDownloadAt: number | undefined;

  private constructor(server: http.Server, port: number, target: string) {
    this.#server = server;
    this.#port = port;
    this.#target = target;
    this.hostPort = `127.0.0.1:${port}`;
    this.url = `http://${this.hostPort}`;
  }

  /** Starts a proxy for the registry at `target` (`host:port`, plain HTTP). */
  static async start(target: string): Promise<RegistryProxy> {
    let proxy!: RegistryProxy;
    const server = http.createServer((req, res) => proxy.#handle(req, res));
    server.keepAliveTimeout = 30_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const address = server.address();
    if (!address || typeof address !== 'object') throw new Error('proxy: no address');
    proxy = new RegistryProxy(server, address.port, target);
    server.on('connection', (socket: Socket) => proxy.#onConnection(socket));
    return proxy;
  }

  /** Answers every manifest PUT with `status` and an OCI error body instead of forwarding it. */
  refuseManifestPut(status = 400, code = status === 400 ? 'MANIFEST_INVALID' : 'UNKNOWN'): void {
    this.#manifestPut = { status, code };
  }

  /**
   * Goes down: `refuse` stops listening (new connections get ECONNREFUSED), `reset` keeps
   * listening but resets every connection. Open connections are cut either way.
   */
  async down(mode: DownMode = 'refuse'): Promise<void> {
    this.#state = mode;
    this.#cutAll();
    if (mode === 'refuse' && this.#server.listening) {
      await new Promise<void>((resolve) => this.#server.close(() => resolve()));
    }
    if (mode === 'reset' && !this.#server.listening) await this.#listen();
  }

  /** Goes down (`refuse`) as soon as more than `bytes` of blob upload bodies (PATCH/PUT) went through. */
  downAfterUploadBytes(bytes: number): void {
    this.#uploadBudget = bytes;
  }

  /** Resets the connection of the next blob GET answered 200 once `fraction` of its
   * Content-Length went through (once; a Range request after it is served whole). */
  cutNextBlobDownloadAt(fraction: number): void {
    this.#cutDownloadAt = fraction;
  }

  /** Back up on the same port. */
  async up(): Promise<void> {
    if (!this.#server.listening) await this.#listen();
    this.#state = 'up';
  }

  #listen(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(this.#port, '127.0.0.1', () => {
        this.#server.off('error', reject);
        resolve();
      });
    });
  }

  /** Drops every rule (refused manifest PUTs, upload budget); up/down state is unchanged. */
  clear(): void {
    this.#manifestPut = undefined;
    this.#uploadBudget = undefined;
    this.#cutDownloadAt = undefined;
  }

  /** Requests since index `from`, as `METHOD path` without the query. */
  since(from: number): string[] {
    return this.requests.slice(from).map((r) => `${r.method} ${r.path.split('?')[0]}`);
  }

  async stop(): Promise<void> {
    this.#cutAll();
    if (this.#server.listening) await new Promise<void>((resolve) => this.#server.close(() => resolve()));
    this.#agent.destroy();
  }

  #onConnection(socket: Socket): void {
    if (this.#state === 'reset') {
      cut(socket);
      return;
    }
    this.#sockets.add(socket);
    socket.once('close', () => this.#sockets.delete(socket));
  }

  #cutAll(): void {
    for (const s of this.#sockets) cut(s);
    this.#sockets.clear();
  }

  #goDown(): void {
    this.#uploadBudget = undefined;
    void this.down('refuse');
  }

  /** Passes `limit` bytes, then resets the client's connection (the bytes before the reset may
   * or may not reach it: a resume must start where the reader got to, not where this cut). */
  #cutter(limit: number, entry: ProxyRequest, stopUpstream: () => void, socket: Socket): Transform {
    let passed = 0;
    return new Transform({
      transform(chunk: Buffer, _enc, done) {
        const room = limit - passed;
        if (chunk.length < room) {
          passed += chunk.length;
          done(null, chunk);
          return;
        }
        passed += room;
        entry.cutAfter = passed;
        done(null, chunk.subarray(0, room));
        // A close rather than a reset: the reader sees the same thing, a body that ends before
        // its Content-Length (the reset path is the proxy's `down('reset')`).
        setImmediate(() => {
          socket.destroy();
          stopUpstream();
        });
      },
    });
  }

  #handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const method = req.method ?? 'GET';
    const path = req.url ?? '/';
    const entry: ProxyRequest = { method, path, status: 'reset' };
    if (typeof req.headers.range === 'string') entry.range = req.headers.range;
    this.requests.push(entry);
    if (this.#state !== 'up') {
      cut(req.socket);
      return;
    }
    if (this.#manifestPut && method === 'PUT' && /^\/v2\/.+\/manifests\/[^/?]+/.test(path)) {
      const { status, code } = this.#manifestPut;
      req.resume();
      req.once('end', () => {
        entry.status = status;
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ errors: [{ code, message: 'refused by the test proxy' }] }));
      });
      return;
    }
    const isUpload = (method === 'PATCH' || method === 'PUT') && path.includes('/blobs/uploads/');
    const upstream = http.request(
      `http://${this.#target}${path}`,
      { method, headers: req.headers, agent: this.#agent },
      (up) => {
        entry.status = up.statusCode ?? 0;
        res.writeHead(up.statusCode ?? 502, up.headers);
        const length = Number(up.headers['content-length']);
        const cutAt = this.#cutDownloadAt;
        if (
          cutAt !== undefined &&
          method === 'GET' &&
          up.statusCode === 200 &&
          /\/blobs\/sha256:/.test(path)
        ) {
          this.#cutDownloadAt = undefined;
          up.pipe(this.#cutter(Math.floor(length * cutAt), entry, () => up.destroy(), req.socket)).pipe(res);
          return;
        }
        up.pipe(res);
      },
    );
    upstream.on('error', () => {
      if (entry.status === 'reset') entry.status = 'error';
      req.socket.destroy();
    });
    req.on('data', (chunk: Buffer) => {
      if (!isUpload || this.#uploadBudget === undefined) return;
      this.#uploadBudget -= chunk.length;
      if (this.#uploadBudget < 0) {
        upstream.destroy();
        this.#goDown();
      }
    });
    req.pipe(upstream);
  }
}
