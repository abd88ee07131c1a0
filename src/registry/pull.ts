/**
 * Snapshot pull (docs/registry.md "Pull flow"; docs/contracts/pod-to-vm.md "Bring-up: clone" step 3): a snapshot artifact streamed from
 * the registry into `cocoon snapshot import`.
 *
 * 1. GET the manifest (index resolved), classify, require a v1 or v2 snapshot; GET and validate
 *    the config and plan the tar (import-plan.ts) — all before anything is streamed.
 * 2. `snapshot rm <local>` (idempotency), then `snapshot import --name <local>
 *    [--description <d>]` with a tar on stdin: `snapshot.json` first, then one entry per file
 *    (v1: per layer in manifest order; v2: its chunks in `chunks` order, zstd-decompressed,
 *    entry-body.ts), each blob hashed while it streams.
 * 3. Close stdin, wait for exit 0, `snapshot inspect <local>`.
 *
 * The head blob streams straight from the registry into the tar (backpressure from cocoon);
 * later blobs that fit in the `SNAPSHOT_PULL_BUDGET_MIB` read-ahead budget download in
 * parallel (`SNAPSHOT_TRANSFER_CONCURRENCY`), each keeping at most a small window (256 KiB) in
 * memory and spilling the rest to a temporary file until its turn; once it is the head, it
 * waits for cocoon instead. Memory is therefore bounded by the concurrency, not the snapshot or
 * the budget. Any error kills the import and removes whatever it left behind (`snapshot rm
 * <local>`); spill files are removed in every outcome.
 */
import { type FileHandle, mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import type { Header, Pack } from 'tar-stream';
import { snapshotImportArgv, snapshotInspectArgv, snapshotRemoveArgv } from '../cocoon/argv.ts';
import { parseSnapshotRecord, type SnapshotRecord } from '../cocoon/records.ts';
import { type CocoonCli, CocoonCommandError } from '../cocoon/runner.ts';
import { type Logger, silentLogger } from '../log.ts';
import { delay, untilAborted } from '../util/deadline.ts';
import { tarStream } from '../util/lazy-packages.ts';
import { Singleflight } from '../util/singleflight.ts';
import { localSnapshotName, splitCloneImage } from '../vmspec/snapshot-name.ts';
import {
  ENVELOPE_MODE,
  MAX_CONFIG_BYTES,
  parseSnapshotConfig,
  snapshotEnvelope,
  validateSnapshotManifest,
} from './artifact.ts';
import type { RegistryClient } from './client.ts';
import { EntryBodyError, entryBody } from './entry-body.ts';
import { nextReadAhead, planTarEntries, type TarLayerEntry, type TarPart } from './import-plan.ts';
import { parseReference, type Reference } from './reference.ts';
import { describeCause, MiB, rate } from './transfer.ts';

/** Default read-ahead budget (`SNAPSHOT_PULL_BUDGET_MIB`). */
export const DEFAULT_PULL_BUDGET_MIB = 2048;
/** Default parallel blob downloads (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
export const DEFAULT_TRANSFER_CONCURRENCY = 8;
/** Own cap of one pull (docs/contracts/pod-to-vm.md "Bring-up: clone" step 3). */
export const PULL_CAP_MS = 30 * 60 * 1000;
/** Deadline of the short cocoon calls around the import (rm, inspect). */
const SHORT_CALL_MS = 60_000;
/** `snapshot rm` of a leased snapshot is retried this long, this often (docs/contracts/cocoon-cli.md "Error classification"). */
const LEASED_RETRY_MS = 30_000;
const LEASED_RETRY_EVERY_MS = 500;

/** A pull that failed; `absent` when the registry has no such manifest. */
export class SnapshotPullError extends Error {
  override readonly name = 'SnapshotPullError';
  readonly absent: boolean;
  /** The artifact cannot be read by this reader (its manifest, format version, config or layer
   * plan): a retry reads the same bytes, so it is permanent until the tag changes. */
  readonly undecodable: boolean;

  constructor(message: string, opts: { absent?: boolean; undecodable?: boolean; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.absent = opts.absent ?? false;
    this.undecodable = opts.undecodable ?? false;
  }
}

export interface PullSnapshotOptions {
  readonly registry: RegistryClient;
  readonly cli: CocoonCli;
  /** Registry-relative repository (resolved under the `OCI_REGISTRY` path). */
  readonly repo: string;
  /** Tag, or a `sha256:` digest. */
  readonly tag: string;
  /** Local cocoon snapshot name to import into. */
  readonly localName: string;
  readonly signal?: AbortSignal;
  readonly log?: Logger;
  /** Read-ahead budget in MiB (default 2048): bytes downloaded ahead of the tar, memory and disk. */
  readonly budgetMiB?: number;
  /** Parallel blob downloads (default 8). */
  readonly concurrency?: number;
  /** Bytes of one read-ahead download held in memory before the rest spills (default 256 KiB). */
  readonly readAheadWindowBytes?: number;
  /** Parent of the read-ahead spill directory (default the OS temp dir). */
  readonly spillDir?: string;
  /** Deadline of the `snapshot import` child (default 30 min). */
  readonly importTimeoutMs?: number;
  /** Progress log cadence (default 5 s). */
  readonly progressIntervalMs?: number;
}

/** Pulls one snapshot into `localName`; resolves with its `snapshot inspect` record. */
export async function pullSnapshot(opts: PullSnapshotOptions): Promise<SnapshotRecord> {
  const { registry, cli, localName } = opts;
  let name: string;
  let ref: Reference;
  try {
    name = registry.repository(opts.repo);
    ref = parseReference(opts.tag);
  } catch (error) {
    throw new SnapshotPullError(
      `pull snapshot ${opts.repo}:${opts.tag} into ${localName}: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
  const display = registry.display(name, ref);
  const log = (opts.log ?? silentLogger).child({ snapshot: localName, ref: display });
  const fail = (message: string, extra: { absent?: boolean; undecodable?: boolean; cause?: unknown } = {}) =>
    new SnapshotPullError(`pull snapshot ${display} into ${localName}: ${message}`, extra);
  const started = performance.now();

  // 1. Manifest and config, validated before anything streams (docs/registry.md "Reader validation").
  const fetched = await registry.getManifest(name, ref, opts.signal).catch((error: unknown) => {
    throw fail((error as Error).message, { cause: error });
  });
  if (fetched === 'absent') throw fail('not found in the registry', { absent: true });
  const manifest = validateSnapshotManifest(fetched.document);
  if (!manifest.ok) throw fail(manifest.error, { undecodable: true });
  const configBytes = await registry
    .getBlobBytes(name, manifest.value.config, MAX_CONFIG_BYTES, opts.signal)
    .catch((error: unknown) => {
      throw fail(`config: ${(error as Error).message}`, { cause: error });
    });
  const config = parseSnapshotConfig(configBytes, manifest.value);
  if (!config.ok) throw fail(config.error, { undecodable: true });
  const entries = planTarEntries(manifest.value, config.value);
  if (!entries.ok) throw fail(entries.error, { undecodable: true });
  const envelope = Buffer.from(JSON.stringify(snapshotEnvelope(config.value, localName)));
  const total = entries.value.reduce((sum, e) => sum + e.size, 0);
  const blobs = entries.value.flatMap((e) => e.parts);
  log.info(
    {
      digest: fetched.digest,
      snapshotId: config.value.snapshotId,
      format: `v${manifest.value.version}`,
      files: entries.value.length,
      blobs: blobs.length,
      totalBytes: total,
    },
    'snapshot pull: starting import',
  );

  // 2. Import. From here on any failure removes the partial snapshot.
  await removeSnapshot(cli, localName, opts.signal).catch((error: unknown) => {
    throw fail(`snapshot rm before import: ${(error as Error).message}`, { cause: error });
  });
  const abort = new AbortController();
  const signal = opts.signal ? AbortSignal.any([abort.signal, opts.signal]) : abort.signal;
  let firstError: unknown;
  const failWith = (error: unknown) => {
    if (firstError === undefined) firstError = error;
    abort.abort(error);
  };
  const progress = new Progress(total);
  const timer = setInterval(() => progress.log(log), opts.progressIntervalMs ?? 5000);
  timer.unref();
  const pack = tarStream().pack();
  // cocoon's stdin: the tar as a Node stream. Its errors (the pack destroyed on failure) are
  // the producer's and are reported from there.
  const stdin = Readable.from(pack, { objectMode: false });
  stdin.on('error', () => {});
  pack.on('error', () => {});
  const importing = cli
    .run(snapshotImportArgv(localName, config.value.description), {
      timeoutMs: opts.importTimeoutMs ?? PULL_CAP_MS,
      signal,
      stdin,
    })
    .catch((error: unknown) => {
      failWith(error);
      throw error;
    });
  // Read-ahead spill files live in one directory, made on first use and removed at the end.
  let spillDir: Promise<string> | undefined;
  let spillSeq = 0;
  const spillFile = async (): Promise<string> => {
    spillDir ??= mkdtemp(join(opts.spillDir ?? tmpdir(), 'vk-pull-'));
    return join(await spillDir, String(spillSeq++));
  };
  const readAhead = new ReadAhead({
    blobs,
    fetch: (part) => registry.getBlob(name, part.layer, signal),
    budgetBytes: Math.max(0, opts.budgetMiB ?? DEFAULT_PULL_BUDGET_MIB) * MiB,
    concurrency: Math.max(1, opts.concurrency ?? DEFAULT_TRANSFER_CONCURRENCY),
    windowBytes: Math.max(1, opts.readAheadWindowBytes ?? DEFAULT_READ_AHEAD_WINDOW_BYTES),
    spillFile,
    onError: failWith,
    progress,
  });
  const producing = writeImportTar(pack, envelope, entries.value, readAhead, progress, signal).catch(
    (error: unknown) => {
      failWith(error);
      pack.destroy(error as Error);
      throw error;
    },
  );
  const results = await Promise.allSettled([producing, importing]);
  clearInterval(timer);
  const failed = results.some((r) => r.status === 'rejected');
  if (failed) abort.abort(firstError ?? new Error('snapshot pull failed'));
  // Every read-ahead download has ended (or is cut now) and its spill file is gone.
  await readAhead.dispose();
  const madeDir = await spillDir?.catch(() => undefined);
  if (madeDir !== undefined) await rm(madeDir, { recursive: true, force: true }).catch(() => {});
  if (failed) {
    const cause =
      firstError ?? (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason;
    log.warn(
      { err: (cause as Error).message, ...progress.fields() },
      'snapshot pull failed; removing the partial snapshot',
    );
    // The child has exited (run settles on close); remove whatever it left. Not bound to the
    // pull's signal: cleanup must also run when the pull was aborted or hit its cap.
    await removeSnapshot(cli, localName, undefined).catch((error: unknown) => {
      log.warn({ err: (error as Error).message }, 'snapshot pull: cleanup failed');
    });
    // Blobs that verify but do not decode into the planned file are the artifact's fault: no retry mends them.
    throw fail(describeCause(cause, opts.signal), { cause, undecodable: cause instanceof EntryBodyError });
  }

  // 3. The imported record.
  const record = await inspectSnapshot(cli, localName, opts.signal).catch((error: unknown) => {
    throw fail(`snapshot inspect after import: ${(error as Error).message}`, { cause: error });
  });
  if (!record) throw fail('snapshot inspect after import: not found');
  if (record.id !== config.value.snapshotId) {
    log.warn(
      { id: record.id, snapshotId: config.value.snapshotId },
      'imported snapshot id differs from the artifact snapshotId',
    );
  }
  const seconds = (performance.now() - started) / 1000;
  log.info(
    {
      id: record.id,
      totalBytes: total,
      seconds: Math.round(seconds * 10) / 10,
      mibPerSecond: rate(total, seconds),
    },
    'snapshot pull: done',
  );
  return record;
}

// --- cocoon calls -------------------------------------------------------------------------

/** `snapshot rm <name>`: not found is success; a lease is retried ≤ 30 s, 500 ms apart. */
async function removeSnapshot(cli: CocoonCli, name: string, signal: AbortSignal | undefined): Promise<void> {
  const deadline = Date.now() + LEASED_RETRY_MS;
  for (;;) {
    try {
      await cli.run(snapshotRemoveArgv(name), { timeoutMs: SHORT_CALL_MS, signal });
      return;
    } catch (error) {
      if (!(error instanceof CocoonCommandError)) throw error;
      if (error.errorClass === 'snapshot_not_found') return;
      if (error.errorClass !== 'snapshot_leased' || Date.now() >= deadline) throw error;
    }
    await delay(LEASED_RETRY_EVERY_MS);
    signal?.throwIfAborted();
  }
}

/** `snapshot inspect <name>`: the record, or `undefined` when cocoon says it does not exist. */
export async function inspectSnapshot(
  cli: CocoonCli,
  name: string,
  signal: AbortSignal | undefined,
): Promise<SnapshotRecord | undefined> {
  let stdout: string;
  try {
    ({ stdout } = await cli.run(snapshotInspectArgv(name), { timeoutMs: SHORT_CALL_MS, signal }));
  } catch (error) {
    if (error instanceof CocoonCommandError && error.errorClass === 'snapshot_not_found') return undefined;
    throw error;
  }
  const record = parseSnapshotRecord(stdout);
  if (!record.ok) throw new Error(record.error);
  return record.value;
}

// --- The tar --------------------------------------------------------------------------------

/** A tar entry header; tar-stream writes `pax` as PAX extended records. */
type EntryHeader = Partial<Header> & Pick<Header, 'name'> & { pax?: Record<string, string> };
/** The writable body of one tar entry (a streamx Writable). */
type EntrySink = ReturnType<Pack['entry']>;

/** Writes a chunk; waits until `w` can take more, or fails when it closes or the pull aborts. */
function writeChunk(w: EntrySink, chunk: Buffer, signal: AbortSignal): Promise<void> {
  if (w.write(chunk)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = (error?: unknown) => {
      w.off('drain', onDrain);
      w.off('close', onClose);
      signal.removeEventListener('abort', onAbort);
      if (error === undefined) resolve();
      else reject(error);
    };
    const onDrain = () => done();
    const onClose = () => done(new Error('tar stream closed'));
    const onAbort = () => done(signal.reason);
    w.on('drain', onDrain);
    w.on('close', onClose);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

async function writeEntry(
  pack: Pack,
  header: EntryHeader,
  body: AsyncIterable<Buffer>,
  signal: AbortSignal,
  onBytes: (n: number) => void,
): Promise<void> {
  let sink!: EntrySink;
  const finished = new Promise<void>((resolve, reject) => {
    sink = pack.entry(header, (error) => (error ? reject(error) : resolve()));
  });
  finished.catch(() => {}); // observed below; avoid an unhandled rejection while writing
  sink.on('error', () => {}); // a destroyed entry reports through the callback above
  for await (const chunk of body) {
    signal.throwIfAborted();
    await writeChunk(sink, chunk, signal);
    onBytes(chunk.length);
  }
  sink.end(undefined);
  await finished;
}

async function* once(buffer: Buffer): AsyncIterable<Buffer> {
  yield buffer;
}

/** snapshot.json, then every file in plan order; finalizes the tar. */
async function writeImportTar(
  pack: Pack,
  envelope: Buffer,
  entries: readonly TarLayerEntry[],
  readAhead: ReadAhead,
  progress: Progress,
  signal: AbortSignal,
): Promise<void> {
  const mtime = new Date();
  await writeEntry(
    pack,
    { name: 'snapshot.json', mode: ENVELOPE_MODE, size: envelope.length, mtime },
    once(envelope),
    signal,
    () => {},
  );
  let first = 0; // the entry's first blob in the read-ahead's order
  for (const entry of entries) {
    signal.throwIfAborted();
    const header: EntryHeader = { name: entry.name, mode: entry.mode, size: entry.size, mtime, type: 'file' };
    if (entry.pax) header.pax = { ...entry.pax };
    progress.current = entry.name;
    const base = first;
    const body = entryBody(entry, (k) => readAhead.take(base + k));
    await writeEntry(pack, header, body, signal, (n) => progress.wrote(n));
    first += entry.parts.length;
  }
  pack.finalize();
}

// --- Read-ahead ---------------------------------------------------------------------------

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

  /** `spillFile` names a new, not yet existing file for this blob's spill. */
  constructor(opts: { window: number; spillFile: () => Promise<string> }) {
    this.#window = Math.max(1, opts.window);
    this.#spillFile = opts.spillFile;
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
          await new Promise<void>((resolve) => {
            this.#wakeReader = resolve;
          });
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

interface ReadAheadOptions {
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
  readonly progress: Progress;
}

/**
 * Schedules blob downloads (docs/registry.md "Pull flow" step 5): the head layer streams; later
 * layers are read ahead while their full size fits in the free budget ({@link nextReadAhead}),
 * each into a {@link SpillBlob} (a small window in memory, the rest in a spill file). The budget
 * is reserved at start and released as the tar writer consumes the bytes.
 */
class ReadAhead {
  readonly #o: ReadAheadOptions;
  readonly #sizes: number[];
  readonly #started = new Set<number>();
  readonly #buffers = new Map<number, SpillBlob>();
  readonly #producers = new Set<Promise<void>>();
  #head = -1;
  #inFlight = 0;
  #reserved = 0;

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
    try {
      const stream = await this.#o.fetch(this.#o.blobs[i]!);
      for await (const chunk of stream) {
        this.#o.progress.downloaded(chunk.length);
        yield chunk as Buffer;
      }
    } finally {
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
    const blob = new SpillBlob({ window: this.#o.windowBytes, spillFile: this.#o.spillFile });
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

// --- Progress -----------------------------------------------------------------------------

class Progress {
  readonly #total: number;
  readonly #started = performance.now();
  #written = 0;
  #downloaded = 0;
  current = 'snapshot.json';

  constructor(total: number) {
    this.#total = total;
  }

  wrote(n: number): void {
    this.#written += n;
  }

  downloaded(n: number): void {
    this.#downloaded += n;
  }

  fields(): Record<string, unknown> {
    const seconds = (performance.now() - this.#started) / 1000;
    return {
      bytes: this.#written,
      totalBytes: this.#total,
      percent: this.#total > 0 ? Math.floor((this.#written / this.#total) * 1000) / 10 : 100,
      downloadedBytes: this.#downloaded,
      file: this.current,
      mibPerSecond: rate(this.#written, seconds),
    };
  }

  log(log: Logger): void {
    log.info(this.fields(), 'snapshot pull: progress');
  }
}

// --- De-duplicated pulls --------------------------------------------------------------------

export interface SnapshotPullerOptions {
  /** `undefined` without `OCI_REGISTRY`: a missing snapshot is then an error. */
  readonly registry: RegistryClient | undefined;
  readonly cli: CocoonCli;
  readonly log?: Logger;
  /** `SNAPSHOT_PULL_BUDGET_MIB`. */
  readonly budgetMiB?: number;
  /** `SNAPSHOT_TRANSFER_CONCURRENCY`. */
  readonly concurrency?: number;
  /** Cap of one pull (default 30 min). */
  readonly capMs?: number;
  /** Provider lifetime: shutdown aborts pulls in flight. */
  readonly lifetime?: AbortSignal;
  readonly progressIntervalMs?: number;
  /** Metrics hook: `cocoon_vk_snapshot_pull_total{result}` and `..._duration_seconds`. */
  readonly onPullDone?: (result: 'ok' | 'failed', seconds: number) => void;
}

/**
 * Ensures clone-source snapshots are present (docs/contracts/pod-to-vm.md "Bring-up: clone" step 3): inspect the local
 * name; when missing, pull `<OCI_REGISTRY>/<repo>:<tag>` into it. Pulls are de-duplicated per
 * local name — callers arriving while one runs share it, and the pull itself re-checks the
 * local name first. A pull is not bound to any caller's signal (the caller's signal only stops
 * that caller's wait); it has its own 30-minute cap and ends at provider shutdown.
 */
export class SnapshotPuller {
  readonly #o: SnapshotPullerOptions;
  readonly #log: Logger;
  readonly #flight = new Singleflight<SnapshotRecord>();

  constructor(opts: SnapshotPullerOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ module: 'snapshot-pull' });
  }

  /** The local snapshot of a clone image `repo[:tag]`, pulled first if missing. */
  async ensure(image: string, opts: { signal?: AbortSignal; log?: Logger } = {}): Promise<SnapshotRecord> {
    const local = localSnapshotName(image);
    const existing = await inspectSnapshot(this.#o.cli, local, opts.signal);
    if (existing) return existing;
    const registry = this.#o.registry;
    if (!registry) throw new Error(`snapshot ${local} not found locally and no registry configured`);
    const { repo, tag } = splitCloneImage(image);
    const pulling = this.#flight.do(local, async () => {
      const again = await inspectSnapshot(this.#o.cli, local, this.#o.lifetime);
      if (again) return again;
      // A whole pull holds one transfer slot (VK_TRANSFER_SLOTS); its cap counts from the grant.
      return await this.#o.cli.transfer(
        () => this.#pull(registry, repo, tag, local, opts.log ?? this.#log),
        this.#o.lifetime,
      );
    });
    return await untilAborted(pulling, opts.signal);
  }

  async #pull(
    registry: RegistryClient,
    repo: string,
    tag: string,
    local: string,
    log: Logger,
  ): Promise<SnapshotRecord> {
    const capMs = this.#o.capMs ?? PULL_CAP_MS;
    const cap = AbortSignal.timeout(capMs);
    const signal = this.#o.lifetime ? AbortSignal.any([cap, this.#o.lifetime]) : cap;
    const started = performance.now();
    try {
      const record = await pullSnapshot({
        registry,
        cli: this.#o.cli,
        repo,
        tag,
        localName: local,
        signal,
        log,
        budgetMiB: this.#o.budgetMiB,
        concurrency: this.#o.concurrency,
        importTimeoutMs: capMs,
        progressIntervalMs: this.#o.progressIntervalMs,
      });
      this.#o.onPullDone?.('ok', (performance.now() - started) / 1000);
      return record;
    } catch (error) {
      this.#o.onPullDone?.('failed', (performance.now() - started) / 1000);
      if (cap.aborted && !this.#o.lifetime?.aborted) {
        const limit = capMs % 60_000 === 0 ? `${capMs / 60_000} min` : `${capMs} ms`;
        throw new SnapshotPullError(
          `snapshot pull of ${repo}:${tag} into ${local} exceeded its ${limit} cap`,
          {
            cause: error,
          },
        );
      }
      throw error;
    }
  }
}
