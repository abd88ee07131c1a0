/**
 * Reused read buffers for blob bodies (docs/registry.md "Blob reads"; docs/decisions.md "Blob
 * bodies over a socket of their own"). A blob's bytes are read into 1 MiB slabs; every piece of a
 * slab handed on is counted, and a slab whose pieces have all come back ({@link SlabPool.release},
 * called by the pull once the import's stdin took the bytes) is read into again. Memory never
 * touched before costs more than the bytes it holds: 512 MiB copied through new 1 MiB buffers
 * costs 0.6–0.8 s of CPU (page faults, the collector) where two reused ones cost 0.05 s
 * (`npm run bench:blob-read`).
 *
 * A piece that never comes back (copied, spilled to a file, decompressed, dropped on an error)
 * only keeps its slab out of the pool until the garbage collector frees it: a leak costs a fresh
 * slab, never a byte. A piece comes back once at most (a second release is ignored). Idle slabs
 * are kept only while a blob read is open, and at most {@link MAX_IDLE_SLABS} of them.
 */

export const SLAB_BYTES = 1024 * 1024;
/** Free slabs kept for the next reads. */
export const MAX_IDLE_SLABS = 16;

export class Slab {
  readonly buf: Buffer;
  /** Bytes of `buf` already read into (the next read lands here). */
  used = 0;
  /** Pieces handed on and not yet back. */
  out = 0;
  /** No read lands in it any more: free once `out` is 0. */
  retired = false;

  constructor() {
    this.buf = Buffer.allocUnsafe(SLAB_BYTES);
  }
}

export class SlabPool {
  readonly #idle: Slab[] = [];
  readonly #owner = new WeakMap<Buffer, Slab>();
  /** Blob reads open now. */
  #readers = 0;
  /** Slabs made and slabs reused (for tests and logs). */
  made = 0;
  reused = 0;

  /** A blob read opens: slabs may now be kept for reuse. */
  open(): void {
    this.#readers++;
  }

  /** A blob read ended; with none open, the idle slabs go. */
  close(): void {
    this.#readers = Math.max(0, this.#readers - 1);
    if (this.#readers === 0) this.#idle.length = 0;
  }

  /** A slab to read into: an idle one, else a new one. */
  take(): Slab {
    const slab = this.#idle.pop();
    if (slab !== undefined) {
      this.reused++;
      slab.used = 0;
      slab.out = 0;
      slab.retired = false;
      return slab;
    }
    this.made++;
    return new Slab();
  }

  /** Counts `piece` (a view of `slab`) as handed on. */
  own(piece: Buffer, slab: Slab): Buffer {
    slab.out++;
    this.#owner.set(piece, slab);
    return piece;
  }

  /** No more reads land in `slab` (its reader moved on or closed). */
  retire(slab: Slab): void {
    slab.retired = true;
    this.#free(slab);
  }

  /** `piece`'s bytes are no longer needed by anyone; any other buffer is ignored. */
  release(piece: Buffer): void {
    const slab = this.#owner.get(piece);
    if (slab === undefined) return;
    this.#owner.delete(piece);
    slab.out--;
    this.#free(slab);
  }

  #free(slab: Slab): void {
    if (slab.retired && slab.out === 0 && this.#readers > 0 && this.#idle.length < MAX_IDLE_SLABS)
      this.#idle.push(slab);
  }
}
