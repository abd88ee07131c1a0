// `kubectl exec` over the Kubernetes WebSocket channel protocol (docs/contracts/virtual-node.md
// "Exec transports"; v5, v4, v1 and the base64 variants), proxied as-is by kube-apiserver when
// the node declares ExtendWebSocketsToKubelet: one channel byte per message, stdin pulled (the
// socket paused while the handler lags), v5 half-close frames, the outcome on the error
// channel, then a normal closure. Client disconnect and idle timeout abort the handler's signal.

import type { IncomingMessage } from 'node:http';
import { type Duplex, Readable, Writable } from 'node:stream';
import type { WebSocket } from 'ws';
import { wsPackage } from '../../util/lazy-packages.ts';
import {
  errorStreamPayload,
  isWebSocketUpgrade,
  type NegotiatedProtocol,
  negotiateWebSocketProtocol,
  parseProtocolOffers,
  type TerminalSize,
  TerminalSizeDecoder,
  WEBSOCKET_EXEC_PROTOCOLS,
} from './exec-protocol.ts';
import {
  AsyncQueue,
  type ExecFinish,
  type ExecHandler,
  type ExecStreams,
  type ExecTransportOptions,
  endAndWait,
  IdleTimer,
  neverThrowing,
  RESIZE_BACKLOG,
  rejectUpgrade,
  reporter,
  runHandler,
  safeCall,
  toError,
  tuneSocket,
  type UpgradeHandler,
} from './exec-transport.ts';

/**
 * Serves `kubectl exec` over the WebSocket channel protocol (v5, v4, v1 and base64 variants) on an
 * upgraded connection. Never throws; errors go to opts.onError.
 */
export const handleWebSocketExec: UpgradeHandler = neverThrowing(startWebSocketExec);

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
