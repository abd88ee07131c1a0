// The client's HTTP transport (shared/spec/peer-restore.md §5 "Transport"; docs/peer-restore.md):
// node:http / node:https (WHATWG fetch hides trailers) through keep-alive agents of our own
// (so no proxy, and no shared global agent), a dial bound, a response-header bound, and for
// https a pinned server certificate checked before a request is written.
import { createHash, type X509Certificate } from 'node:crypto';
import type { Agent as HttpAgent, IncomingMessage } from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls, { type PeerCertificate } from 'node:tls';

// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const http = process.getBuiltinModule('node:http');

export type PeerRestoreReason =
  | 'plan'
  | 'identity'
  | 'validation'
  | 'staging'
  | 'transfer'
  | 'checksum'
  | 'stall'
  | 'timeout'
  | 'tls'
  | 'aborted';

/** Why a restore failed: a short `reason` code for metrics and logs, and the message. */
export class PeerRestoreError extends Error {
  override name = 'PeerRestoreError';
  readonly reason: PeerRestoreReason;
  constructor(reason: PeerRestoreReason, message: string, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.reason = reason;
  }
}

/** Normalizes a SHA-256 pin: hex, lower case, colons allowed (as `openssl x509 -fingerprint` prints them). */
export function normalizePin(pin: string): string {
  const hex = pin.replaceAll(':', '').toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new Error('pinSha256 must be 64 hex digits');
  return hex;
}

/** Hex SHA-256 of a certificate's DER bytes (what `pinSha256` names). */
export function certSha256(cert: Pick<X509Certificate, 'raw'> | Pick<PeerCertificate, 'raw'>): string {
  return createHash('sha256').update(cert.raw).digest('hex');
}

export interface AgentOptions {
  https: boolean;
  /** Required for https: the server certificate's SHA-256. */
  pinSha256?: string;
  clientCert?: { cert: string; key: string };
  dialMs: number;
  maxSockets: number;
}

type Callback = (err: Error | null, socket?: net.Socket) => void;

/**
 * A keep-alive agent whose connections are handed over only once they are usable: TCP
 * connected within `dialMs`, and for https the handshake done and the server's certificate
 * equal to the pin. The chain itself is not verified (peers serve self-signed certificates;
 * the pin is the identity), so `checkServerIdentity`, which Node skips for a chain it could
 * not verify, is not where the pin is checked: the connection is refused before the agent
 * ever writes a request on it.
 */
export function makeAgent(o: AgentOptions): HttpAgent {
  const pin = o.https ? normalizePin(o.pinSha256 ?? '') : undefined;
  const base = {
    keepAlive: true,
    maxSockets: o.maxSockets,
    maxFreeSockets: o.maxSockets,
    scheduling: 'lifo' as const,
  };
  const connect = (options: net.NetConnectOpts & tls.ConnectionOptions, cb: Callback): undefined => {
    let done = false;
    const finish = (err: Error | null, socket?: net.Socket) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      cb(err, socket);
    };
    const socket = pin
      ? tls.connect({ ...options, rejectUnauthorized: false, ...(o.clientCert ?? {}) })
      : net.connect(options);
    const timer = setTimeout(() => {
      socket.destroy();
      finish(new PeerRestoreError('timeout', `dial timed out after ${o.dialMs} ms`));
    }, o.dialMs);
    socket.once('connect', () => clearTimeout(timer));
    socket.once('error', (err) => finish(err));
    if (!pin) {
      socket.once('connect', () => finish(null, socket));
      return undefined;
    }
    socket.once('secureConnect', () => {
      const got = certSha256((socket as tls.TLSSocket).getPeerCertificate(false));
      if (got !== pin) {
        socket.destroy();
        finish(new PeerRestoreError('tls', `server certificate sha256 ${got} does not match the pin`));
      } else finish(null, socket);
    });
    return undefined;
  };
  if (o.https) {
    const agent = new https.Agent({ ...base, maxCachedSessions: 0 });
    agent.createConnection = connect as never;
    return agent;
  }
  const agent = new http.Agent(base);
  agent.createConnection = connect as never;
  return agent;
}

/**
 * GET `url` through `agent` with `Accept-Encoding: identity`; resolves with the response once
 * its headers are in (within `headerMs`), rejects on a transport error or when `signal` aborts.
 * The body is the caller's; aborting `signal` later destroys it too.
 */
export function get(
  agent: HttpAgent,
  url: string,
  o: { signal: AbortSignal; headerMs: number },
): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    if (o.signal.aborted) {
      reject(new PeerRestoreError('aborted', 'aborted'));
      return;
    }
    const mod = url.startsWith('https:') ? https : http;
    const req = mod.get(url, {
      agent,
      headers: { 'Accept-Encoding': 'identity', 'User-Agent': 'vk-cocoon-peer' },
    });
    const onAbort = () => req.destroy(new PeerRestoreError('aborted', 'aborted'));
    o.signal.addEventListener('abort', onAbort, { once: true });
    const timer = setTimeout(
      () => req.destroy(new PeerRestoreError('timeout', `no response headers within ${o.headerMs} ms`)),
      o.headerMs,
    );
    req.once('error', (err) => {
      clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
      reject(err);
    });
    req.once('response', (res) => {
      clearTimeout(timer);
      res.once('close', () => o.signal.removeEventListener('abort', onAbort));
      resolve(res);
    });
  });
}

/**
 * A stall timer: fires `ms` after the last `kick()` (Go's per-slice stall timer, restarted
 * after every body read). While paused (the client is writing or throttling itself, not
 * waiting for the peer) it does not fire; `kick()` resumes it.
 */
export class StallTimer {
  readonly #timer: NodeJS.Timeout;
  #stopped = false;
  #paused = false;

  constructor(ms: number, fire: () => void) {
    this.#timer = setTimeout(() => {
      if (!this.#stopped && !this.#paused) fire();
    }, ms);
  }

  /** Restarts the countdown (and ends a pause). */
  kick(): void {
    this.#paused = false;
    if (!this.#stopped) this.#timer.refresh();
  }

  pause(): void {
    this.#paused = true;
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
  }
}

/** Reads at most `max` bytes of a body (the rest is dropped); a body silent for `stallMs` is cut. */
export async function readSome(res: IncomingMessage, max: number, stallMs: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  const stall = new StallTimer(stallMs, () =>
    res.destroy(new PeerRestoreError('stall', `no body bytes for ${stallMs} ms`)),
  );
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      stall.kick();
      parts.push(chunk.subarray(0, max - n));
      n += Math.min(chunk.length, max - n);
      if (n >= max) break;
    }
  } finally {
    stall.stop();
  }
  return Buffer.concat(parts);
}
