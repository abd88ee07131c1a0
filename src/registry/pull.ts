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
 * parallel (`SNAPSHOT_TRANSFER_CONCURRENCY`, read-ahead.ts), each keeping at most a small window (256 KiB) in
 * memory and spilling the rest to a temporary file until its turn; once it is the head, it
 * waits for cocoon instead. Memory is therefore bounded by the concurrency, not the snapshot or
 * the budget. Any error kills the import and removes whatever it left behind (`snapshot rm
 * <local>`); spill files are removed in every outcome. De-duplicated pulls are
 * snapshot-puller.ts.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Writable } from 'node:stream';
import type { Header, Pack } from 'tar-stream';
import { snapshotImportArgv } from '../cocoon/argv.ts';
import type { SnapshotRecord } from '../cocoon/records.ts';
import type { CocoonCli } from '../cocoon/runner.ts';
import { inspectSnapshot, removeSnapshot } from '../cocoon/snapshots.ts';
import { type Logger, silentLogger } from '../log.ts';
import { tarStream } from '../util/lazy-packages.ts';
import { MAX_CONFIG_BYTES, validateSnapshotManifest } from './artifact.ts';
import { ENVELOPE_MODE, parseSnapshotConfig, snapshotEnvelope } from './artifact-config.ts';
import type { RegistryClient } from './client.ts';
import { EntryBodyError, entryBody } from './entry-body.ts';
import { planTarEntries, type TarLayerEntry } from './import-plan.ts';
import { DEFAULT_READ_AHEAD_WINDOW_BYTES, ReadAhead } from './read-ahead.ts';
import { parseReference, type Reference } from './reference.ts';
import { spoolPrefix } from './spool-dirs.ts';
import { describeCause, MiB, rate } from './transfer.ts';

/** Re-exported for the provider modules that still import it from here (src/provider/cocoon:
 * bring-up, restore, sources); its home is src/cocoon/snapshots.ts. */

/** Default read-ahead budget (`SNAPSHOT_PULL_BUDGET_MIB`). */
export const DEFAULT_PULL_BUDGET_MIB = 2048;
/** Default parallel blob downloads (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
export const DEFAULT_TRANSFER_CONCURRENCY = 8;
/** Own cap of one pull (docs/contracts/pod-to-vm.md "Bring-up: clone" step 3). */
export const PULL_CAP_MS = 30 * 60 * 1000;

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
  await removeSnapshot(cli, localName, { signal: opts.signal }).catch((error: unknown) => {
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
  // A piece of a blob read whose bytes went where they go: its read buffer may be read into again.
  const recycle = (piece: Buffer) => registry.recycle(piece);
  const pack = tarStream().pack();
  // Its errors (the pack destroyed on failure) are the producer's and are reported from there.
  pack.on('error', () => {});
  const importing = cli
    .run(snapshotImportArgv(localName, config.value.description), {
      timeoutMs: opts.importTimeoutMs ?? PULL_CAP_MS,
      signal,
      stdin: (sink) => pumpTar(pack, sink, recycle, signal),
    })
    .catch((error: unknown) => {
      failWith(error);
      throw error;
    });
  // Read-ahead spill files live in one directory, made on first use and removed at the end.
  let spillDir: Promise<string> | undefined;
  let spillSeq = 0;
  const spillFile = async (): Promise<string> => {
    spillDir ??= mkdtemp(join(opts.spillDir ?? tmpdir(), spoolPrefix('pull')));
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
  const producing = writeImportTar(pack, envelope, entries.value, readAhead, progress, recycle, signal).catch(
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
    await removeSnapshot(cli, localName).catch((error: unknown) => {
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

// --- The tar --------------------------------------------------------------------------------

/** A tar entry header; tar-stream writes `pax` as PAX extended records. */
type EntryHeader = Partial<Header> & Pick<Header, 'name'> & { pax?: Record<string, string> };
/** The writable body of one tar entry (a streamx Writable). */
type EntrySink = ReturnType<Pack['entry']>;

/** Writes a chunk; waits until `w` can take more, or fails when it closes or the pull aborts. */
function writeChunk(w: EntrySink, chunk: Buffer, signal: AbortSignal): Promise<void> {
  if (w.write(chunk)) return Promise.resolve();
  return drained(w, signal, 'tar stream closed');
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

/**
 * The tar into cocoon's stdin, piece by piece; a piece the pipe has taken goes back to the
 * registry's read buffers (`recycle`, slab-pool.ts): the write callback is the one moment nothing
 * holds it any more (tar-stream hands body pieces on as they are).
 */
export async function pumpTar(
  pack: Pack,
  sink: Writable,
  recycle: (piece: Buffer) => void,
  signal: AbortSignal,
): Promise<void> {
  for await (const piece of pack as AsyncIterable<Buffer>) {
    const ok = sink.write(piece, (error) => {
      if (!error) recycle(piece);
    });
    if (!ok) await drained(sink, signal, 'the import closed its stdin');
  }
  sink.end();
}

/** A Node or a streamx writable, as far as waiting for room goes. */
interface Drainable {
  on(event: 'drain' | 'close', listener: () => void): unknown;
  off(event: 'drain' | 'close', listener: () => void): unknown;
}

/** Resolves on `drain`; fails with `closed` when the stream closes first, or when the pull aborts. */
function drained(w: Drainable, signal: AbortSignal, closed: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (error?: unknown) => {
      w.off('drain', onDrain);
      w.off('close', onClose);
      signal.removeEventListener('abort', onAbort);
      if (error === undefined) resolve();
      else reject(error);
    };
    const onDrain = () => done();
    const onClose = () => done(new Error(closed));
    const onAbort = () => done(signal.reason);
    w.on('drain', onDrain);
    w.on('close', onClose);
    signal.addEventListener('abort', onAbort, { once: true });
  });
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
  recycle: (chunk: Buffer) => void,
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
    const body = entryBody(entry, (k) => readAhead.take(base + k), recycle);
    await writeEntry(pack, header, body, signal, (n) => progress.wrote(n));
    first += entry.parts.length;
  }
  pack.finalize();
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
