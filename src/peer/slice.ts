// The server's slice route and its error replies (shared/spec/peer-restore.md §3 "GET
// /v1/snapshot-slice"; docs/peer-restore.md). Checks in Go's order, then ours: the 256 MiB
// bound on `length`, the stream gate (a global and a per-caller share), the file opened
// without following a symlink. The body is the byte range, sent chunked and never
// compressed; the CRC-32C trailer goes out only when exactly `length` bytes did.
import { constants, promises as fsp } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import type { Logger } from '../log.ts';
import type { Gate, KeyedCount, TokenBucket } from './gate.ts';
import { goParseInt64, goQueryGet, goQuote } from './gojson.ts';
import { CRC_TRAILER, crc32cHex, crc32cUpdate, isPlainName, MAX_SLICE } from './wire.ts';

/** Bytes read and written at a time (and drawn from the rate bucket). */
const CHUNK = 256 * 1024;

export type PeerRoute = 'plan' | 'slice' | 'other';
export type PeerResult =
  | 'ok'
  | 'incomplete'
  | 'bad_request'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'method_not_allowed'
  | 'saturated'
  | 'error';
export type PeerRefusal =
  | 'plain_http'
  | 'unauthorized'
  | 'forbidden'
  | 'saturated'
  | 'caller_saturated'
  | 'plan_saturated'
  | 'too_long'
  | 'write_stall';

/** What the server reports; the provider implements it (prom-client). Plain callbacks, no library types. */
export interface PeerServerMetrics {
  /** Slice streams holding a slot now (set on every change). */
  streamsInUse(n: number): void;
  /** Body bytes of slices sent (added as they go). */
  bytesServed(n: number): void;
  /** One finished request: its route and how it ended. */
  request(route: PeerRoute, result: PeerResult): void;
  /** One refusal, by reason (also counted in `request` under its status). */
  refused(reason: PeerRefusal): void;
}

/** Go's `http.Error`: text/plain, nosniff, the message and a newline (no body for HEAD). */
export function sendError(res: ServerResponse, status: number, message: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = `${message}\n`;
  res.writeHead(status, {
    'Content-Type': 'text/plain; charset=utf-8',
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': Buffer.byteLength(body),
  });
  res.end(res.req.method === 'HEAD' ? undefined : body);
}

/** The result a refused or failed request counts as. */
export function resultOf(status: number): PeerResult {
  switch (status) {
    case 400:
      return 'bad_request';
    case 401:
      return 'unauthorized';
    case 403:
      return 'forbidden';
    case 404:
      return 'not_found';
    case 405:
      return 'method_not_allowed';
    case 503:
      return 'saturated';
    default:
      return 'error';
  }
}

export interface SliceContext {
  readonly storeDir: string;
  readonly streams: Gate;
  readonly perCaller: KeyedCount;
  readonly bucket: TokenBucket;
  readonly writeStallMs: number;
  readonly metrics?: PeerServerMetrics;
  readonly log: Logger;
  /** Aborts when the server closes. */
  readonly closing: AbortSignal;
}

/** Answers one slice request (authorized already; `caller` keys its share of the gate). */
export async function serveSlice(
  ctx: SliceContext,
  req: IncomingMessage,
  res: ServerResponse,
  query: Map<string, string[]>,
  caller: string,
): Promise<PeerResult> {
  const fail = (status: number, message: string, refusal?: PeerRefusal): PeerResult => {
    if (refusal) ctx.metrics?.refused(refusal);
    sendError(res, status, message);
    return resultOf(status);
  };
  const id = goQueryGet(query, 'id');
  const file = goQueryGet(query, 'file');
  const offset = goParseInt64(goQueryGet(query, 'offset'));
  const length = goParseInt64(goQueryGet(query, 'length'));
  if (
    id === '' ||
    file === '' ||
    offset === undefined ||
    length === undefined ||
    offset < 0n ||
    length <= 0n
  ) {
    return fail(400, 'id, file, offset, length are required');
  }
  if (!isPlainName(id)) return fail(400, `invalid snapshot id ${goQuote(id)}`);
  if (!isPlainName(file)) return fail(400, 'file must be a plain name');
  if (length > BigInt(MAX_SLICE)) return fail(400, `length must not exceed ${MAX_SLICE} bytes`, 'too_long');
  if (offset + length > BigInt(Number.MAX_SAFE_INTEGER)) return fail(400, 'offset is out of range');
  if (!ctx.streams.tryTake()) return fail(503, 'slice streams saturated', 'saturated');
  if (!ctx.perCaller.tryTake(caller)) {
    ctx.streams.release();
    return fail(503, 'slice streams saturated', 'caller_saturated');
  }
  ctx.metrics?.streamsInUse(ctx.streams.used);
  try {
    return await stream(ctx, req, res, join(ctx.storeDir, id, file), Number(offset), Number(length));
  } finally {
    ctx.perCaller.release(caller);
    ctx.streams.release();
    ctx.metrics?.streamsInUse(ctx.streams.used);
  }
}

async function stream(
  ctx: SliceContext,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  offset: number,
  length: number,
): Promise<PeerResult> {
  let fh: fsp.FileHandle;
  try {
    // Not following a symlink (Go does): the plan lists regular files only.
    fh = await fsp.open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    ctx.log.debug({ err: (err as Error).message }, 'peer slice: open failed');
    sendError(res, 404, 'snapshot file not found');
    return 'not_found';
  }
  try {
    if (!(await fh.stat()).isFile()) {
      sendError(res, 404, 'snapshot file not found');
      return 'not_found';
    }
    // Node refuses a declared trailer where it cannot send one (HEAD, HTTP/1.0): Go sends
    // the header there and no trailer; we send neither.
    const trailer = req.method !== 'HEAD' && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1;
    res.writeHead(200, {
      'Content-Type': 'application/octet-stream',
      ...(trailer ? { Trailer: CRC_TRAILER } : {}),
    });
    if (req.method === 'HEAD') {
      res.end();
      return 'ok';
    }
    const gone = new AbortController();
    const onClose = () => gone.abort();
    res.once('close', onClose);
    const onClosing = () => gone.abort();
    ctx.closing.addEventListener('abort', onClosing, { once: true });
    try {
      return await copyRange(ctx, res, fh, offset, length, trailer, gone.signal);
    } finally {
      res.off('close', onClose);
      ctx.closing.removeEventListener('abort', onClosing);
    }
  } finally {
    await fh.close();
  }
}

async function copyRange(
  ctx: SliceContext,
  res: ServerResponse,
  fh: fsp.FileHandle,
  offset: number,
  length: number,
  trailer: boolean,
  signal: AbortSignal,
): Promise<PeerResult> {
  let sent = 0;
  let crc = 0;
  while (sent < length && !signal.aborted) {
    const want = Math.min(CHUNK, length - sent);
    try {
      await ctx.bucket.take(want, signal);
    } catch {
      break; // the connection went away while waiting for its turn
    }
    const buf = Buffer.allocUnsafe(want);
    let got: number;
    try {
      got = (await fh.read(buf, 0, want, offset + sent)).bytesRead;
    } catch (err) {
      ctx.log.warn({ err: (err as Error).message }, 'peer slice: read failed; the body ends short');
      break;
    }
    if (got === 0) break; // EOF before `length`: the body ends without a trailer
    if (signal.aborted) break;
    const chunk = buf.subarray(0, got);
    crc = crc32cUpdate(crc, chunk);
    sent += got;
    ctx.metrics?.bytesServed(got);
    if (!res.write(chunk) && !(await drained(res, ctx.writeStallMs, signal))) {
      if (!res.destroyed && !signal.aborted) {
        ctx.metrics?.refused('write_stall');
        ctx.log.debug(
          { stallMs: ctx.writeStallMs },
          'peer slice: the reader drained nothing; connection cut',
        );
        res.destroy();
      }
      return 'incomplete';
    }
  }
  if (signal.aborted || res.destroyed) return 'incomplete';
  if (sent === length && trailer) res.addTrailers({ [CRC_TRAILER]: crc32cHex(crc) });
  res.end();
  return sent === length ? 'ok' : 'incomplete';
}

/** True once the response drains; false when it closes (`signal`) or `stallMs` pass without a drain. */
function drained(res: ServerResponse, stallMs: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted || res.destroyed) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(timer);
      res.off('drain', onDrain);
      signal.removeEventListener('abort', onGone);
      resolve(ok);
    };
    const onDrain = () => done(true);
    const onGone = () => done(false);
    const timer = setTimeout(() => done(false), stallMs);
    res.once('drain', onDrain);
    signal.addEventListener('abort', onGone, { once: true });
  });
}
