/**
 * OCI distribution client (docs/registry.md "Transport and errors", docs/registry.md "Distribution API subset", docs/registry.md "Authentication").
 * Read path: ping, manifest HEAD/GET (with the mandatory Accept header and index resolution),
 * verified streaming blob GET. Write path (docs/registry.md "Push flow"): blob HEAD, blob upload
 * (POST, then one PUT for a small blob, or PATCH chunks streamed from a file and a final PUT;
 * 416 restarts the upload), a streamed upload (one PATCH, or chunks, taken from a source as
 * it is read, the digest last; nothing to restart from), manifest PUT, and manifest DELETE
 * with the tag ⇒ digest fallback.
 *
 * {@link RegistryClient} is the one class callers use; its verbs live beside it, each on the
 * client's {@link RegistryTransport}: manifests.ts, blob-read.ts, blob-upload.ts. The transport
 * (transport.ts: keep-alive agents, the request loop, busy retries, redirects), its
 * `Authorization` header (authorization.ts) and {@link RegistryError} (errors.ts) are below them.
 *
 * "Absent" (404 on a manifest) is a result value; everything else that is not a success is a
 * {@link RegistryError}.
 */
import type { Readable } from 'node:stream';
import { type Logger, silentLogger } from '../log.ts';
import type { Descriptor } from './artifact.ts';
import { plainHttpCredentialRefusal } from './auth.ts';
import * as blobRead from './blob-read.ts';
import type { BlobSource, StreamedBlob, UploadOptions } from './blob-upload.ts';
import * as blobUpload from './blob-upload.ts';
import { type CredentialSource, defaultCredentialSources, type GoogleAdcMode } from './credentials.ts';
import { drain, type RegistryResponse, statusError } from './errors.ts';
import type { FetchedManifest, ManifestHead } from './manifests.ts';
import * as manifests from './manifests.ts';
import {
  displayReference,
  parseRegistryBase,
  type Reference,
  type RegistryBase,
  repositoryName,
} from './reference.ts';
import { type RegistryRequest, RegistryTransport } from './transport.ts';

export interface RegistryClientOptions {
  /** `OCI_REGISTRY` (`host[:port][/path]`) or an already parsed base. */
  readonly base: string | RegistryBase;
  /** `VK_REGISTRY_PLAIN_HTTP`: plain HTTP for a non-loopback host (tests only). */
  readonly plainHttp?: boolean;
  /** Credential sources in order; default {@link defaultCredentialSources}. */
  readonly credentials?: readonly CredentialSource[];
  readonly log?: Logger;
  /** Socket inactivity that fails a request (default 120 s). */
  readonly idleTimeoutMs?: number;
  /** Idle keep-alive sockets kept per host (default 32, docs/registry.md "Transport and errors"). */
  readonly maxIdleSockets?: number;
  /** PEM certificates trusted besides Node's default CAs (`OCI_REGISTRY_CA_FILE`): a private registry CA. */
  readonly ca?: string;
  /** `VK_REGISTRY_GOOGLE_ADC` for the default credential sources (default: no Google credentials). */
  readonly googleAdc?: GoogleAdcMode;
}

export class RegistryClient {
  readonly base: RegistryBase;
  readonly #t: RegistryTransport;

  constructor(opts: RegistryClientOptions) {
    this.base =
      typeof opts.base === 'string' ? parseRegistryBase(opts.base, { plainHttp: opts.plainHttp }) : opts.base;
    const log = (opts.log ?? silentLogger).child({ module: 'registry', registry: this.base.host });
    const credentials =
      opts.credentials ??
      defaultCredentialSources(
        process.env,
        log,
        opts.googleAdc ? { mode: opts.googleAdc, host: this.base.host } : undefined,
      );
    if (plainHttpCredentialRefusal(this.base.scheme, this.base.host, '') !== undefined) {
      // Said once at startup, so an operator learns it before the first 401 does.
      log.warn(
        { host: this.base.host },
        'registry is plain HTTP on a non-loopback host: anonymous access only, credentials will be refused',
      );
    }
    this.#t = new RegistryTransport({
      base: this.base,
      log,
      credentials,
      idleTimeoutMs: opts.idleTimeoutMs ?? 120_000,
      maxIdleSockets: opts.maxIdleSockets ?? 32,
      ca: opts.ca,
    });
  }

  /** The repository name of a registry-relative repo under the base path (`<prefix>/<repo>`). */
  repository(repo: string): string {
    return repositoryName(this.base, repo);
  }

  /** `host/name:tag` for messages. */
  display(name: string, ref: Reference): string {
    return displayReference(this.base, name, ref);
  }

  /** Closes idle keep-alive sockets. */
  close(): void {
    this.#t.close();
  }

  /** `GET /v2/`: reachability and auth discovery. Resolves on 200. */
  async ping(signal?: AbortSignal): Promise<void> {
    const res = await this.#t.request({ method: 'GET', repository: '', path: '/v2/', signal });
    if (res.statusCode !== 200) throw await statusError(res, 'GET /v2/');
    drain(res);
  }

  /** `HEAD` a manifest: `{digest}` when it exists, `'absent'` on 404 (docs/registry.md "Transport and errors"). */
  headManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<ManifestHead | 'absent'> {
    return manifests.headManifest(this.#t, name, ref, signal);
  }

  /** `GET` a manifest, an index resolved to one child (manifests.ts); 404 ⇒ `'absent'`. */
  getManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<FetchedManifest | 'absent'> {
    return manifests.getManifest(this.#t, name, ref, signal);
  }

  /** A blob streamed and verified against its descriptor (blob-read.ts). */
  getBlob(name: string, desc: Pick<Descriptor, 'digest' | 'size'>, signal?: AbortSignal): Promise<Readable> {
    return blobRead.getBlob(this.#t, name, desc, signal);
  }

  /** A piece of a blob read by {@link getBlob} has been written where it goes and nothing holds
   * it any more: its read buffer may be read into again (slab-pool.ts). Other buffers are ignored. */
  recycle(piece: Buffer): void {
    this.#t.slabs.release(piece);
  }

  /** Read buffers made and reused so far (slab-pool.ts; tests and logs). */
  get readBuffers(): { made: number; reused: number } {
    return { made: this.#t.slabs.made, reused: this.#t.slabs.reused };
  }

  /** A whole blob in memory (config blobs), refused up front when larger than `maxBytes`. */
  getBlobBytes(
    name: string,
    desc: Pick<Descriptor, 'digest' | 'size'>,
    maxBytes: number,
    signal?: AbortSignal,
  ): Promise<Buffer> {
    return blobRead.getBlobBytes(this.#t, name, desc, maxBytes, signal);
  }

  // --- Write path (docs/registry.md "Push flow") ------------------------------------------

  /** `HEAD` a blob: true when the repository has it, false on 404 (blob-upload.ts). */
  headBlob(name: string, digest: string, signal?: AbortSignal): Promise<boolean> {
    return blobUpload.headBlob(this.#t, name, digest, signal);
  }

  /** Uploads a blob from memory or a file, in chunks when large; 416 starts over (blob-upload.ts). */
  uploadBlob(name: string, blob: BlobSource, opts: UploadOptions = {}): Promise<void> {
    return blobUpload.uploadBlob(this.#t, name, blob, opts);
  }

  /** Uploads a blob as it is read, once; resolves with its digest (blob-upload.ts). */
  uploadStreamedBlob(name: string, blob: StreamedBlob, opts: UploadOptions = {}): Promise<string> {
    return blobUpload.uploadStreamedBlob(this.#t, name, blob, opts);
  }

  /** `PUT` a manifest under a tag; resolves with the digest of the exact bytes sent. */
  putManifest(
    name: string,
    tag: string,
    bytes: Buffer,
    mediaType: string,
    signal?: AbortSignal,
  ): Promise<string> {
    return manifests.putManifest(this.#t, name, tag, bytes, mediaType, signal);
  }

  /** `DELETE` a manifest: `'deleted'` or `'absent'`; a refused tag delete falls back to the digest
   * (manifests.ts, docs/registry.md "Tag delete"). */
  deleteManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<'deleted' | 'absent'> {
    return manifests.deleteManifest(this.#t, name, ref, signal);
  }

  /**
   * Sends one request with auth (anonymous or cached credentials first; one retry after a 401
   * challenge) and, when asked, redirects (transport.ts). The caller owns the response body.
   */
  request(req: RegistryRequest): Promise<RegistryResponse> {
    return this.#t.request(req);
  }
}

/**
 * The client of a configured registry, or `undefined` without `OCI_REGISTRY` (clone-source
 * pulls are then disabled, docs/registry.md "Naming").
 */
export function registryFromConfig(
  config: {
    readonly ociRegistry: string | undefined;
    readonly registryPlainHttp: boolean;
    readonly registryCa?: string | undefined;
    readonly registryGoogleAdc?: GoogleAdcMode;
  },
  log?: Logger,
): RegistryClient | undefined {
  if (config.ociRegistry === undefined) return undefined;
  return new RegistryClient({
    base: config.ociRegistry,
    plainHttp: config.registryPlainHttp,
    log,
    ...(config.registryCa !== undefined ? { ca: config.registryCa } : {}),
    ...(config.registryGoogleAdc ? { googleAdc: config.registryGoogleAdc } : {}),
  });
}
