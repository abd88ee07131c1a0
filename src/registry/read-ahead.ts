/**
 * The pull's read-ahead (docs/registry.md "Pull flow" step 5): {@link ReadAhead} schedules the
 * blob downloads ahead of the tar writer within the `SNAPSHOT_PULL_BUDGET_MIB` budget, each
 * into a {@link SpillBlob} that keeps a small window in memory and spills the rest to a file.
 */
import { type FileHandle, open, rm } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import { nextReadAhead, type TarPart } from './import-plan.ts';
import { MiB } from './transfer.ts';
/**
 * Bytes of one read-ahead download held in memory; the rest spills to a file (default). Small
 * on purpose: buffers held longer than a few socket reads get promoted and collected by
 * mark-compacts; with 1–4 MiB windows a 1 GiB pull ran ~90 of them (~1 s of CPU more) in every
 * measurement, with 64–256 KiB often a third of that (docs/decisions.md "Snapshot transfer
 * memory").
 */
export const DEFAULT_READ_AHEAD_WINDOW_BYTES = 256 * 1024;
/** Spilled bytes are written in batches of about this size, and read back in pieces of it. */
const SPILL_IO_BYTES = 1 * MiB;
/**
 * Longest a read-ahead download waits at its full window (its socket paused) while the tar
 * writer is busy rather than starved; after it, the download spills freely. Far below the
 * registry client's 120 s idle timeout and a front end's patience with a paused stream.
 */
export const READ_AHEAD_PARK_MS = 5000;

/**
 * Whether the tar writer is starved (docs/registry.md "Pull flow" step 5): it waits for bytes of
 * the blob it is writing. Only then is downloading ahead worth a spill file: when the writer is
 * busy (cocoon, or v2's decompression, sets the pace), bytes spilled ahead are written to disk
 * and read back for nothing, so a read-ahead download at its full window waits instead
 * ({@link SpillBlob}), at most {@link READ_AHEAD_PARK_MS}.
 */
export class SpillGate {
  #starved = false;
  readonly #waiting = new Set<() => void>();

  get starved(): boolean {
    return this.#starved;
  }

  /** The tar writer starts (true) or stops (false) waiting for the head's bytes. */
  starve(on: boolean): void {
    this.#starved = on;
    if (!on) return;
    for (const wake of [...this.#waiting]) wake();
  }

  /** Calls `wake` the next time the tar writer starves; returns the cancel. */
  onStarve(wake: () => void): () => void {
    this.#waiting.add(wake);
    return () => this.#waiting.delete(wake);
  }
}

/** A piece of a blob held in memory, at byte offset `pos` of the blob. */
interface Held {
  readonly pos: number;
  readonly buf: Buffer;
}

/**
 * A blob downloading ahead of its turn (docs/registry.md "Pull flow" step 5), read once, in
 * order, by the tar writer. At most `window` bytes are held in memory: while the blob waits for
 * its turn, older bytes beyond the window go to a spill file (appended in batches), so
 * the download never waits on a paused socket; once the tar writer reads it (it is the head),
 * nothing more spills and each downloaded chunk waits until the tar writer has taken what is
 * held, as the head layer's own stream waits for cocoon. The bytes are, in blob order: the file's `[consumed, fileEnd)`, then
 * the batch being written (`transit`), then `mem`. Every byte is counted once by `onByte`
 * (the read-ahead budget) when the reader takes it.
 */
export class SpillBlob {
  readonly #window: number;
  readonly #spillFile: () => Promise<string>;
  readonly #mem: Held[] = [];
  #transit: Held[] = [];
  /** Bytes in `mem` and `transit`. */
  #memBytes = 0;
  /** Bytes pushed so far (the blob offset of the next pushed byte). */
  #produced = 0;
  /** Bytes handed to the reader so far. */
  #consumed = 0;
  /** Blob offset where the spill file starts, and where its written part ends. */
  #fileBase = 0;
  #fileEnd = 0;
  #file: { path: string; handle: FileHandle } | undefined;
  #opening: Promise<{ path: string; handle: FileHandle }> | undefined;
  #reading = false;
  #done = false;
  #closed = false;
  #error: unknown;
  /** The reader waits for bytes; the producer waits for room (only once the reader is on). */
  #wakeReader: (() => void) | undefined;
  #wakeProducer: (() => void) | undefined;
  /** Counts {@link #notifyReader} calls, so a wake-up during the reader's own await is not lost. */
  #readerSignals = 0;
  /** Bytes that went through the spill file (for tests and logs). */
  spilledBytes = 0;
  /** When bytes past the window may spill; none: always. */
  readonly #gate: SpillGate | undefined;
  /** It waited {@link READ_AHEAD_PARK_MS} at its window once: it spills freely from then on. */
  #parkedOut = false;

  /** `spillFile` names a new, not yet existing file for this blob's spill; with a `gate`, bytes
   * past the window spill only while the tar writer starves, or after the download has waited
   * {@link READ_AHEAD_PARK_MS} at its window. */
  constructor(opts: { window: number; spillFile: () => Promise<string>; gate?: SpillGate }) {
    this.#window = Math.max(1, opts.window);
    this.#spillFile = opts.spillFile;
    this.#gate = opts.gate;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Bytes held in memory now (never much more than the window plus one chunk). */
  get memoryBytes(): number {
    return this.#memBytes;
  }

  /** Takes the next downloaded chunk; resolves when the producer may go on. */
  async push(chunk: Buffer): Promise<void> {
    if (this.#closed) throw new Error('read-ahead closed');
    if (chunk.length === 0) return;
    this.#mem.push({ pos: this.#produced, buf: chunk });
    this.#produced += chunk.length;
    this.#memBytes += chunk.length;
    this.#notifyReader();
    for (;;) {
      if (this.#closed) return;
      if (this.#reading) {
        // The head: hand each chunk over and wait until the tar writer has taken everything
        // held, as the head layer's own stream does. (A full window here would only keep
        // buffers alive long enough to need old-space collections: measured, ~1.5 s of CPU
        // per GiB more.)
        if (this.#memBytes === 0) return;
        await new Promise<void>((resolve) => {
          this.#wakeProducer = resolve;
        });
        continue;
      }
      if (this.#memBytes <= this.#window) return;
      const gate = this.#gate;
      if (gate !== undefined && !gate.starved && !this.#parkedOut) {
        // The writer is busy: wait here (the socket pauses) until it starves, this blob's turn
        // comes, the pull ends, or the park runs out.
        let timer: NodeJS.Timeout | undefined;
        let cancel = () => {};
        await new Promise<void>((resolve) => {
          this.#wakeProducer = resolve;
          cancel = gate.onStarve(resolve);
          timer = setTimeout(() => {
            this.#parkedOut = true;
            resolve();
          }, READ_AHEAD_PARK_MS);
        });
        clearTimeout(timer);
        cancel();
        this.#wakeProducer = undefined;
        continue;
      }
      await this.#spill();
    }
  }

  /** The download ended (`error` set when it failed). */
  end(error?: unknown): void {
    this.#done = true;
    if (error !== undefined && this.#error === undefined) this.#error = error;
    this.#notifyReader();
  }

  /** Moves the oldest in-memory bytes (≥ 1 MiB, or all there are) to the end of the spill file. */
  async #spill(): Promise<void> {
    const batch: Held[] = [];
    let n = 0;
    while (this.#mem.length > 0 && (n < SPILL_IO_BYTES || this.#memBytes - n > this.#window)) {
      const held = this.#mem.shift()!;
      batch.push(held);
      n += held.buf.length;
    }
    if (n === 0) return;
    this.#transit = batch;
    // Batches are contiguous: only the reader takes bytes from memory, and once it reads nothing
    // spills any more. The file starts at the first spilled byte.
    if (this.#file === undefined && this.#opening === undefined) this.#fileBase = batch[0]!.pos;
    try {
      const file = await this.#openFile();
      let at = batch[0]!.pos - this.#fileBase;
      const bufs = batch.map((h) => h.buf);
      // writev may write less than asked: go on from where it stopped.
      for (let i = 0, skip = 0; i < bufs.length; ) {
        const part = skip > 0 ? [bufs[i]!.subarray(skip), ...bufs.slice(i + 1)] : bufs.slice(i);
        const { bytesWritten } = await file.handle.writev(part, at);
        at += bytesWritten;
        let left = bytesWritten;
        while (i < bufs.length && left >= bufs[i]!.length - skip) {
          left -= bufs[i]!.length - skip;
          i++;
          skip = 0;
        }
        skip += left;
      }
    } catch (error) {
      this.#transit = [];
      this.#memBytes -= n;
      throw new Error(`read-ahead spill: ${(error as Error).message}`, { cause: error });
    }
    this.#transit = [];
    this.#memBytes -= n;
    this.#fileEnd = batch[0]!.pos + n;
    this.spilledBytes += n;
    this.#notifyReader();
  }

  #openFile(): Promise<{ path: string; handle: FileHandle }> {
    if (this.#file) return Promise.resolve(this.#file);
    this.#opening ??= (async () => {
      const path = await this.#spillFile();
      const handle = await open(path, 'wx+', 0o600);
      this.#file = { path, handle };
      return this.#file;
    })();
    return this.#opening;
  }

  #notifyReader(): void {
    this.#readerSignals++;
    const wake = this.#wakeReader;
    this.#wakeReader = undefined;
    wake?.();
  }

  #notifyProducer(): void {
    const wake = this.#wakeProducer;
    this.#wakeProducer = undefined;
    wake?.();
  }

  /** The blob's bytes in order (iterated once); `onBytes` as each piece is handed over. */
  async *drain(onBytes: (n: number) => void): AsyncIterable<Buffer> {
    this.#reading = true;
    this.#notifyProducer();
    try {
      for (;;) {
        if (this.#closed) throw new Error('read-ahead closed');
        const seen = this.#readerSignals;
        const piece = await this.#next();
        if (piece === undefined) {
          if (this.#error !== undefined) throw this.#error;
          if (this.#done && this.#consumed === this.#produced) return;
          // Something arrived while #next looked (it awaits): look again rather than sleep.
          if (this.#readerSignals !== seen) continue;
          this.#gate?.starve(true);
          await new Promise<void>((resolve) => {
            this.#wakeReader = resolve;
          });
          this.#gate?.starve(false);
          continue;
        }
        this.#consumed += piece.length;
        onBytes(piece.length);
        yield piece;
      }
    } finally {
      await this.close();
    }
  }

  /** The bytes at `consumed`, if they are here yet. */
  async #next(): Promise<Buffer | undefined> {
    const at = this.#consumed;
    if (this.#file && at < this.#fileEnd) {
      const length = Math.min(SPILL_IO_BYTES, this.#fileEnd - at);
      const buf = Buffer.allocUnsafe(length);
      let got = 0;
      while (got < length) {
        const { bytesRead } = await this.#file.handle.read(buf, got, length - got, at - this.#fileBase + got);
        if (bytesRead === 0) throw new Error('read-ahead spill file ended early');
        got += bytesRead;
      }
      return buf;
    }
    // Being written to the file, but still in memory: read it from there.
    for (const held of this.#transit) {
      if (held.pos === at) return held.buf;
    }
    const head = this.#mem[0];
    if (head !== undefined && head.pos === at) {
      this.#mem.shift();
      this.#memBytes -= head.buf.length;
      this.#notifyProducer();
      return head.buf;
    }
    return undefined;
  }

  /** Drops everything: memory, the spill file (closed and removed). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#mem.length = 0;
    this.#notifyProducer();
    this.#notifyReader();
    const file = this.#file ?? (await this.#opening?.catch(() => undefined));
    if (!file) return;
    await file.handle.close().catch(() => {});
    await rm(file.path, { force: true }).catch(() => {});
  }
}

export interface ReadAheadOptions {
  /** Every blob of the snapshot, in the order the tar takes them. */
  readonly blobs: readonly TarPart[];
  readonly fetch: (part: TarPart) => Promise<Readable>;
  readonly budgetBytes: number;
  readonly concurrency: number;
  /** Bytes of one download held in memory before the rest spills to disk. */
  readonly windowBytes: number;
  /** A new spill file path (its directory created on first use). */
  readonly spillFile: () => Promise<string>;
  /** A read-ahead download failed: abort the pull now, not when its turn comes. */
  readonly onError: (error: unknown) => void;
  /** The pull's progress: counts the bytes downloaded. */
  readonly progress: { downloaded(n: number): void };
}

/**
 * Schedules blob downloads (docs/registry.md "Pull flow" step 5): the head layer streams; later
 * layers are read ahead while their full size fits in the free budget ({@link nextReadAhead}),
 * each into a {@link SpillBlob} (a small window in memory, the rest in a spill file). The budget
 * is reserved at start and released as the tar writer consumes the bytes.
 */
export class ReadAhead {
  readonly #o: ReadAheadOptions;
  readonly #sizes: number[];
  readonly #started = new Set<number>();
  readonly #buffers = new Map<number, SpillBlob>();
  readonly #producers = new Set<Promise<void>>();
  #head = -1;
  #inFlight = 0;
  #reserved = 0;
  /** Whether the tar writer waits for the head's bytes: read-ahead downloads spill only then. */
  readonly #gate = new SpillGate();

  constructor(o: ReadAheadOptions) {
    this.#o = o;
    this.#sizes = o.blobs.map((b) => b.layer.size);
  }

  /** The bytes of blob `i`, which becomes the head. */
  async *take(i: number): AsyncIterable<Buffer> {
    this.#head = i;
    const buffered = this.#buffers.get(i);
    if (buffered) {
      this.#buffers.delete(i);
      this.#schedule();
      yield* buffered.drain((n) => {
        this.#reserved -= n;
        this.#schedule();
      });
      return;
    }
    this.#started.add(i);
    this.#inFlight++;
    this.#schedule();
    let it: AsyncIterator<Buffer> | undefined;
    try {
      // The writer starves while the head connects, and whenever it asks for bytes the stream
      // does not hold yet.
      this.#gate.starve(true);
      const stream = await this.#o.fetch(this.#o.blobs[i]!);
      it = stream[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
      for (;;) {
        const starved = stream.readableLength === 0;
        this.#gate.starve(starved);
        const next = await it.next();
        if (starved) this.#gate.starve(false);
        if (next.done) break;
        this.#o.progress.downloaded(next.value.length);
        yield next.value;
      }
      it = undefined;
    } finally {
      this.#gate.starve(false);
      await it?.return?.();
      this.#inFlight--;
      this.#schedule();
    }
  }

  /** Stops scheduling, drops every read-ahead blob and waits for their downloads to end. */
  async dispose(): Promise<void> {
    this.#head = this.#sizes.length;
    const blobs = [...this.#buffers.values()];
    this.#buffers.clear();
    await Promise.all(blobs.map((b) => b.close()));
    await Promise.allSettled([...this.#producers]);
  }

  #schedule(): void {
    for (;;) {
      const next = nextReadAhead({
        head: this.#head,
        sizes: this.#sizes,
        started: this.#started,
        inFlight: this.#inFlight,
        concurrency: this.#o.concurrency,
        freeBudget: this.#o.budgetBytes - this.#reserved,
      });
      if (next === undefined) return;
      this.#start(next);
    }
  }

  #start(i: number): void {
    const size = this.#sizes[i]!;
    const blob = new SpillBlob({
      window: this.#o.windowBytes,
      spillFile: this.#o.spillFile,
      gate: this.#gate,
    });
    this.#started.add(i);
    this.#buffers.set(i, blob);
    this.#inFlight++;
    this.#reserved += size;
    const producing = (async () => {
      let stream: Readable | undefined;
      try {
        stream = await this.#o.fetch(this.#o.blobs[i]!);
        for await (const chunk of stream) {
          this.#o.progress.downloaded((chunk as Buffer).length);
          await blob.push(chunk as Buffer);
        }
        blob.end();
      } catch (error) {
        stream?.destroy();
        blob.end(error);
        // A blob closed under it (the pull is failing already) is not a new failure.
        if (!blob.closed) this.#o.onError(error);
      } finally {
        this.#inFlight--;
        this.#schedule();
      }
    })();
    this.#producers.add(producing);
    void producing.finally(() => this.#producers.delete(producing));
  }
}
