/**
 * Snapshot push (docs/registry.md "Push flow"): the export read as it streams (push-export.ts),
 * its layers uploaded in the background (push-upload.ts), then the config and the manifest.
 * Tag delete and the identity read are identity.ts.
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
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { CocoonCli } from '../cocoon/runner.ts';
import { type Logger, silentLogger } from '../log.ts';
import { MEDIA_TYPE } from './artifact.ts';
import type { SnapshotFileInfo } from './artifact-config.ts';
import {
  ANNOTATION,
  buildSnapshotManifest,
  checkCallerAnnotations,
  type ExportEnvelope,
  snapshotConfigFromEnvelope,
} from './artifact-write.ts';
import { DEFAULT_CHUNK_BYTES } from './blob-upload.ts';
import type { RegistryClient } from './client.ts';
import { RegistryError } from './errors.ts';
import { exportLayers, type SpooledLayer } from './push-export.ts';
import { LayerUploader, PushProgress } from './push-upload.ts';
import { parseReference, type Reference } from './reference.ts';
import { spoolPrefix } from './spool-dirs.ts';
import { describeCause, MiB, rate } from './transfer.ts';
import { isV2, SpoolBudget, type V2Format } from './v2-write.ts';

/** Default parallel layer uploads (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
export const DEFAULT_PUSH_CONCURRENCY = 8;
/** Files larger than this are streamed to the registry as they are exported (`streamMinMiB`). */
export const DEFAULT_STREAM_MIN_MIB = 64;

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
  const spool = await mkdtemp(join(opts.spoolDir ?? tmpdir(), spoolPrefix('push'))).catch(
    (error: unknown) => {
      clearInterval(timer);
      throw fail('export', `spool directory: ${(error as Error).message}`, error);
    },
  );
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
