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

/**
 * Output buffer of a zstd (de)compressor. zlib's default (16 KiB) cuts every 64 KiB socket or
 * pipe read into several pieces, each a round trip through the thread pool and a chunk through
 * every stream after it: with the daemon's V8 flags (no optimizing JIT) that per-chunk cost was
 * most of a v2 transfer's CPU (docs/benchmarks.md "bench:transfer"). Pieces are slices of it.
 */
export const ZSTD_CHUNK_BYTES = 1024 * 1024;

/** The decompressed bytes of one zstd stream (one or more frames). A truncated or corrupt stream throws. */
export async function* unzstd(source: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  const z = createZstdDecompress({ chunkSize: ZSTD_CHUNK_BYTES });
  const feeding = (async () => {
    try {
      for await (const chunk of source) if (!z.write(chunk)) await once(z, 'drain');
      z.end();
    } catch (error) {
      z.destroy(error as Error);
    }
  })();
  try {
    for await (const out of z) yield out as Buffer;
  } finally {
    z.destroy();
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
): AsyncGenerator<Buffer> {
  const chunked = entry.parts.length > 1;
  let total = 0;
  let chunkBytes: number | undefined;
  for (const [k, part] of entry.parts.entries()) {
    const where = chunked ? `${entry.name} chunk ${k} (${part.layer.digest})` : entry.name;
    let n = 0;
    try {
      for await (const chunk of part.zstd ? unzstd(take(k)) : take(k)) {
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
