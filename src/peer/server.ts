// The peer restore server (shared/spec/peer-restore.md §3; docs/peer-restore.md): the plan
// and slice routes of Go vk-cocoon on one TCP port that serves TLS (ours, with client
// certificates) and, only when allowed, plain HTTP (Go peers). The first byte of a connection
// decides: 0x16 (a TLS handshake record) goes to the HTTPS server, anything else to the plain
// one or is closed. Every request is authorized by the injected policy before any route runs.
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import net from 'node:net';
import type { TLSSocket } from 'node:tls';
import { type Logger, silentLogger } from '../log.ts';
import { planSnapshotFiles, type ScanMethod } from './extents.ts';
import { Gate, KeyedCount, TokenBucket } from './gate.ts';
import { goParseQuery, goQueryGet } from './gojson.ts';
import {
  type PeerResult,
  type PeerRoute,
  type PeerServerMetrics,
  resultOf,
  type SliceContext,
  sendError,
  serveSlice,
} from './slice.ts';
import { encodePlanJson, PLAN_PATH, SLICE_PATH } from './wire.ts';

// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const { createServer: createHttpServer } = process.getBuiltinModule('node:http');

export type { PeerRefusal, PeerResult, PeerRoute, PeerServerMetrics } from './slice.ts';

/** Who is asking, as the transport saw it; the provider's policy decides what that is worth. */
export type PeerCaller =
  | { transport: 'tls'; certCn?: string; certGroups: string[]; certVerified: boolean; remoteAddress: string }
  | { transport: 'plain'; remoteAddress: string };

export type PeerAuthDecision = { ok: true; node: string } | { ok: false; status: 401 | 403; message: string };

export interface PeerServerOptions {
  listen: { host: string; port: number };
  /** PEM serving certificate and key. */
  tls: { cert: string; key: string };
  /** PEM bundle client certificates are verified against; without it no caller is `certVerified`. */
  clientCa?: string;
  /** Snapshot files live at `<storeDir>/<snapshotID>/<file>`. */
  storeDir: string;
  /** Snapshot name → ID (`cocoon snapshot inspect`); 'absent' when there is no such snapshot. */
  resolve(name: string, signal: AbortSignal): Promise<{ id: string } | 'absent'>;
  /** The node-identity policy; `node` keys the caller's share of the stream gate. */
  authorize(who: PeerCaller): Promise<PeerAuthDecision>;
  /** Serve plain-HTTP (Go) clients on the same port; otherwise their connections are closed. */
  allowPlainHttp: boolean;
  /** Slice streams at once (128). */
  maxStreams?: number;
  /** Slice streams of one caller at once (16). */
  maxStreamsPerCaller?: number;
  /** Slice bytes per second, shared by all streams (0: unbounded). */
  bytesPerSecond?: number;
  /** A reader that takes no chunk for this long is cut (30 s). */
  writeStallMs?: number;
  /** Plan requests at once (8); each may spawn a resolve and scan files. */
  maxPlans?: number;
  /** TCP connections at once (512). */
  maxConnections?: number;
  /** Bound on a connection's first byte, a TLS handshake and a request's headers (10 s, Go's ReadHeaderTimeout). */
  headersTimeoutMs?: number;
  /** How extents are found (default: SEEK_DATA via perl, else the read scan). */
  scan?: ScanMethod;
  log?: Logger;
  metrics?: PeerServerMetrics;
}

const HEADERS_MS = 10_000;
const TLS_RECORD_HANDSHAKE = 0x16;
const NODE_PREFIX = 'system:node:';
const NODES_GROUP = 'system:nodes';

/**
 * The node a caller proves with its client certificate: verified against the client CA, CN
 * `system:node:<name>` and the group (O) `system:nodes`, as kubelets' certificates are.
 */
export function nodeFromCert(caller: PeerCaller): string | undefined {
  if (caller.transport !== 'tls' || !caller.certVerified || !caller.certCn) return undefined;
  if (!caller.certCn.startsWith(NODE_PREFIX) || !caller.certGroups.includes(NODES_GROUP)) return undefined;
  const node = caller.certCn.slice(NODE_PREFIX.length);
  return node === '' ? undefined : node;
}

export class PeerServer {
  readonly #o: PeerServerOptions;
  readonly #log: Logger;
  readonly #net: net.Server;
  readonly #http: Server;
  readonly #https: Server;
  readonly #sockets = new Set<net.Socket>();
  readonly #plans: Gate;
  readonly #closing = new AbortController();
  readonly #slice: SliceContext;
  readonly #headersMs: number;
  #port = 0;

  constructor(o: PeerServerOptions) {
    this.#o = o;
    this.#log = (o.log ?? silentLogger).child({ module: 'peer-server' });
    this.#plans = new Gate(o.maxPlans ?? 8);
    this.#slice = {
      storeDir: o.storeDir,
      streams: new Gate(o.maxStreams ?? 128),
      perCaller: new KeyedCount(o.maxStreamsPerCaller ?? 16),
      bucket: new TokenBucket(o.bytesPerSecond ?? 0),
      writeStallMs: o.writeStallMs ?? 30_000,
      metrics: o.metrics,
      log: this.#log,
      closing: this.#closing.signal,
    };
    this.#headersMs = o.headersTimeoutMs ?? HEADERS_MS;
    const handler = (req: IncomingMessage, res: ServerResponse) => void this.#handle(req, res);
    const timeouts = {
      headersTimeout: this.#headersMs,
      requestTimeout: 0,
      connectionsCheckingInterval: Math.min(1000, this.#headersMs),
    };
    this.#http = createHttpServer(timeouts, handler);
    this.#https = createHttpsServer(
      {
        ...timeouts,
        cert: o.tls.cert,
        key: o.tls.key,
        ca: o.clientCa,
        // Verified per request by `authorize` (certVerified), so a caller without a client
        // certificate gets an HTTP answer, not a failed handshake.
        requestCert: true,
        rejectUnauthorized: false,
        minVersion: 'TLSv1.2',
        handshakeTimeout: this.#headersMs,
      },
      handler,
    );
    // The two HTTP servers never listen themselves (connections reach them by 'connection'),
    // but Node enforces headersTimeout from a timer it starts on 'listening': start it.
    this.#http.emit('listening');
    this.#https.emit('listening');
    this.#https.on('tlsClientError', (err) => this.#log.debug({ err: err.message }, 'peer TLS client error'));
    this.#net = net.createServer((socket) => this.#accept(socket));
    this.#net.maxConnections = o.maxConnections ?? 512;
  }

  /** Resolves once listening. */
  start(): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#net.once('error', reject);
      this.#net.listen(this.#o.listen.port, this.#o.listen.host, () => {
        this.#net.off('error', reject);
        const a = this.#net.address();
        this.#port = a && typeof a === 'object' ? a.port : this.#o.listen.port;
        resolve();
      });
    });
  }

  /** The port listened on (the actual one when `listen.port` was 0; 0 before `start()`). */
  get port(): number {
    return this.#port;
  }

  /** Stops accepting, ends the streams and destroys every open connection. */
  async close(): Promise<void> {
    this.#closing.abort();
    const closed = new Promise<void>((resolve) => this.#net.close(() => resolve()));
    for (const s of this.#sockets) s.destroy();
    this.#http.closeAllConnections();
    this.#https.closeAllConnections();
    this.#http.close(); // stops the headers-timeout timer (they never listened: nothing else to close)
    this.#https.close();
    await closed;
  }

  #accept(socket: net.Socket): void {
    this.#sockets.add(socket);
    socket.once('close', () => this.#sockets.delete(socket));
    socket.on('error', (err) => this.#log.debug({ err: err.message }, 'peer connection error'));
    socket.setTimeout(this.#headersMs, () => socket.destroy());
    socket.once('data', (first: Buffer) => {
      socket.setTimeout(0);
      socket.pause();
      socket.unshift(first);
      if (first[0] === TLS_RECORD_HANDSHAKE) {
        this.#https.emit('connection', socket);
      } else if (this.#o.allowPlainHttp) {
        this.#http.emit('connection', socket);
        socket.resume(); // the HTTP server reads a paused socket only once resumed
      } else {
        this.#o.metrics?.refused('plain_http');
        this.#log.debug({ remoteAddress: socket.remoteAddress }, 'peer: plain HTTP refused');
        socket.destroy();
      }
    });
  }

  #caller(req: IncomingMessage): PeerCaller {
    const socket = req.socket as TLSSocket;
    const remoteAddress = socket.remoteAddress ?? '';
    if (!socket.encrypted) return { transport: 'plain', remoteAddress };
    const cert = socket.getPeerCertificate();
    const has = cert !== null && typeof cert === 'object' && Object.keys(cert).length > 0;
    const first = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v);
    const cn = has ? first(cert.subject?.CN as string | string[] | undefined) : undefined;
    const o = has ? (cert.subject?.O as string | string[] | undefined) : undefined;
    return {
      transport: 'tls',
      ...(cn ? { certCn: cn } : {}),
      certGroups: o === undefined ? [] : Array.isArray(o) ? o : [o],
      // Without a client CA Node would verify against the public roots: never "verified" then.
      certVerified: has && socket.authorized === true && this.#o.clientCa !== undefined,
      remoteAddress,
    };
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    const route: PeerRoute = path === PLAN_PATH ? 'plan' : path === SLICE_PATH ? 'slice' : 'other';
    let result: PeerResult;
    try {
      result = await this.#route(req, res, route, q < 0 ? '' : url.slice(q + 1));
    } catch (err) {
      this.#log.warn({ err: (err as Error).message, route }, 'peer request failed');
      sendError(res, 500, 'internal error');
      result = 'error';
    }
    this.#o.metrics?.request(route, result);
  }

  async #route(
    req: IncomingMessage,
    res: ServerResponse,
    route: PeerRoute,
    rawQuery: string,
  ): Promise<PeerResult> {
    const fail = (status: number, message: string): PeerResult => {
      sendError(res, status, message);
      return resultOf(status);
    };
    const decision = await this.#o.authorize(this.#caller(req));
    if (!decision.ok) {
      this.#o.metrics?.refused(decision.status === 401 ? 'unauthorized' : 'forbidden');
      return fail(decision.status, decision.message);
    }
    if (route === 'other') return fail(404, '404 page not found');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      return fail(405, 'Method Not Allowed');
    }
    const query = goParseQuery(rawQuery);
    if (route === 'slice') return await serveSlice(this.#slice, req, res, query, decision.node);
    return await this.#plan(req, res, goQueryGet(query, 'name'));
  }

  async #plan(req: IncomingMessage, res: ServerResponse, name: string): Promise<PeerResult> {
    const fail = (status: number, message: string): PeerResult => {
      sendError(res, status, message);
      return resultOf(status);
    };
    if (name === '') return fail(400, 'name is required');
    if (!this.#plans.tryTake()) {
      this.#o.metrics?.refused('plan_saturated');
      return fail(503, 'plan requests saturated');
    }
    const gone = new AbortController();
    const onGone = () => gone.abort();
    res.once('close', onGone);
    this.#closing.signal.addEventListener('abort', onGone, { once: true });
    try {
      let resolved: { id: string } | 'absent';
      try {
        resolved = await this.#o.resolve(name, gone.signal);
      } catch (err) {
        // The CLI's stderr stays in the log: it may name paths of this host.
        this.#log.warn({ err: (err as Error).message, name }, 'peer plan: resolve failed');
        return fail(500, `resolve snapshot ${name}: failed`);
      }
      if (resolved === 'absent') return fail(404, `snapshot ${name} not found`);
      let body: string;
      try {
        const files = await planSnapshotFiles(this.#o.storeDir, resolved.id, this.#o.scan);
        body = encodePlanJson({ snapshotId: resolved.id, files });
      } catch (err) {
        this.#log.warn({ err: (err as Error).message, name, id: resolved.id }, 'peer plan failed');
        return fail(500, `plan snapshot ${name}: ${(err as Error).message}`);
      }
      if (res.destroyed) return 'incomplete';
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
      res.end(req.method === 'HEAD' ? undefined : body);
      return 'ok';
    } finally {
      res.off('close', onGone);
      this.#closing.signal.removeEventListener('abort', onGone);
      this.#plans.release();
    }
  }
}
