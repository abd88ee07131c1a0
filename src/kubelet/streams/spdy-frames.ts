// SPDY/3.1 frame codec: pure encoding/decoding of frames and header blocks, plus the SPDY/3 zlib
// dictionary. Hand-written because no maintained npm SPDY implementation exists (the `spdy` package is
// unmaintained and speaks HTTP-over-SPDY, not raw streams), yet kube-apiserver still reaches the kubelet
// exec endpoint over SPDY/3.1 via moby/spdystream. Zlib state lives in spdy-zlib.ts; this module has no
// state beyond the incremental parser's byte buffer and does no I/O.

export const SPDY_VERSION = 3;

export const FRAME_TYPE = {
  SYN_STREAM: 1,
  SYN_REPLY: 2,
  RST_STREAM: 3,
  SETTINGS: 4,
  PING: 6,
  GOAWAY: 7,
  HEADERS: 8,
  WINDOW_UPDATE: 9,
} as const;

/** FIN on DATA, SYN_STREAM, SYN_REPLY and HEADERS. */
export const FLAG_FIN = 0x01;
/** UNIDIRECTIONAL on SYN_STREAM. */
export const FLAG_UNIDIRECTIONAL = 0x02;
/** CLEAR_SETTINGS on SETTINGS. */
export const FLAG_SETTINGS_CLEAR_SETTINGS = 0x01;

export const RST_STATUS = {
  PROTOCOL_ERROR: 1,
  INVALID_STREAM: 2,
  REFUSED_STREAM: 3,
  UNSUPPORTED_VERSION: 4,
  CANCEL: 5,
  INTERNAL_ERROR: 6,
  FLOW_CONTROL_ERROR: 7,
  STREAM_IN_USE: 8,
  STREAM_ALREADY_CLOSED: 9,
  FRAME_TOO_LARGE: 11,
} as const;

// SPDY/3.1 numbering (spdystream uses the same values).
export const GOAWAY_STATUS = { OK: 0, PROTOCOL_ERROR: 1, INTERNAL_ERROR: 2 } as const;

export const SETTINGS_ID = {
  UPLOAD_BANDWIDTH: 1,
  DOWNLOAD_BANDWIDTH: 2,
  ROUND_TRIP_TIME: 3,
  MAX_CONCURRENT_STREAMS: 4,
  CURRENT_CWND: 5,
  DOWNLOAD_RETRANS_RATE: 6,
  INITIAL_WINDOW_SIZE: 7,
  CLIENT_CERTIFICATE_VECTOR_SIZE: 8,
} as const;

/** Initial stream and session flow-control window of SPDY/3.1 (64 KiB). */
export const DEFAULT_INITIAL_WINDOW_SIZE = 65536;
/** Largest payload the 24-bit length field can describe. */
export const MAX_FRAME_PAYLOAD = 0xffffff;
export const MAX_STREAM_ID = 0x7fffffff;
export const MAX_WINDOW_SIZE = 0x7fffffff;

/**
 * The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1), byte for byte. Both zlib
 * contexts of a connection are primed with it.
 */
export const SPDY3_DICTIONARY: Buffer = Buffer.from(
  '\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put' +
    '\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset' +
    '\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges' +
    '\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-contr' +
    'ol\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding' +
    '\x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location' +
    '\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type' +
    '\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires' +
    '\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-sinc' +
    'e\x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since' +
    '\x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards' +
    '\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization' +
    '\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after' +
    '\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding' +
    '\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via' +
    '\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method' +
    '\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version' +
    '\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\x0aset-cookie' +
    '\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin100101201202205206300302303304305306307402405406' +
    '407408409410411412413414415416417502504505203 Non-Authoritative Information204 No Content301 Mov' +
    'ed Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error' +
    '501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00' +
    ':00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,applic' +
    'ation/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdc' +
    'hcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.',
  'latin1',
);

export interface DataFrame {
  type: 'DATA';
  streamId: number;
  flags: number;
  data: Buffer;
}
export interface SynStreamFrame {
  type: 'SYN_STREAM';
  flags: number;
  streamId: number;
  associatedStreamId: number;
  /** 3-bit priority, 0 is highest. */
  priority: number;
  slot: number;
  /** Compressed header block. */
  headerBlock: Buffer;
}
export interface SynReplyFrame {
  type: 'SYN_REPLY';
  flags: number;
  streamId: number;
  headerBlock: Buffer;
}
export interface RstStreamFrame {
  type: 'RST_STREAM';
  flags: number;
  streamId: number;
  status: number;
}
export interface SettingsEntry {
  flags: number;
  id: number;
  value: number;
}
export interface SettingsFrame {
  type: 'SETTINGS';
  flags: number;
  entries: SettingsEntry[];
}
export interface PingFrame {
  type: 'PING';
  flags: number;
  id: number;
}
export interface GoAwayFrame {
  type: 'GOAWAY';
  flags: number;
  lastGoodStreamId: number;
  status: number;
}
export interface HeadersFrame {
  type: 'HEADERS';
  flags: number;
  streamId: number;
  headerBlock: Buffer;
}
export interface WindowUpdateFrame {
  type: 'WINDOW_UPDATE';
  flags: number;
  streamId: number;
  deltaWindowSize: number;
}
/** A control frame of an unknown type or another SPDY version; receivers ignore it. */
export interface UnknownControlFrame {
  type: 'UNKNOWN';
  version: number;
  controlType: number;
  flags: number;
  payload: Buffer;
}

export type SpdyFrame =
  | DataFrame
  | SynStreamFrame
  | SynReplyFrame
  | RstStreamFrame
  | SettingsFrame
  | PingFrame
  | GoAwayFrame
  | HeadersFrame
  | WindowUpdateFrame
  | UnknownControlFrame;

/** A malformed frame or header block: the session answers with GOAWAY PROTOCOL_ERROR. */
export class SpdyProtocolError extends Error {
  override name = 'SpdyProtocolError';
}

const u31 = (n: number): number => n & 0x7fffffff;

function controlHeader(type: number, flags: number, length: number): Buffer {
  if (length > MAX_FRAME_PAYLOAD) throw new RangeError(`SPDY frame payload too large: ${length}`);
  const b = Buffer.allocUnsafe(8);
  b.writeUInt16BE(0x8000 | SPDY_VERSION, 0);
  b.writeUInt16BE(type, 2);
  b.writeUInt32BE((((flags & 0xff) << 24) | length) >>> 0, 4);
  return b;
}

/** Serialises one frame. Header blocks must already be compressed. */
export function encodeFrame(frame: SpdyFrame): Buffer {
  switch (frame.type) {
    case 'DATA': {
      if (frame.data.length > MAX_FRAME_PAYLOAD) throw new RangeError('SPDY DATA payload too large');
      const h = Buffer.allocUnsafe(8);
      h.writeUInt32BE(u31(frame.streamId), 0);
      h.writeUInt32BE((((frame.flags & 0xff) << 24) | frame.data.length) >>> 0, 4);
      return Buffer.concat([h, frame.data]);
    }
    case 'SYN_STREAM': {
      const p = Buffer.allocUnsafe(10);
      p.writeUInt32BE(u31(frame.streamId), 0);
      p.writeUInt32BE(u31(frame.associatedStreamId), 4);
      p.writeUInt8((frame.priority & 0x7) << 5, 8);
      p.writeUInt8(frame.slot & 0xff, 9);
      return Buffer.concat([
        controlHeader(FRAME_TYPE.SYN_STREAM, frame.flags, 10 + frame.headerBlock.length),
        p,
        frame.headerBlock,
      ]);
    }
    case 'SYN_REPLY':
    case 'HEADERS': {
      const p = Buffer.allocUnsafe(4);
      p.writeUInt32BE(u31(frame.streamId), 0);
      const type = frame.type === 'SYN_REPLY' ? FRAME_TYPE.SYN_REPLY : FRAME_TYPE.HEADERS;
      return Buffer.concat([
        controlHeader(type, frame.flags, 4 + frame.headerBlock.length),
        p,
        frame.headerBlock,
      ]);
    }
    case 'RST_STREAM':
    case 'GOAWAY':
    case 'WINDOW_UPDATE': {
      const p = Buffer.allocUnsafe(8);
      if (frame.type === 'RST_STREAM') {
        p.writeUInt32BE(u31(frame.streamId), 0);
        p.writeUInt32BE(frame.status >>> 0, 4);
        return Buffer.concat([controlHeader(FRAME_TYPE.RST_STREAM, frame.flags, 8), p]);
      }
      if (frame.type === 'GOAWAY') {
        p.writeUInt32BE(u31(frame.lastGoodStreamId), 0);
        p.writeUInt32BE(frame.status >>> 0, 4);
        return Buffer.concat([controlHeader(FRAME_TYPE.GOAWAY, frame.flags, 8), p]);
      }
      p.writeUInt32BE(u31(frame.streamId), 0);
      p.writeUInt32BE(u31(frame.deltaWindowSize), 4);
      return Buffer.concat([controlHeader(FRAME_TYPE.WINDOW_UPDATE, frame.flags, 8), p]);
    }
    case 'SETTINGS': {
      const p = Buffer.allocUnsafe(4 + 8 * frame.entries.length);
      p.writeUInt32BE(frame.entries.length, 0);
      frame.entries.forEach((e, i) => {
        p.writeUInt32BE((((e.flags & 0xff) << 24) | (e.id & 0xffffff)) >>> 0, 4 + 8 * i);
        p.writeUInt32BE(e.value >>> 0, 8 + 8 * i);
      });
      return Buffer.concat([controlHeader(FRAME_TYPE.SETTINGS, frame.flags, p.length), p]);
    }
    case 'PING': {
      const p = Buffer.allocUnsafe(4);
      p.writeUInt32BE(frame.id >>> 0, 0);
      return Buffer.concat([controlHeader(FRAME_TYPE.PING, frame.flags, 4), p]);
    }
    case 'UNKNOWN': {
      if (frame.payload.length > MAX_FRAME_PAYLOAD) throw new RangeError('SPDY frame payload too large');
      const h = Buffer.allocUnsafe(8);
      h.writeUInt16BE(0x8000 | (frame.version & 0x7fff), 0);
      h.writeUInt16BE(frame.controlType & 0xffff, 2);
      h.writeUInt32BE((((frame.flags & 0xff) << 24) | frame.payload.length) >>> 0, 4);
      return Buffer.concat([h, frame.payload]);
    }
  }
}

function need(payload: Buffer, min: number, what: string): void {
  if (payload.length < min) throw new SpdyProtocolError(`${what} frame too short (${payload.length} bytes)`);
}

/**
 * Decodes one frame from its 8-byte header and payload. Liberal: fixed-size control frames may carry
 * trailing bytes, and unknown types or versions come back as UNKNOWN instead of failing.
 */
export function decodeFrame(header: Buffer, payload: Buffer): SpdyFrame {
  const first = header.readUInt32BE(0);
  const flags = header.readUInt8(4);
  if ((first & 0x80000000) === 0) return { type: 'DATA', streamId: u31(first), flags, data: payload };
  const version = (first >>> 16) & 0x7fff;
  const controlType = first & 0xffff;
  if (version !== SPDY_VERSION) return { type: 'UNKNOWN', version, controlType, flags, payload };
  switch (controlType) {
    case FRAME_TYPE.SYN_STREAM:
      need(payload, 10, 'SYN_STREAM');
      return {
        type: 'SYN_STREAM',
        flags,
        streamId: u31(payload.readUInt32BE(0)),
        associatedStreamId: u31(payload.readUInt32BE(4)),
        priority: payload.readUInt8(8) >>> 5,
        slot: payload.readUInt8(9),
        headerBlock: payload.subarray(10),
      };
    case FRAME_TYPE.SYN_REPLY:
    case FRAME_TYPE.HEADERS:
      need(payload, 4, controlType === FRAME_TYPE.SYN_REPLY ? 'SYN_REPLY' : 'HEADERS');
      return {
        type: controlType === FRAME_TYPE.SYN_REPLY ? 'SYN_REPLY' : 'HEADERS',
        flags,
        streamId: u31(payload.readUInt32BE(0)),
        headerBlock: payload.subarray(4),
      };
    case FRAME_TYPE.RST_STREAM:
      need(payload, 8, 'RST_STREAM');
      return {
        type: 'RST_STREAM',
        flags,
        streamId: u31(payload.readUInt32BE(0)),
        status: payload.readUInt32BE(4),
      };
    case FRAME_TYPE.SETTINGS: {
      need(payload, 4, 'SETTINGS');
      const count = payload.readUInt32BE(0);
      if (count > (payload.length - 4) / 8)
        throw new SpdyProtocolError(`SETTINGS frame claims ${count} entries`);
      const entries: SettingsEntry[] = [];
      for (let i = 0; i < count; i++) {
        const fid = payload.readUInt32BE(4 + 8 * i);
        entries.push({ flags: fid >>> 24, id: fid & 0xffffff, value: payload.readUInt32BE(8 + 8 * i) });
      }
      return { type: 'SETTINGS', flags, entries };
    }
    case FRAME_TYPE.PING:
      need(payload, 4, 'PING');
      return { type: 'PING', flags, id: payload.readUInt32BE(0) };
    case FRAME_TYPE.GOAWAY:
      // SPDY/2 GOAWAY had no status; accept 4-byte bodies as OK.
      need(payload, 4, 'GOAWAY');
      return {
        type: 'GOAWAY',
        flags,
        lastGoodStreamId: u31(payload.readUInt32BE(0)),
        status: payload.length >= 8 ? payload.readUInt32BE(4) : GOAWAY_STATUS.OK,
      };
    case FRAME_TYPE.WINDOW_UPDATE:
      need(payload, 8, 'WINDOW_UPDATE');
      return {
        type: 'WINDOW_UPDATE',
        flags,
        streamId: u31(payload.readUInt32BE(0)),
        deltaWindowSize: u31(payload.readUInt32BE(4)),
      };
    default:
      return { type: 'UNKNOWN', version, controlType, flags, payload };
  }
}

export interface FrameParserOptions {
  /** Largest accepted frame payload; larger frames are a protocol error. Default: 2^24-1. */
  maxFramePayload?: number;
}

/**
 * Incremental frame parser: feed it socket chunks split anywhere, get whole frames back in order.
 * Buffers are only concatenated once a frame is complete, so a large DATA frame arriving in many small
 * chunks costs one copy.
 */
export class FrameParser {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private readonly maxPayload: number;

  constructor(opts: FrameParserOptions = {}) {
    this.maxPayload = Math.min(opts.maxFramePayload ?? MAX_FRAME_PAYLOAD, MAX_FRAME_PAYLOAD);
  }

  /** Bytes received but not yet part of a complete frame. */
  get pendingBytes(): number {
    return this.buffered;
  }

  /** Throws SpdyProtocolError on a malformed frame; the parser is unusable afterwards. */
  push(chunk: Buffer): SpdyFrame[] {
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const frames: SpdyFrame[] = [];
    while (this.buffered >= 8) {
      const header = this.peek(8);
      const length = header.readUInt32BE(4) & 0xffffff;
      if (length > this.maxPayload) {
        throw new SpdyProtocolError(`SPDY frame payload of ${length} bytes exceeds limit ${this.maxPayload}`);
      }
      if (this.buffered < 8 + length) break;
      this.take(8);
      frames.push(decodeFrame(header, this.take(length)));
    }
    return frames;
  }

  private peek(n: number): Buffer {
    const head = this.chunks[0]!;
    if (head.length >= n) return head.subarray(0, n);
    const joined = Buffer.concat(this.chunks);
    this.chunks = [joined];
    return joined.subarray(0, n);
  }

  private take(n: number): Buffer {
    if (n === 0) return Buffer.alloc(0);
    this.buffered -= n;
    const head = this.chunks[0]!;
    if (head.length >= n) {
      const out = head.subarray(0, n);
      if (head.length === n) this.chunks.shift();
      else this.chunks[0] = head.subarray(n);
      return out;
    }
    const parts: Buffer[] = [];
    let left = n;
    while (left > 0) {
      const c = this.chunks[0]!;
      if (c.length <= left) {
        parts.push(c);
        this.chunks.shift();
        left -= c.length;
      } else {
        parts.push(c.subarray(0, left));
        this.chunks[0] = c.subarray(left);
        left = 0;
      }
    }
    return Buffer.concat(parts, n);
  }
}

/** Decoded header block: lower-case names, values split on NUL. */
export type HeaderMap = Map<string, string[]>;

export type HeaderInput =
  | Iterable<readonly [string, string | readonly string[]]>
  | Readonly<Record<string, string | readonly string[]>>;

function headerEntries(headers: HeaderInput): Array<readonly [string, string | readonly string[]]> {
  if (Symbol.iterator in headers)
    return [...(headers as Iterable<readonly [string, string | readonly string[]]>)];
  return Object.entries(headers as Record<string, string | readonly string[]>);
}

/**
 * Serialises an (uncompressed) SPDY/3 name/value header block: 32-bit count, then 32-bit length-prefixed
 * names and values. Names are lower-cased (spdystream flags upper-case names as an error), repeated values
 * are joined with NUL, and names that differ only in case are merged. Bytes are latin1, as in HTTP/1.
 */
export function encodeHeaderBlock(headers: HeaderInput): Buffer {
  const merged = new Map<string, string[]>();
  for (const [rawName, value] of headerEntries(headers)) {
    const name = rawName.toLowerCase();
    const values = typeof value === 'string' ? [value] : [...value];
    const existing = merged.get(name);
    if (existing) existing.push(...values);
    else merged.set(name, values);
  }
  const parts: Buffer[] = [];
  const count = Buffer.allocUnsafe(4);
  count.writeUInt32BE(merged.size, 0);
  parts.push(count);
  for (const [name, values] of merged) {
    for (const s of [name, values.join('\0')]) {
      const bytes = Buffer.from(s, 'latin1');
      const len = Buffer.allocUnsafe(4);
      len.writeUInt32BE(bytes.length, 0);
      parts.push(len, bytes);
    }
  }
  return Buffer.concat(parts);
}

export interface HeaderBlockLimits {
  /** Default 1000, as spdystream. */
  maxHeaders?: number;
  /** Default 1 MiB per name or value, as spdystream. */
  maxFieldSize?: number;
}

/** Parses an uncompressed header block. Liberal: names are lower-cased, duplicates merged, trailing bytes ignored. */
export function decodeHeaderBlock(block: Buffer, limits: HeaderBlockLimits = {}): HeaderMap {
  const maxHeaders = limits.maxHeaders ?? 1000;
  const maxField = limits.maxFieldSize ?? 1 << 20;
  if (block.length < 4) throw new SpdyProtocolError('header block too short');
  const count = block.readUInt32BE(0);
  if (count > maxHeaders)
    throw new SpdyProtocolError(`header block has ${count} headers (limit ${maxHeaders})`);
  const out: HeaderMap = new Map();
  let off = 4;
  const field = (): string => {
    if (off + 4 > block.length) throw new SpdyProtocolError('truncated header block');
    const len = block.readUInt32BE(off);
    off += 4;
    if (len > maxField) throw new SpdyProtocolError(`header field of ${len} bytes exceeds limit`);
    if (off + len > block.length) throw new SpdyProtocolError('truncated header block');
    const s = block.toString('latin1', off, off + len);
    off += len;
    return s;
  };
  for (let i = 0; i < count; i++) {
    const name = field().toLowerCase();
    const values = field().split('\0');
    const existing = out.get(name);
    if (existing) existing.push(...values);
    else out.set(name, values);
  }
  return out;
}

/** First value of a header, case-insensitive. */
export function headerValue(headers: HeaderMap, name: string): string | undefined {
  return headers.get(name.toLowerCase())?.[0];
}
