// What both exec transports share (exec-session.ts is their entry point): the transport-neutral
// ExecStreams handed to the handler, the options and the outcome report, and the I/O helpers of
// an upgraded connection (the resize queue, idle detection, error reporting, rejecting an
// upgrade, ending a stream and waiting for it to flush, running the handler).

import type { IncomingMessage } from 'node:http';
import type { Duplex, Writable } from 'node:stream';
import { type ExecOutcome, httpErrorResponse } from './exec-protocol.ts';
import type { FlowControlMode, SpdyStream } from './spdy-session.ts';

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

/** Resize events kept when the handler does not consume them (only the latest size matters). */
export const RESIZE_BACKLOG = 16;

/** A small async queue: the resize iterable handed to the handler. */
export class AsyncQueue<T> implements AsyncIterable<T> {
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
export class IdleTimer {
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

export function toError(err: unknown): Error {
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

export function reporter(opts: ExecTransportOptions): (err: Error) => void {
  return (err) => {
    if (!isDisconnect(err)) safeCall(opts.onError, err);
  };
}

export function safeCall<A>(fn: ((a: A) => void) | undefined, arg: A): void {
  try {
    fn?.(arg);
  } catch {
    // Observers must not break the transport.
  }
}

export function rejectUpgrade(
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

export function tuneSocket(socket: Duplex): void {
  const s = socket as Partial<{ setNoDelay(v: boolean): void; setTimeout(ms: number): void }>;
  if (typeof s.setNoDelay === 'function') s.setNoDelay(true);
  if (typeof s.setTimeout === 'function') s.setTimeout(0);
}

/** Ends a writable and waits until it has flushed (or was torn down). */
export function endAndWait(w: Writable | SpdyStream | null): Promise<void> {
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

/** A transport's entry point on an upgraded connection (from the HTTP(S) server's `upgrade` event). */
export type UpgradeHandler = (
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  opts: ExecTransportOptions,
  handler: ExecHandler,
) => void;

/** A transport's start as its entry point: it never throws; errors go to opts.onError and the
 * socket is destroyed. */
export function neverThrowing(start: UpgradeHandler): UpgradeHandler {
  return (req, socket, head, opts, handler) => {
    try {
      start(req, socket, head, opts, handler);
    } catch (err) {
      safeCall(opts.onError, toError(err));
      socket.destroy();
    }
  };
}

export async function runHandler(handler: ExecHandler, streams: ExecStreams): Promise<ExecOutcome> {
  try {
    return await handler(streams);
  } catch (err) {
    return { kind: 'error', message: toError(err).message };
  }
}
