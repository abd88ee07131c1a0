/**
 * The export side of a snapshot push (docs/registry.md "Push flow" steps 1–3): `cocoon snapshot
 * export <name> -o -` read as it streams, the envelope checked at once, every other file handed
 * to the uploader (push-upload.ts) — spooled and hashed, cut into v2 blobs (v2-write.ts), or, when
 * large and not seen before ({@link knownFiles}), streamed to the registry as it is read
 * ({@link StreamedFile}).
 */
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { snapshotExportArgv } from '../cocoon/argv.ts';
import { formatJsonVerbError } from '../cocoon/errors.ts';
import { type CocoonCli, killGroup } from '../cocoon/runner.ts';
import type { Logger } from '../log.ts';
import { tarStream } from '../util/lazy-packages.ts';
import { layerMediaType } from './artifact.ts';
import type { SnapshotFileInfo } from './artifact-config.ts';
import {
  type ExportEnvelope,
  exportEntryTitle,
  exportedFileInfo,
  MAX_ENVELOPE_BYTES,
  parseExportEnvelope,
  snapshotConfigFromEnvelope,
} from './artifact-write.ts';
import type { StreamedBlob } from './blob-upload.ts';
import type { LayerUploader, PushProgress, SpooledBlob } from './push-upload.ts';
import { Hashing, MiB, PIECE_BYTES } from './transfer.ts';
import { fileLayout, type SpoolBudget, type V2Format, writeV2File } from './v2-write.ts';

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

/** One layer of the manifest, with its file's config entry. */
export interface SpooledLayer extends SpooledBlob {
  readonly info: SnapshotFileInfo;
}

export interface ExportOptions {
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
export async function exportLayers(
  o: ExportOptions,
): Promise<{ envelope: ExportEnvelope; layers: SpooledLayer[] }> {
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
export class StreamedFile implements StreamedBlob {
  readonly label: string;
  readonly size: number;
  readonly #signal: AbortSignal;
  readonly #hash = createHash('sha256');
  #written = 0;
  #part: { stream: Readable; left: number } | undefined;
  #failure: unknown;
  #wakeWriter: (() => void) | undefined;
  #digest: string | undefined;
  /** The piece being gathered, and how much of it is filled. */
  #gather: Buffer | undefined;
  #gathered = 0;
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

  /** The export's next bytes; resolves when it may read on. They are gathered into pieces of
   * {@link PIECE_BYTES} (cut to the file's end) before they go to the upload. */
  async write(chunk: Buffer): Promise<void> {
    if (this.#failure !== undefined) throw this.#failure;
    this.#hash.update(chunk);
    const start = this.#written;
    this.#written += chunk.length;
    if (this.#written > this.size)
      throw new Error(`${this.label}: more than the ${this.size} bytes of its tar entry`);
    if (this.#gather === undefined && chunk.length >= PIECE_BYTES) {
      await this.#send(chunk);
      return;
    }
    for (let at = 0; at < chunk.length; ) {
      this.#gather ??= Buffer.allocUnsafe(Math.min(PIECE_BYTES, this.size - (start + at)));
      const n = chunk.copy(this.#gather, this.#gathered, at);
      this.#gathered += n;
      at += n;
      if (this.#gathered === this.#gather.length) {
        const piece = this.#gather;
        this.#gather = undefined;
        this.#gathered = 0;
        await this.#send(piece);
      }
    }
  }

  /** Hands bytes to the parts the upload asks for, waiting for it. */
  async #send(chunk: Buffer): Promise<void> {
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

export function rememberFile(key: string | undefined, digest: string): void {
  if (key === undefined) return;
  knownFiles.delete(key);
  knownFiles.set(key, digest);
  while (knownFiles.size > KNOWN_FILES_MAX) {
    const oldest = knownFiles.keys().next();
    if (oldest.done) break;
    knownFiles.delete(oldest.value);
  }
}
