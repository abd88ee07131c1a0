// The exec transports of the kubelet API (docs/contracts/virtual-node.md "Exec transports"): SPDY/3.1 (what kube-apiserver speaks
// to kubelets, translating kubectl's WebSocket) and the WebSocket channel protocol (proxied as-is when
// the node declares ExtendWebSocketsToKubelet). Both turn an `upgrade` request into the
// transport-neutral ExecStreams, run the handler, write its outcome on the error stream/channel and
// close. Client disconnect and idle timeout abort the handler's signal. Protocol decisions live in
// exec-protocol.ts; this module only does the I/O.

import type { IncomingMessage } from 'node:http';
import { type Duplex, Readable, Writable } from 'node:stream';
import type { WebSocket } from 'ws';
import { wsPackage } from '../../util/lazy-packages.ts';
import {
  type ExecOutcome,
  errorStreamPayload,
  expectedSpdyStreams,
  httpErrorResponse,
  isSpdyUpgrade,
  isWebSocketUpgrade,
  type NegotiatedProtocol,
  negotiateSpdyProtocol,
  negotiateWebSocketProtocol,
  parseProtocolOffers,
  SPDY_EXEC_PROTOCOLS,
  type SpdyStreamType,
  spdyUpgradeResponse,
  type TerminalSize,
  TerminalSizeDecoder,
  WEBSOCKET_EXEC_PROTOCOLS,
} from './exec-protocol.ts';
import { headerValue } from './spdy-frames.ts';
import { type FlowControlMode, SpdySession, type SpdyStream } from './spdy-session.ts';

export type { ExecOutcome, TerminalSize } from './exec-protocol.ts';

export interface ExecStreams {
  stdin: NodeJS.ReadableStream | null;
  stdout: NodeJS.WritableStream | null;
  stderr: NodeJS.WritableStream | null;
  tty: boolean;
  resize: AsyncIterable<{ width: number; height: number }> | null;
  /** Aborted on client disconnect or idle timeout. */
  signal: AbortSignal;
}

export type ExecHandler = (streams: ExecStreams) => Promise<ExecOutcome>;

export interface ExecTransportOptions {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
  /** No frame in either direction for this long aborts the exec; 0 disables. */
  idleTimeoutMs: number;
  /** SPDY: how long to wait for the client to open the expected streams (default 30 s). */
  streamCreationTimeoutMs?: number;
  /** Transport and protocol errors (the session is closed after reporting). */
  onError?: (err: Error) => void;
  /** Called once at the end: the outcome written, or why the exec was cut short. */
  onFinished?: (result: ExecFinish) => void;
  /** SPDY send-side flow control (see spdy-session.ts); default 'auto'. */
  sendFlowControl?: FlowControlMode;
}

export interface ExecFinish {
  /** What the handler returned, when it was written to the client. */
  outcome: ExecOutcome | null;
  /** Why the client did not get an outcome: 'client disconnected', 'idle timeout', ... */
  aborted: string | null;
}

const DEFAULT_STREAM_CREATION_TIMEOUT_MS = 30_000;
/** Resize events kept when the handler does not consume them (only the latest size matters). */
const RESIZE_BACKLOG = 16;

/** A small async queue: the resize iterable handed to the handler. */
class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiting: Array<(r: IteratorResult<T>) => void> = [];
  private done = false;
  private readonly limit: number;

  constructor(limit: number) {
    this.limit = limit;
  }

  push(item: T): void {
    if (this.done) return;
    const w = this.waiting.shift();
    if (w) {
      w({ value: item, done: false });
      return;
    }
    this.items.push(item);
    if (this.items.length > this.limit) this.items.shift();
  }

  end(): void {
    this.done = true;
    for (const w of this.waiting.splice(0)) w({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        const item = this.items.shift();
        if (item !== undefined) return Promise.resolve({ value: item, done: false });
        if (this.done) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => this.waiting.push(resolve));
      },
      return: () => {
        this.end();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}

/** Idle detection without re-arming a timer per frame: activity only records a timestamp. */
class IdleTimer {
  private last = Date.now();
  private timer: NodeJS.Timeout | null = null;

  constructor(ms: number, onIdle: () => void) {
    if (ms <= 0) return;
    const check = (): void => {
      const idle = Date.now() - this.last;
      if (idle >= ms) {
        this.timer = null;
        onIdle();
        return;
      }
      this.timer = setTimeout(check, ms - idle);
    };
    this.timer = setTimeout(check, ms);
  }

  touch(): void {
    this.last = Date.now();
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}

function toError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}

/**
 * Socket errors that only mean the client went away (client-go even resets the TCP connection after a
 * successful exec). They surface as `aborted: 'client disconnected'`, not as errors.
 */
function isDisconnect(err: Error): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ECONNABORTED';
}

function reporter(opts: ExecTransportOptions): (err: Error) => void {
  return (err) => {
    if (!isDisconnect(err)) safeCall(opts.onError, err);
  };
}

function safeCall<A>(fn: ((a: A) => void) | undefined, arg: A): void {
  try {
    fn?.(arg);
  } catch {
    // Observers must not break the transport.
  }
}

function rejectUpgrade(
  socket: Duplex,
  status: number,
  message: string,
  headers: Array<[string, string]> = [],
): void {
  socket.on('error', () => undefined);
  socket.end(httpErrorResponse(status, message, headers));
  const t = setTimeout(() => socket.destroy(), 5000);
  t.unref?.();
  socket.once('close', () => clearTimeout(t));
}

function tuneSocket(socket: Duplex): void {
  const s = socket as Partial<{ setNoDelay(v: boolean): void; setTimeout(ms: number): void }>;
  if (typeof s.setNoDelay === 'function') s.setNoDelay(true);
  if (typeof s.setTimeout === 'function') s.setTimeout(0);
}

/** Ends a writable and waits until it has flushed (or was torn down). */
function endAndWait(w: Writable | SpdyStream | null): Promise<void> {
  if (!w || w.writableFinished || w.destroyed) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = (): void => {
      w.off('finish', done);
      w.off('close', done);
      resolve();
    };
    w.on('finish', done);
    w.on('close', done);
    if (!w.writableEnded) w.end();
  });
}

async function runHandler(handler: ExecHandler, streams: ExecStreams): Promise<ExecOutcome> {
  try {
    return await handler(streams);
  } catch (err) {
    return { kind: 'error', message: toError(err).message };
  }
}

/**
 * Serves `kubectl exec` over SPDY/3.1 on an upgraded connection (call from the HTTP(S) server's
 * `upgrade` event). Never throws; errors go to opts.onError.
 */
export function handleSpdyExec(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  opts: ExecTransportOptions,
  handler: ExecHandler,
): void {
  try {
    startSpdyExec(req, socket, head, opts, handler);
  } catch (err) {
    safeCall(opts.onError, toError(err));
    socket.destroy();
  }
}

function startSpdyExec(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  opts: ExecTransportOptions,
  handler: ExecHandler,
): void {
  if (!isSpdyUpgrade(req.headers)) {
    rejectUpgrade(socket, 400, 'unable to upgrade: missing upgrade headers in request');
    return;
  }
  const offers = parseProtocolOffers(req.headers['x-stream-protocol-version']);
  const protocol = negotiateSpdyProtocol(offers);
  if (!protocol) {
    rejectUpgrade(
      socket,
      403,
      `unable to upgrade: unable to negotiate protocol: client supports [${offers.join(' ')}], server accepts [${SPDY_EXEC_PROTOCOLS.join(' ')}]`,
      SPDY_EXEC_PROTOCOLS.map((p): [string, string] => ['X-Accepted-Stream-Protocol-Versions', p]),
    );
    return;
  }
  tuneSocket(socket);
  socket.write(spdyUpgradeResponse(protocol));

  const expected = expectedSpdyStreams(opts, protocol.version);
  const byType = new Map<SpdyStreamType, SpdyStream>();
  const extras: SpdyStream[] = [];
  const abort = new AbortController();
  let phase: 'waiting' | 'running' | 'finishing' | 'done' = 'waiting';
  let started = false;
  let resize: AsyncQueue<TerminalSize> | null = null;
  let creationTimer: NodeJS.Timeout | undefined;

  const finish = (result: ExecFinish): void => {
    if (phase === 'done') return;
    phase = 'done';
    idle.stop();
    clearTimeout(creationTimer);
    safeCall(opts.onFinished, result);
  };
  const cutShort = (reason: string): void => {
    if (phase === 'done') return;
    if (!abort.signal.aborted) abort.abort(new Error(reason));
    resize?.end();
    finish({ outcome: null, aborted: reason });
    session.destroy();
  };

  const idle = new IdleTimer(opts.idleTimeoutMs, () => cutShort('idle timeout'));
  const reportError = reporter(opts);
  const session = new SpdySession(socket, {
    role: 'server',
    sendFlowControl: opts.sendFlowControl ?? 'auto',
    onActivity: () => idle.touch(),
    onError: reportError,
    // The client (spdystream) sends GOAWAY only from Close(), i.e. when it is done with us.
    onGoAway: () => {
      if (phase === 'waiting' || phase === 'running') cutShort('client disconnected');
    },
    onClose: () => {
      if (phase !== 'done')
        cutShort(phase === 'finishing' ? 'client disconnected while finishing' : 'client disconnected');
    },
    onStream: (stream) => {
      // Reply at once: client-go opens streams one by one and waits for each SYN_REPLY.
      stream.sendReply();
      const type = headerValue(stream.headers, 'streamtype');
      if (
        phase === 'waiting' &&
        type &&
        expected.has(type as SpdyStreamType) &&
        !byType.has(type as SpdyStreamType)
      ) {
        byType.set(type as SpdyStreamType, stream);
        if (byType.size === expected.size) begin();
      } else {
        // Unknown, unexpected or duplicate: accept and ignore, as the kubelet does.
        extras.push(stream);
        stream.resume();
      }
    },
  });

  creationTimer = setTimeout(() => {
    if (phase !== 'waiting') return;
    reportError(new Error('timed out waiting for client to create streams'));
    cutShort('stream creation timeout');
  }, opts.streamCreationTimeoutMs ?? DEFAULT_STREAM_CREATION_TIMEOUT_MS);
  creationTimer.unref?.();

  const begin = (): void => {
    if (started) return;
    started = true;
    phase = 'running';
    clearTimeout(creationTimer);
    const stdin = byType.get('stdin') ?? null;
    const stdout = byType.get('stdout') ?? null;
    const stderr = byType.get('stderr') ?? null;
    const error = byType.get('error')!;
    const resizeStream = byType.get('resize') ?? null;
    // Input nobody reads must not hold the session window.
    for (const s of [stdout, stderr, error]) s?.resume();
    for (const s of [stdout, stderr, error, stdin]) s?.on('error', reportError);
    if (resizeStream) {
      const queue = new AsyncQueue<TerminalSize>(RESIZE_BACKLOG);
      resize = queue;
      const decoder = new TerminalSizeDecoder();
      resizeStream.on('data', (chunk: Buffer) => {
        for (const size of decoder.push(chunk)) queue.push(size);
      });
      resizeStream.on('end', () => queue.end());
    }
    const streams: ExecStreams = {
      stdin: opts.stdin ? stdin : null,
      stdout: opts.stdout ? stdout : null,
      stderr: opts.stderr && !opts.tty ? stderr : null,
      tty: opts.tty,
      resize,
      signal: abort.signal,
    };
    void runHandler(handler, streams).then(async (outcome) => {
      if (phase !== 'running') return;
      phase = 'finishing';
      try {
        await Promise.all([endAndWait(stdout), endAndWait(stderr)]);
        if (session.closed) return;
        const payload = errorStreamPayload(outcome, protocol.version);
        if (payload) error.write(payload);
        await endAndWait(error);
        // Half-close the rest: client-go closes its stdin stream when it sees ours closed.
        await Promise.all([stdin, resizeStream, ...extras].map((s) => endAndWait(s)));
        resize?.end();
        if (session.closed) return;
        finish({ outcome, aborted: null });
        await session.close();
      } catch (err) {
        reportError(toError(err));
        cutShort('internal error while finishing');
      }
    });
  };

  session.feed(head);
}

/**
 * Serves `kubectl exec` over the WebSocket channel protocol (v5, v4, v1 and base64 variants) on an
 * upgraded connection. Never throws; errors go to opts.onError.
 */
export function handleWebSocketExec(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  opts: ExecTransportOptions,
  handler: ExecHandler,
): void {
  try {
    startWebSocketExec(req, socket, head, opts, handler);
  } catch (err) {
    safeCall(opts.onError, toError(err));
    socket.destroy();
  }
}

const CHANNEL_STDIN = 0;
const CHANNEL_STDOUT = 1;
const CHANNEL_STDERR = 2;
const CHANNEL_ERROR = 3;
const CHANNEL_RESIZE = 4;
const CHANNEL_CLOSE = 255;

function startWebSocketExec(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  opts: ExecTransportOptions,
  handler: ExecHandler,
): void {
  if (!isWebSocketUpgrade(req.headers)) {
    rejectUpgrade(socket, 400, 'unable to upgrade: not a websocket request');
    return;
  }
  const offers = parseProtocolOffers(req.headers['sec-websocket-protocol']);
  const protocol = negotiateWebSocketProtocol(offers);
  if (!protocol) {
    rejectUpgrade(
      socket,
      403,
      `requested protocol(s) are not supported: [${offers.join(' ')}]; supports [${WEBSOCKET_EXEC_PROTOCOLS.join(' ')}]`,
    );
    return;
  }
  tuneSocket(socket);
  const { WebSocketServer } = wsPackage();
  const wss = new WebSocketServer({
    noServer: true,
    clientTracking: false,
    perMessageDeflate: false,
    maxPayload: 16 * 1024 * 1024,
    handleProtocols: () => protocol.name || false,
  });
  wss.handleUpgrade(req, socket, head, (ws) => runWebSocketExec(ws, protocol, opts, handler));
}

function runWebSocketExec(
  ws: WebSocket,
  protocol: NegotiatedProtocol,
  opts: ExecTransportOptions,
  handler: ExecHandler,
): void {
  const abort = new AbortController();
  const reportError = reporter(opts);
  let phase: 'running' | 'finishing' | 'done' = 'running';
  const idle = new IdleTimer(opts.idleTimeoutMs, () => cutShort('idle timeout'));

  const finish = (result: ExecFinish): void => {
    if (phase === 'done') return;
    phase = 'done';
    idle.stop();
    safeCall(opts.onFinished, result);
  };
  const cutShort = (reason: string): void => {
    if (phase === 'done') return;
    if (!abort.signal.aborted) abort.abort(new Error(reason));
    endInput();
    finish({ outcome: null, aborted: reason });
    ws.terminate();
  };

  const send = (channel: number, data: Buffer, cb?: () => void): void => {
    if (ws.readyState !== ws.OPEN) {
      cb?.();
      return;
    }
    idle.touch();
    const done = (err?: Error): void => {
      if (err) reportError(err);
      cb?.();
    };
    if (protocol.base64) ws.send(String.fromCharCode(48 + channel) + data.toString('base64'), done);
    else ws.send(Buffer.concat([Buffer.from([channel]), data]), { binary: true }, done);
  };

  // stdin: a pull stream; the socket is paused while the handler lags behind.
  let stdinEnded = false;
  const stdin = opts.stdin
    ? new Readable({
        read: () => {
          if (ws.isPaused) ws.resume();
        },
      })
    : null;
  const resize = opts.tty ? new AsyncQueue<TerminalSize>(RESIZE_BACKLOG) : null;
  const decoder = new TerminalSizeDecoder();
  const endInput = (): void => {
    if (stdin && !stdinEnded) {
      stdinEnded = true;
      stdin.push(null);
    }
    resize?.end();
  };

  const output = (channel: number): Writable =>
    new Writable({
      write: (chunk: Buffer, _enc, cb) => send(channel, chunk, () => cb()),
    });
  const stdout = opts.stdout ? output(CHANNEL_STDOUT) : null;
  const stderr = opts.stderr && !opts.tty ? output(CHANNEL_STDERR) : null;
  for (const s of [stdout, stderr, stdin]) s?.on('error', reportError);

  ws.on('error', reportError);
  ws.on('ping', () => idle.touch());
  ws.on('pong', () => idle.touch());
  ws.on('close', () => {
    endInput();
    if (phase !== 'done') cutShort('client disconnected');
  });
  ws.on('message', (raw: Buffer | ArrayBuffer | Buffer[]) => {
    try {
      idle.touch();
      const data = Buffer.isBuffer(raw) ? raw : Array.isArray(raw) ? Buffer.concat(raw) : Buffer.from(raw);
      if (data.length === 0) return;
      if (protocol.version >= 5 && data[0] === CHANNEL_CLOSE) {
        // v5 half-close: [255, channel]. Malformed close frames are ignored.
        if (data.length !== 2) return;
        if (data[1] === CHANNEL_STDIN && stdin && !stdinEnded) {
          stdinEnded = true;
          stdin.push(null);
        } else if (data[1] === CHANNEL_RESIZE) resize?.end();
        return;
      }
      const channel = protocol.base64 ? data[0]! - 48 : data[0]!;
      const payload = protocol.base64
        ? Buffer.from(data.subarray(1).toString('latin1'), 'base64')
        : data.subarray(1);
      if (channel === CHANNEL_STDIN && stdin && !stdinEnded) {
        if (!stdin.push(payload)) ws.pause();
      } else if (channel === CHANNEL_RESIZE) {
        for (const size of decoder.push(payload)) resize?.push(size);
      }
    } catch (err) {
      reportError(toError(err));
    }
  });

  // Like the kubelet: an empty first frame tells the client the streams are ready.
  send(
    opts.stdout ? CHANNEL_STDOUT : opts.stderr && !opts.tty ? CHANNEL_STDERR : CHANNEL_ERROR,
    Buffer.alloc(0),
  );

  const streams: ExecStreams = { stdin, stdout, stderr, tty: opts.tty, resize, signal: abort.signal };
  void runHandler(handler, streams).then(async (outcome) => {
    if (phase !== 'running') return;
    phase = 'finishing';
    try {
      await Promise.all([endAndWait(stdout), endAndWait(stderr)]);
      if (ws.readyState !== ws.OPEN) {
        if (phase === 'finishing') cutShort('client disconnected');
        return;
      }
      const payload = errorStreamPayload(outcome, protocol.version);
      if (payload) await new Promise<void>((resolve) => send(CHANNEL_ERROR, payload, resolve));
      endInput();
      finish({ outcome, aborted: null });
      // A normal closure is what makes client-go's readers see EOF instead of an error.
      ws.close(1000);
    } catch (err) {
      reportError(toError(err));
      cutShort('internal error while finishing');
    }
  });
}
