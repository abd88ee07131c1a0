// The Prometheus listener (docs/metrics.md "`cocoon_vk_*` families", README.md "Configuration" `VK_METRICS_ADDR`): plain HTTP,
// `GET /metrics` only, 404 for every other path.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../log.ts';

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
}

/** Starts the listener; resolves `undefined` when `addr` is empty (disabled). */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer | undefined> {
  const listen = parseListenAddress(options.addr);
  if (!listen) {
    options.log.info('metrics listener disabled (VK_METRICS_ADDR is empty)');
    return undefined;
  }
  const server: Server = createServer((req, res) => {
    void handle(options, req, res);
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
  options.log.info({ addr: `${bound.address}:${bound.port}` }, 'metrics listener started');
  return {
    address: () => bound,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

async function handle(
  options: MetricsServerOptions,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const path = (req.url ?? '/').split('?')[0];
  if (path !== '/metrics') {
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
    res.end('404 page not found\n');
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { 'content-type': 'text/plain; charset=utf-8', allow: 'GET, HEAD' });
    res.end('method not allowed\n');
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
