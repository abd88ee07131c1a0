// SPDY/3 header compression contexts. Each direction of a connection is ONE zlib stream primed with the
// SPDY/3 dictionary: every header block is deflated with Z_SYNC_FLUSH and the peer keeps inflating the
// same stream. Node has no synchronous streaming zlib API (`_processChunk` closes the handle after one
// call), so these contexts wrap the asynchronous zlib streams and serialise operations: results come back
// in call order, which is what keeps the wire order of header blocks equal to the compression order.

import zlib from 'node:zlib';
import { SPDY3_DICTIONARY } from './spdy-frames.ts';

class ZlibContext {
  private readonly z: zlib.Deflate | zlib.Inflate;
  private readonly maxOutput: number;
  private chain: Promise<unknown> = Promise.resolve();
  private acc: Buffer[] = [];
  private accBytes = 0;
  private failure: Error | null = null;
  private closed = false;
  private rejectCurrent: ((err: Error) => void) | null = null;

  constructor(z: zlib.Deflate | zlib.Inflate, maxOutput: number) {
    this.z = z;
    this.maxOutput = maxOutput;
    // Drain continuously so zlib never stalls on a full readable buffer mid-operation.
    z.on('readable', () => this.drain());
    z.on('error', (err) => this.fail(err));
  }

  protected run(input: Buffer): Promise<Buffer> {
    const op = this.chain.then(() => this.once(input));
    // Keep the chain alive after a failure; each caller still sees its own rejection.
    this.chain = op.catch(() => undefined);
    return op;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.z.destroy();
    this.rejectCurrent?.(new Error('header compression context closed'));
  }

  private fail(err: Error): void {
    this.failure ??= err;
    this.rejectCurrent?.(this.failure);
  }

  private drain(): void {
    for (let c = this.z.read() as Buffer | null; c !== null; c = this.z.read() as Buffer | null) {
      this.acc.push(c);
      this.accBytes += c.length;
    }
    if (this.accBytes > this.maxOutput && !this.failure) {
      // Stop a zlib bomb as soon as it crosses the limit rather than after inflating all of it.
      this.fail(new Error(`header block inflates to more than ${this.maxOutput} bytes`));
      this.close();
    }
  }

  private once(input: Buffer): Promise<Buffer> {
    return new Promise<Buffer>((resolve, reject) => {
      if (this.closed) return reject(new Error('header compression context closed'));
      if (this.failure) return reject(this.failure);
      this.acc = [];
      this.accBytes = 0;
      this.rejectCurrent = reject;
      // The stream was created with flush: Z_SYNC_FLUSH, so every write ends byte-aligned and complete.
      this.z.write(input, (err) => {
        if (err) return reject(err);
        this.drain();
        if (this.failure) return reject(this.failure);
        const out = Buffer.concat(this.acc, this.accBytes);
        this.acc = [];
        this.accBytes = 0;
        resolve(out);
      });
    }).finally(() => {
      this.rejectCurrent = null;
    });
  }
}

/** Outbound context: deflate + sync flush per header block. */
export class HeaderCompressor extends ZlibContext {
  constructor() {
    super(
      zlib.createDeflate({ dictionary: SPDY3_DICTIONARY, flush: zlib.constants.Z_SYNC_FLUSH }),
      Number.MAX_SAFE_INTEGER,
    );
  }

  compress(block: Buffer): Promise<Buffer> {
    return this.run(block);
  }
}

/** Inbound context: inflate continuing the peer's single zlib stream. */
export class HeaderDecompressor extends ZlibContext {
  /** @param maxOutput largest inflated header block accepted (default 1 MiB); guards against zlib bombs. */
  constructor(maxOutput = 1 << 20) {
    super(
      zlib.createInflate({ dictionary: SPDY3_DICTIONARY, flush: zlib.constants.Z_SYNC_FLUSH }),
      maxOutput,
    );
  }

  decompress(compressed: Buffer): Promise<Buffer> {
    return this.run(compressed);
  }
}
