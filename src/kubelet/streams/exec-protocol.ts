// Pure decisions of the Kubernetes remote-command ("channel.k8s.io") protocols, shared by the SPDY and
// WebSocket transports: sub-protocol negotiation, the stream set to wait for, the Status written on the
// error stream, and the resize message decoder. Mirrors the kubelet's k8s.io/cri-streaming remotecommand
// server and what client-go's remotecommand client decodes.

/** What the exec handler reports; the transport turns it into the error-stream payload. */
export type ExecOutcome =
  | { kind: 'success' }
  | { kind: 'exit'; code: number }
  | { kind: 'error'; message: string };

export interface TerminalSize {
  width: number;
  height: number;
}

export type ProtocolVersion = 1 | 2 | 3 | 4 | 5;

export interface NegotiatedProtocol {
  /** Sub-protocol name to echo back; '' when the client offered none (v1 fallback, nothing echoed). */
  name: string;
  version: ProtocolVersion;
  /** WebSocket only: frames are text, '0'+channel followed by base64. */
  base64: boolean;
}

const SPDY_PROTOCOLS: Record<string, ProtocolVersion> = {
  'v5.channel.k8s.io': 5,
  'v4.channel.k8s.io': 4,
  'v3.channel.k8s.io': 3,
  'v2.channel.k8s.io': 2,
  'channel.k8s.io': 1,
};

const WEBSOCKET_PROTOCOLS: Record<string, { version: ProtocolVersion; base64: boolean }> = {
  'v5.channel.k8s.io': { version: 5, base64: false },
  'v4.channel.k8s.io': { version: 4, base64: false },
  'v4.base64.channel.k8s.io': { version: 4, base64: true },
  'channel.k8s.io': { version: 1, base64: false },
  'base64.channel.k8s.io': { version: 1, base64: true },
};

/** Sub-protocols accepted over SPDY, newest first (X-Accepted-Stream-Protocol-Versions on failure). */
export const SPDY_EXEC_PROTOCOLS: readonly string[] = Object.keys(SPDY_PROTOCOLS);
/** Sub-protocols accepted over WebSocket. */
export const WEBSOCKET_EXEC_PROTOCOLS: readonly string[] = Object.keys(WEBSOCKET_PROTOCOLS);

/**
 * Splits protocol offers from one or more header values ("a, b" or repeated headers that a proxy or
 * Node joined with ", "), trimming blanks, keeping the client's order.
 */
export function parseProtocolOffers(value: string | readonly string[] | undefined): string[] {
  if (value === undefined) return [];
  const values = typeof value === 'string' ? [value] : value;
  return values.flatMap((v) => v.split(',').map((p) => p.trim())).filter((p) => p.length > 0);
}

function pick<T>(
  offers: readonly string[],
  table: Record<string, T>,
  versionOf: (t: T) => number,
): string | null {
  const supported = offers.filter((o) => Object.hasOwn(table, o));
  // v4/v5 carry exit codes: prefer them wherever the client listed them, else the client's first choice.
  return supported.find((o) => versionOf(table[o]!) >= 4) ?? supported[0] ?? null;
}

/**
 * Chooses the SPDY sub-protocol from the X-Stream-Protocol-Version offers. No offer at all means a
 * pre-negotiation client: v1 without echo. null means nothing in common (answer 403).
 */
export function negotiateSpdyProtocol(offers: readonly string[]): NegotiatedProtocol | null {
  if (offers.length === 0) return { name: '', version: 1, base64: false };
  const name = pick(offers, SPDY_PROTOCOLS, (v) => v);
  return name === null ? null : { name, version: SPDY_PROTOCOLS[name]!, base64: false };
}

/** Chooses the WebSocket sub-protocol from Sec-WebSocket-Protocol offers (same rules as SPDY). */
export function negotiateWebSocketProtocol(offers: readonly string[]): NegotiatedProtocol | null {
  if (offers.length === 0) return { name: '', version: 1, base64: false };
  const name = pick(offers, WEBSOCKET_PROTOCOLS, (p) => p.version);
  if (name === null) return null;
  const p = WEBSOCKET_PROTOCOLS[name]!;
  return { name, version: p.version, base64: p.base64 };
}

export type SpdyStreamType = 'error' | 'stdin' | 'stdout' | 'stderr' | 'resize';

export interface ExecStreamOptions {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

/**
 * The streams a SPDY client opens before the command starts: always `error`; stdin/stdout as requested;
 * stderr unless tty (a tty merges it into stdout, as the kubelet and client-go do); resize for tty from v3.
 */
export function expectedSpdyStreams(opts: ExecStreamOptions, version: ProtocolVersion): Set<SpdyStreamType> {
  const set = new Set<SpdyStreamType>(['error']);
  if (opts.stdin) set.add('stdin');
  if (opts.stdout) set.add('stdout');
  if (opts.stderr && !opts.tty) set.add('stderr');
  if (opts.tty && version >= 3) set.add('resize');
  return set;
}

/** Case-insensitive token match in a header such as `Connection: keep-alive, Upgrade`. */
function headerHas(value: string | string[] | undefined, token: string): boolean {
  const v = Array.isArray(value) ? value.join(',') : (value ?? '');
  return v.toLowerCase().includes(token.toLowerCase());
}

/** `Connection: Upgrade` + `Upgrade: SPDY/3.1`, matched the way the kubelet's upgrader does. */
export function isSpdyUpgrade(headers: Record<string, string | string[] | undefined>): boolean {
  return headerHas(headers.connection, 'upgrade') && headerHas(headers.upgrade, 'spdy/3.1');
}

export function isWebSocketUpgrade(headers: Record<string, string | string[] | undefined>): boolean {
  const upgrade = Array.isArray(headers.upgrade) ? headers.upgrade[0] : headers.upgrade;
  return headerHas(headers.connection, 'upgrade') && (upgrade ?? '').trim().toLowerCase() === 'websocket';
}

export interface StatusCause {
  /** metav1.StatusCause.Type is serialised as "reason". */
  reason?: string;
  message?: string;
}

/** The metav1.Status subset written on the error stream. */
export interface ExecStatus {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Success' | 'Failure';
  message?: string;
  reason?: string;
  details?: { causes: StatusCause[] };
  code?: number;
}

/**
 * metav1.Status for an outcome. The exit code travels as a cause {"reason":"ExitCode","message":"<n>"}:
 * client-go's v4 decoder reads StatusCause.Type, whose JSON name is "reason", and parses the message
 * as an unsigned 8-bit integer (so codes outside 1-255 would not decode as exit codes).
 */
export function buildExecStatus(outcome: ExecOutcome): ExecStatus {
  const base = { kind: 'Status', apiVersion: 'v1', metadata: {} } as const;
  if (outcome.kind === 'success' || (outcome.kind === 'exit' && outcome.code === 0)) {
    return { ...base, status: 'Success' };
  }
  if (outcome.kind === 'exit') {
    return {
      ...base,
      status: 'Failure',
      message: `command terminated with non-zero exit code: ${outcome.code}`,
      reason: 'NonZeroExitCode',
      details: { causes: [{ reason: 'ExitCode', message: String(outcome.code) }] },
    };
  }
  return {
    ...base,
    status: 'Failure',
    message: `Internal error occurred: ${outcome.message}`,
    reason: 'InternalError',
    details: { causes: [{ message: outcome.message }] },
    code: 500,
  };
}

/**
 * Bytes for the error stream/channel: v4 and v5 always carry the JSON Status; v1-v3 carry the plain
 * failure message and nothing on success (null).
 */
export function errorStreamPayload(outcome: ExecOutcome, version: ProtocolVersion): Buffer | null {
  const status = buildExecStatus(outcome);
  if (version >= 4) return Buffer.from(JSON.stringify(status));
  if (status.status === 'Success') return null;
  return Buffer.from(status.message ?? 'unknown error');
}

const UINT16_MAX = 0xffff;

function dimension(v: unknown): number | null {
  if (typeof v !== 'number' || !Number.isFinite(v)) return null;
  return Math.min(Math.max(Math.trunc(v), 0), UINT16_MAX);
}

/**
 * Reads one resize message. Go's encoding/json matches field names case-insensitively, so "width"
 * works like "Width"; a missing field is 0 as in Go. Non-objects and non-numeric values are rejected.
 */
export function parseTerminalSize(value: unknown): TerminalSize | null {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return null;
  let width: number | null = 0;
  let height: number | null = 0;
  for (const [k, v] of Object.entries(value)) {
    const key = k.toLowerCase();
    if (key === 'width') width = dimension(v);
    else if (key === 'height') height = dimension(v);
  }
  return width === null || height === null ? null : { width, height };
}

/**
 * Incremental decoder for the resize stream: a sequence of JSON objects (client-go writes one per line,
 * but frame boundaries are arbitrary and the kubelet's json.Decoder needs no separator). Invalid objects
 * are skipped; a runaway object larger than 64 KiB is dropped.
 */
export class TerminalSizeDecoder {
  private buf = '';
  private depth = 0;
  private inString = false;
  private escaped = false;
  private start = -1;
  private scanned = 0;

  push(chunk: Buffer | string): TerminalSize[] {
    this.buf += typeof chunk === 'string' ? chunk : chunk.toString('utf8');
    const out: TerminalSize[] = [];
    let i = this.scanned;
    for (; i < this.buf.length; i++) {
      const c = this.buf[i]!;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (c === '\\') this.escaped = true;
        else if (c === '"') this.inString = false;
        continue;
      }
      if (c === '"' && this.depth > 0) this.inString = true;
      else if (c === '{') {
        if (this.depth === 0) this.start = i;
        this.depth++;
      } else if (c === '}' && this.depth > 0) {
        this.depth--;
        if (this.depth === 0) {
          const text = this.buf.slice(this.start, i + 1);
          try {
            const size = parseTerminalSize(JSON.parse(text));
            if (size) out.push(size);
          } catch {
            // Skip a malformed object; the next one may be fine.
          }
          this.start = -1;
        }
      }
    }
    // Keep only the unfinished object.
    if (this.depth === 0) {
      this.buf = '';
      this.scanned = 0;
    } else {
      this.buf = this.buf.slice(this.start);
      this.scanned = this.buf.length;
      this.start = 0;
      if (this.buf.length > 64 * 1024) this.reset();
    }
    return out;
  }

  private reset(): void {
    this.buf = '';
    this.depth = 0;
    this.inString = false;
    this.escaped = false;
    this.start = -1;
    this.scanned = 0;
  }
}

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  403: 'Forbidden',
  404: 'Not Found',
  500: 'Internal Server Error',
};

/** A complete HTTP/1.1 error response for a refused upgrade (the socket is closed after it). */
export function httpErrorResponse(
  status: number,
  message: string,
  extraHeaders: ReadonlyArray<readonly [string, string]> = [],
): string {
  const body = `${message}\n`;
  const lines = [
    `HTTP/1.1 ${status} ${REASONS[status] ?? 'Error'}`,
    'Content-Type: text/plain; charset=utf-8',
    'X-Content-Type-Options: nosniff',
    `Content-Length: ${Buffer.byteLength(body)}`,
    'Connection: close',
    ...extraHeaders.map(([k, v]) => `${k}: ${v}`),
  ];
  return `${lines.join('\r\n')}\r\n\r\n${body}`;
}

/** The 101 answer to a SPDY upgrade. */
export function spdyUpgradeResponse(protocol: NegotiatedProtocol): string {
  const lines = ['HTTP/1.1 101 Switching Protocols', 'Connection: Upgrade', 'Upgrade: SPDY/3.1'];
  if (protocol.name) lines.push(`X-Stream-Protocol-Version: ${protocol.name}`);
  return `${lines.join('\r\n')}\r\n\r\n`;
}
