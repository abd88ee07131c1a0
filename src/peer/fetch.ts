// One slice from a peer into the staged file (shared/spec/peer-restore.md §4 "Client check",
// "Reassembly"): the body is buffered up to 4 MiB and written at its offset, all-zero 1 MiB
// chunks skipped so they stay holes; then, in Go's order, the byte count, the trailer's
// presence and its value (an exact string) are checked.
import type { FileHandle } from 'node:fs/promises';
import type http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import type { TokenBucket } from './gate.ts';
import { get, PeerRestoreError, readSome, StallTimer } from './transport.ts';
import { CRC_TRAILER, crc32cHex, crc32cUpdate, type Extent, WRITE_BUFFER, ZERO_CHUNK } from './wire.ts';

const ZEROS = Buffer.alloc(ZERO_CHUNK);
/** Body bytes of a refused slice quoted in the error. */
const QUOTED_BODY = 512;

async function writeAll(fh: FileHandle, data: Buffer, position: number): Promise<void> {
  for (let done = 0; done < data.length; ) {
    const { bytesWritten } = await fh.write(data, done, data.length - done, position + done);
    done += bytesWritten;
  }
}

/**
 * Writes `data` at `position`, skipping every all-zero ZERO_CHUNK-sized piece (counted from
 * the start of `data`): the file was truncated to its size, so skipped ranges read as zeros
 * and stay holes.
 */
export async function writeSkippingZeros(fh: FileHandle, data: Buffer, position: number): Promise<void> {
  for (let at = 0; at < data.length; at += ZERO_CHUNK) {
    const piece = data.subarray(at, Math.min(at + ZERO_CHUNK, data.length));
    if (!piece.equals(ZEROS.subarray(0, piece.length))) await writeAll(fh, piece, position + at);
  }
}

/** Go's `sectionWriter`: body bytes gathered in `buf` and written at their offset when it fills. */
export class SectionWriter {
  readonly #fh: FileHandle;
  readonly #buf: Buffer;
  #position = 0;
  #used = 0;

  constructor(fh: FileHandle, buf: Buffer = Buffer.allocUnsafe(WRITE_BUFFER)) {
    this.#fh = fh;
    this.#buf = buf;
  }

  /** Starts a section at `offset` (the previous one must have been flushed). */
  begin(offset: number): void {
    this.#position = offset;
    this.#used = 0;
  }

  async write(chunk: Buffer): Promise<void> {
    await this.append(chunk);
  }

  /**
   * Copies `chunk` in; `undefined` when that was all (the common case: no promise, no tick), a
   * promise when the buffer filled and had to be written out first (the rest follows it).
   */
  append(chunk: Buffer): Promise<void> | undefined {
    const n = chunk.copy(this.#buf, this.#used);
    this.#used += n;
    if (this.#used < this.#buf.length) return undefined;
    return this.flush().then(() => (n < chunk.length ? this.append(chunk.subarray(n)) : undefined));
  }

  async flush(): Promise<void> {
    if (this.#used === 0) return;
    await writeSkippingZeros(this.#fh, this.#buf.subarray(0, this.#used), this.#position);
    this.#position += this.#used;
    this.#used = 0;
  }
}

export interface SliceFetch {
  agent: http.Agent;
  url: string;
  /** Names the slice in errors: `<file>@<offset>+<length>`. */
  what: string;
  slice: Extent;
  writer: SectionWriter;
  signal: AbortSignal;
  headerMs: number;
  stallMs: number;
  bucket: TokenBucket;
  onBytes?: (n: number) => void;
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Fetches one slice into the writer; resolves with its byte count, rejects with a PeerRestoreError. */
export async function fetchSlice(f: SliceFetch): Promise<number> {
  const wrap = (err: unknown): PeerRestoreError => {
    if (err instanceof PeerRestoreError) return err;
    if (f.signal.aborted) return new PeerRestoreError('aborted', `slice ${f.what}: aborted`, err);
    return new PeerRestoreError('transfer', `slice ${f.what}: ${describe(err)}`, err);
  };
  let res: http.IncomingMessage;
  try {
    res = await get(f.agent, f.url, { signal: f.signal, headerMs: f.headerMs });
  } catch (err) {
    throw wrap(err);
  }
  const onAbort = () => res.destroy(new PeerRestoreError('aborted', `slice ${f.what}: aborted`));
  f.signal.addEventListener('abort', onAbort, { once: true });
  try {
    if (res.statusCode !== 200) {
      const body = await readSome(res, QUOTED_BODY, f.stallMs).catch(() => Buffer.alloc(0));
      throw new PeerRestoreError(
        'transfer',
        `slice ${f.what}: HTTP ${res.statusCode} ${res.statusMessage ?? ''}: ${body.toString('utf8').trim()}`,
      );
    }
    const encoding = res.headers['content-encoding'];
    if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
      throw new PeerRestoreError('transfer', `slice ${f.what}: the peer sent a ${encoding}-encoded body`);
    }
    const { offset, length } = f.slice;
    f.writer.begin(offset);
    let got = 0;
    let crc = 0;
    const stall = new StallTimer(f.stallMs, () =>
      res.destroy(new PeerRestoreError('stall', `slice ${f.what}: no body bytes for ${f.stallMs} ms`)),
    );
    // Flowing mode, not `for await`: a TLS body arrives in 16 KiB records, and an async iterator
    // costs a promise and several ticks per record (most of the client's CPU in bench/peer-wake.ts).
    // Each record is copied into the writer synchronously; the response is paused only while the
    // writer flushes a full buffer or the bandwidth bound makes it wait.
    try {
      await new Promise<void>((resolve, reject) => {
        let waiting: Promise<unknown> | undefined;
        let failed = false;
        const fail = (err: unknown) => {
          if (failed) return;
          failed = true;
          res.destroy();
          reject(err);
        };
        res.on('data', (chunk: Buffer) => {
          if (failed) return;
          got += chunk.length;
          if (got > length)
            return fail(
              new PeerRestoreError('transfer', `slice ${f.what}: got ${got} bytes, want ${length}`),
            );
          crc = crc32cUpdate(crc, chunk);
          f.onBytes?.(chunk.length);
          const flushing = f.writer.append(chunk);
          const wait = f.bucket.reserve(chunk.length);
          if (!flushing && wait <= 0) return void stall.kick();
          stall.pause();
          res.pause();
          waiting = Promise.all([
            flushing,
            wait > 0 ? sleep(wait, undefined, { signal: f.signal }) : undefined,
          ]).then(() => {
            waiting = undefined;
            if (failed) return;
            stall.kick();
            res.resume();
          }, fail);
        });
        res.once('end', () => {
          void (async () => {
            await waiting;
            stall.pause();
            await f.writer.flush();
          })().then(() => {
            if (!failed) resolve();
          }, fail);
        });
        res.once('error', fail);
        res.once('close', () => {
          if (!res.complete)
            fail(new PeerRestoreError('transfer', `slice ${f.what}: the peer closed the body early`));
        });
      });
    } finally {
      stall.stop();
    }
    if (got !== length)
      throw new PeerRestoreError('transfer', `slice ${f.what}: got ${got} bytes, want ${length}`);
    const sum = res.trailers[CRC_TRAILER.toLowerCase()];
    if (sum === undefined)
      throw new PeerRestoreError('checksum', `slice ${f.what}: server sent no checksum trailer`);
    if (sum !== crc32cHex(crc)) {
      throw new PeerRestoreError(
        'checksum',
        `slice ${f.what}: checksum mismatch (trailer ${sum}, body ${crc32cHex(crc)})`,
      );
    }
    return got;
  } catch (err) {
    res.destroy();
    throw wrap(err);
  } finally {
    f.signal.removeEventListener('abort', onAbort);
  }
}
