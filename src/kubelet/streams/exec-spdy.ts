// `kubectl exec` over SPDY/3.1 (docs/contracts/virtual-node.md "Exec transports"), what
// kube-apiserver speaks to kubelets (translating kubectl's WebSocket): the upgrade, the streams
// the client opens (one reply each, as client-go expects), the handler, then its outcome on the
// error stream and a half-close of the rest. Client disconnect, GOAWAY and idle timeout abort
// the handler's signal.

import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import {
  errorStreamPayload,
  expectedSpdyStreams,
  isSpdyUpgrade,
  negotiateSpdyProtocol,
  parseProtocolOffers,
  SPDY_EXEC_PROTOCOLS,
  type SpdyStreamType,
  spdyUpgradeResponse,
  type TerminalSize,
  TerminalSizeDecoder,
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
import { headerValue } from './spdy-frames.ts';
import { SpdySession, type SpdyStream } from './spdy-session.ts';

const DEFAULT_STREAM_CREATION_TIMEOUT_MS = 30_000;

/**
 * Serves `kubectl exec` over SPDY/3.1 on an upgraded connection (call from the HTTP(S) server's
 * `upgrade` event). Never throws; errors go to opts.onError.
 */
export const handleSpdyExec: UpgradeHandler = neverThrowing(startSpdyExec);

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
