/**
 * The bytes of one import-tar file from its blobs (docs/registry.md "The v2 format"): each blob as it
 * downloads (already verified against its digest by the client), zstd-decompressed when its layer type
 * says so, concatenated in the plan's order, and checked as it goes: a chunked file's chunks all hold
 * the same number of bytes but the last (which holds at most that many), and the file ends at exactly
 * the size the config gives. Any disagreement fails the pull with the file and chunk named, before the
 * tar entry could be closed with wrong bytes.
 */
import { once } from 'node:events';
import { createZstdDecompress } from 'node:zlib';
import type { TarLayerEntry } from './import-plan.ts';
import { PIECE_BYTES } from './transfer.ts';
import { FrameCutter } from './zstd-frames.ts';

type ZstdDecompress = ReturnType<typeof createZstdDecompress>;

/**
 * The decompressed bytes of one zstd stream (one or more frames). A truncated or corrupt stream
 * throws. Each frame goes to a decompressor of its own (zstd-frames.ts): Node's zstd stream
 * ends at the end of a frame unless its output buffer is full there, dropping what follows, so
 * one decompressor decodes several frames only when each ends on a multiple of its output
 * buffer. The output buffer is {@link PIECE_BYTES}: zlib's default (16 KiB) cut every input
 * piece into several outputs, each a round trip through the thread pool.
 */
export async function* unzstd(
  source: AsyncIterable<Buffer>,
  recycle: (chunk: Buffer) => void = () => {},
): AsyncGenerator<Buffer> {
  const frames = new FrameCutter();
  /** The frames' decompressors in order, opened by the feeder and not yet read. */
  const queue: ZstdDecompress[] = [];
  let opened = 0;
  let fed = false;
  let failure: unknown;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const open = (): ZstdDecompress => {
    const z = createZstdDecompress({ chunkSize: PIECE_BYTES });
    // It may fail before the reader gets to it; the reader's iteration then throws the error.
    z.on('error', () => {});
    queue.push(z);
    opened++;
    notify();
    return z;
  };
  const feeding = (async () => {
    let z: ZstdDecompress | undefined;
    try {
      for await (const chunk of source) {
        for (let at = 0; at < chunk.length; ) {
          z ??= open();
          const { n, ended } = frames.take(chunk, at);
          const piece = n === chunk.length ? chunk : chunk.subarray(at, at + n);
          at += n;
          // Once the decompressor has taken the chunk's last piece (its write callback: zlib
          // holds no input after it), the chunk's read buffer may be read into again.
          const last = at === chunk.length;
          const taken = last ? (error?: Error | null) => error || recycle(chunk) : undefined;
          if (n > 0 && !z.write(piece, taken)) await once(z, 'drain');
          else if (n === 0 && last) recycle(chunk);
          if (ended) {
            z.end();
            z = undefined;
          }
        }
      }
      // No bytes at all: one decompressor fed nothing, which calls the stream truncated.
      if (z !== undefined || opened === 0) (z ?? open()).end();
    } catch (error) {
      failure = error;
      z?.destroy(error as Error);
    } finally {
      fed = true;
      notify();
    }
  })();
  let reading: ZstdDecompress | undefined;
  try {
    for (;;) {
      while (queue.length === 0 && !fed) {
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
      }
      reading = queue.shift();
      if (reading === undefined) break;
      for await (const out of reading) yield out as Buffer;
    }
    if (failure !== undefined) throw failure;
  } finally {
    reading?.destroy();
    for (const z of queue) z.destroy();
    await feeding;
  }
}

/** Why a zstd stream failed, in words (zlib's codes say little on their own). */
function zstdProblem(error: unknown): string {
  const e = error as NodeJS.ErrnoException;
  if (e.code === 'Z_BUF_ERROR') return 'the zstd stream is truncated';
  return `not a valid zstd stream (${e.message})`;
}

export class EntryBodyError extends Error {}

/**
 * The file's bytes: for each part in order, `take(k)` (the k-th blob of the file, raw) decompressed when
 * it is zstd. Throws {@link EntryBodyError} on a corrupt or truncated zstd chunk, a chunk of the wrong
 * length, or a total other than `entry.size`.
 */
export async function* entryBody(
  entry: TarLayerEntry,
  take: (k: number) => AsyncIterable<Buffer>,
  recycle?: (chunk: Buffer) => void,
): AsyncGenerator<Buffer> {
  const chunked = entry.parts.length > 1;
  let total = 0;
  let chunkBytes: number | undefined;
  for (const [k, part] of entry.parts.entries()) {
    const where = chunked ? `${entry.name} chunk ${k} (${part.layer.digest})` : entry.name;
    let n = 0;
    try {
      for await (const chunk of part.zstd ? unzstd(take(k), recycle) : take(k)) {
        n += chunk.length;
        if (total + n > entry.size)
          throw new EntryBodyError(`${where}: more bytes than the file's size ${entry.size}`);
        yield chunk;
      }
    } catch (error) {
      if (
        error instanceof EntryBodyError ||
        !part.zstd ||
        !(error as NodeJS.ErrnoException).code?.startsWith('Z')
      )
        throw error;
      throw new EntryBodyError(`${where}: ${zstdProblem(error)}`, { cause: error });
    }
    const last = k === entry.parts.length - 1;
    if (chunked) {
      chunkBytes ??= n;
      if (last ? n > chunkBytes : n !== chunkBytes)
        throw new EntryBodyError(
          `${where}: ${n} bytes where the chunks before it hold ${chunkBytes}: the chunks are out of order or cut at different sizes`,
        );
    }
    total += n;
  }
  if (total !== entry.size)
    throw new EntryBodyError(`${entry.name}: ${total} bytes where the config says ${entry.size}`);
}
