/**
 * Run-mode images in the registry (docs/registry.md "Cloud-image artifacts (run mode)";
 * docs/contracts/pod-to-vm.md "Bring-up: run" step 1).
 *
 * 1. {@link resolveRunImage} peeks the manifest of the pod's image under `OCI_REGISTRY` (one
 *    manifest GET, an index resolved to its child) and classifies it: a cocoonstack cloud-image
 *    artifact, a snapshot artifact, or anything else (absent, a container image, an
 *    `http(s)://` URL, a host-qualified or malformed reference — these last two without any
 *    request). A registry that does not answer is an error, never "anything else".
 * 2. {@link importCloudImage} streams the artifact's disk layers, stable-sorted by title and
 *    concatenated, into `cocoon image import <local>`; every blob is hashed while it streams
 *    (RegistryClient.getBlob) and a mismatch, a registry failure or an abort kills the child
 *    before its stdin ever ends, so cocoon never commits a partial image.
 * 3. {@link RunImageImporter} de-duplicates concurrent imports of one local name, skips an
 *    import this process already made of the same manifest digest (unless forced), and bounds
 *    each import by its own 30-minute cap and the daemon's lifetime.
 */
import { Readable } from 'node:stream';
import { imageImportArgv, imageInspectArgv } from '../cocoon/argv.ts';
import type { CocoonCli } from '../cocoon/runner.ts';
import { type Logger, silentLogger } from '../log.ts';
import { untilAborted } from '../util/deadline.ts';
import { Singleflight } from '../util/singleflight.ts';
import {
  classifyArtifact,
  type Descriptor,
  type ManifestDocument,
  MEDIA_TYPE,
  TITLE_ANNOTATION,
} from './artifact.ts';
import type { RegistryClient } from './client.ts';
import { isDigest, parseReference, type Reference } from './reference.ts';
import { describeCause, rate } from './transfer.ts';

/** Own cap of one import (docs/contracts/pod-to-vm.md "Bring-up: run": 30 min). */
export const IMAGE_IMPORT_CAP_MS = 30 * 60 * 1000;
const SHORT_CALL_MS = 60_000;

/** The disk layer media types of a cloud-image artifact (docs/registry.md "Cloud-image artifacts (run mode)"). */
export const CLOUD_IMAGE_DISK_TYPES: ReadonlySet<string> = new Set([
  MEDIA_TYPE.diskQcow2,
  `${MEDIA_TYPE.diskQcow2}.part`,
  MEDIA_TYPE.diskRaw,
  `${MEDIA_TYPE.diskRaw}.part`,
  'application/vnd.cocoonstack.windows.disk.qcow2',
  'application/vnd.cocoonstack.windows.disk.qcow2.part',
  'application/vnd.cocoonstack.windows.disk.raw',
  'application/vnd.cocoonstack.windows.disk.raw.part',
]);

/** A run-mode failure. `permanent` when the registry answered and the answer cannot be booted
 * (a cloud-image artifact without disk layers); otherwise retrying may help. */
export class RunImageError extends Error {
  override readonly name = 'RunImageError';
  readonly permanent: boolean;

  constructor(message: string, opts: { permanent?: boolean; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.permanent = opts.permanent ?? false;
  }
}

// --- Pure parts -------------------------------------------------------------------------------

/** A disk layer to import: its descriptor and its title (`''` when it has none). */
export interface DiskLayer extends Descriptor {
  readonly title: string;
}

/**
 * The disk layers of a cloud-image artifact in import order: only the disk media types, then a
 * stable sort by title (plain code-unit order, so `part.000` < `part.001` < `part.010`); every
 * other layer (`SHA256SUMS`, metadata) is dropped.
 */
export function selectDiskLayers(layers: readonly Descriptor[]): DiskLayer[] {
  return layers
    .filter((l) => CLOUD_IMAGE_DISK_TYPES.has(l.mediaType))
    .map((l) => ({ ...l, title: l.annotations[TITLE_ANNOTATION] ?? '' }))
    .sort((a, b) => (a.title < b.title ? -1 : a.title > b.title ? 1 : 0));
}

/** What a run image reference means to the registry peek. */
export type RunImageRef =
  | {
      readonly kind: 'registry';
      /** Registry-relative repository (as written). */
      readonly repo: string;
      readonly ref: Reference;
      /** The local cocoon image name: `<repo>:<tag>` (tag `latest` when absent) or `<repo>@<digest>`. */
      readonly localName: string;
    }
  | { readonly kind: 'elsewhere'; readonly why: string };

/**
 * Splits a run image into a registry-relative repository and a tag or digest. A URL, a
 * host-qualified reference (first of several path components with a `.` or `:`, or
 * `localhost`: Docker's rule) or a malformed tag/digest is `elsewhere`: it is never looked up
 * under `OCI_REGISTRY`. The repository grammar itself is checked by `RegistryClient.repository`.
 */
export function parseRunImageRef(image: string): RunImageRef {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(image)) return { kind: 'elsewhere', why: 'a URL' };
  let rest = image;
  let digest: string | undefined;
  const at = rest.lastIndexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!isDigest(digest))
      return { kind: 'elsewhere', why: `digest ${JSON.stringify(digest)} is not sha256` };
  }
  const colon = rest.indexOf(':', rest.lastIndexOf('/') + 1);
  const repo = colon < 0 ? rest : rest.slice(0, colon);
  const tag = colon < 0 ? '' : rest.slice(colon + 1);
  const components = repo.split('/');
  const first = components[0] ?? '';
  if (components.length > 1 && (first.includes('.') || first.includes(':') || first === 'localhost')) {
    return { kind: 'elsewhere', why: `host-qualified (${first})` };
  }
  if (repo === '') return { kind: 'elsewhere', why: 'no repository' };
  let ref: Reference;
  try {
    ref = parseReference(digest ?? tag);
  } catch (error) {
    return { kind: 'elsewhere', why: (error as Error).message };
  }
  const localName = ref.kind === 'digest' ? `${repo}@${ref.value}` : `${repo}:${ref.value}`;
  return { kind: 'registry', repo, ref, localName };
}

/** The run-mode meaning of a fetched manifest (docs/registry.md "Reader validation" classification). */
export function runImageKind(doc: ManifestDocument): 'cloud-image' | 'snapshot' | 'other' {
  const kind = classifyArtifact(doc).kind;
  return kind === 'cloud-image' || kind === 'snapshot' ? kind : 'other';
}

// --- Peek -----------------------------------------------------------------------------------

/** The registry calls the peek and the import need (a RegistryClient; a fake in unit tests). */
export type RunImageRegistry = Pick<RegistryClient, 'repository' | 'display' | 'getManifest' | 'getBlob'>;

/** A cloud-image artifact ready to import. */
export interface CloudImageArtifact {
  readonly kind: 'cloud-image';
  /** Repository name under the registry's path prefix. */
  readonly name: string;
  readonly ref: Reference;
  /** `host/name:tag` for messages. */
  readonly display: string;
  /** Digest of the image manifest. */
  readonly digest: string;
  readonly localName: string;
  readonly layers: readonly DiskLayer[];
  readonly totalBytes: number;
}

export type RunImageResolution =
  | CloudImageArtifact
  | { readonly kind: 'snapshot'; readonly display: string; readonly digest: string }
  | { readonly kind: 'other'; readonly reason: string };

/**
 * Peeks the run image in the registry. Absent, a container image, an unknown artifact, a URL
 * or a reference that cannot be registry-relative ⇒ `other` (the last two without a request).
 * A registry failure (network, 5xx, auth, a malformed manifest) throws a transient
 * {@link RunImageError}; a cloud-image artifact without disk layers a permanent one.
 */
export async function resolveRunImage(
  registry: RunImageRegistry,
  image: string,
  signal?: AbortSignal,
): Promise<RunImageResolution> {
  const parsed = parseRunImageRef(image);
  if (parsed.kind === 'elsewhere') return { kind: 'other', reason: parsed.why };
  let name: string;
  try {
    name = registry.repository(parsed.repo);
  } catch (error) {
    return { kind: 'other', reason: (error as Error).message };
  }
  const display = registry.display(name, parsed.ref);
  let fetched: Awaited<ReturnType<RunImageRegistry['getManifest']>>;
  try {
    fetched = await registry.getManifest(name, parsed.ref, signal);
  } catch (error) {
    throw new RunImageError(`run image ${image}: reading ${display}: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (fetched === 'absent') return { kind: 'other', reason: `not in the registry (${display})` };
  const kind = runImageKind(fetched.document);
  if (kind === 'snapshot') return { kind, display, digest: fetched.digest };
  if (kind === 'other') {
    return { kind, reason: `${classifyArtifact(fetched.document).kind} at ${display}` };
  }
  const layers = selectDiskLayers(fetched.manifest.layers);
  if (layers.length === 0) {
    throw new RunImageError(`run image ${image}: cloud-image artifact ${display} has no disk layers`, {
      permanent: true,
    });
  }
  return {
    kind,
    name,
    ref: parsed.ref,
    display,
    digest: fetched.digest,
    localName: parsed.localName,
    layers,
    totalBytes: layers.reduce((sum, l) => sum + l.size, 0),
  };
}

// --- Import ---------------------------------------------------------------------------------

export interface ImportCloudImageOptions {
  readonly registry: RunImageRegistry;
  readonly cli: CocoonCli;
  readonly image: CloudImageArtifact;
  /** Local cocoon image name to import into. */
  readonly localName: string;
  readonly signal?: AbortSignal;
  readonly log?: Logger;
  /** Deadline of the `image import` child (default 30 min). */
  readonly importTimeoutMs?: number;
  /** Progress log cadence (default 5 s). */
  readonly progressIntervalMs?: number;
}

/**
 * Streams the disk layers in order, concatenated, into `cocoon image import <localName>`. One
 * blob downloads at a time and flows through with backpressure from cocoon (nothing is
 * buffered beyond the stream windows). Every blob is verified against its digest and size
 * while it streams; any failure aborts the downloads and kills the child before its stdin
 * ends, so the import never commits (the cocoon CLI has no image removal verb: not committing
 * is the cleanup).
 */
export async function importCloudImage(opts: ImportCloudImageOptions): Promise<void> {
  const { registry, cli, image, localName } = opts;
  const log = (opts.log ?? silentLogger).child({ image: localName, ref: image.display });
  const abort = new AbortController();
  const signal = opts.signal ? AbortSignal.any([abort.signal, opts.signal]) : abort.signal;
  let firstError: unknown;
  const failWith = (error: unknown) => {
    if (firstError === undefined) firstError = error;
    abort.abort(error);
  };
  const started = performance.now();
  let bytes = 0;
  let current = image.layers[0]?.title ?? '';
  let finished = false;
  const fields = () => {
    const seconds = (performance.now() - started) / 1000;
    return {
      bytes,
      totalBytes: image.totalBytes,
      percent: image.totalBytes > 0 ? Math.floor((bytes / image.totalBytes) * 1000) / 10 : 100,
      layer: current,
      mibPerSecond: rate(bytes, seconds),
    };
  };
  log.info(
    { digest: image.digest, layers: image.layers.map((l) => l.title), totalBytes: image.totalBytes },
    'image import: starting',
  );
  async function* disk(): AsyncGenerator<Buffer> {
    try {
      for (const layer of image.layers) {
        current = layer.title;
        const blob = await registry.getBlob(image.name, layer, signal);
        try {
          for await (const chunk of blob) {
            bytes += (chunk as Buffer).length;
            yield chunk as Buffer;
          }
        } finally {
          blob.destroy();
        }
      }
      finished = true;
    } catch (error) {
      // Kill the child now: its stdin must never see the end of a stream that failed.
      failWith(error);
      throw error;
    }
  }
  const stdin = Readable.from(disk(), { objectMode: false });
  stdin.on('error', () => {}); // reported through failWith
  const timer = setInterval(
    () => log.info(fields(), 'image import: progress'),
    opts.progressIntervalMs ?? 5000,
  );
  timer.unref();
  try {
    await cli.run(imageImportArgv(localName), {
      timeoutMs: opts.importTimeoutMs ?? IMAGE_IMPORT_CAP_MS,
      signal,
      stdin,
    });
    if (!finished) throw new Error('cocoon image import exited before reading the whole disk stream');
  } catch (error) {
    failWith(error);
  } finally {
    clearInterval(timer);
    stdin.destroy();
  }
  if (firstError !== undefined) {
    log.warn({ err: (firstError as Error).message, ...fields() }, 'image import failed; nothing committed');
    throw new RunImageError(
      `import ${image.display} into ${localName}: ${describeCause(firstError, opts.signal)}`,
      { cause: firstError },
    );
  }
  const seconds = (performance.now() - started) / 1000;
  log.info(
    { totalBytes: bytes, seconds: Math.round(seconds * 10) / 10, mibPerSecond: rate(bytes, seconds) },
    'image import: done',
  );
}

// --- De-duplicated imports -------------------------------------------------------------------

/** What run mode boots: an imported local name, a refusal, or `image pull` of the image as written. */
export type RunImageOutcome =
  | {
      readonly kind: 'imported';
      readonly localName: string;
      readonly digest: string;
      readonly reused: boolean;
    }
  | { readonly kind: 'refused'; readonly message: string }
  | { readonly kind: 'pull'; readonly reason: string };

export interface RunImageImporterOptions {
  readonly registry: RunImageRegistry;
  readonly cli: CocoonCli;
  readonly log?: Logger;
  /** Provider lifetime: shutdown aborts imports in flight. */
  readonly lifetime?: AbortSignal;
  /** Cap of one import (default 30 min). */
  readonly capMs?: number;
  readonly progressIntervalMs?: number;
}

/**
 * The run-mode image step with a registry configured (docs/contracts/pod-to-vm.md "Bring-up:
 * run" step 1). An import is not bound to any caller's signal: it has its own cap and ends at
 * shutdown; callers arriving while one runs for the same local name share it (a forced caller
 * too: the running import is a fresh one).
 */
export class RunImageImporter {
  readonly #o: RunImageImporterOptions;
  readonly #log: Logger;
  readonly #flight = new Singleflight<void>();
  /** Manifest digest this process last imported under each local name. */
  readonly #imported = new Map<string, string>();

  constructor(opts: RunImageImporterOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ module: 'image-import' });
  }

  async ensure(
    image: string,
    opts: { force?: boolean; signal?: AbortSignal; log?: Logger } = {},
  ): Promise<RunImageOutcome> {
    const log = opts.log ?? this.#log;
    let found: RunImageResolution;
    try {
      const signals = [opts.signal, this.#o.lifetime].filter((s) => s !== undefined);
      found = await resolveRunImage(this.#o.registry, image, AbortSignal.any(signals));
    } catch (error) {
      if (error instanceof RunImageError && error.permanent)
        return { kind: 'refused', message: error.message };
      throw error;
    }
    if (found.kind === 'other') return { kind: 'pull', reason: found.reason };
    if (found.kind === 'snapshot') {
      return {
        kind: 'refused',
        message: `run image ${image} is a snapshot artifact (${found.display}): use mode=clone`,
      };
    }
    const local = found.localName;
    if (!opts.force && this.#imported.get(local) === found.digest && (await this.#exists(local))) {
      log.info({ image: local, digest: found.digest }, 'cloud image already imported from this manifest');
      return { kind: 'imported', localName: local, digest: found.digest, reused: true };
    }
    const importing = this.#flight.do(local, () => this.#import(found, log));
    await untilAborted(importing, opts.signal);
    return { kind: 'imported', localName: local, digest: found.digest, reused: false };
  }

  async #import(image: CloudImageArtifact, log: Logger): Promise<void> {
    const capMs = this.#o.capMs ?? IMAGE_IMPORT_CAP_MS;
    const cap = AbortSignal.timeout(capMs);
    const signal = this.#o.lifetime ? AbortSignal.any([cap, this.#o.lifetime]) : cap;
    this.#imported.delete(image.localName);
    try {
      await importCloudImage({
        registry: this.#o.registry,
        cli: this.#o.cli,
        image,
        localName: image.localName,
        signal,
        log,
        importTimeoutMs: capMs,
        progressIntervalMs: this.#o.progressIntervalMs,
      });
    } catch (error) {
      if (cap.aborted && !this.#o.lifetime?.aborted) {
        const limit = capMs % 60_000 === 0 ? `${capMs / 60_000} min` : `${capMs} ms`;
        throw new RunImageError(
          `import of ${image.display} into ${image.localName} exceeded its ${limit} cap`,
          {
            cause: error,
          },
        );
      }
      throw error;
    }
    this.#imported.set(image.localName, image.digest);
  }

  /** `image inspect`: true when cocoon has the name; any failure counts as missing (re-import). */
  async #exists(local: string): Promise<boolean> {
    try {
      await this.#o.cli.run(imageInspectArgv(local), { timeoutMs: SHORT_CALL_MS, signal: this.#o.lifetime });
      return true;
    } catch {
      return false;
    }
  }
}
