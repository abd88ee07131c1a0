/**
 * The upload side of a snapshot push (docs/registry.md "Push flow" step 2): {@link LayerUploader}
 * puts the layers up in the background while the export goes on, and {@link PushProgress} counts
 * what was exported, uploaded and skipped.
 */
import { rm } from 'node:fs/promises';
import type { WrittenLayer } from './artifact-write.ts';
import type { RegistryClient } from './client.ts';
import { rememberFile, type StreamedFile } from './push-export.ts';
import { rate } from './transfer.ts';

/** One blob, spooled and hashed (v1: one per file). */
export interface SpooledBlob extends WrittenLayer {
  readonly file: string;
}

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
export class LayerUploader {
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

export class PushProgress {
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
