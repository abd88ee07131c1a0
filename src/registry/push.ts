/**
 * Snapshot push (docs/registry.md "Push flow"), tag delete (docs/registry.md "Tag delete") and
 * the identity read (docs/registry.md "Identity read").
 *
 * 1. `cocoon snapshot export <name> -o -`; the tar is read as it streams.
 * 2. `snapshot.json` ⇒ the envelope (checked at once). Then every other regular file: under the
 *    v2 format, one that is compressed or cut goes through v2-write.ts (each blob spooled and
 *    handed to the uploader as it is done); any other, by size:
 *    - larger than `streamMinMiB` (64) and not seen by this process in this repository before
 *      ({@link knownFiles}): uploaded as it is read — no spool file, no `HEAD` first — in one
 *      PATCH whose body is the tar entry, hashed on the way, the export waiting for the upload;
 *    - otherwise spooled to a temporary file while it is hashed (the digest is needed first),
 *      then — in the background, at most `concurrency` at a time — `HEAD`ed and uploaded only
 *      when missing; its spool file is removed as soon as it is up.
 * 3. The tar ends and the export exits 0; any failure (export, tar, upload) aborts here,
 *    without a manifest.
 * 4. The config blob (if missing), then the manifest `PUT` — last, so "the tag exists" means
 *    "the snapshot is complete".
 * 5. Hibernate only: the same manifest is put again with `cocoonstack.snapshot.from-node`.
 *
 * Memory stays bounded whatever the snapshot size: the tar is consumed with backpressure, a
 * streamed file holds at most a part's buffer (1 MiB) and the socket's, a spooled one goes to
 * disk and is uploaded from the file by range. The spool directory is removed in every outcome,
 * abort included.
 */
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { snapshotExportArgv } from '../cocoon/argv.ts';
import { formatJsonVerbError } from '../cocoon/errors.ts';
import { type CocoonCli, killGroup } from '../cocoon/runner.ts';
import { type Logger, silentLogger } from '../log.ts';
import { tarStream } from '../util/lazy-packages.ts';
import {
  layerMediaType,
  MAX_CONFIG_BYTES,
  MEDIA_TYPE,
  parseSnapshotConfig,
  type SnapshotConfig,
  type SnapshotFileInfo,
  validateSnapshotManifest,
} from './artifact.ts';
import {
  ANNOTATION,
  buildSnapshotManifest,
  checkCallerAnnotations,
  type ExportEnvelope,
  exportEntryTitle,
  exportedFileInfo,
  MAX_ENVELOPE_BYTES,
  parseExportEnvelope,
  snapshotConfigFromEnvelope,
  type WrittenLayer,
} from './artifact-write.ts';
import { DEFAULT_CHUNK_BYTES, type RegistryClient, RegistryError, type StreamedBlob } from './client.ts';
import { parseReference, type Reference } from './reference.ts';
import { describeCause, Hashing, MiB, rate } from './transfer.ts';
import { fileLayout, isV2, SpoolBudget, type V2Format, writeV2File } from './v2-write.ts';

/** Default parallel layer uploads (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
export const DEFAULT_PUSH_CONCURRENCY = 8;
/** Files larger than this are streamed to the registry as they are exported (`streamMinMiB`). */
export const DEFAULT_STREAM_MIN_MIB = 64;
/** Files remembered as present in a repository (see {@link knownFiles}). */
const KNOWN_FILES_MAX = 4096;
/** Tail of the export's stderr kept for the error message. */
const STDERR_TAIL = 8 * 1024;
/** How long a failed tar stream waits for the export to exit and say why. */
const EXIT_GRACE_MS = 2000;
/** How long the export may take to exit once its tar has ended. */
const EXIT_AFTER_TAR_MS = 60_000;

/** The export's tar is not what a snapshot export must be (our verdict, not a stream failure). */
class ExportFormatError extends Error {}

export type PushPhase = 'export' | 'upload' | 'config' | 'manifest';

/** A push that failed; `phase` says where (no manifest was written unless it is `manifest`'s re-put). */
export class SnapshotPushError extends Error {
  override readonly name = 'SnapshotPushError';
  readonly phase: PushPhase;

  constructor(phase: PushPhase, message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.phase = phase;
  }
}

export interface PushSnapshotOptions {
  readonly registry: RegistryClient;
  readonly cli: CocoonCli;
  /** Local cocoon snapshot to export. */
  readonly localName: string;
  /** Registry-relative repository (the VM name), resolved under the `OCI_REGISTRY` path. */
  readonly repo: string;
  /** `hibernate` or `latest`. */
  readonly tag: string;
  /** ⇒ `cocoonstack.snapshot.baseimage` (`''` omits it). */
  readonly baseImage: string;
  /** Hibernate: re-put the manifest with `cocoonstack.snapshot.from-node` (step 5). */
  readonly fromNode?: string;
  /** Caller annotations, merged last; keys starting with `cocoonstack.` are refused. */
  readonly annotations?: Readonly<Record<string, string>>;
  /** Parent of the spool directory (default the OS temp dir). */
  readonly spoolDir?: string;
  /** Parallel layer uploads (default 8). */
  readonly concurrency?: number;
  /** PATCH chunk in MiB (default 64). */
  readonly chunkMiB?: number;
  /**
   * Files larger than this (MiB, default 64) are uploaded as they are exported, with no spool
   * and no `HEAD` first, unless this process has seen the same file in the repository before
   * (then: spool, `HEAD`, upload when missing). See docs/registry.md "Push flow".
   */
  readonly streamMinMiB?: number;
  /** The v2 format (`SNAPSHOT_ZSTD_LEVEL`, `SNAPSHOT_CHUNK_SIZE_MIB`); absent or both 0: v1. */
  readonly v2?: V2Format;
  /** v2: spooled blobs not yet uploaded, at most (MiB, `SNAPSHOT_MEMORY_BUDGET_MIB`, default 9216). */
  readonly spoolBudgetMiB?: number;
  readonly signal?: AbortSignal;
  readonly log?: Logger;
  /** Progress log cadence (default 5 s). */
  readonly progressIntervalMs?: number;
}

export interface PushResult {
  /** Digest of the manifest now under the tag (the from-node re-put, when there was one). */
  digest: string;
  snapshotId: string;
  /** Layer bytes plus the config blob. */
  bytes: number;
  /** Bytes actually uploaded (blobs the registry lacked). */
  uploadedBytes: number;
  seconds: number;
}

/** One blob, spooled and hashed (v1: one per file). */
interface SpooledBlob extends WrittenLayer {
  readonly file: string;
}

/** One layer of the manifest, with its file's config entry. */
interface SpooledLayer extends SpooledBlob {
  readonly info: SnapshotFileInfo;
}

/** Default `SNAPSHOT_MEMORY_BUDGET_MIB`. */
export const DEFAULT_SPOOL_BUDGET_MIB = 9216;

/** Pushes the local snapshot `localName` to `<repo>:<tag>`. */
export async function pushSnapshot(opts: PushSnapshotOptions): Promise<PushResult> {
  const { registry, cli, localName, repo, tag } = opts;
  const started = performance.now();
  let name: string;
  let ref: Reference;
  try {
    name = registry.repository(repo);
    ref = parseReference(tag);
    if (ref.kind !== 'tag') throw new Error(`a push needs a tag, not the digest ${tag}`);
  } catch (error) {
    throw new SnapshotPushError('manifest', `push ${repo}:${tag}: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const display = registry.display(name, ref);
  const fail = (phase: PushPhase, message: string, cause?: unknown) =>
    new SnapshotPushError(phase, `push ${display}: ${message}`, { cause });
  const annotations = checkCallerAnnotations(opts.annotations);
  if (!annotations.ok) throw fail('manifest', annotations.error);
  const log = (opts.log ?? silentLogger).child({ snapshot: localName, ref: display });

  const abort = new AbortController();
  const signal = opts.signal ? AbortSignal.any([abort.signal, opts.signal]) : abort.signal;
  let first: { phase: PushPhase; error: unknown } | undefined;
  const failWith = (phase: PushPhase, error: unknown) => {
    if (first === undefined) first = { phase, error };
    abort.abort(error);
  };
  const progress = new PushProgress();
  const timer = setInterval(
    () => log.info(progress.fields(), 'snapshot push: progress'),
    opts.progressIntervalMs ?? 5000,
  );
  timer.unref();
  const spool = await mkdtemp(join(opts.spoolDir ?? tmpdir(), 'vk-push-')).catch((error: unknown) => {
    clearInterval(timer);
    throw fail('export', `spool directory: ${(error as Error).message}`, error);
  });
  log.info({ spool }, 'snapshot push: exporting');
  try {
    // 1–3. Export, spool, upload the layers.
    const uploader = new LayerUploader({
      registry,
      name,
      concurrency: Math.max(1, Math.floor(opts.concurrency ?? DEFAULT_PUSH_CONCURRENCY)),
      chunkBytes: opts.chunkMiB !== undefined ? Math.max(1, opts.chunkMiB) * MiB : DEFAULT_CHUNK_BYTES,
      signal,
      progress,
      onError: (error) => failWith('upload', error),
    });
    let exported: { envelope: ExportEnvelope; layers: SpooledLayer[] } | undefined;
    try {
      exported = await exportLayers({
        cli,
        localName,
        spool,
        signal,
        uploader,
        progress,
        log,
        streamMinBytes: Math.max(0, opts.streamMinMiB ?? DEFAULT_STREAM_MIN_MIB) * MiB,
        v2: isV2(opts.v2)
          ? {
              format: opts.v2,
              budget: new SpoolBudget(Math.max(1, opts.spoolBudgetMiB ?? DEFAULT_SPOOL_BUDGET_MIB) * MiB),
            }
          : undefined,
        fileKey: (snapshotId, title, size) =>
          `${registry.base.host}/${name}\n${snapshotId}\n${title}\n${size}`,
      });
    } catch (error) {
      failWith('export', error);
    }
    await uploader.settled();
    if (first !== undefined || exported === undefined) {
      throw fail(first?.phase ?? 'export', describeCause(first?.error, opts.signal), first?.error);
    }
    const { envelope, layers } = exported;

    // 4. Config blob, then the manifest.
    const files: Record<string, SnapshotFileInfo> = {};
    for (const l of layers) files[l.title] = l.info;
    const version: 1 | 2 = isV2(opts.v2) ? 2 : 1;
    const config = snapshotConfigFromEnvelope(envelope, files, version);
    if (!config.ok) throw fail('export', config.error);
    const configDigest = `sha256:${createHash('sha256').update(config.value).digest('hex')}`;
    let uploadedBytes = progress.uploadedBytes;
    try {
      if (!(await registry.headBlob(name, configDigest, signal))) {
        await registry.uploadBlob(
          name,
          { digest: configDigest, size: config.value.length, bytes: config.value },
          { signal },
        );
        uploadedBytes += config.value.length;
      }
    } catch (error) {
      throw fail('config', `config blob ${configDigest}: ${describeCause(error, opts.signal)}`, error);
    }
    const created = new Date();
    const manifestInput = {
      config: { digest: configDigest, size: config.value.length },
      layers: layers.map(({ title, mediaType, digest, size, annotations }) => ({
        title,
        mediaType,
        digest,
        size,
        annotations,
      })),
      created,
      version,
      baseImage: opts.baseImage,
      annotations: annotations.value,
    };
    const putManifest = async (bytes: Buffer, what: string): Promise<string> => {
      try {
        return await registry.putManifest(name, ref.value, bytes, MEDIA_TYPE.ociManifest, signal);
      } catch (error) {
        if (error instanceof RegistryError && error.status !== undefined) {
          const code = error.code ? ` ${error.code}` : '';
          throw fail('manifest', `${what} refused: ${error.status}${code} (${error.message})`, error);
        }
        throw fail('manifest', `${what} failed: ${describeCause(error, opts.signal)}`, error);
      }
    };
    let digest = await putManifest(buildSnapshotManifest(manifestInput), 'manifest PUT');
    log.info({ digest, snapshotId: envelope.id }, 'snapshot push: manifest written');

    // 5. Hibernate: the same manifest again, stamped with the node that pushed it.
    if (opts.fromNode !== undefined && opts.fromNode !== '') {
      digest = await putManifest(
        buildSnapshotManifest({ ...manifestInput, fromNode: opts.fromNode }),
        `manifest re-put with ${ANNOTATION.fromNode}`,
      );
    }
    const seconds = (performance.now() - started) / 1000;
    const bytes = layers.reduce((sum, l) => sum + l.size, 0) + config.value.length;
    log.info(
      {
        digest,
        snapshotId: envelope.id,
        layers: layers.length,
        bytes,
        uploadedBytes,
        seconds: Math.round(seconds * 10) / 10,
        mibPerSecond: rate(bytes, seconds),
      },
      'snapshot push: done',
    );
    return { digest, snapshotId: envelope.id, bytes, uploadedBytes, seconds };
  } catch (error) {
    log.warn({ err: (error as Error).message, ...progress.fields() }, 'snapshot push failed');
    throw error;
  } finally {
    clearInterval(timer);
    abort.abort(new Error('push finished'));
    await rm(spool, { recursive: true, force: true });
  }
}

/**
 * Deletes `<repo>:<tag>` (rollback of a failed hibernate, docs/registry.md "Tag delete"):
 * `'deleted'`, or `'absent'` when there was nothing to delete. Any other outcome throws
 * {@link RegistryError}.
 */
export async function deleteSnapshotTag(
  registry: RegistryClient,
  repo: string,
  tag: string,
  signal?: AbortSignal,
): Promise<'deleted' | 'absent'> {
  const name = registry.repository(repo);
  const ref = parseReference(tag);
  return await registry.deleteManifest(name, ref, signal);
}

/** What identifies a pushed snapshot (docs/registry.md "Identity read"). */
export interface SnapshotIdentity {
  /** Digest of the manifest under the tag. */
  digest: string;
  /** The config's `snapshotId`. */
  snapshotId: string;
  /** `cocoonstack.snapshot.baseimage` (`''` when absent). */
  baseImage: string;
  /** `cocoonstack.snapshot.from-node` (`''` when absent). */
  fromNode: string;
  /** `vm.cocoonstack.io/namespace` (`''` when absent: an older writer, the Go daemon). */
  namespace: string;
  /** `vm.cocoonstack.io/controller-uid` (`''` when absent). */
  controllerUid: string;
  /** `vm.cocoonstack.io/peer-address` and `-cert-sha256` (`''` when absent: a Go pusher). */
  peerAddress: string;
  peerPin: string;
  /** The validated config blob: what a peer restore checks the peer against and stages as
   * `snapshot.json` (docs/peer-restore.md). */
  config: SnapshotConfig;
}

/**
 * Reads the manifest (GET, index resolved) and config of `repo:tag`: `'absent'` on 404; throws
 * {@link RegistryError} on any other failure — unreachable registry, 5xx, a document that is
 * not a valid v1 snapshot — so a caller never mistakes "cannot tell" for "not there".
 */
export async function readSnapshotIdentity(
  registry: RegistryClient,
  repo: string,
  tag: string,
  signal?: AbortSignal,
): Promise<SnapshotIdentity | 'absent'> {
  const name = registry.repository(repo);
  const ref = parseReference(tag);
  const display = registry.display(name, ref);
  const fetched = await registry.getManifest(name, ref, signal);
  if (fetched === 'absent') return 'absent';
  const manifest = validateSnapshotManifest(fetched.document);
  if (!manifest.ok) throw new RegistryError('invalid', `${display}: ${manifest.error}`);
  const configBytes = await registry.getBlobBytes(name, manifest.value.config, MAX_CONFIG_BYTES, signal);
  const config = parseSnapshotConfig(configBytes, manifest.value);
  if (!config.ok) throw new RegistryError('invalid', `${display}: ${config.error}`);
  const a = manifest.value.annotations;
  return {
    digest: fetched.digest,
    snapshotId: config.value.snapshotId,
    baseImage: a[ANNOTATION.baseImage] ?? '',
    fromNode: a[ANNOTATION.fromNode] ?? '',
    namespace: a[ANNOTATION.namespace] ?? '',
    controllerUid: a[ANNOTATION.controllerUid] ?? '',
    peerAddress: a[ANNOTATION.peerAddress] ?? '',
    peerPin: a[ANNOTATION.peerPin] ?? '',
    config: config.value,
  };
}

// --- Export ---------------------------------------------------------------------------------

interface ExportOptions {
  readonly cli: CocoonCli;
  readonly localName: string;
  readonly spool: string;
  readonly signal: AbortSignal;
  readonly uploader: LayerUploader;
  readonly progress: PushProgress;
  readonly log: Logger;
  /** Files larger than this are streamed (unless known, see {@link knownFiles}). */
  readonly streamMinBytes: number;
  /** The {@link knownFiles} key of a file of this snapshot. */
  readonly fileKey: (snapshotId: string, title: string, size: number) => string;
  readonly v2?: { readonly format: V2Format; readonly budget: SpoolBudget };
}

/**
 * Runs `snapshot export <name> -o -` and reads its tar: the envelope, and every regular file
 * spooled, hashed and handed to the uploader. Resolves once the tar ended and the export exited
 * 0; rejects (the export killed) on anything else.
 */
async function exportLayers(o: ExportOptions): Promise<{ envelope: ExportEnvelope; layers: SpooledLayer[] }> {
  const argv = snapshotExportArgv(o.localName);
  const child = o.cli.spawn(argv, { signal: o.signal });
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (text: string) => {
    stderr = (stderr + text).slice(-STDERR_TAIL);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>(
    (resolve) => {
      child.once('error', (error) => resolve({ code: null, signal: null, error }));
      child.once('close', (code, sig) => resolve({ code, signal: sig }));
    },
  );
  const exitError = async (): Promise<Error | undefined> => {
    const exit = await exited;
    if (exit.error) return new Error(`cocoon snapshot export: ${exit.error.message}`);
    if (exit.code === 0) return undefined;
    return new Error(`cocoon snapshot export ${o.localName}: ${formatJsonVerbError(exit, stderr)}`);
  };
  const stdout = child.stdout;
  if (!stdout) throw new Error('cocoon snapshot export: no stdout');
  const extract = tarStream().extract();
  const feeding = pipeline(stdout, extract, { signal: o.signal });
  feeding.catch(() => {}); // observed below
  let envelope: ExportEnvelope | undefined;
  const layers: SpooledLayer[] = [];
  const titles = new Set<string>();
  try {
    for await (const entry of extract) {
      o.signal.throwIfAborted();
      const h = entry.header;
      const bare = h.name.replace(/^(\.\/)+/, '');
      if (bare === 'snapshot.json' && (h.type === 'file' || h.type === 'contiguous-file')) {
        if (envelope !== undefined) throw new ExportFormatError('export tar: two snapshot.json entries');
        const body = await readCapped(entry, MAX_ENVELOPE_BYTES);
        const parsed = parseExportEnvelope(body);
        if (!parsed.ok) throw new ExportFormatError(`export tar: ${parsed.error}`);
        const check = snapshotConfigFromEnvelope(parsed.value, {});
        if (!check.ok) throw new ExportFormatError(`export tar: ${check.error}`);
        envelope = parsed.value;
        o.log.debug({ snapshotId: envelope.id }, 'snapshot push: envelope read');
        continue;
      }
      if (h.type !== 'file' && h.type !== 'contiguous-file') {
        o.log.debug({ entry: h.name, type: h.type }, 'snapshot push: skipping a non-file tar entry');
        entry.resume();
        continue;
      }
      const title = exportEntryTitle(h.name);
      if (!title.ok) throw new ExportFormatError(`export tar: ${title.error}`);
      if (titles.has(title.value))
        throw new ExportFormatError(`export tar: two entries named ${JSON.stringify(title.value)}`);
      titles.add(title.value);
      const file = join(o.spool, String(layers.length));
      o.progress.file = title.value;
      const declared = h.size ?? 0;
      /** Its `files[title]` entry: mode, size and sparse records (refused when unreadable). */
      const fileInfo = (size: number): SnapshotFileInfo => {
        const info = exportedFileInfo(
          title.value,
          h.mode,
          size,
          h.pax as Record<string, string> | null | undefined,
        );
        if (!info.ok) throw new ExportFormatError(`export tar: ${info.error}`);
        return info.value;
      };
      const layout = o.v2 ? fileLayout(declared, o.v2.format) : undefined;
      if (o.v2 && layout && (layout.compress || layout.ranges.length > 1)) {
        const { budget } = o.v2;
        let seq = 0;
        const blobs = await writeV2File(entry as AsyncIterable<Buffer>, {
          title: title.value,
          size: declared,
          mediaType: layerMediaType(title.value),
          layout,
          zstdLevel: o.v2.format.zstdLevel,
          spoolFile: () => `${file}.${seq++}`,
          budget,
          signal: o.signal,
          onBytes: (n) => o.progress.spooled(n),
          onBlob: (b) =>
            o.uploader.add({ ...b, title: title.value }, undefined, () => budget.release(b.size)),
        });
        const info = fileInfo(declared);
        const withChunks = blobs.length > 1 ? { ...info, chunks: blobs.map((b) => b.digest) } : info;
        for (const b of blobs) layers.push({ ...b, title: title.value, info: withChunks });
        continue;
      }
      const key = envelope ? o.fileKey(envelope.id, title.value, declared) : undefined;
      const streamed = declared > o.streamMinBytes && !(key !== undefined && isKnownFile(key));
      let digest: string;
      let size: number;
      if (streamed) {
        // Large and not seen here before: uploaded as it is read, no spool (docs/registry.md "Push flow").
        const source = new StreamedFile(title.value, declared, o.signal);
        o.uploader.stream(source, key);
        try {
          for await (const chunk of entry) {
            o.progress.spooled((chunk as Buffer).length);
            await source.write(chunk as Buffer);
          }
          source.end();
        } catch (error) {
          source.fail(error);
          throw error;
        }
        digest = await source.digest();
        size = declared;
      } else {
        const hashing = new Hashing((n) => o.progress.spooled(n));
        await pipeline(entry, hashing, createWriteStream(file, { flags: 'wx', mode: 0o600 }), {
          signal: o.signal,
        });
        digest = hashing.digest();
        size = hashing.size;
      }
      const layer: SpooledLayer = {
        title: title.value,
        mediaType: layerMediaType(title.value),
        digest,
        size,
        file,
        info: fileInfo(size),
      };
      layers.push(layer);
      if (!streamed) o.uploader.add(layer, key);
    }
    await feeding;
  } catch (error) {
    // A broken stream is usually the symptom of the export failing: report the export's own
    // error when it exits non-zero soon. Our own verdicts on the tar stand as they are. The
    // export is killed and reaped before this rejects, so nothing outlives the push.
    child.stdout?.destroy();
    let own: Error | undefined;
    if (!(error instanceof ExportFormatError) && !o.signal.aborted) {
      own = await Promise.race([exitError(), sleep(EXIT_GRACE_MS, undefined, { ref: false })]);
    }
    killGroup(child);
    await exited;
    throw own ?? error;
  }
  // The tar is complete; the export must now exit 0 (and soon).
  const late = sleep(EXIT_AFTER_TAR_MS, 'late' as const, { ref: false });
  const failure = await Promise.race([exitError(), late]);
  if (failure === 'late') {
    killGroup(child);
    await exited;
    throw new Error(
      `cocoon snapshot export ${o.localName}: did not exit ${EXIT_AFTER_TAR_MS / 1000} s after its tar ended`,
    );
  }
  if (failure) throw failure;
  if (envelope === undefined) throw new ExportFormatError('export tar: no snapshot.json');
  return { envelope, layers };
}

async function readCapped(entry: AsyncIterable<unknown>, max: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let length = 0;
  for await (const chunk of entry) {
    length += (chunk as Buffer).length;
    if (length > max) throw new ExportFormatError(`export tar: snapshot.json larger than ${max} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/**
 * A large exported file on its way to the registry without a spool ({@link StreamedBlob}): the
 * export loop {@link write}s the tar entry's bytes, hashing them, into the part the upload has
 * asked for ({@link take}, one per PATCH chunk), with backpressure both ways — the export
 * waits for the upload, never the reverse, and at most a part's buffer is in memory.
 */
class StreamedFile implements StreamedBlob {
  readonly label: string;
  readonly size: number;
  readonly #signal: AbortSignal;
  readonly #hash = createHash('sha256');
  #written = 0;
  #part: { stream: Readable; left: number } | undefined;
  #failure: unknown;
  #wakeWriter: (() => void) | undefined;
  #digest: string | undefined;
  readonly #done: Promise<string>;
  #settle!: { resolve: (digest: string) => void; reject: (error: unknown) => void };

  constructor(label: string, size: number, signal: AbortSignal) {
    this.label = label;
    this.size = size;
    this.#signal = signal;
    this.#done = new Promise<string>((resolve, reject) => {
      this.#settle = { resolve, reject };
    });
    this.#done.catch(() => {}); // observed by the upload, or the export's own error wins
  }

  get failure(): unknown {
    return this.#failure;
  }

  take(length: number): Readable {
    if (this.#part) throw new Error(`${this.label}: a part was asked for before the last one ended`);
    if (this.#failure !== undefined) throw this.#failure;
    const stream = new Readable({ highWaterMark: 1 * MiB, read: () => this.#wake() });
    stream.on('close', () => this.#wake());
    this.#part = { stream, left: length };
    this.#wake();
    return stream;
  }

  digest(): Promise<string> {
    return this.#done;
  }

  /** The export's next bytes; resolves when it may read on. */
  async write(chunk: Buffer): Promise<void> {
    this.#hash.update(chunk);
    this.#written += chunk.length;
    if (this.#written > this.size)
      throw new Error(`${this.label}: more than the ${this.size} bytes of its tar entry`);
    let rest = chunk;
    while (rest.length > 0) {
      const part = this.#part;
      if (this.#failure !== undefined) throw this.#failure;
      this.#signal.throwIfAborted();
      if (part === undefined || part.stream.destroyed) {
        // The upload has not asked for the next part yet (or is dropping this one): wait.
        await this.#sleep();
        continue;
      }
      const piece = rest.length > part.left ? rest.subarray(0, part.left) : rest;
      rest = rest.subarray(piece.length);
      part.left -= piece.length;
      const more = part.stream.push(piece);
      if (part.left === 0) {
        part.stream.push(null);
        this.#part = undefined;
      } else if (!more) {
        await this.#sleep();
      }
    }
  }

  /** Every byte has been written: the digest is known. */
  end(): void {
    if (this.#written !== this.size) {
      this.fail(new Error(`${this.label}: ${this.#written} of ${this.size} bytes`));
      return;
    }
    this.#digest = `sha256:${this.#hash.digest('hex')}`;
    this.#settle.resolve(this.#digest);
  }

  /** The export side failed, or the upload gave up: the other side stops. */
  fail(error: unknown): void {
    if (this.#failure !== undefined || this.#digest !== undefined) return;
    this.#failure = error ?? new Error(`${this.label}: failed`);
    this.#part?.stream.destroy(this.#failure as Error);
    this.#settle.reject(this.#failure);
    this.#wake();
  }

  #wake(): void {
    const wake = this.#wakeWriter;
    this.#wakeWriter = undefined;
    wake?.();
  }

  #sleep(): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        this.#signal.removeEventListener('abort', done);
        resolve();
      };
      this.#wakeWriter = done;
      this.#signal.addEventListener('abort', done, { once: true });
    });
  }
}

/**
 * Files this process has found in, or put into, a repository: `<registry>/<repository>`,
 * snapshot id, title and size ⇒ digest (a snapshot's files never change). A file seen before
 * is spooled, `HEAD`ed and uploaded only when missing, so a retried or repeated push skips it;
 * a large file never seen is streamed (docs/registry.md "Push flow"). The least
 * recently used entries go beyond {@link KNOWN_FILES_MAX}.
 */
const knownFiles = new Map<string, string>();

function isKnownFile(key: string): boolean {
  const digest = knownFiles.get(key);
  if (digest === undefined) return false;
  knownFiles.delete(key);
  knownFiles.set(key, digest);
  return true;
}

function rememberFile(key: string | undefined, digest: string): void {
  if (key === undefined) return;
  knownFiles.delete(key);
  knownFiles.set(key, digest);
  while (knownFiles.size > KNOWN_FILES_MAX) {
    const oldest = knownFiles.keys().next();
    if (oldest.done) break;
    knownFiles.delete(oldest.value);
  }
}

// --- Uploads --------------------------------------------------------------------------------

interface UploaderOptions {
  readonly registry: RegistryClient;
  readonly name: string;
  readonly concurrency: number;
  readonly chunkBytes: number;
  readonly signal: AbortSignal;
  readonly progress: PushProgress;
  readonly onError: (error: unknown) => void;
}

/**
 * Uploads layers in the background, at most `concurrency` at a time. A spooled layer: `HEAD`
 * first, upload only when missing, each digest once per push; its spool file goes as soon as
 * its blob is in the registry. A streamed one: one `PATCH` fed by the export as it reads the
 * file, the digest in the final `PUT`. The first failure is reported through `onError` (which
 * aborts the push).
 */
class LayerUploader {
  readonly #o: UploaderOptions;
  readonly #byDigest = new Map<string, Promise<void>>();
  readonly #all: Promise<void>[] = [];
  readonly #waiting: (() => void)[] = [];
  #running = 0;

  constructor(o: UploaderOptions) {
    this.#o = o;
  }

  /** A spooled blob; `key` remembers it (see {@link knownFiles}) once it is in the registry;
   * `onDone` runs once its spool file is gone, whatever the outcome. */
  add(layer: SpooledBlob, key: string | undefined, onDone?: () => void): void {
    const same = this.#byDigest.get(layer.digest);
    const task = same
      ? same.then(() => this.#o.progress.skipped(layer.size))
      : this.#withSlot(() => this.#upload(layer));
    if (!same) this.#byDigest.set(layer.digest, task);
    const done = task
      .then(() => rememberFile(key, layer.digest))
      .catch((error: unknown) => {
        const text = error instanceof Error ? error.message : String(error);
        this.#o.onError(new Error(`layer ${layer.title} (${layer.digest}): ${text}`, { cause: error }));
      })
      .finally(() =>
        rm(layer.file, { force: true })
          .catch(() => {})
          .then(() => onDone?.()),
      );
    this.#all.push(done);
  }

  /** A layer read from the export as it uploads (no spool file, no `HEAD` first). */
  stream(source: StreamedFile, key: string | undefined): void {
    const { registry, name, signal, progress } = this.#o;
    const task = this.#withSlot(async () => {
      signal.throwIfAborted();
      const digest = await registry.uploadStreamedBlob(name, source, {
        signal, // one PATCH for the whole file: there is no restart to make chunks worth their gaps
        onBytes: (n) => progress.uploaded(n),
      });
      rememberFile(key, digest);
    });
    const done = task.catch((error: unknown) => {
      // The export side failed first (this upload failed with it): the export reports that.
      if (source.failure !== undefined) return;
      source.fail(error);
      const text = error instanceof Error ? error.message : String(error);
      this.#o.onError(new Error(`layer ${source.label} (streamed): ${text}`, { cause: error }));
    });
    this.#all.push(done);
  }

  /** Resolves when every upload has finished or failed. */
  async settled(): Promise<void> {
    await Promise.allSettled(this.#all);
  }

  async #upload(layer: SpooledBlob): Promise<void> {
    const { registry, name, signal, progress } = this.#o;
    signal.throwIfAborted();
    if (await registry.headBlob(name, layer.digest, signal)) {
      progress.skipped(layer.size);
      return;
    }
    await registry.uploadBlob(
      name,
      { digest: layer.digest, size: layer.size, file: layer.file },
      { chunkBytes: this.#o.chunkBytes, signal, onBytes: (n) => progress.uploaded(n) },
    );
  }

  async #withSlot<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#running >= this.#o.concurrency) {
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    } else {
      this.#running++;
    }
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next();
      else this.#running--;
    }
  }
}

// --- Progress -------------------------------------------------------------------------------

class PushProgress {
  readonly #started = performance.now();
  #spooled = 0;
  #uploaded = 0;
  #skipped = 0;
  file = 'snapshot.json';

  spooled(n: number): void {
    this.#spooled += n;
  }

  uploaded(n: number): void {
    this.#uploaded += n;
  }

  skipped(n: number): void {
    this.#skipped += n;
  }

  get uploadedBytes(): number {
    return this.#uploaded;
  }

  fields(): Record<string, unknown> {
    const seconds = (performance.now() - this.#started) / 1000;
    const done = this.#uploaded + this.#skipped;
    return {
      exportedBytes: this.#spooled,
      bytes: done,
      totalBytes: this.#spooled,
      uploadedBytes: this.#uploaded,
      skippedBytes: this.#skipped,
      file: this.file,
      mibPerSecond: rate(done, seconds),
    };
  }
}
