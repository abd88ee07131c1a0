// A SPDY/3.1 session over a byte stream (net.Socket, TLSSocket or any Duplex), either end. Hand-written
// for the reason given in spdy-frames.ts. Shaped after what moby/spdystream (kube-apiserver's and
// kubectl's SPDY stack) does and expects:
// - every stream the peer opens gets a SYN_REPLY before we send DATA on it; FIN half-closes;
// - peer PINGs (odd ids from a client) are echoed; SETTINGS and unknown control frames are tolerated;
// - spdystream implements no flow control at all: it never sends WINDOW_UPDATE or SETTINGS and ignores
//   ours, relying on TCP back-pressure. Honouring the 64 KiB default send window against it would stall
//   every exec after 64 KiB of output. So send-side flow control is enforced once the peer shows it does
//   flow control (a SETTINGS INITIAL_WINDOW_SIZE or any WINDOW_UPDATE), or always with 'always'. Windows
//   are tracked from the first byte either way, and WINDOW_UPDATEs are always sent for consumed input.
// Nothing here throws out of a socket callback: failures go to onError and end the session.

import { Duplex } from 'node:stream';
import {
  DEFAULT_INITIAL_WINDOW_SIZE,
  decodeHeaderBlock,
  encodeFrame,
  encodeHeaderBlock,
  FLAG_FIN,
  FLAG_UNIDIRECTIONAL,
  FrameParser,
  GOAWAY_STATUS,
  type GoAwayFrame,
  type HeaderInput,
  type HeaderMap,
  MAX_STREAM_ID,
  MAX_WINDOW_SIZE,
  RST_STATUS,
  SETTINGS_ID,
  type SpdyFrame,
  SpdyProtocolError,
} from './spdy-frames.ts';
import { HeaderCompressor, HeaderDecompressor } from './spdy-zlib.ts';

/**
 * 'auto': enforce the peer's windows once it has sent SETTINGS INITIAL_WINDOW_SIZE or a WINDOW_UPDATE;
 * 'always': enforce from the start (spec-strict; stalls against spdystream); 'never': ignore windows.
 */
export type FlowControlMode = 'auto' | 'always' | 'never';

export interface SpdySessionOptions {
  /** Servers open even stream ids and answer odd-id PINGs; clients the reverse. */
  role: 'server' | 'client';
  /** A stream opened by the peer (SYN_STREAM), headers decoded. Call stream.reply() to accept it. */
  onStream?: (stream: SpdyStream) => void;
  onGoAway?: (frame: GoAwayFrame) => void;
  /** Called once when the transport is gone; `err` is set when the session failed. */
  onClose?: (err?: Error) => void;
  /** Protocol or transport errors; the session closes itself after reporting. */
  onError?: (err: Error) => void;
  /** Any frame read or written (for idle timers). */
  onActivity?: () => void;
  sendFlowControl?: FlowControlMode;
  /** Largest incoming frame payload accepted (default 2^24-1). */
  maxFramePayload?: number;
  /** Outgoing DATA frames are split at this size (default 32 KiB). */
  maxDataFrameSize?: number;
  /** Pause reading the socket while more unread inbound DATA than this is buffered (default 1 MiB). */
  maxBufferedBytes?: number;
  /** After a graceful close() the socket is destroyed if the peer has not closed it by then (default 5 s). */
  closeGraceMs?: number;
}

/** WINDOW_UPDATEs are batched until this much input was consumed (half the default window). */
const ACK_THRESHOLD = DEFAULT_INITIAL_WINDOW_SIZE / 2;

/**
 * One SPDY stream as a Node Duplex. The readable side carries the peer's DATA (ending on its FIN or
 * RST); the writable side sends DATA, `end()` sends FIN. Writes after the stream or session closed are
 * discarded rather than errored: callers learn about disconnects from the session, and a stray write
 * must never crash the process through an unhandled 'error' event.
 */
export class SpdyStream extends Duplex {
  readonly id: number;
  /** SYN_STREAM headers: the peer's for incoming streams, ours for outgoing ones. */
  readonly headers: HeaderMap;
  /** Resolves with the SYN_REPLY headers of a stream we opened; rejects on RST or session close. */
  readonly reply: Promise<HeaderMap>;

  /** @internal */ readonly session: SpdySession;
  /** @internal */ replySent: boolean;
  /** @internal */ localClosed = false;
  /** @internal */ remoteClosed = false;
  /** @internal */ resetStatus: number | null = null;
  /** @internal */ sendWindow: number;
  /** @internal */ inQueue: Buffer[] = [];
  /** @internal */ inQueueBytes = 0;
  /** @internal */ pendingAck = 0;
  /** @internal */ readWanted = false;
  /** @internal */ eofPushed = false;
  /** @internal */ resolveReply: (h: HeaderMap) => void = () => {};
  /** @internal */ rejectReply: (e: Error) => void = () => {};
  private writeChain: Promise<void> = Promise.resolve();

  /** @internal use SpdySession.openStream or the session's onStream callback. */
  constructor(session: SpdySession, id: number, headers: HeaderMap, sendWindow: number, replySent: boolean) {
    super({ allowHalfOpen: true, autoDestroy: false, decodeStrings: true });
    this.session = session;
    this.id = id;
    this.headers = headers;
    this.sendWindow = sendWindow;
    this.replySent = replySent;
    this.reply = new Promise<HeaderMap>((resolve, reject) => {
      this.resolveReply = resolve;
      this.rejectReply = reject;
    });
    this.reply.catch(() => undefined);
  }

  /** Accepts a stream the peer opened (SYN_REPLY). Idempotent. */
  sendReply(headers: HeaderInput = {}, fin = false): void {
    this.session.replyStream(this, headers, fin);
  }

  /** Aborts the stream with RST_STREAM (default CANCEL). */
  reset(status: number = RST_STATUS.CANCEL): void {
    this.session.resetStream(this, status);
  }

  /** True once neither side will send more on this stream. */
  get fullyClosed(): boolean {
    return this.localClosed && this.remoteClosed;
  }

  override _read(): void {
    this.readWanted = true;
    this.session.pumpStream(this);
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.writeChain = this.session.writeData(this, chunk).then(
      () => cb(),
      () => cb(),
    );
  }

  override _final(cb: (err?: Error | null) => void): void {
    void this.writeChain.then(() => {
      this.session.finishStream(this);
      cb();
    });
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    // `for await` and pipeline() destroy a stream once its input ended: that is a clean finish (FIN),
    // not an abort. Destroying while the peer may still send, or with an error, resets the stream.
    if (!this.localClosed) {
      if (err === null && this.remoteClosed && this.resetStatus === null) this.session.finishStream(this);
      else this.session.resetStream(this, RST_STATUS.CANCEL);
    }
    cb(err);
  }
}

type OutItem = Buffer | Promise<Buffer>;

export class SpdySession {
  private readonly socket: Duplex;
  private readonly opts: SpdySessionOptions;
  private readonly parser: FrameParser;
  private readonly compressor = new HeaderCompressor();
  private readonly decompressor = new HeaderDecompressor();
  private readonly streams = new Map<number, SpdyStream>();
  private readonly maxDataFrameSize: number;
  private readonly maxBufferedBytes: number;
  private nextStreamId: number;
  private nextPingId: number;
  private readonly pings = new Map<number, { resolve: () => void; reject: (e: Error) => void }>();
  /** Highest stream id the peer opened (for GOAWAY). */
  private lastPeerStreamId = 0;

  // Inbound frames are handled strictly in order; header frames wait for the inflater.
  private inbound: SpdyFrame[] = [];
  private inboundBusy = false;
  private bufferedBytes = 0;
  private socketPaused = false;

  // Outbound frames are written strictly in order; header frames wait for the deflater.
  private outQueue: OutItem[] = [];
  private outDraining = false;
  private outIdle: Array<() => void> = [];

  private peerInitialWindow = DEFAULT_INITIAL_WINDOW_SIZE;
  private sessionSendWindow = DEFAULT_INITIAL_WINDOW_SIZE;
  private sessionPendingAck = 0;
  private peerDoesFlowControl = false;
  private windowWaiters: Array<() => void> = [];
  private drainWaiters: Array<() => void> = [];

  /** The peer closed its side; the session ends once frames already received are handled. */
  private peerGone = false;
  private goAwaySent = false;
  private goAwayReceived = false;
  private ended = false;
  private graceTimer: NodeJS.Timeout | null = null;

  constructor(socket: Duplex, opts: SpdySessionOptions) {
    this.socket = socket;
    this.opts = opts;
    this.parser = new FrameParser({ maxFramePayload: opts.maxFramePayload });
    this.maxDataFrameSize = Math.max(1, opts.maxDataFrameSize ?? 32 * 1024);
    this.maxBufferedBytes = opts.maxBufferedBytes ?? 1 << 20;
    this.nextStreamId = opts.role === 'server' ? 2 : 1;
    this.nextPingId = opts.role === 'server' ? 2 : 1;
    if (opts.sendFlowControl === 'always') this.peerDoesFlowControl = true;

    socket.on('data', this.onData);
    socket.on('drain', this.onDrain);
    socket.on('end', this.onEnd);
    socket.on('error', this.onSocketError);
    socket.on('close', this.onSocketClose);
  }

  /** Feeds bytes that were read before the session took over the socket (the `head` of an upgrade). */
  feed(bytes: Buffer): void {
    if (bytes.length > 0) this.onData(bytes);
  }

  get closed(): boolean {
    return this.ended;
  }

  get peerWentAway(): boolean {
    return this.goAwayReceived;
  }

  /** Whether DATA sending currently honours the peer's windows. */
  get enforcingSendWindow(): boolean {
    return this.opts.sendFlowControl !== 'never' && this.peerDoesFlowControl;
  }

  /** Opens a stream (SYN_STREAM). */
  openStream(headers: HeaderInput, opts: { fin?: boolean; priority?: number } = {}): SpdyStream {
    if (this.ended || this.goAwaySent || this.goAwayReceived) throw new Error('SPDY session is closing');
    const id = this.nextStreamId;
    if (id > MAX_STREAM_ID) throw new Error('SPDY stream ids exhausted');
    this.nextStreamId += 2;
    const block = encodeHeaderBlock(headers);
    const stream = new SpdyStream(this, id, decodeHeaderBlock(block), this.peerInitialWindow, true);
    this.streams.set(id, stream);
    this.enqueue(
      this.compressor.compress(block).then((headerBlock) =>
        encodeFrame({
          type: 'SYN_STREAM',
          flags: opts.fin ? FLAG_FIN : 0,
          streamId: id,
          associatedStreamId: 0,
          priority: opts.priority ?? 0,
          slot: 0,
          headerBlock,
        }),
      ),
    );
    if (opts.fin) this.markLocalClosed(stream);
    return stream;
  }

  /** Sends a PING and resolves with the round-trip time in ms when the peer echoes it. */
  ping(): Promise<number> {
    if (this.ended) return Promise.reject(new Error('SPDY session closed'));
    const id = this.nextPingId;
    this.nextPingId += 2;
    if (this.nextPingId > 0x7fffffff) this.nextPingId = this.opts.role === 'server' ? 2 : 1;
    const start = performance.now();
    return new Promise<number>((resolve, reject) => {
      this.pings.set(id, { resolve: () => resolve(performance.now() - start), reject });
      this.send(encodeFrame({ type: 'PING', flags: 0, id }));
    });
  }

  /** Sends GOAWAY once (no new streams will be accepted). */
  goAway(status: number = GOAWAY_STATUS.OK): void {
    if (this.goAwaySent || this.ended) return;
    this.goAwaySent = true;
    this.send(encodeFrame({ type: 'GOAWAY', flags: 0, lastGoodStreamId: this.lastPeerStreamId, status }));
  }

  /**
   * Graceful close: GOAWAY, flush queued frames, then end our side of the socket. The socket is
   * destroyed when the peer closes it or after closeGraceMs.
   */
  async close(): Promise<void> {
    if (this.ended) return;
    this.goAway();
    await this.outFlushed();
    if (this.ended) return;
    this.socket.end();
    this.graceTimer = setTimeout(() => this.destroy(), this.opts.closeGraceMs ?? 5000);
    this.graceTimer.unref?.();
  }

  /** Tears the session down immediately. */
  destroy(err?: Error): void {
    if (err) this.report(err);
    this.terminate(err);
    this.socket.destroy();
  }

  // ---- socket callbacks (never throw) ----

  private readonly onData = (chunk: Buffer): void => {
    if (this.ended) return;
    try {
      const frames = this.parser.push(chunk);
      if (frames.length === 0) return;
      this.activity();
      for (const f of frames) this.inbound.push(f);
      this.pumpInbound();
    } catch (err) {
      this.protocolError(err);
    }
  };

  private readonly onDrain = (): void => {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of waiters) w();
  };

  private readonly onEnd = (): void => {
    // spdystream never half-closes TCP: EOF means the peer is gone (or finished after our close()).
    this.peerGone = true;
    this.pumpInbound();
  };

  private readonly onSocketError = (err: Error): void => {
    this.report(err);
    this.terminate(err);
  };

  private readonly onSocketClose = (): void => {
    this.peerGone = true;
    this.pumpInbound();
  };

  // ---- inbound ----

  private pumpInbound(): void {
    if (this.inboundBusy) return;
    try {
      while (this.inbound.length > 0 && !this.ended) {
        const frame = this.inbound.shift()!;
        if (frame.type === 'SYN_STREAM' || frame.type === 'SYN_REPLY' || frame.type === 'HEADERS') {
          this.inboundBusy = true;
          this.decompressor.decompress(frame.headerBlock).then(
            (raw) => {
              this.inboundBusy = false;
              if (this.ended) return;
              try {
                this.handleHeaderFrame(frame, decodeHeaderBlock(raw));
              } catch (err) {
                this.protocolError(err);
                return;
              }
              this.pumpInbound();
            },
            (err: unknown) => {
              this.inboundBusy = false;
              this.protocolError(err);
            },
          );
          return;
        }
        this.handleFrame(frame);
      }
    } catch (err) {
      this.protocolError(err);
      return;
    }
    if (this.peerGone && this.inbound.length === 0 && !this.ended) {
      this.terminate();
      this.socket.destroy();
    }
  }

  private handleHeaderFrame(
    frame: Extract<SpdyFrame, { type: 'SYN_STREAM' | 'SYN_REPLY' | 'HEADERS' }>,
    headers: HeaderMap,
  ): void {
    const fin = (frame.flags & FLAG_FIN) !== 0;
    if (frame.type === 'SYN_STREAM') {
      const id = frame.streamId;
      if (id === 0 || id <= this.lastPeerStreamId || this.streams.has(id)) {
        this.sendRst(id, RST_STATUS.PROTOCOL_ERROR);
        return;
      }
      this.lastPeerStreamId = id;
      if (this.goAwaySent) {
        this.sendRst(id, RST_STATUS.REFUSED_STREAM);
        return;
      }
      const stream = new SpdyStream(this, id, headers, this.peerInitialWindow, false);
      this.streams.set(id, stream);
      if ((frame.flags & FLAG_UNIDIRECTIONAL) !== 0) stream.localClosed = true;
      if (fin) this.remoteFinished(stream);
      if (this.opts.onStream) this.opts.onStream(stream);
      else stream.reset(RST_STATUS.REFUSED_STREAM);
      return;
    }
    const stream = this.streams.get(frame.streamId);
    if (!stream) return;
    if (frame.type === 'SYN_REPLY') stream.resolveReply(headers);
    else stream.emit('headers', headers);
    if (fin) this.remoteFinished(stream);
  }

  private handleFrame(frame: SpdyFrame): void {
    switch (frame.type) {
      case 'DATA': {
        const stream = this.streams.get(frame.streamId);
        const len = frame.data.length;
        if (!stream || stream.remoteClosed) {
          // Nobody will read it: give the session window back straight away.
          this.ackSession(len);
          return;
        }
        if (len > 0) {
          stream.inQueue.push(frame.data);
          stream.inQueueBytes += len;
          this.bufferedBytes += len;
          if (this.bufferedBytes > this.maxBufferedBytes && !this.socketPaused) {
            this.socketPaused = true;
            this.socket.pause();
          }
        }
        if ((frame.flags & FLAG_FIN) !== 0) stream.remoteClosed = true;
        this.pumpStream(stream);
        if (stream.remoteClosed) this.maybeForget(stream);
        return;
      }
      case 'RST_STREAM': {
        const stream = this.streams.get(frame.streamId);
        if (!stream) return;
        stream.resetStatus = frame.status;
        stream.localClosed = true;
        stream.rejectReply(new Error(`stream ${stream.id} reset by peer (status ${frame.status})`));
        this.remoteFinished(stream);
        this.wakeWindowWaiters();
        stream.emit('reset', frame.status);
        return;
      }
      case 'SETTINGS': {
        for (const e of frame.entries) {
          if (e.id !== SETTINGS_ID.INITIAL_WINDOW_SIZE) continue;
          const value = Math.min(e.value, MAX_WINDOW_SIZE);
          const delta = value - this.peerInitialWindow;
          this.peerInitialWindow = value;
          for (const s of this.streams.values()) s.sendWindow += delta;
          if (this.opts.sendFlowControl !== 'never') this.peerDoesFlowControl = true;
        }
        this.wakeWindowWaiters();
        return;
      }
      case 'WINDOW_UPDATE': {
        if (this.opts.sendFlowControl !== 'never') this.peerDoesFlowControl = true;
        if (frame.streamId === 0) {
          this.sessionSendWindow = Math.min(this.sessionSendWindow + frame.deltaWindowSize, MAX_WINDOW_SIZE);
        } else {
          const stream = this.streams.get(frame.streamId);
          if (stream)
            stream.sendWindow = Math.min(stream.sendWindow + frame.deltaWindowSize, MAX_WINDOW_SIZE);
        }
        this.wakeWindowWaiters();
        return;
      }
      case 'PING': {
        const ours = (frame.id & 1) === (this.opts.role === 'client' ? 1 : 0);
        if (!ours) {
          this.send(encodeFrame({ type: 'PING', flags: 0, id: frame.id }));
          return;
        }
        const pending = this.pings.get(frame.id);
        this.pings.delete(frame.id);
        pending?.resolve();
        return;
      }
      case 'GOAWAY': {
        this.goAwayReceived = true;
        this.opts.onGoAway?.(frame);
        return;
      }
      default:
        // SYN_* and HEADERS are handled by handleHeaderFrame; UNKNOWN control frames are ignored.
        return;
    }
  }

  /** Moves queued input into the stream's readable side as far as it wants, acknowledging windows. */
  pumpStream(stream: SpdyStream): void {
    while (stream.readWanted && stream.inQueue.length > 0) {
      const chunk = stream.inQueue.shift()!;
      stream.inQueueBytes -= chunk.length;
      this.bufferedBytes -= chunk.length;
      stream.pendingAck += chunk.length;
      stream.readWanted = stream.push(chunk);
      this.ackSession(chunk.length);
    }
    if (stream.pendingAck >= ACK_THRESHOLD && !stream.remoteClosed && !this.ended) {
      this.send(
        encodeFrame({
          type: 'WINDOW_UPDATE',
          flags: 0,
          streamId: stream.id,
          deltaWindowSize: stream.pendingAck,
        }),
      );
      stream.pendingAck = 0;
    }
    if (stream.inQueue.length === 0 && stream.remoteClosed && !stream.eofPushed) {
      stream.eofPushed = true;
      stream.push(null);
    }
    if (this.socketPaused && this.bufferedBytes <= this.maxBufferedBytes / 2 && !this.ended) {
      this.socketPaused = false;
      this.socket.resume();
    }
  }

  private ackSession(bytes: number): void {
    this.sessionPendingAck += bytes;
    if (this.sessionPendingAck >= ACK_THRESHOLD && !this.ended) {
      this.send(
        encodeFrame({
          type: 'WINDOW_UPDATE',
          flags: 0,
          streamId: 0,
          deltaWindowSize: this.sessionPendingAck,
        }),
      );
      this.sessionPendingAck = 0;
    }
  }

  // ---- outbound ----

  /** @internal */
  replyStream(stream: SpdyStream, headers: HeaderInput, fin: boolean): void {
    if (stream.replySent || this.ended || stream.resetStatus !== null) return;
    stream.replySent = true;
    const block = encodeHeaderBlock(headers);
    this.enqueue(
      this.compressor
        .compress(block)
        .then((headerBlock) =>
          encodeFrame({ type: 'SYN_REPLY', flags: fin ? FLAG_FIN : 0, streamId: stream.id, headerBlock }),
        ),
    );
    if (fin) this.markLocalClosed(stream);
  }

  /** @internal Sends `chunk` as DATA, honouring windows (when enforced) and socket back-pressure. */
  async writeData(stream: SpdyStream, chunk: Buffer): Promise<void> {
    if (!stream.replySent) this.replyStream(stream, {}, false);
    let off = 0;
    while (off < chunk.length) {
      if (stream.localClosed || this.ended) return;
      let n = Math.min(chunk.length - off, this.maxDataFrameSize);
      if (this.enforcingSendWindow) {
        const available = Math.min(stream.sendWindow, this.sessionSendWindow);
        if (available <= 0) {
          await new Promise<void>((resolve) => this.windowWaiters.push(resolve));
          continue;
        }
        n = Math.min(n, available);
      }
      stream.sendWindow -= n;
      this.sessionSendWindow -= n;
      this.send(
        encodeFrame({ type: 'DATA', streamId: stream.id, flags: 0, data: chunk.subarray(off, off + n) }),
      );
      off += n;
      if (this.socket.writableNeedDrain && !this.ended) {
        await new Promise<void>((resolve) => this.drainWaiters.push(resolve));
      }
    }
  }

  /** @internal Half-closes our side with an empty DATA frame carrying FIN. */
  finishStream(stream: SpdyStream): void {
    if (stream.localClosed || this.ended) return;
    if (!stream.replySent) this.replyStream(stream, {}, false);
    this.send(encodeFrame({ type: 'DATA', streamId: stream.id, flags: FLAG_FIN, data: Buffer.alloc(0) }));
    this.markLocalClosed(stream);
  }

  /** @internal */
  resetStream(stream: SpdyStream, status: number): void {
    if (stream.resetStatus !== null) return;
    stream.resetStatus = status;
    if (!this.ended && !(stream.localClosed && stream.remoteClosed)) this.sendRst(stream.id, status);
    stream.localClosed = true;
    stream.rejectReply(new Error(`stream ${stream.id} reset`));
    // We gave up on the stream: drop its unread input and return the session window it held.
    const dropped = stream.inQueueBytes;
    stream.inQueue = [];
    stream.inQueueBytes = 0;
    this.bufferedBytes -= dropped;
    if (dropped > 0) this.ackSession(dropped);
    this.remoteFinished(stream);
    this.wakeWindowWaiters();
  }

  private sendRst(streamId: number, status: number): void {
    if (this.ended || streamId === 0) return;
    this.send(encodeFrame({ type: 'RST_STREAM', flags: 0, streamId, status }));
  }

  private markLocalClosed(stream: SpdyStream): void {
    stream.localClosed = true;
    this.maybeForget(stream);
  }

  private remoteFinished(stream: SpdyStream): void {
    stream.remoteClosed = true;
    this.pumpStream(stream);
    this.maybeForget(stream);
  }

  private maybeForget(stream: SpdyStream): void {
    // Later frames for a forgotten stream are ignored (DATA is still acknowledged session-wide).
    if (stream.localClosed && stream.remoteClosed && stream.inQueue.length === 0)
      this.streams.delete(stream.id);
  }

  private send(frame: Buffer): void {
    this.enqueue(frame);
  }

  private enqueue(item: OutItem): void {
    if (this.ended) {
      if (item instanceof Promise) item.catch(() => undefined);
      return;
    }
    if (!this.outDraining && this.outQueue.length === 0 && Buffer.isBuffer(item)) {
      this.write(item);
      return;
    }
    if (item instanceof Promise) item.catch(() => undefined);
    this.outQueue.push(item);
    void this.drainOut();
  }

  private async drainOut(): Promise<void> {
    if (this.outDraining) return;
    this.outDraining = true;
    try {
      while (this.outQueue.length > 0 && !this.ended) {
        const head = this.outQueue[0]!;
        const buf = Buffer.isBuffer(head) ? head : await head;
        this.outQueue.shift();
        this.write(buf);
      }
    } catch (err) {
      this.outDraining = false;
      this.destroy(err instanceof Error ? err : new Error(String(err)));
      return;
    }
    this.outDraining = false;
    const idle = this.outIdle;
    this.outIdle = [];
    for (const w of idle) w();
  }

  private outFlushed(): Promise<void> {
    if (this.outQueue.length === 0 && !this.outDraining) return Promise.resolve();
    return new Promise<void>((resolve) => this.outIdle.push(resolve));
  }

  private write(buf: Buffer): void {
    if (this.ended || !this.socket.writable) return;
    this.activity();
    this.socket.write(buf);
  }

  // ---- teardown ----

  private wakeWindowWaiters(): void {
    const waiters = this.windowWaiters;
    this.windowWaiters = [];
    for (const w of waiters) w();
  }

  private protocolError(err: unknown): void {
    const e = err instanceof Error ? err : new Error(String(err));
    if (e instanceof SpdyProtocolError && !this.ended) {
      // Best effort: tell the peer why before hanging up.
      const frame = encodeFrame({
        type: 'GOAWAY',
        flags: 0,
        lastGoodStreamId: this.lastPeerStreamId,
        status: GOAWAY_STATUS.PROTOCOL_ERROR,
      });
      this.goAwaySent = true;
      this.socket.write(frame);
    }
    this.destroy(e);
  }

  private report(err: Error): void {
    try {
      this.opts.onError?.(err);
    } catch {
      // A throwing logger must not break teardown.
    }
  }

  private activity(): void {
    this.opts.onActivity?.();
  }

  /** Marks everything closed, wakes every waiter, ends every readable side. Idempotent. */
  private terminate(err?: Error): void {
    if (this.ended) return;
    this.ended = true;
    if (this.graceTimer) clearTimeout(this.graceTimer);
    for (const w of this.outIdle) w();
    this.outIdle = [];
    for (const item of this.outQueue) if (item instanceof Promise) item.catch(() => undefined);
    this.outQueue = [];
    this.wakeWindowWaiters();
    this.onDrain();
    for (const stream of this.streams.values()) {
      stream.localClosed = true;
      stream.remoteClosed = true;
      stream.rejectReply(new Error('SPDY session closed'));
      // Input that already arrived is still delivered, then the readable side ends.
      for (const chunk of stream.inQueue) stream.push(chunk);
      stream.inQueue = [];
      stream.inQueueBytes = 0;
      if (!stream.eofPushed) {
        stream.eofPushed = true;
        stream.push(null);
      }
    }
    this.streams.clear();
    for (const p of this.pings.values()) p.reject(new Error('SPDY session closed'));
    this.pings.clear();
    this.compressor.close();
    this.decompressor.close();
    if (this.socketPaused) this.socket.resume();
    try {
      this.opts.onClose?.(err);
    } catch (e) {
      this.report(e instanceof Error ? e : new Error(String(e)));
    }
  }
}
