/**
 * The v2 writer's cut of one exported file (docs/registry.md "The v2 format", "Push flow"), as
 * cocoon-common v0.3.0 writes it: with `SNAPSHOT_ZSTD_LEVEL` > 0 a file of at least 1 MiB is
 * zstd-compressed; with `SNAPSHOT_CHUNK_SIZE_MIB` > 0 a file that is compressed or larger than one
 * chunk is cut at fixed uncompressed offsets of that size, each chunk one blob (an independent
 * zstd frame when compressed). Each blob is spooled to a file while it is hashed, then handed to
 * the uploader; the spool waits while the blobs not yet uploaded hold `SNAPSHOT_MEMORY_BUDGET_MIB`.
 */
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import type { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { constants, createZstdCompress } from 'node:zlib';
import { ZSTD_SUFFIX } from './artifact.ts';
import { CHUNK_COUNT_ANNOTATION, CHUNK_INDEX_ANNOTATION } from './import-plan.ts';
import { Hashing, MiB, PIECE_BYTES } from './transfer.ts';

/** Files smaller than this stay uncompressed (cocoon-common's threshold). */
export const COMPRESS_MIN_BYTES = 1 * MiB;

/** The v2 settings; both 0 is the v1 format. */
export interface V2Format {
  /** zstd level, 1–22; 0: no compression. */
  readonly zstdLevel: number;
  /** Chunk size in bytes; 0: files are not cut. */
  readonly chunkBytes: number;
}

export const isV2 = (f: V2Format | undefined): f is V2Format =>
  f !== undefined && (f.zstdLevel > 0 || f.chunkBytes > 0);

/** How one file of `size` bytes is stored: compressed or not, and its blobs' `[start, end)` ranges. */
export interface FileLayout {
  readonly compress: boolean;
  readonly ranges: readonly (readonly [start: number, end: number])[];
}

/** The layout of a file (pure). A file neither compressed nor cut is one raw blob, as in v1. */
export function fileLayout(size: number, f: V2Format): FileLayout {
  const compress = f.zstdLevel > 0 && size >= COMPRESS_MIN_BYTES;
  const cut = f.chunkBytes > 0 && (compress || size > f.chunkBytes);
  if (!cut || size === 0) return { compress, ranges: [[0, size]] };
  const ranges: [number, number][] = [];
  for (let start = 0; start < size; start += f.chunkBytes)
    ranges.push([start, Math.min(size, start + f.chunkBytes)]);
  return { compress, ranges };
}

/** One blob of a v2 file, spooled. */
export interface V2Blob {
  readonly file: string;
  readonly digest: string;
  /** Bytes of the blob (compressed when the layer type ends in `+zstd`). */
  readonly size: number;
  readonly mediaType: string;
  /** `cocoonstack.chunk.index` / `.count` on the blobs of a file stored in more than one. */
  readonly annotations?: Readonly<Record<string, string>>;
}

/** Bytes spooled and not yet uploaded, capped: a new blob waits while the cap is reached. */
export class SpoolBudget {
  readonly #cap: number;
  #held = 0;
  #waiters: (() => void)[] = [];

  constructor(capBytes: number) {
    this.#cap = capBytes;
  }

  get held(): number {
    return this.#held;
  }

  /** Writers waiting for room now. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /** Resolves once less than the cap is held (at once when nothing is). */
  async room(signal: AbortSignal): Promise<void> {
    while (this.#held > 0 && this.#held >= this.#cap) {
      signal.throwIfAborted();
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener('abort', done);
          resolve();
        };
        this.#waiters.push(done);
        signal.addEventListener('abort', done, { once: true });
      });
    }
  }

  add(n: number): void {
    this.#held += n;
  }

  release(n: number): void {
    this.#held -= n;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }
}

async function write(w: Writable, chunk: Buffer): Promise<void> {
  if (!w.write(chunk)) await once(w, 'drain');
}

export interface WriteV2Options {
  readonly title: string;
  readonly size: number;
  /** The v1 media type of the file (`+zstd` is appended for compressed blobs). */
  readonly mediaType: string;
  readonly layout: FileLayout;
  readonly zstdLevel: number;
  /** A new spool file path. */
  readonly spoolFile: () => string;
  readonly budget: SpoolBudget;
  readonly signal: AbortSignal;
  /** Bytes of the file read so far (progress). */
  readonly onBytes: (n: number) => void;
  /** A blob is spooled (hand it to the uploader; release its budget once it is up). */
  readonly onBlob: (blob: V2Blob) => void;
}

/**
 * Reads one tar entry and writes its blobs as the layout says: each range through a zstd
 * compressor (one frame) when compressing, hashed, into its own spool file. Returns the blobs in
 * order; a file that does not end at `size` bytes throws.
 */
export async function writeV2File(entry: AsyncIterable<Buffer>, o: WriteV2Options): Promise<V2Blob[]> {
  const { ranges } = o.layout;
  const count = ranges.length;
  const blobs: V2Blob[] = [];
  let k = -1;
  let current:
    | { sink: Writable; done: Promise<void>; hashing: Hashing; file: string; end: number }
    | undefined;
  const open = async () => {
    k++;
    await o.budget.room(o.signal);
    const file = o.spoolFile();
    const hashing = new Hashing();
    const out = createWriteStream(file, { flags: 'wx', mode: 0o600 });
    const zstd = o.layout.compress
      ? createZstdCompress({
          chunkSize: PIECE_BYTES,
          params: {
            [constants.ZSTD_c_compressionLevel]: o.zstdLevel,
            [constants.ZSTD_c_checksumFlag]: 1,
            [constants.ZSTD_c_contentSizeFlag]: 1,
          },
          pledgedSrcSize:
            (ranges[k] as readonly [number, number])[1] - (ranges[k] as readonly [number, number])[0],
        })
      : undefined;
    const done = zstd
      ? pipeline(zstd, hashing, out, { signal: o.signal })
      : pipeline(hashing, out, { signal: o.signal });
    done.catch(() => {}); // observed when the blob is closed
    current = {
      sink: zstd ?? hashing,
      done,
      hashing,
      file,
      end: (ranges[k] as readonly [number, number])[1],
    };
  };
  const close = async () => {
    if (!current) return;
    const c = current;
    current = undefined;
    c.sink.end();
    await c.done;
    const blob: V2Blob = {
      file: c.file,
      digest: c.hashing.digest(),
      size: c.hashing.size,
      mediaType: o.layout.compress ? `${o.mediaType}${ZSTD_SUFFIX}` : o.mediaType,
      ...(count > 1
        ? { annotations: { [CHUNK_INDEX_ANNOTATION]: String(k), [CHUNK_COUNT_ANNOTATION]: String(count) } }
        : {}),
    };
    o.budget.add(blob.size);
    blobs.push(blob);
    o.onBlob(blob);
  };
  let pos = 0;
  // Bytes gathered for the sink (PIECE_BYTES, or to the end of the blob's range when nearer).
  let gather: Buffer | undefined;
  let gathered = 0;
  try {
    await open();
    for await (const chunk of entry) {
      o.signal.throwIfAborted();
      let buf = chunk;
      while (buf.length > 0) {
        if (!current) throw new Error(`${o.title}: more than the ${o.size} bytes its tar header declares`);
        const take = Math.min(buf.length, current.end - pos);
        let n: number;
        if (gather === undefined && take >= PIECE_BYTES) {
          n = take;
          await write(current.sink, take === buf.length ? buf : buf.subarray(0, take));
        } else {
          gather ??= Buffer.allocUnsafe(Math.min(PIECE_BYTES, current.end - pos));
          n = buf.copy(gather, gathered, 0, take);
          gathered += n;
          if (gathered === gather.length) {
            const piece = gather;
            gather = undefined;
            gathered = 0;
            await write(current.sink, piece);
          }
        }
        o.onBytes(n);
        pos += n;
        buf = buf.subarray(n);
        if (pos === current.end) {
          await close();
          if (k + 1 < count) await open();
        }
      }
    }
    if (pos !== o.size) throw new Error(`${o.title}: ${pos} of ${o.size} bytes`);
    // A zero-byte file: its one (empty) blob.
    await close();
  } catch (error) {
    current?.sink.destroy(error as Error);
    await current?.done.catch(() => {});
    throw error;
  }
  return blobs;
}
