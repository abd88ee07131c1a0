// Small pieces every registry transfer shares (pull, push, cloud-image import): the MiB/s of a
// progress line, the error text of a transfer that its caller aborted, and a hashing pass-through.
import { createHash } from 'node:crypto';
import { Transform, type TransformCallback } from 'node:stream';

export const MiB = 1024 * 1024;

/**
 * Bytes a transfer gathers before it hands them on (the blob verifier of a pull, a streamed or
 * v2 file of a push), and the output buffer of its zstd (de)compressors. A socket or pipe read
 * is at most 64 KiB (zlib's default output 16 KiB), and every chunk costs about the same in each
 * stream, async iteration and thread-pool round trip after it whatever its size: with the
 * daemon's V8 flags (no optimizing JIT) those per-chunk costs were most of a transfer's CPU
 * (docs/benchmarks.md "bench:transfer"). Gathering costs one copy. Small enough that a piece is
 * gone after a young-generation collection or two: a promoted buffer waits for a mark-compact.
 */
export const PIECE_BYTES = 256 * 1024;

/** MiB per second, one decimal (0 for no time). */
export function rate(bytes: number, seconds: number): number {
  return seconds > 0 ? Math.round((bytes / MiB / seconds) * 10) / 10 : 0;
}

/** The text of a transfer's failure; when the caller aborted it (cap, shutdown), the abort's
 * reason comes first, since everything failed because of it. */
export function describeCause(cause: unknown, outer: AbortSignal | undefined): string {
  const text = cause instanceof Error ? cause.message : String(cause);
  if (outer?.aborted) {
    const reason = outer.reason instanceof Error ? outer.reason.message : 'aborted';
    return reason === text ? text : `${reason} (${text})`;
  }
  return text;
}

/** A pass-through that hashes (SHA-256) and counts what goes through it (a spooled blob). */
export class Hashing extends Transform {
  readonly #hash = createHash('sha256');
  readonly #onBytes: (n: number) => void;
  size = 0;

  constructor(onBytes: (n: number) => void = () => {}) {
    super();
    this.#onBytes = onBytes;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.#hash.update(chunk);
    this.size += chunk.length;
    this.#onBytes(chunk.length);
    cb(null, chunk);
  }

  #digest: string | undefined;

  /** The digest of everything that went through (computed once). */
  digest(): string {
    this.#digest ??= `sha256:${this.#hash.digest('hex')}`;
    return this.#digest;
  }
}
