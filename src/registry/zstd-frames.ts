/**
 * Where the frames of a zstd stream end (RFC 8878 §3.1), found from their headers as the
 * compressed bytes stream by, so that each frame can go to a decompressor of its own: Node's
 * zstd stream ends at the end of a frame unless its output buffer happens to be full there,
 * dropping whatever follows (entry-body.ts). Only the headers are read (a frame header, then a
 * 3-byte header per block of at most 128 KiB); block contents are counted, not looked at.
 * Bytes that are not a zstd or skippable frame make one frame that never ends: the decompressor
 * then says what is wrong with them.
 */

const ZSTD_MAGIC = 0xfd2fb528;
/** Skippable frames: 0x184D2A50 to 0x184D2A5F, then a 4-byte size and that many bytes. */
const SKIPPABLE_MASK = 0xfffffff0;
const SKIPPABLE_MAGIC = 0x184d2a50;

/** What the next field read is. */
type Field = 'magic' | 'descriptor' | 'block' | 'skippable-size';

export class FrameCutter {
  #field: Field = 'magic';
  /** The field's bytes so far, and how many it has. */
  readonly #bytes = Buffer.alloc(4);
  #got = 0;
  /** Bytes to pass over before the next field (a header's rest, a block, a checksum). */
  #skip = 0;
  /** After the skip: the next field, or the end of the frame. */
  #then: Field | 'end' = 'magic';
  /** The frame's content checksum (0 or 4 bytes after its last block). */
  #checksum = 0;
  /** Not a frame we know: everything from here on is one frame. */
  #opaque = false;

  /** How many bytes of `buf`, from `at`, belong to the current frame; `ended` when it ends
   * there (the next byte starts a new frame). */
  take(buf: Buffer, at: number): { n: number; ended: boolean } {
    const start = at;
    while (at < buf.length) {
      if (this.#opaque) return { n: buf.length - start, ended: false };
      if (this.#skip > 0) {
        const n = Math.min(this.#skip, buf.length - at);
        this.#skip -= n;
        at += n;
        if (this.#skip > 0) break;
        if (this.#next(this.#then)) return { n: at - start, ended: true };
        continue;
      }
      this.#bytes[this.#got++] = buf[at++] as number;
      const need = this.#field === 'descriptor' ? 1 : this.#field === 'block' ? 3 : 4;
      if (this.#got < need) continue;
      this.#got = 0;
      if (this.#read()) return { n: at - start, ended: true };
    }
    return { n: at - start, ended: false };
  }

  /** Goes on to `then` after a skip of nothing; true when that ends the frame. */
  #next(then: Field | 'end'): boolean {
    if (then === 'end') {
      this.#field = 'magic';
      this.#then = 'magic';
      return true;
    }
    this.#field = then;
    return false;
  }

  /** Passes over `n` bytes, then goes on to `then`; true when that ends the frame at once. */
  #pass(n: number, then: Field | 'end'): boolean {
    this.#skip = n;
    this.#then = then;
    return n === 0 && this.#next(then);
  }

  /** A whole field is in `#bytes`: what follows it. True when the frame ends right after it. */
  #read(): boolean {
    const b = this.#bytes;
    switch (this.#field) {
      case 'magic': {
        const magic = b.readUInt32LE(0);
        if (magic === ZSTD_MAGIC) return this.#next('descriptor');
        if ((magic & SKIPPABLE_MASK) >>> 0 === SKIPPABLE_MAGIC) return this.#next('skippable-size');
        this.#opaque = true;
        return false;
      }
      case 'skippable-size':
        return this.#pass(b.readUInt32LE(0), 'end');
      case 'descriptor': {
        const d = b[0] as number;
        const single = (d >> 5) & 1;
        const fcsFlag = d >> 6;
        const fcs = fcsFlag === 0 ? single : [0, 2, 4, 8][fcsFlag]!;
        const dictionary = [0, 1, 2, 4][d & 3]!;
        this.#checksum = (d >> 2) & 1 ? 4 : 0;
        return this.#pass((single ? 0 : 1) + dictionary + fcs, 'block');
      }
      case 'block': {
        const h = b[0]! | (b[1]! << 8) | (b[2]! << 16);
        const last = h & 1;
        const type = (h >> 1) & 3;
        const size = h >>> 3;
        if (type === 3) {
          // Reserved: not a stream we can follow; the decompressor refuses it.
          this.#opaque = true;
          return false;
        }
        // An RLE block is one byte repeated `size` times.
        const content = type === 1 ? 1 : size;
        if (!last) return this.#pass(content, 'block');
        return this.#pass(content + this.#checksum, 'end');
      }
    }
  }
}
