// The kubelet HTTPS API (docs/contracts/virtual-node.md "Kubelet API"): what the apiserver proxies `kubectl logs` and
// `kubectl exec` to, what metrics-server scrapes. Every request except /healthz is
// authenticated and authorized (docs/contracts/virtual-node.md "Authentication and authorization") unless VK_KUBELET_AUTH=none.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { Duplex } from 'node:stream';
import type { V1Pod } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';
import { isLoopbackHost } from '../util/loopback.ts';
import type { AuthDecision } from './auth.ts';
import { type ContainerAccess, InvalidInputError, NotFoundError } from './ports.ts';
import { parseExecQuery, parseLogQuery, podRoute } from './queries.ts';
import { handleSpdyExec, handleWebSocketExec } from './streams/exec-session.ts';

export interface KubeletServerOptions {
  port: number;
  host?: string;
  cert: string;
  key: string;
  /** CA bundle for client certificates (undefined: none are trusted). */
  clientCa: string | undefined;
  /** Authentication + authorization; `undefined` disables both (VK_KUBELET_AUTH=none). */
  authorize: ((req: IncomingMessage) => Promise<AuthDecision>) | undefined;
  provider: ContainerAccess;
  /** `/pods`: this node's pods from the watch cache. */
  nodePods: () => V1Pod[];
  /** `/runningpods/`: the provider's pods. */
  runningPods: () => V1Pod[];
  /** Optional extra routes (stats, resource metrics). */
  extraRoutes?: Record<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>>;
  streamIdleTimeoutMs: number;
  /** VK_KUBELET_MAX_CONNECTIONS: open connections at most; the next ones are closed at once. */
  maxConnections?: number;
  /** Called for every connection closed because `maxConnections` were open. */
  onConnectionDropped?: () => void;
  log: Logger;
}

/** At most one warning a minute about connections dropped at the cap (a flood would
 * otherwise turn into a flood of log lines). */
const DROP_WARN_INTERVAL_MS = 60_000;

function podList(items: V1Pod[]): string {
  return JSON.stringify({ kind: 'PodList', apiVersion: 'v1', metadata: {}, items });
}

function sendText(res: ServerResponse, status: number, text: string, retryAfterSeconds?: number): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    ...(retryAfterSeconds === undefined ? {} : { 'retry-after': String(retryAfterSeconds) }),
  });
  res.end(text);
}

function errorStatus(err: unknown): number {
  if (err instanceof NotFoundError) return 404;
  if (err instanceof InvalidInputError) return 400;
  return 500;
}

function rejectUpgrade(socket: Duplex, status: number, message: string, retryAfterSeconds?: number): void {
  const reason =
    {
      400: 'Bad Request',
      401: 'Unauthorized',
      403: 'Forbidden',
      404: 'Not Found',
      429: 'Too Many Requests',
      500: 'Internal Server Error',
      501: 'Not Implemented',
    }[status] ?? 'Error';
  const retry = retryAfterSeconds === undefined ? '' : `Retry-After: ${retryAfterSeconds}\r\n`;
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(message)}\r\n${retry}Connection: close\r\n\r\n${message}`,
  );
}

export class KubeletServer {
  readonly #o: KubeletServerOptions;
  readonly #server: Server;
  readonly #log: Logger;
  #dropped = 0;
  #dropWarnedAt = Number.NEGATIVE_INFINITY;

  constructor(opts: KubeletServerOptions) {
    this.#o = opts;
    this.#log = opts.log.child({ module: 'kubelet-api' });
    this.#server = createServer(
      {
        cert: opts.cert,
        key: opts.key,
        ca: opts.clientCa,
        requestCert: true,
        // Verification happens per request: a certificate from another CA falls back to
        // bearer-token authentication instead of failing the handshake.
        rejectUnauthorized: false,
        minVersion: 'TLSv1.2',
      },
      (req, res) => void this.#handle(req, res),
    );
    this.#server.headersTimeout = 30_000;
    this.#server.requestTimeout = 0;
    this.#server.on(
      'upgrade',
      (req: IncomingMessage, socket: Duplex, head: Buffer) => void this.#upgrade(req, socket, head),
    );
    this.#server.on('tlsClientError', (err) => this.#log.debug({ err: err.message }, 'TLS client error'));
    // The cap counts TCP connections before TLS: a client that opens sockets and never
    // finishes a handshake (or holds exec streams open) cannot take the daemon's memory and
    // file descriptors with it. Node closes a connection over the cap at once and says so.
    if (opts.maxConnections !== undefined) this.#server.maxConnections = opts.maxConnections;
    this.#server.on('drop', (data) => this.#onDrop(data?.remoteAddress));
  }

  #onDrop(remoteAddress: string | undefined): void {
    this.#dropped++;
    this.#o.onConnectionDropped?.();
    const now = performance.now();
    if (now - this.#dropWarnedAt < DROP_WARN_INTERVAL_MS) return;
    this.#dropWarnedAt = now;
    this.#log.warn(
      { maxConnections: this.#o.maxConnections, droppedSoFar: this.#dropped, remoteAddress },
      'kubelet API connection closed: VK_KUBELET_MAX_CONNECTIONS connections are open',
    );
  }

  listen(): Promise<void> {
    const host = this.#o.host ?? '0.0.0.0';
    // Without authentication the API must not be reachable from another host: anyone
    // could exec into every VM (VK_KUBELET_AUTH=none is for tests on loopback).
    if (!this.#o.authorize && !isLoopbackHost(host)) {
      return Promise.reject(
        new Error(
          `kubelet API without authentication (VK_KUBELET_AUTH=none) refuses to listen on ${host}: only a loopback address is allowed`,
        ),
      );
    }
    return new Promise((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(this.#o.port, host, () => {
        this.#server.off('error', reject);
        resolve();
      });
    });
  }

  get port(): number {
    const a = this.#server.address();
    return a && typeof a === 'object' ? a.port : this.#o.port;
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  async #authorize(req: IncomingMessage): Promise<AuthDecision> {
    if (!this.#o.authorize) return { ok: true, user: { name: 'anonymous', groups: [] } };
    return await this.#o.authorize(req);
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'https://kubelet');
    const path = url.pathname;
    try {
      if (path === '/healthz') {
        sendText(res, 200, 'ok');
        return;
      }
      const decision = await this.#authorize(req);
      if (!decision.ok) {
        sendText(res, decision.status, decision.message, decision.retryAfterSeconds);
        return;
      }
      const method = req.method ?? 'GET';
      const first = path.split('/')[1] ?? '';
      if ((path === '/pods' || path === '/pods/') && method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(podList(this.#o.nodePods()));
        return;
      }
      if ((path === '/runningpods' || path === '/runningpods/') && method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(podList(this.#o.runningPods()));
        return;
      }
      if (first === 'containerLogs' && method === 'GET') {
        await this.#logs(res, url);
        return;
      }
      if (first === 'exec') {
        sendText(res, 400, 'Upgrade request required');
        return;
      }
      if (first === 'attach' || first === 'portForward' || first === 'run') {
        sendText(res, 501, `${first} is not supported by vk-cocoon`);
        return;
      }
      const extra = this.#o.extraRoutes?.[path];
      if (extra && method === 'GET') {
        await extra(req, res);
        return;
      }
      sendText(res, 404, '404 request not found');
    } catch (err) {
      this.#log.warn({ path, err: String(err) }, 'kubelet API request failed');
      sendText(res, errorStatus(err), err instanceof Error ? err.message : String(err));
    }
  }

  async #logs(res: ServerResponse, url: URL): Promise<void> {
    const route = podRoute(url.pathname, 'containerLogs');
    if (!route) {
      sendText(res, 400, 'expected /containerLogs/{namespace}/{pod}/{container}');
      return;
    }
    const q = parseLogQuery(url.searchParams);
    if (!q.ok) {
      sendText(res, 400, q.message);
      return;
    }
    const abort = new AbortController();
    res.on('close', () => abort.abort());
    const stream = await this.#o.provider.getContainerLogs(
      route.namespace,
      route.pod,
      route.container,
      q.value,
      abort.signal,
    );
    res.writeHead(200, { 'content-type': 'text/plain', 'transfer-encoding': 'chunked' });
    let idle: NodeJS.Timeout | undefined;
    const resetIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => abort.abort(), this.#o.streamIdleTimeoutMs);
      idle.unref();
    };
    resetIdle();
    abort.signal.addEventListener('abort', () => stream.destroy(), { once: true });
    await new Promise<void>((resolve) => {
      stream.on('data', (chunk: Buffer) => {
        resetIdle();
        if (!res.write(chunk)) {
          stream.pause();
          res.once('drain', () => stream.resume());
        }
      });
      stream.on('end', resolve);
      stream.on('close', resolve);
      stream.on('error', (err) => {
        this.#log.debug({ err: err.message }, 'log stream error');
        resolve();
      });
    });
    clearTimeout(idle);
    res.end();
  }

  async #upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', (err) => this.#log.debug({ err: err.message }, 'upgrade socket error'));
    const url = new URL(req.url ?? '/', 'https://kubelet');
    try {
      const decision = await this.#authorize(req);
      if (!decision.ok) {
        rejectUpgrade(socket, decision.status, decision.message, decision.retryAfterSeconds);
        return;
      }
      const first = url.pathname.split('/')[1] ?? '';
      if (first === 'attach' || first === 'portForward') {
        rejectUpgrade(socket, 501, `${first} is not supported by vk-cocoon`);
        return;
      }
      const route = podRoute(url.pathname, 'exec');
      if (!route) {
        rejectUpgrade(socket, 404, '404 request not found');
        return;
      }
      const q = parseExecQuery(url.searchParams);
      if (!q.ok) {
        rejectUpgrade(socket, 400, q.message);
        return;
      }
      const { command, stdin, stdout, stderr, tty } = q.value;
      const opts = { stdin, stdout, stderr, tty, idleTimeoutMs: this.#o.streamIdleTimeoutMs };
      const handler = (streams: Parameters<ContainerAccess['runInContainer']>[4]) =>
        this.#o.provider.runInContainer(route.namespace, route.pod, route.container, command, streams);
      const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
      // The fact of an exec, never its argv: a command line can carry secrets (passwords,
      // tokens in curl headers) and logs are read by more people than the VM's owner.
      this.#log.info(
        {
          pod: `${route.namespace}/${route.pod}`,
          container: route.container,
          user: decision.user.name,
          transport: upgrade,
          tty,
        },
        'exec',
      );
      if (upgrade === 'websocket') handleWebSocketExec(req, socket, head, opts, handler);
      else handleSpdyExec(req, socket, head, opts, handler);
    } catch (err) {
      rejectUpgrade(socket, errorStatus(err), err instanceof Error ? err.message : String(err));
    }
  }
}
