/**
 * Blob bodies over a connection of their own (docs/registry.md "Blob reads"): one HTTP/1.1 GET
 * on a fresh TCP or TLS socket whose reads land in 1 MiB slabs (the socket's `onread` option),
 * answered as a {@link BulkResponse}: a Readable with `statusCode`, `headers` and `complete`,
 * the part of IncomingMessage the registry modules read.
 *
 * Hand-written, and only for blob GETs, because node:http reads at most 64 KiB at a time, each
 * read into new memory and through several stream layers: under the daemon's interpreter-only
 * V8 flags (bin/vk-cocoon) a 512 MiB blob from loopback, hashed as it arrives, takes 1.3–2.3 s
 * through node:http and 0.5–0.7 s through this reader with its slabs reused (slab-pool.ts;
 * `npm run bench:blob-read`, docs/decisions.md "Snapshot transfer memory"). No maintained client
 * lets the caller own the read buffers. Everything else (manifests, tokens, uploads) stays on
 * node:http and its keep-alive pool.
 *
 * The parser is small and strict: a status line, header lines (64 KiB in all), then a body
 * framed by Content-Length, the chunked transfer coding, or the end of the connection (RFC 9112
 * §6.3). Interim 1xx answers are skipped; a malformed head or framing is a network error. Every
 * request says `Connection: close`, and the socket is closed once the body has ended.
 */
import type { IncomingHttpHeaders } from 'node:http';
import net from 'node:net';
import { Readable } from 'node:stream';
import tls from 'node:tls';
import { networkError, RegistryError } from './errors.ts';
import { SLAB_BYTES, type Slab, type SlabPool } from './slab-pool.ts';

/** A read gets at least this much room: a slab with less left is retired for a fresh one. */
const MIN_READ_BYTES = 64 * 1024;
/** The status line and headers together. */
const MAX_HEAD_BYTES = 64 * 1024;
/** A chunk-size line or a trailer line of the chunked coding. */
const MAX_LINE_BYTES = 4096;

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const STATUS_LINE = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/;
const HEADER_LINE = /^([^:\s]+):[ \t]*(.*?)[ \t]*$/;

export interface BulkGetOptions {
  readonly url: URL;
  /** Request headers (lower-case names); `host` and `connection` are set here. */
  readonly headers: Readonly<Record<string, string>>;
  /** HTTPS: the certificates to trust (default Node's). */
  readonly ca?: readonly string[];
  /** Socket inactivity that fails the request, before and during the body. */
  readonly idleTimeoutMs: number;
  /** Where the reads land: every body piece pushed is a counted view of one of its slabs. */
  readonly pool: SlabPool;
  readonly signal?: AbortSignal;
}

/** The answer to a {@link bulkGet}: the body as a Readable of slab pieces. */
export class BulkResponse extends Readable {
  statusCode = 0;
  statusMessage = '';
  headers: IncomingHttpHeaders = {};
  /** Every byte of the body arrived (as IncomingMessage.complete). */
  complete = false;
  readonly #socket: net.Socket;

  constructor(socket: net.Socket) {
    super({ highWaterMark: SLAB_BYTES });
    this.#socket = socket;
  }

  override _read(): void {
    this.#socket.resume();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.#socket.destroy();
    callback(error);
  }
}

/** The request head; refuses header names and values that would break the message. */
export function requestHead(url: URL, headers: Readonly<Record<string, string>>): string {
  const lines = [`GET ${url.pathname}${url.search} HTTP/1.1`, `host: ${url.host}`, 'connection: close'];
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    if (lower === 'host' || lower === 'connection') continue;
    if (!TOKEN.test(name) || /[\r\n\0]/.test(value))
      throw new RegistryError('invalid', `request header ${JSON.stringify(name)} cannot be sent`);
    lines.push(`${name}: ${value}`);
  }
  return `${lines.join('\r\n')}\r\n\r\n`;
}

/** How the body ends (RFC 9112 §6.3). */
type Framing = { kind: 'length'; left: number } | { kind: 'chunked' } | { kind: 'close' };

/** Status, headers and framing of one response head (without its blank line); throws on a malformed one. */
export function parseHead(text: string): {
  status: number;
  message: string;
  headers: IncomingHttpHeaders;
  framing: Framing;
} {
  const lines = text.split(/\r?\n/);
  const status = STATUS_LINE.exec(lines[0] ?? '');
  if (!status) throw new Error(`malformed status line ${JSON.stringify((lines[0] ?? '').slice(0, 80))}`);
  const headers: Record<string, string> = {};
  for (const line of lines.slice(1)) {
    const m = HEADER_LINE.exec(line);
    if (!m || !TOKEN.test(m[1] as string))
      throw new Error(`malformed header line ${JSON.stringify(line.slice(0, 80))}`);
    const name = (m[1] as string).toLowerCase();
    const value = m[2] as string;
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  const code = Number(status[1]);
  let framing: Framing;
  const te = headers['transfer-encoding'];
  const cl = headers['content-length'];
  if (code < 200 || code === 204 || code === 304) framing = { kind: 'length', left: 0 };
  else if (te !== undefined)
    framing =
      te.split(',').at(-1)?.trim().toLowerCase() === 'chunked' ? { kind: 'chunked' } : { kind: 'close' };
  else if (cl !== undefined) {
    const values = new Set(cl.split(',').map((v) => v.trim()));
    const only = [...values][0] as string;
    if (values.size !== 1 || !/^\d{1,15}$/.test(only))
      throw new Error(`invalid Content-Length ${JSON.stringify(cl)}`);
    framing = { kind: 'length', left: Number(only) };
  } else framing = { kind: 'close' };
  return { status: code, message: status[2] ?? '', headers, framing };
}

/** One GET on a connection of its own; resolves once the response head is in. */
export function bulkGet(o: BulkGetOptions): Promise<BulkResponse> {
  const { url, signal } = o;
  const what = `GET ${url.host}${url.pathname}`;
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(networkError(what, signal.reason ?? new Error('aborted')));
      return;
    }
    let head: string;
    try {
      head = requestHead(url, o.headers);
    } catch (error) {
      reject(error);
      return;
    }
    const { pool } = o;
    pool.open();
    let slab: Slab = pool.take();
    // A read lands at the start of the region and the next region starts after its bytes, so a
    // byte handed on is never written over while its slab is in use. (Node asks for the next
    // region right after each callback.)
    const region = (): Buffer => {
      if (SLAB_BYTES - slab.used < MIN_READ_BYTES) {
        pool.retire(slab);
        slab = pool.take();
      }
      return slab.buf.subarray(slab.used);
    };
    const onread = {
      buffer: region,
      callback: (n: number, buf: Uint8Array): boolean => {
        slab.used += n;
        return onBytes((buf as Buffer).subarray(0, n), slab);
      },
    };
    const https = url.protocol === 'https:';
    const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
    const port = Number(url.port || (https ? 443 : 80));
    const socket: net.Socket = https
      ? tls.connect({
          host,
          port,
          servername: net.isIP(host) ? undefined : host,
          ALPNProtocols: ['http/1.1'],
          ...(o.ca ? { ca: [...o.ca] } : {}),
          // tls.connect takes net.Socket's `onread` and `allowHalfOpen` (Node's docs), which
          // @types/node leaves out of its options.
          ...({ onread, allowHalfOpen: true } as object),
        })
      : net.connect({ host, port, onread, allowHalfOpen: true });
    const res = new BulkResponse(socket);
    let answered = false;
    let pending: Buffer | undefined;
    let framing: Framing = { kind: 'close' };
    let finished = false;
    // Chunked coding: reading a size line, the chunk's data, its CRLF, or the trailer.
    let chunkState: 'size' | 'data' | 'crlf' | 'trailer' = 'size';
    let chunkLeft = 0;
    let line = '';

    // Before the head, as node:http's request error; in the body, as IncomingMessage's: the
    // reader (blob-read.ts) says which blob and how far.
    const fail = (error: Error) => {
      if (!answered) reject(networkError(what, error));
      else res.destroy(error);
      socket.destroy();
    };
    const finish = () => {
      if (finished) return;
      finished = true;
      res.complete = true;
      res.push(null);
      socket.destroy();
    };
    /** A line of the chunked coding from `data` at `at`; undefined until its LF arrives. */
    const takeLine = (data: Buffer, at: number): { text: string; next: number } | undefined => {
      const nl = data.indexOf(10, at);
      line += data.toString('latin1', at, nl < 0 ? data.length : nl);
      if (line.length > MAX_LINE_BYTES) throw new Error('chunked coding: line too long');
      if (nl < 0) return undefined;
      const text = line.replace(/\r$/, '');
      line = '';
      return { text, next: nl + 1 };
    };
    /** Body bytes (a view of `from`, when they are slab memory); returns push()'s verdict (false
     * pauses the socket). */
    const body = (data: Buffer, from: Slab | undefined): boolean => {
      const give = (piece: Buffer) => res.push(from === undefined ? piece : pool.own(piece, from));
      if (framing.kind === 'close') return give(data);
      if (framing.kind === 'length') {
        const piece = data.length > framing.left ? data.subarray(0, framing.left) : data;
        framing.left -= piece.length;
        const more = piece.length > 0 ? give(piece) : true;
        if (framing.left === 0) finish();
        return more;
      }
      let more = true;
      for (let at = 0; at < data.length && !finished; ) {
        if (chunkState === 'data') {
          const n = Math.min(chunkLeft, data.length - at);
          more = give(at === 0 && n === data.length ? data : data.subarray(at, at + n));
          chunkLeft -= n;
          at += n;
          if (chunkLeft === 0) chunkState = 'crlf';
          continue;
        }
        const got = takeLine(data, at);
        if (got === undefined) break;
        at = got.next;
        if (chunkState === 'size') {
          const size = /^([0-9A-Fa-f]{1,12})(?:[ \t]*;.*)?$/.exec(got.text);
          if (!size)
            throw new Error(`chunked coding: bad chunk size ${JSON.stringify(got.text.slice(0, 40))}`);
          chunkLeft = Number.parseInt(size[1] as string, 16);
          chunkState = chunkLeft === 0 ? 'trailer' : 'data';
        } else if (chunkState === 'crlf') {
          if (got.text !== '') throw new Error('chunked coding: no CRLF after a chunk');
          chunkState = 'size';
        } else if (got.text === '') finish();
      }
      return more;
    };
    const onBytes = (data: Buffer, from: Slab): boolean => {
      try {
        if (answered) return finished || body(data, from);
        // The head so far is a copy (its slab may be read into again before the head is whole);
        // body bytes after a head that came in one read are still the read's own view.
        let all = pending === undefined ? data : Buffer.concat([pending, data]);
        for (;;) {
          const text = all.toString('latin1', 0, Math.min(all.length, MAX_HEAD_BYTES + 4));
          const end = /\r?\n\r?\n/.exec(text);
          if (!end) {
            if (all.length > MAX_HEAD_BYTES)
              throw new Error(`response head larger than ${MAX_HEAD_BYTES} bytes`);
            pending = all === data || all.buffer === data.buffer ? Buffer.from(all) : all;
            return true;
          }
          const parsed = parseHead(text.slice(0, end.index));
          const rest = all.subarray(end.index + end[0].length);
          if (parsed.status >= 100 && parsed.status < 200) {
            if (parsed.status === 101) throw new Error('unexpected 101 Switching Protocols');
            all = rest; // an interim answer: the real one follows
            continue;
          }
          pending = undefined;
          res.statusCode = parsed.status;
          res.statusMessage = parsed.message;
          res.headers = parsed.headers;
          framing = parsed.framing;
          answered = true;
          resolve(res);
          if (framing.kind === 'length' && framing.left === 0) finish();
          return (
            rest.length === 0 || finished || body(rest, rest.buffer === from.buf.buffer ? from : undefined)
          );
        }
      } catch (error) {
        fail(error as Error);
        return false;
      }
    };
    const onEnd = () => {
      if (finished) return;
      if (answered && framing.kind === 'close') finish();
      else
        fail(
          new Error(
            answered
              ? framing.kind === 'length'
                ? `connection closed with ${framing.left} body bytes still to come`
                : 'connection closed inside the chunked body'
              : 'connection closed before a response',
          ),
        );
    };
    socket.setTimeout(o.idleTimeoutMs, () =>
      socket.destroy(new RegistryError('network', `${what}: no data for ${o.idleTimeoutMs} ms`)),
    );
    socket.on('error', (error) => fail(error));
    // Half-open allowed: Node then never shuts our side down on the server's FIN by itself;
    // every end of the answer destroys the socket here instead.
    socket.on('end', onEnd);
    socket.on('close', () => {
      signal?.removeEventListener('abort', onAbort);
      onEnd();
      pool.retire(slab);
      pool.close();
    });
    const onAbort = () => fail(signal?.reason instanceof Error ? signal.reason : new Error('aborted'));
    signal?.addEventListener('abort', onAbort, { once: true });
    socket.write(head);
  });
}
