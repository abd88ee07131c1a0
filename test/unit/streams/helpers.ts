// Test helpers for the exec transports: an HTTP server on 127.0.0.1 whose `upgrade` event goes to the
// transports under test, a SPDY client built on the session in client mode (shaped like client-go's
// remotecommand client), and a frame-level raw client for flow-control and PING assertions that must not
// depend on the session code being tested.
import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import {
  type ExecFinish,
  type ExecHandler,
  type ExecTransportOptions,
  handleSpdyExec,
  handleWebSocketExec,
} from '../../../src/kubelet/streams/exec-session.ts';
import {
  decodeHeaderBlock,
  encodeFrame,
  encodeHeaderBlock,
  FrameParser,
  type HeaderInput,
  type HeaderMap,
  type SpdyFrame,
} from '../../../src/kubelet/streams/spdy-frames.ts';
import { SpdySession, type SpdyStream } from '../../../src/kubelet/streams/spdy-session.ts';
import { HeaderCompressor, HeaderDecompressor } from '../../../src/kubelet/streams/spdy-zlib.ts';

export interface ExecServer {
  port: number;
  /** One entry per finished exec, in order. */
  finished: ExecFinish[];
  errors: Error[];
  nextFinish(): Promise<ExecFinish>;
  close(): Promise<void>;
}

export type ServerExecOptions = Omit<ExecTransportOptions, 'onError' | 'onFinished'>;

export async function startExecServer(handler: ExecHandler, opts: ServerExecOptions): Promise<ExecServer> {
  const finished: ExecFinish[] = [];
  const errors: Error[] = [];
  const waiters: Array<(f: ExecFinish) => void> = [];
  const sockets = new Set<net.Socket>();
  const server = http.createServer((_req, res) => {
    res.statusCode = 404;
    res.end();
  });
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
    const o: ExecTransportOptions = {
      ...opts,
      onError: (err) => errors.push(err),
      onFinished: (f) => {
        finished.push(f);
        const w = waiters.shift();
        w?.(f);
      },
    };
    if (String(req.headers.upgrade).toLowerCase() === 'websocket')
      handleWebSocketExec(req, socket, head, o, handler);
    else handleSpdyExec(req, socket, head, o, handler);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  let seen = 0;
  return {
    port,
    finished,
    errors,
    nextFinish: () => {
      const f = finished[seen];
      if (f) {
        seen++;
        return Promise.resolve(f);
      }
      return new Promise((resolve) =>
        waiters.push((x) => {
          seen++;
          resolve(x);
        }),
      );
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      server.close();
      await once(server, 'close');
    },
  };
}

export interface UpgradeResult {
  socket: net.Socket;
  status: number;
  headers: Map<string, string[]>;
  /** Body (for error responses) or the first upgraded bytes. */
  rest: Buffer;
}

/** Sends a raw HTTP upgrade request and reads the response head. */
export async function rawUpgrade(
  port: number,
  requestHeaders: Array<[string, string]>,
  path = '/exec/ns/pod/c',
): Promise<UpgradeResult> {
  const socket = net.connect(port, '127.0.0.1');
  await once(socket, 'connect');
  socket.setNoDelay(true);
  const lines = [`POST ${path} HTTP/1.1`, 'Host: 127.0.0.1', ...requestHeaders.map(([k, v]) => `${k}: ${v}`)];
  socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  let buf = Buffer.alloc(0);
  for (;;) {
    const idx = buf.indexOf('\r\n\r\n');
    if (idx >= 0) {
      const head = buf.subarray(0, idx).toString('latin1').split('\r\n');
      const status = Number(head[0]!.split(' ')[1]);
      const headers = new Map<string, string[]>();
      for (const line of head.slice(1)) {
        const i = line.indexOf(':');
        const k = line.slice(0, i).trim().toLowerCase();
        const list = headers.get(k) ?? [];
        list.push(line.slice(i + 1).trim());
        headers.set(k, list);
      }
      return { socket, status, headers, rest: buf.subarray(idx + 4) };
    }
    const [chunk] = (await once(socket, 'data')) as [Buffer];
    buf = Buffer.concat([buf, chunk]);
  }
}

export const SPDY_OFFERS: Array<[string, string]> = [
  ['X-Stream-Protocol-Version', 'v5.channel.k8s.io'],
  ['X-Stream-Protocol-Version', 'v4.channel.k8s.io'],
  ['X-Stream-Protocol-Version', 'v3.channel.k8s.io'],
  ['X-Stream-Protocol-Version', 'v2.channel.k8s.io'],
  ['X-Stream-Protocol-Version', 'channel.k8s.io'],
];

export function spdyUpgradeHeaders(offers: Array<[string, string]> = SPDY_OFFERS): Array<[string, string]> {
  return [['Connection', 'Upgrade'], ['Upgrade', 'SPDY/3.1'], ...offers];
}

export interface SpdyClient {
  session: SpdySession;
  socket: net.Socket;
  protocol: string | undefined;
  closed: Promise<void>;
  /** Opens a stream like client-go: one at a time, each waiting for its SYN_REPLY. */
  open(streamType: string): Promise<SpdyStream>;
}

export async function spdyClient(port: number, offers?: Array<[string, string]>): Promise<SpdyClient> {
  const up = await rawUpgrade(port, spdyUpgradeHeaders(offers));
  if (up.status !== 101) throw new Error(`upgrade failed: ${up.status} ${up.rest.toString()}`);
  let closedResolve: () => void = () => {};
  const closed = new Promise<void>((r) => {
    closedResolve = r;
  });
  const session = new SpdySession(up.socket, { role: 'client', onClose: () => closedResolve() });
  session.feed(up.rest);
  return {
    session,
    socket: up.socket,
    protocol: up.headers.get('x-stream-protocol-version')?.[0],
    closed,
    open: async (streamType) => {
      const s = session.openStream({ streamType });
      await s.reply;
      return s;
    },
  };
}

export async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(Buffer.isBuffer(c) ? c : Buffer.from(c));
  return Buffer.concat(chunks);
}

export function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Resolves when `cond` holds, polling; rejects after `ms`. */
export async function waitFor(cond: () => boolean, ms = 5000, what = 'condition'): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > ms) throw new Error(`timed out waiting for ${what}`);
    await delay(5);
  }
}

export type DecodedFrame = SpdyFrame & { headers?: HeaderMap };

/**
 * Frame-level SPDY client that owns its zlib contexts and never acknowledges anything on its own:
 * tests drive every WINDOW_UPDATE, so they can assert exactly what the server does with the windows.
 */
export class RawSpdyClient {
  readonly socket: net.Socket;
  readonly frames: DecodedFrame[] = [];
  private readonly parser = new FrameParser();
  private readonly deflate = new HeaderCompressor();
  private readonly inflate = new HeaderDecompressor();
  private chain: Promise<void> = Promise.resolve();
  private listeners: Array<() => void> = [];
  ended = false;

  constructor(socket: net.Socket, initial: Buffer) {
    this.socket = socket;
    socket.on('data', (c: Buffer) => this.onData(c));
    socket.on('close', () => {
      this.ended = true;
      this.notify();
    });
    socket.on('error', () => undefined);
    if (initial.length) this.onData(initial);
  }

  static async connect(port: number, offers?: Array<[string, string]>): Promise<RawSpdyClient> {
    const up = await rawUpgrade(port, spdyUpgradeHeaders(offers));
    if (up.status !== 101) throw new Error(`upgrade failed: ${up.status}`);
    return new RawSpdyClient(up.socket, up.rest);
  }

  private onData(chunk: Buffer): void {
    for (const f of this.parser.push(chunk)) {
      // Keep arrival order even though header blocks inflate asynchronously.
      this.chain = this.chain.then(async () => {
        if (f.type === 'SYN_STREAM' || f.type === 'SYN_REPLY' || f.type === 'HEADERS') {
          this.frames.push({
            ...f,
            headers: decodeHeaderBlock(await this.inflate.decompress(f.headerBlock)),
          });
        } else this.frames.push(f);
        this.notify();
      });
    }
  }

  private notify(): void {
    for (const l of this.listeners.splice(0)) l();
  }

  send(frame: SpdyFrame): void {
    this.socket.write(encodeFrame(frame));
  }

  async synStream(streamId: number, headers: HeaderInput, flags = 0): Promise<void> {
    const headerBlock = await this.deflate.compress(encodeHeaderBlock(headers));
    this.send({
      type: 'SYN_STREAM',
      flags,
      streamId,
      associatedStreamId: 0,
      priority: 0,
      slot: 0,
      headerBlock,
    });
  }

  /** Waits until a received frame matches. */
  async waitFrame(pred: (f: DecodedFrame) => boolean, ms = 5000): Promise<DecodedFrame> {
    const start = Date.now();
    for (;;) {
      const f = this.frames.find(pred);
      if (f) return f;
      if (this.ended) throw new Error('connection closed while waiting for a frame');
      if (Date.now() - start > ms) throw new Error('timed out waiting for a frame');
      await Promise.race([new Promise<void>((r) => this.listeners.push(r)), delay(50)]);
    }
  }

  dataOn(streamId: number): Buffer {
    return Buffer.concat(
      this.frames.flatMap((f) => (f.type === 'DATA' && f.streamId === streamId ? [f.data] : [])),
    );
  }

  finOn(streamId: number): boolean {
    return this.frames.some((f) => f.type === 'DATA' && f.streamId === streamId && (f.flags & 1) === 1);
  }

  close(): void {
    this.deflate.close();
    this.inflate.close();
    this.socket.destroy();
  }
}
