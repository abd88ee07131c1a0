// Fixtures of the peer restore tests: registry configs, temp dirs, sparse files, a PeerServer on
// 127.0.0.1 and a raw-socket peer that answers with the exact bytes it is given (Go's wire form).
import { X509Certificate } from 'node:crypto';
import { closeSync, ftruncateSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type PeerCaller,
  PeerServer,
  type PeerServerMetrics,
  type PeerServerOptions,
} from '../../../src/peer/server.ts';
import { certSha256 } from '../../../src/peer/transport.ts';
import type { SnapshotConfig } from '../../../src/registry/artifact-config.ts';
import { issue, makeCa, type Pair } from '../fakes/pki.ts';

export function snapshotConfig(snapshotId: string, extra: Partial<SnapshotConfig> = {}): SnapshotConfig {
  return { schemaVersion: 'v1', snapshotId, files: {}, raw: {}, ...extra };
}

/** A fresh temp directory, removed by the returned cleanup. */
export function tempDir(prefix = 'peer-test-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Writes `parts` at their offsets into a file of apparent size `size` (the rest holes). */
export function writeSparse(path: string, size: number, parts: [offset: number, data: Buffer][]): void {
  const fd = openSync(path, 'w');
  try {
    for (const [offset, data] of parts) writeSync(fd, data, 0, data.length, offset);
    ftruncateSync(fd, size);
  } finally {
    closeSync(fd);
  }
}

/** The §8 sparse test file: 4 KiB at 0, 32 KiB at 3 MiB, 4 MiB in all (the spec's plan example). */
export function writeSpecSparse(path: string): void {
  writeSparse(path, 4 << 20, [
    [0, Buffer.alloc(4096, 'a')],
    [3 << 20, Buffer.alloc(32 * 1024, 'b')],
  ]);
}

/** Metrics that record what they were told. */
export function recordingMetrics(): PeerServerMetrics & {
  streams: number[];
  bytes: number;
  requests: string[];
  refusals: string[];
} {
  const m = {
    streams: [] as number[],
    bytes: 0,
    requests: [] as string[],
    refusals: [] as string[],
    streamsInUse: (n: number) => m.streams.push(n),
    bytesServed: (n: number) => {
      m.bytes += n;
    },
    request: (route: string, result: string) => m.requests.push(`${route}:${result}`),
    refused: (reason: string) => m.refusals.push(reason),
  };
  return m;
}

/** Authorizes everyone as node `n1` (the plain-HTTP and TLS tests narrow this). */
export const allowAll = async (_who: PeerCaller) => ({ ok: true as const, node: 'n1' });

export async function startPeer(
  o: Partial<PeerServerOptions> & Pick<PeerServerOptions, 'storeDir'>,
): Promise<{ server: PeerServer; base: string; stop: () => Promise<void> }> {
  const { server: cert, ca } = await testPki();
  const server = new PeerServer({
    tls: { cert: cert.cert, key: cert.key },
    clientCa: ca.cert,
    listen: { host: '127.0.0.1', port: 0 },
    resolve: async () => 'absent',
    authorize: allowAll,
    allowPlainHttp: true,
    ...o,
  });
  await server.start();
  return { server, base: `http://127.0.0.1:${server.port}`, stop: () => server.close() };
}

export interface RawRequest {
  method: string;
  target: string;
  path: string;
  query: string;
  headers: string[];
}

/**
 * A peer on a raw socket: each request's head is parsed and `answer` gives the exact bytes
 * to write (a string or buffers), or 'hang' to write nothing more; a function may write parts
 * itself and keep the socket open. Keep-alive: several requests per connection are served.
 */
export async function rawPeer(
  answer: (req: RawRequest, socket: net.Socket) => string | Buffer | 'hang',
): Promise<{ base: string; requests: RawRequest[]; stop: () => Promise<void> }> {
  const requests: RawRequest[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let buffered = '';
    socket.on('data', (chunk) => {
      buffered += chunk.toString('latin1');
      for (let end = buffered.indexOf('\r\n\r\n'); end >= 0; end = buffered.indexOf('\r\n\r\n')) {
        const head = buffered.slice(0, end).split('\r\n');
        buffered = buffered.slice(end + 4);
        const [method = '', target = ''] = (head[0] ?? '').split(' ');
        const q = target.indexOf('?');
        const req = {
          method,
          target,
          path: q < 0 ? target : target.slice(0, q),
          query: q < 0 ? '' : target.slice(q + 1),
          headers: head.slice(1),
        };
        requests.push(req);
        const out = answer(req, socket);
        if (out !== 'hang') socket.write(out);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    base: `http://127.0.0.1:${port}`,
    requests,
    stop: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A Go-style response with a fixed body (Content-Length), as net/http writes a small one. */
export function goFixed(status: string, contentType: string, body: string): string {
  return (
    `HTTP/1.1 ${status}\r\nContent-Type: ${contentType}\r\nDate: Tue, 02 Dec 2025 16:00:00 GMT\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
}

/** A Go slice response: chunked body and the trailer lines given (exact text). */
export function goSlice(body: Buffer | string, trailerLines: string[], declare = true): Buffer {
  const data = typeof body === 'string' ? Buffer.from(body) : body;
  const head =
    'HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n' +
    (declare ? 'Trailer: X-Slice-Crc32c\r\n' : '') +
    'Date: Tue, 02 Dec 2025 16:00:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n';
  const chunk =
    data.length > 0
      ? Buffer.concat([Buffer.from(`${data.length.toString(16)}\r\n`), data, Buffer.from('\r\n')])
      : Buffer.alloc(0);
  const tail = `0\r\n${trailerLines.map((l) => `${l}\r\n`).join('')}\r\n`;
  return Buffer.concat([Buffer.from(head), chunk, Buffer.from(tail)]);
}

/** Query parameters of a raw request, decoded. */
export function params(req: RawRequest): URLSearchParams {
  return new URLSearchParams(req.query);
}

export interface Got {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
  trailers: Record<string, string | undefined>;
}

/** One request with node:http (a fresh connection), the whole body read. */
export function httpGet(
  url: string,
  o: { method?: string; headers?: Record<string, string>; localAddress?: string } = {},
): Promise<Got> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method: o.method ?? 'GET',
      headers: o.headers,
      localAddress: o.localAddress,
      agent: false,
    });
    req.on('error', reject);
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('error', reject);
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(parts),
          trailers: res.trailers,
        }),
      );
    });
    req.end();
  });
}

/** Sends raw request bytes and collects everything the server sends until it closes the connection. */
export function rawExchange(port: number, request: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    const s = net.connect(port, '127.0.0.1', () => s.write(request));
    s.on('data', (d) => parts.push(d));
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(parts)));
  });
}

/** Resolves once `check()` holds, polling on the event loop (no wall-clock bound: the test's own timeout rules). */
export async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 5));
}

export interface Pki {
  ca: Pair;
  server: Pair;
  /** CN=system:node:n1, O=system:nodes, issued by `ca`. */
  node: Pair;
  /** The same subject from another CA (not verified by the server). */
  stranger: Pair;
  /** Hex SHA-256 of the server certificate's DER. */
  pin: string;
}

let pki: Promise<Pki> | undefined;

/** A throwaway PKI shared by the tests of a file (made once). */
export function testPki(): Promise<Pki> {
  pki ??= (async () => {
    const ca = await makeCa('CN=peer-ca');
    const other = await makeCa('CN=other-ca');
    const server = await issue(ca, 'CN=peer-server', 'server', [{ type: 'ip', value: '127.0.0.1' }]);
    const node = await issue(ca, 'CN=system:node:n1, O=system:nodes', 'client');
    const stranger = await issue(other, 'CN=system:node:n1, O=system:nodes', 'client');
    return { ca, server, node, stranger, pin: certSha256(new X509Certificate(server.cert)) };
  })();
  return pki;
}
