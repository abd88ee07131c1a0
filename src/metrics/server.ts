// The Prometheus listener (docs/metrics.md "`cocoon_vk_*` families", README.md "Configuration" `VK_METRICS_ADDR`): plain HTTP,
// `GET /metrics` only, 404 for every other path. With VK_DEBUG_ENDPOINTS=true it also serves
// what /debug/pprof is to a Go daemon (docs/operations.md "Profiling in place"): a CPU profile
// of N seconds (`/debug/pprof/profile?seconds=N`, a .cpuprofile for Chrome DevTools) and a
// heap snapshot (`/debug/pprof/heap`, a .heapsnapshot), one at a time (409 while busy).
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream/promises';
import { getHeapSnapshot } from 'node:v8';
import type { Logger } from '../log.ts';
import { pause } from '../util/deadline.ts';
import { isLoopbackHost } from '../util/loopback.ts';

// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const { createServer } = process.getBuiltinModule('node:http');

export interface ListenAddress {
  /** `undefined`: every interface (the `:port` form). */
  host: string | undefined;
  port: number;
}

/**
 * Parses `host:port`, `[v6]:port` or `:port`. Returns `undefined` for the empty string (the
 * listener is disabled) and throws on anything else malformed.
 */
export function parseListenAddress(addr: string): ListenAddress | undefined {
  if (addr === '') return undefined;
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]*)):([0-9]{1,5})$/.exec(addr);
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || !Number.isInteger(port) || port > 65535) {
    throw new Error(`invalid listen address ${JSON.stringify(addr)}: expected host:port or :port`);
  }
  const host = m[1] ?? (m[2] === '' ? undefined : m[2]);
  return { host, port };
}

/** What the listener renders: `createMetrics()` satisfies it. */
export interface MetricsSource {
  render(): Promise<string>;
  contentType: string;
}

export interface MetricsServer {
  /** The bound address (useful with port 0). */
  address(): AddressInfo;
  close(): Promise<void>;
}

export interface MetricsServerOptions {
  /** `VK_METRICS_ADDR`; empty disables the listener. */
  addr: string;
  metrics: MetricsSource;
  log: Logger;
  /** `VK_DEBUG_ENDPOINTS`: serve /debug/pprof/profile and /debug/pprof/heap (default off: 404). */
  debugEndpoints?: boolean;
}

/** Starts the listener; resolves `undefined` when `addr` is empty (disabled). */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer | undefined> {
  const listen = parseListenAddress(options.addr);
  if (!listen) {
    options.log.info('metrics listener disabled (VK_METRICS_ADDR is empty)');
    return undefined;
  }
  // The configuration refuses this already (src/config/env.ts); the listener checks again so
  // no other caller can put a heap snapshot on every interface.
  if (options.debugEndpoints && (listen.host === undefined || !isLoopbackHost(listen.host)))
    throw new Error(
      `VK_DEBUG_ENDPOINTS=true needs VK_METRICS_ADDR on a loopback host, not ${JSON.stringify(options.addr)}`,
    );
  const debug = options.debugEndpoints ? new DebugEndpoints(options.log) : undefined;
  const server: Server = createServer((req, res) => {
    void handle(options, debug, req, res);
  });
  server.requestTimeout = 30_000;
  server.headersTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => options.log.warn({ err: String(err) }, 'metrics listener error'));
  const bound = server.address() as AddressInfo;
  options.log.info(
    { addr: `${bound.address}:${bound.port}`, debugEndpoints: debug !== undefined },
    'metrics listener started',
  );
  return {
    address: () => bound,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

function sendText(
  res: ServerResponse,
  status: number,
  text: string,
  headers: Record<string, string> = {},
): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', ...headers });
  res.end(text);
}

async function handle(
  options: MetricsServerOptions,
  debug: DebugEndpoints | undefined,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://metrics');
  const path = url.pathname;
  if (debug && path.startsWith(DEBUG_PREFIX)) {
    await debug.handle(req, res, url);
    return;
  }
  if (path !== '/metrics') {
    sendText(res, 404, '404 page not found\n');
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    sendText(res, 405, 'method not allowed\n', { allow: 'GET, HEAD' });
    return;
  }
  try {
    const body = await options.metrics.render();
    res.writeHead(200, {
      'content-type': options.metrics.contentType,
      'content-length': Buffer.byteLength(body),
    });
    res.end(req.method === 'HEAD' ? undefined : body);
  } catch (err) {
    options.log.warn({ err: String(err) }, 'rendering metrics failed');
    if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
    res.end('metrics unavailable\n');
  }
}

const DEBUG_PREFIX = '/debug/pprof/';
/** `?seconds=` of a CPU profile: default 30 (Go's), bounded 1–60. */
export const PROFILE_SECONDS = { default: 30, min: 1, max: 60 } as const;

/** Parses `seconds` of `/debug/pprof/profile`; a string is the 400 message. */
export function profileSeconds(raw: string | null): number | string {
  if (raw === null || raw === '') return PROFILE_SECONDS.default;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < PROFILE_SECONDS.min || n > PROFILE_SECONDS.max)
    return `seconds=${JSON.stringify(raw)}: expected an integer from ${PROFILE_SECONDS.min} to ${PROFILE_SECONDS.max}\n`;
  return n;
}

function stamp(): string {
  return new Date().toISOString().replace(/[:.]/g, '-');
}

/**
 * The debug endpoints: a CPU profile through the inspector's Profiler (in-process session,
 * sampling on V8's profiler thread, so the daemon keeps running while it records) and a heap
 * snapshot streamed from V8 (the snapshot itself stops the world while it is taken). One at
 * a time: a second request while one runs is answered 409.
 */
class DebugEndpoints {
  readonly #log: Logger;
  #busy: string | undefined;

  constructor(log: Logger) {
    this.#log = log.child({ module: 'debug-endpoints' });
  }

  async handle(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const what = url.pathname.slice(DEBUG_PREFIX.length);
    if (what !== 'profile' && what !== 'heap') {
      sendText(
        res,
        404,
        '404 page not found (debug endpoints: /debug/pprof/profile?seconds=N, /debug/pprof/heap)\n',
      );
      return;
    }
    if (req.method !== 'GET') {
      sendText(res, 405, 'method not allowed\n', { allow: 'GET' });
      return;
    }
    const seconds = what === 'profile' ? profileSeconds(url.searchParams.get('seconds')) : 0;
    if (typeof seconds === 'string') {
      sendText(res, 400, seconds);
      return;
    }
    if (this.#busy) {
      sendText(res, 409, `a ${this.#busy} is being taken; try again when it is done\n`);
      return;
    }
    this.#busy = what === 'profile' ? 'CPU profile' : 'heap snapshot';
    const t0 = Date.now();
    try {
      if (what === 'profile') await this.#profile(req, res, seconds);
      else await this.#heap(res);
      this.#log.info(
        { what, seconds: what === 'profile' ? seconds : undefined, ms: Date.now() - t0 },
        'debug endpoint served',
      );
    } catch (err) {
      this.#log.warn({ what, err: String(err) }, 'debug endpoint failed');
      if (!res.headersSent) sendText(res, 500, `${what} failed: ${String(err)}\n`);
      else res.destroy();
    } finally {
      this.#busy = undefined;
    }
  }

  async #profile(req: IncomingMessage, res: ServerResponse, seconds: number): Promise<void> {
    // A client that goes away ends the recording early (and gets nothing).
    const gone = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) gone.abort();
    };
    req.socket.once('close', onClose);
    // Loaded on the first profile only: node:inspector/promises is ~30 modules a daemon without
    // VK_DEBUG_ENDPOINTS, or that is never profiled, does not need.
    const { Session } = await import('node:inspector/promises');
    const session = new Session();
    session.connect();
    try {
      await session.post('Profiler.enable');
      await session.post('Profiler.start');
      let stopped = false;
      try {
        await pause(seconds * 1000, gone.signal); // a plain setTimeout: tests tick it
        const { profile } = await session.post('Profiler.stop');
        stopped = true;
        if (gone.signal.aborted) return;
        const body = JSON.stringify(profile);
        res.writeHead(200, {
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
          'content-disposition': `attachment; filename="vk-cocoon-${stamp()}.cpuprofile"`,
        });
        res.end(body);
      } finally {
        if (!stopped) await session.post('Profiler.stop').catch(() => {});
        await session.post('Profiler.disable').catch(() => {});
      }
    } finally {
      session.disconnect();
      req.socket.off('close', onClose);
    }
  }

  async #heap(res: ServerResponse): Promise<void> {
    const snapshot = getHeapSnapshot();
    res.writeHead(200, {
      'content-type': 'application/json',
      'content-disposition': `attachment; filename="vk-cocoon-${stamp()}.heapsnapshot"`,
    });
    await pipeline(snapshot, res);
  }
}
