/**
 * OCI distribution client (docs/registry.md "Transport and errors", docs/registry.md "Distribution API subset", docs/registry.md "Authentication").
 * Read path: ping, manifest HEAD/GET (with the mandatory Accept header and index resolution),
 * verified streaming blob GET. Write path (docs/registry.md "Push flow"): blob HEAD, blob upload
 * (POST, then one PUT for a small blob, or PATCH chunks streamed from a file and a final PUT;
 * 416 restarts the upload), a streamed upload (one PATCH, or chunks, taken from a source as
 * it is read, the digest last; nothing to restart from), manifest PUT, and manifest DELETE
 * with the tag ⇒ digest fallback.
 *
 * Transport: node:http/https over HTTP/1.1 with a keep-alive pool of up to 32 idle sockets per
 * host (`maxFreeSockets`), chosen over the global fetch because it exposes exactly that pool
 * setting and real stream backpressure. Redirects on blob GET are followed by hand so the
 * `Authorization` header never reaches another host.
 *
 * Auth: anonymous first; a 401 challenge selects Bearer (token per repository and action set,
 * cached until shortly before expiry, fetched with Basic credentials when a source has them)
 * or Basic. Every request goes through {@link RegistryClient.request}, which takes a method, the
 * action set (`pull` for reads, `pull,push` for uploads and manifest PUT, `pull,push,delete` for
 * DELETE) and an optional replayable body: a buffer, or a {@link StreamBody} opened afresh for
 * each send, so a layer is streamed from its file and never held in memory.
 *
 * "Absent" (404 on a manifest) is a result value; everything else that is not a success is a
 * {@link RegistryError}.
 */
import { createHash, type Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import type * as Http from 'node:http';
import type { IncomingMessage } from 'node:http';
import https from 'node:https';
import { Readable, Transform, type TransformCallback } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { getCACertificates } from 'node:tls';
import type { Logger } from '../log.ts';
import { silentLogger } from '../log.ts';
import { VERSION } from '../version.ts';
import {
  type Descriptor,
  type ImageManifest,
  MANIFEST_ACCEPT,
  MAX_MANIFEST_BYTES,
  type ManifestDocument,
  parseManifestDocument,
  selectIndexChild,
} from './artifact.ts';
import {
  basicAuthorization,
  type Challenge,
  type Credential,
  parseTokenResponse,
  parseWwwAuthenticate,
  plainHttpCredentialRefusal,
  repositoryScope,
  tokenExpiresAt,
  tokenUrl,
} from './auth.ts';
import {
  type CredentialSource,
  defaultCredentialSources,
  type GoogleAdcMode,
  lookupCredential,
} from './credentials.ts';
import {
  blobPath,
  displayReference,
  isDigest,
  manifestPath,
  parseRegistryBase,
  type Reference,
  type RegistryBase,
  registryOrigin,
  repositoryName,
} from './reference.ts';

// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const http = process.getBuiltinModule('node:http');

/**
 * What went wrong: `http` (an unexpected status), `network` (connection refused, reset,
 * truncated, timed out), `auth` (401/403 after the challenge, token endpoint failure),
 * `integrity` (digest or size mismatch), `invalid` (a malformed document).
 */
export type RegistryErrorKind = 'http' | 'network' | 'auth' | 'integrity' | 'invalid';

export class RegistryError extends Error {
  override readonly name = 'RegistryError';
  readonly kind: RegistryErrorKind;
  /** HTTP status, when the registry answered. */
  readonly status: number | undefined;
  /** First OCI error code of the body (`BLOB_UNKNOWN`, `DENIED`, ...), when present. */
  readonly code: string | undefined;

  constructor(
    kind: RegistryErrorKind,
    message: string,
    opts: { status?: number; code?: string; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.kind = kind;
    this.status = opts.status;
    this.code = opts.code;
  }
}

/** A manifest that exists (HEAD). */
export interface ManifestHead {
  /** `Docker-Content-Digest` (`''` if the registry did not send it). */
  readonly digest: string;
  readonly mediaType: string;
  /** `Content-Length`, `-1` if absent. */
  readonly size: number;
}

/** A fetched image manifest; an index has already been resolved to one child. */
export interface FetchedManifest {
  /** Digest of the image manifest's exact bytes. */
  readonly digest: string;
  readonly bytes: Buffer;
  readonly document: Extract<ManifestDocument, { kind: 'manifest' }>;
  readonly manifest: ImageManifest;
  /** Digest of the index the manifest was chosen from, if the reference named an index. */
  readonly indexDigest: string | undefined;
}

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

/** Options of a single registry request (the building block of every verb). */
export interface RegistryRequest {
  readonly method: 'GET' | 'HEAD' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** Repository the request acts on (the token scope); `''` for `/v2/`. */
  readonly repository: string;
  /** Path on the registry (`/v2/...`) or an absolute URL on the registry host (upload locations). */
  readonly path: string;
  /** Token actions; default `['pull']`. */
  readonly actions?: readonly string[];
  readonly headers?: Readonly<Record<string, string>>;
  /** A replayable body (sent again after a 401 challenge). */
  readonly body?: Buffer | StreamBody;
  /** Follow 301/302/303/307/308 (blob GET), dropping `Authorization` for other hosts. */
  readonly followRedirects?: boolean;
  readonly signal?: AbortSignal;
}

/**
 * A request body streamed from somewhere else (a spooled layer file): `open` is called once per
 * send (again after a 401 challenge) and must yield exactly `length` bytes.
 */
export interface StreamBody {
  readonly length: number;
  readonly open: () => Readable;
}

/** A blob to upload: in memory (the config) or a file on disk (a spooled layer). */
export type BlobSource =
  | { readonly digest: string; readonly size: number; readonly bytes: Buffer }
  | { readonly digest: string; readonly size: number; readonly file: string };

export interface UploadOptions {
  /** Blobs larger than this go up in PATCH chunks of this size (default 64 MiB). */
  readonly chunkBytes?: number;
  readonly signal?: AbortSignal;
  /** Bytes the registry accepted (after each chunk or the whole PUT); negative on a restart. */
  readonly onBytes?: (n: number) => void;
}

/**
 * A blob uploaded as it is read, front to back, once (docs/registry.md "Push flow"): its size
 * is known up front, its digest only once every byte has been taken.
 */
export interface StreamedBlob {
  readonly size: number;
  /** What messages call it before its digest is known (a layer title). */
  readonly label: string;
  /** The next `length` bytes as a stream; called in order, each time the previous one ended. */
  readonly take: (length: number) => Readable;
  /** Resolves with the digest once every byte has been taken; rejects when the source failed. */
  readonly digest: () => Promise<string>;
}

/** Default PATCH chunk (docs/registry.md "Distribution API subset": 64 MiB). */
export const DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024;
/** Times an upload is started over after a 416 (or a Range the client did not expect). */
const MAX_UPLOAD_RESTARTS = 3;
const PULL: readonly string[] = ['pull'];
const PUSH: readonly string[] = ['pull', 'push'];
/** distribution maps DELETE to the `delete` action of the token scope. */
const DELETE: readonly string[] = ['pull', 'push', 'delete'];

/** A 416 or an unexpected upload offset: the upload session is started over. */
class UploadRestart extends Error {}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
/** Answers that ask the client to come back later (Too Many Requests, Service Unavailable). */
const BUSY_STATUS = new Set([429, 503]);
/** Tries of one request while the registry answers busy (the last busy answer is the error). */
export const BUSY_ATTEMPTS = 4;
const BUSY_MAX_WAIT_MS = 30_000;

/**
 * How long to wait before trying a busy registry again: its `Retry-After` (delta-seconds or an
 * HTTP date, RFC 9110 §10.2.3), else 0.5 s doubling per try; never more than 30 s. Pure.
 */
export function busyWaitMs(retryAfter: string | undefined, tries: number, now: number): number {
  const backoff = 500 * 2 ** tries;
  const text = retryAfter?.trim() ?? '';
  let ms: number | undefined;
  if (/^\d+$/.test(text)) ms = Number(text) * 1000;
  else if (/ GMT$/.test(text)) {
    const at = Date.parse(text);
    if (!Number.isNaN(at)) ms = Math.max(0, at - now);
  }
  return Math.min(BUSY_MAX_WAIT_MS, ms ?? backoff);
}

const MAX_REDIRECTS = 5;
/** Range requests after a blob body was cut short, per blob read. */
export const BLOB_RESUMES = 3;
const MAX_ERROR_BODY = 64 * 1024;
const MAX_TOKEN_BODY = 1024 * 1024;

interface CachedToken {
  readonly token: string;
  readonly expiresAt: number;
}

/** Reads a whole body, failing once it grows past `max` bytes. */
async function readBody(res: IncomingMessage, max: number, what: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let length = 0;
  for await (const chunk of res) {
    length += (chunk as Buffer).length;
    if (length > max) {
      res.destroy();
      throw new RegistryError('invalid', `${what}: body larger than ${max} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** Discards a body so the socket returns to the pool. */
function drain(res: IncomingMessage): void {
  res.on('error', () => {});
  res.resume();
}

/** `{errors:[{code,message}]}` ⇒ the first code and a compact message. */
function describeErrorBody(body: Buffer): { code?: string; text: string } {
  const text = body.toString('utf8').trim();
  try {
    const json = JSON.parse(text) as { errors?: { code?: unknown; message?: unknown }[] };
    const first = json.errors?.[0];
    if (first && typeof first.code === 'string') {
      return {
        code: first.code,
        text:
          typeof first.message === 'string' && first.message !== ''
            ? `${first.code}: ${first.message}`
            : first.code,
      };
    }
  } catch {
    // not JSON
  }
  return { text: text.length > 200 ? `${text.slice(0, 200)}...` : text };
}

function networkError(what: string, error: unknown): RegistryError {
  if (error instanceof RegistryError) return error;
  const e = error as NodeJS.ErrnoException;
  const detail = e.name === 'AbortError' ? 'aborted' : `${e.code ? `${e.code} ` : ''}${e.message}`;
  return new RegistryError('network', `${what}: ${detail}`, { cause: error });
}

/**
 * Verifies a blob while it streams: counts bytes (failing at the first byte past the
 * descriptor size — no trailing data), hashes with SHA-256, and at the end fails unless both
 * the size and the digest match. The failure arrives before `end`, so a consumer never takes
 * an unverified blob for complete.
 */
class VerifyingStream extends Transform {
  readonly #digest: string;
  readonly #size: number;
  readonly #hash: Hash = createHash('sha256');
  #seen = 0;

  constructor(digest: string, size: number) {
    super();
    this.#digest = digest;
    this.#size = size;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.#seen += chunk.length;
    if (this.#seen > this.#size) {
      cb(
        new RegistryError(
          'integrity',
          `blob ${this.#digest}: more than the ${this.#size} bytes of its descriptor`,
        ),
      );
      return;
    }
    this.#hash.update(chunk);
    cb(null, chunk);
  }

  override _flush(cb: TransformCallback): void {
    if (this.#seen !== this.#size) {
      cb(new RegistryError('integrity', `blob ${this.#digest}: got ${this.#seen} of ${this.#size} bytes`));
      return;
    }
    const got = `sha256:${this.#hash.digest('hex')}`;
    if (got !== this.#digest) {
      cb(new RegistryError('integrity', `blob ${this.#digest}: digest mismatch (content hashes to ${got})`));
      return;
    }
    cb();
  }
}

/** `length` bytes of a file from `start` (a chunk or a whole spooled layer). */
function fileRange(file: string, start: number, length: number): Readable {
  if (length === 0) return Readable.from([]);
  return createReadStream(file, { start, end: start + length - 1, highWaterMark: 1024 * 1024 });
}

export class RegistryClient {
  readonly base: RegistryBase;
  readonly #origin: string;
  readonly #credentials: readonly CredentialSource[];
  readonly #log: Logger;
  readonly #idleTimeoutMs: number;
  readonly #httpAgent: Http.Agent;
  readonly #httpsAgent: https.Agent;
  /** The registry's last challenge; drives pre-emptive auth on later requests. */
  #challenge: Challenge | undefined;
  readonly #tokens = new Map<string, CachedToken>();
  readonly #tokenFetches = new Map<string, Promise<string>>();

  constructor(opts: RegistryClientOptions) {
    this.base =
      typeof opts.base === 'string' ? parseRegistryBase(opts.base, { plainHttp: opts.plainHttp }) : opts.base;
    this.#origin = registryOrigin(this.base);
    this.#log = (opts.log ?? silentLogger).child({ module: 'registry', registry: this.base.host });
    this.#credentials =
      opts.credentials ??
      defaultCredentialSources(
        process.env,
        this.#log,
        opts.googleAdc ? { mode: opts.googleAdc, host: this.base.host } : undefined,
      );
    if (plainHttpCredentialRefusal(this.base.scheme, this.base.host, '') !== undefined) {
      // Said once at startup, so an operator learns it before the first 401 does.
      this.#log.warn(
        { host: this.base.host },
        'registry is plain HTTP on a non-loopback host: anonymous access only, credentials will be refused',
      );
    }
    this.#idleTimeoutMs = opts.idleTimeoutMs ?? 120_000;
    const maxFreeSockets = opts.maxIdleSockets ?? 32;
    this.#httpAgent = new http.Agent({ keepAlive: true, maxFreeSockets });
    // Added to the default CAs (bundled, system and NODE_EXTRA_CA_CERTS), not in their place: a
    // token realm on a public host keeps working.
    const ca = opts.ca === undefined ? undefined : [...getCACertificates('default'), opts.ca];
    this.#httpsAgent = new https.Agent({ keepAlive: true, maxFreeSockets, ...(ca ? { ca } : {}) });
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
    this.#httpAgent.destroy();
    this.#httpsAgent.destroy();
  }

  /** `GET /v2/`: reachability and auth discovery. Resolves on 200. */
  async ping(signal?: AbortSignal): Promise<void> {
    const res = await this.request({ method: 'GET', repository: '', path: '/v2/', signal });
    if (res.statusCode !== 200) throw await this.#statusError(res, 'GET /v2/');
    drain(res);
  }

  /** `HEAD` a manifest: `{digest}` when it exists, `'absent'` on 404 (docs/registry.md "Transport and errors"). */
  async headManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<ManifestHead | 'absent'> {
    const res = await this.request({
      method: 'HEAD',
      repository: name,
      path: manifestPath(name, ref),
      headers: { accept: MANIFEST_ACCEPT },
      signal,
    });
    if (res.statusCode !== 200 && res.statusCode !== 404) {
      throw await this.#statusError(res, `HEAD ${this.display(name, ref)}`);
    }
    drain(res);
    if (res.statusCode === 404) return 'absent';
    const length = Number(res.headers['content-length']);
    return {
      digest: String(res.headers['docker-content-digest'] ?? ''),
      mediaType: String(res.headers['content-type'] ?? '')
        .split(';')[0]!
        .trim(),
      size: Number.isSafeInteger(length) ? length : -1,
    };
  }

  /**
   * `GET` a manifest (404 ⇒ `'absent'`). An index is resolved to its `linux/amd64` child, else
   * the first child whose architecture is not `unknown` (docs/registry.md "Reader validation"); a missing child is
   * an error, not absence. A manifest fetched by digest is checked against the digest.
   */
  async getManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<FetchedManifest | 'absent'> {
    const top = await this.#fetchManifestDocument(name, ref, signal);
    if (top === 'absent') return 'absent';
    if (top.document.kind === 'manifest') {
      return { ...top, document: top.document, manifest: top.document.manifest, indexDigest: undefined };
    }
    const child = selectIndexChild(top.document.children);
    if (!child) {
      throw new RegistryError(
        'invalid',
        `${this.display(name, ref)}: image index has no usable child manifest`,
      );
    }
    const childRef: Reference = { kind: 'digest', value: child.digest };
    const sub = await this.#fetchManifestDocument(name, childRef, signal);
    if (sub === 'absent') {
      throw new RegistryError('http', `${this.display(name, childRef)}: index child manifest not found`, {
        status: 404,
        code: 'MANIFEST_UNKNOWN',
      });
    }
    if (sub.document.kind !== 'manifest') {
      throw new RegistryError('invalid', `${this.display(name, childRef)}: nested image index`);
    }
    return { ...sub, document: sub.document, manifest: sub.document.manifest, indexDigest: top.digest };
  }

  /**
   * Streams a blob, verified against its descriptor: the returned stream errors (before `end`)
   * on a digest or size mismatch, extra bytes, a truncated body or a network failure. 404 is an
   * error (`BLOB_UNKNOWN`). Redirects are followed without forwarding `Authorization`.
   */
  async getBlob(
    name: string,
    desc: Pick<Descriptor, 'digest' | 'size'>,
    signal?: AbortSignal,
  ): Promise<Readable> {
    const what = `blob ${desc.digest} of ${name}`;
    const res = await this.request({
      method: 'GET',
      repository: name,
      path: blobPath(name, desc.digest),
      followRedirects: true,
      signal,
    });
    if (res.statusCode !== 200) throw await this.#statusError(res, `GET ${what}`);
    const declared = res.headers['content-length'];
    if (declared !== undefined && Number(declared) !== desc.size) {
      res.destroy();
      throw new RegistryError(
        'integrity',
        `${what}: Content-Length ${declared} but the descriptor says ${desc.size}`,
      );
    }
    const verifier = new VerifyingStream(desc.digest, desc.size);
    let current = res;
    let resumes = 0;
    // Bytes handed to the verifier so far: where a resume starts. (The verifier's own count lags
    // behind while it holds written bytes its reader has not taken yet.)
    let received = 0;
    verifier.on('close', () => {
      if (!current.complete) current.destroy();
    });
    // A body cut short (the connection dropped, the server went away mid-blob) is asked again
    // from where it stopped with `Range: bytes=<n>-`, up to BLOB_RESUMES times; a 200 instead of
    // a 206 (a server without ranges) is read from the start with the bytes we have skipped.
    // The verifier sees one continuous stream, so size and digest still cover every byte.
    const feed = (body: IncomingMessage, skip: number) => {
      current = body;
      let toSkip = skip;
      let cut = false;
      const onCut = (error?: Error) => {
        if (cut || verifier.destroyed) return;
        cut = true;
        const seen = received;
        if (resumes >= BLOB_RESUMES || signal?.aborted || seen >= desc.size) {
          verifier.destroy(
            networkError(
              `${what} after ${seen} of ${desc.size} bytes`,
              error ?? new Error('connection closed'),
            ),
          );
          return;
        }
        resumes++;
        this.#log.warn(
          { blob: desc.digest, bytes: seen, size: desc.size, attempt: resumes, err: error?.message },
          'registry blob read cut short; resuming with a Range request',
        );
        this.request({
          method: 'GET',
          repository: name,
          path: blobPath(name, desc.digest),
          headers: { range: `bytes=${seen}-` },
          followRedirects: true,
          signal,
        }).then(
          async (next) => {
            if (verifier.destroyed) return next.destroy();
            const range = /^bytes (\d+)-/.exec(String(next.headers['content-range'] ?? ''));
            if (next.statusCode === 206 && range && Number(range[1]) === seen) feed(next, 0);
            else if (next.statusCode === 200) feed(next, seen);
            else if (next.statusCode === 206) {
              next.destroy();
              verifier.destroy(
                new RegistryError(
                  'integrity',
                  `${what}: asked for bytes ${seen}- and got ${String(next.headers['content-range'])}`,
                ),
              );
            } else verifier.destroy(await this.#statusError(next, `GET ${what} (resumed at ${seen})`));
          },
          (err: unknown) => verifier.destroy(err as Error),
        );
      };
      body.on('data', (chunk: Buffer) => {
        let data = chunk;
        if (toSkip > 0) {
          const n = Math.min(toSkip, data.length);
          toSkip -= n;
          data = data.subarray(n);
          if (data.length === 0) return;
        }
        received += data.length;
        if (!verifier.write(data)) {
          body.pause();
          verifier.once('drain', () => body.resume());
        }
      });
      body.on('error', (error) => onCut(error));
      body.on('end', () => {
        if (body.complete && toSkip === 0 && received === desc.size) verifier.end();
        else if (body.complete && received < desc.size && !cut) onCut();
        else if (!cut) verifier.end(); // more than the size is the verifier's own verdict
      });
      body.on('close', () => {
        if (!body.complete) onCut();
      });
    };
    feed(res, 0);
    return verifier;
  }

  /** A whole blob in memory (config blobs), refused up front when larger than `maxBytes`. */
  async getBlobBytes(
    name: string,
    desc: Pick<Descriptor, 'digest' | 'size'>,
    maxBytes: number,
    signal?: AbortSignal,
  ): Promise<Buffer> {
    if (desc.size > maxBytes) {
      throw new RegistryError(
        'invalid',
        `blob ${desc.digest}: ${desc.size} bytes exceed the ${maxBytes}-byte cap`,
      );
    }
    const stream = await this.getBlob(name, desc, signal);
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  // --- Write path (docs/registry.md "Push flow") ------------------------------------------

  /**
   * `HEAD` a blob: true when the repository has it, false on 404 (the push then uploads it).
   * Asks for the push scope: its only use is deciding what a push uploads, so one token serves
   * the whole push.
   */
  async headBlob(name: string, digest: string, signal?: AbortSignal): Promise<boolean> {
    const what = `HEAD blob ${digest} of ${name}`;
    const res = await this.request({
      method: 'HEAD',
      repository: name,
      path: blobPath(name, digest),
      actions: PUSH,
      followRedirects: true,
      signal,
    });
    if (res.statusCode === 404) {
      drain(res);
      return false;
    }
    if (res.statusCode !== 200) throw await this.#statusError(res, what);
    drain(res);
    return true;
  }

  /**
   * Uploads a blob (docs/registry.md "Distribution API subset"): `POST /v2/<name>/blobs/uploads/`
   * ⇒ 202 + `Location`; a blob of at most `chunkBytes` (or one in memory) then goes up as a
   * single `PUT <location>?digest=<d>` with the body; a larger file as `PATCH` chunks
   * (`Content-Range: <start>-<end>`, each streamed from the file) and a final body-less `PUT`.
   * A 416, or a `Range` that disagrees with what was sent, starts the upload over (at most 3
   * times). `Location` may be relative or absolute; its query string is kept.
   */
  async uploadBlob(name: string, blob: BlobSource, opts: UploadOptions = {}): Promise<void> {
    if (!isDigest(blob.digest)) {
      throw new RegistryError(
        'invalid',
        `upload to ${name}: ${JSON.stringify(blob.digest)} is not a sha256 digest`,
      );
    }
    const chunk = Math.max(1, Math.floor(opts.chunkBytes ?? DEFAULT_CHUNK_BYTES));
    for (let restarts = 0; ; restarts++) {
      let accepted = 0;
      const onBytes = (n: number) => {
        accepted += n;
        opts.onBytes?.(n);
      };
      try {
        if ('bytes' in blob || blob.size <= chunk) await this.#uploadWhole(name, blob, opts.signal, onBytes);
        else await this.#uploadChunked(name, blob, chunk, opts.signal, onBytes);
        return;
      } catch (error) {
        if (!(error instanceof UploadRestart)) throw error;
        if (accepted !== 0) opts.onBytes?.(-accepted);
        if (restarts >= MAX_UPLOAD_RESTARTS) {
          throw new RegistryError(
            'http',
            `upload of blob ${blob.digest} to ${name}: ${error.message}; gave up after ${restarts + 1} attempts`,
            { status: 416 },
          );
        }
        this.#log.info(
          { digest: blob.digest, repository: name, why: error.message },
          'restarting blob upload',
        );
      }
    }
  }

  /** `PUT` a manifest under a tag; resolves with the digest of the exact bytes sent. */
  async putManifest(
    name: string,
    tag: string,
    bytes: Buffer,
    mediaType: string,
    signal?: AbortSignal,
  ): Promise<string> {
    const ref: Reference = { kind: 'tag', value: tag };
    const what = `PUT ${this.display(name, ref)}`;
    const res = await this.request({
      method: 'PUT',
      repository: name,
      path: manifestPath(name, ref),
      actions: PUSH,
      headers: { 'content-type': mediaType },
      body: bytes,
      signal,
    });
    if (res.statusCode !== 201 && res.statusCode !== 200) throw await this.#statusError(res, what);
    drain(res);
    const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    const echoed = res.headers['docker-content-digest'];
    if (typeof echoed === 'string' && echoed !== '' && echoed !== digest) {
      throw new RegistryError(
        'integrity',
        `${what}: the registry stored ${echoed}, the bytes sent hash to ${digest}`,
      );
    }
    return digest;
  }

  /**
   * `DELETE` a manifest (docs/registry.md "Tag delete"): 202 ⇒ `'deleted'`, 404 ⇒ `'absent'`. A
   * registry that refuses to delete by tag (405, or 400 as CNCF distribution does) gets the tag
   * resolved with `HEAD` and the manifest deleted by digest — which removes every tag of that
   * manifest in the repository.
   */
  async deleteManifest(name: string, ref: Reference, signal?: AbortSignal): Promise<'deleted' | 'absent'> {
    const first = await this.#deleteOnce(name, ref, signal);
    if (first !== 'refused') return first;
    if (ref.kind === 'digest') {
      throw new RegistryError('http', `DELETE ${this.display(name, ref)}: refused by the registry`, {
        status: 405,
      });
    }
    const head = await this.headManifest(name, ref, signal);
    if (head === 'absent') return 'absent';
    let digest = head.digest;
    if (!isDigest(digest)) {
      // No Docker-Content-Digest on HEAD: hash the manifest itself.
      const got = await this.getManifest(name, ref, signal);
      if (got === 'absent') return 'absent';
      digest = got.indexDigest ?? got.digest;
    }
    this.#log.debug({ repository: name, tag: ref.value, digest }, 'tag delete refused; deleting by digest');
    const second = await this.#deleteOnce(name, { kind: 'digest', value: digest }, signal);
    if (second === 'refused') {
      throw new RegistryError(
        'http',
        `DELETE ${this.display(name, { kind: 'digest', value: digest })}: refused by the registry`,
        {
          status: 405,
        },
      );
    }
    return second;
  }

  async #deleteOnce(
    name: string,
    ref: Reference,
    signal: AbortSignal | undefined,
  ): Promise<'deleted' | 'absent' | 'refused'> {
    const res = await this.request({
      method: 'DELETE',
      repository: name,
      path: manifestPath(name, ref),
      actions: DELETE,
      headers: { accept: MANIFEST_ACCEPT },
      signal,
    });
    const status = res.statusCode ?? 0;
    if (status === 202 || status === 200 || status === 204) {
      drain(res);
      return 'deleted';
    }
    if (status === 404) {
      drain(res);
      return 'absent';
    }
    if (ref.kind === 'tag' && (status === 405 || status === 400)) {
      drain(res);
      return 'refused';
    }
    throw await this.#statusError(res, `DELETE ${this.display(name, ref)}`);
  }

  /** `POST /v2/<name>/blobs/uploads/` ⇒ the absolute upload URL. */
  async #startUpload(name: string, signal: AbortSignal | undefined): Promise<URL> {
    const path = `/v2/${name}/blobs/uploads/`;
    const res = await this.request({ method: 'POST', repository: name, path, actions: PUSH, signal });
    if (res.statusCode !== 202) throw await this.#statusError(res, `POST ${path}`);
    drain(res);
    return this.#location(res, new URL(path, this.#origin), `POST ${path}`);
  }

  /** The `Location` of an upload answer, resolved against the request URL. */
  #location(res: IncomingMessage, current: URL, what: string): URL {
    const location = res.headers.location;
    if (location === undefined || location === '') {
      throw new RegistryError('http', `${what}: answer ${res.statusCode} without Location`, {
        status: res.statusCode,
      });
    }
    const url = new URL(location, current);
    if (url.host !== this.base.host || url.protocol !== `${this.base.scheme}:`) {
      throw new RegistryError(
        'http',
        `${what}: upload location ${url.protocol}//${url.host} is not the registry`,
      );
    }
    return url;
  }

  /** The upload URL with `digest=` added, keeping whatever query the registry put there. */
  #withDigest(url: URL, digest: string): string {
    const query = url.search.length > 1 ? `${url.search}&` : '?';
    return `${url.origin}${url.pathname}${query}digest=${digest}`;
  }

  async #finishUpload(
    name: string,
    location: URL,
    blob: Pick<BlobSource, 'digest'>,
    body: Buffer | StreamBody | undefined,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const what = `PUT blob ${blob.digest} of ${name}`;
    const headers: Record<string, string> = body ? { 'content-type': 'application/octet-stream' } : {};
    const res = await this.request({
      method: 'PUT',
      repository: name,
      path: this.#withDigest(location, blob.digest),
      actions: PUSH,
      headers,
      body,
      signal,
    });
    if (res.statusCode === 416) {
      drain(res);
      throw new UploadRestart('416 on the final PUT');
    }
    if (res.statusCode !== 201 && res.statusCode !== 204) throw await this.#statusError(res, what);
    drain(res);
    const echoed = res.headers['docker-content-digest'];
    if (typeof echoed === 'string' && echoed !== '' && echoed !== blob.digest) {
      throw new RegistryError('integrity', `${what}: the registry stored ${echoed}`);
    }
  }

  async #uploadWhole(
    name: string,
    blob: BlobSource,
    signal: AbortSignal | undefined,
    onBytes: (n: number) => void,
  ): Promise<void> {
    const location = await this.#startUpload(name, signal);
    const body: Buffer | StreamBody =
      'bytes' in blob ? blob.bytes : { length: blob.size, open: () => fileRange(blob.file, 0, blob.size) };
    await this.#finishUpload(name, location, blob, body, signal);
    onBytes(blob.size);
  }

  async #uploadChunked(
    name: string,
    blob: Extract<BlobSource, { file: string }>,
    chunk: number,
    signal: AbortSignal | undefined,
    onBytes: (n: number) => void,
  ): Promise<void> {
    let location = await this.#startUpload(name, signal);
    for (let offset = 0; offset < blob.size; ) {
      const end = Math.min(blob.size, offset + chunk) - 1;
      const body = { length: end - offset + 1, open: () => fileRange(blob.file, offset, end - offset + 1) };
      location = await this.#patch(name, location, body, blob.digest, offset, end, signal);
      onBytes(end - offset + 1);
      offset = end + 1;
    }
    await this.#finishUpload(name, location, blob, undefined, signal);
  }

  /** `PATCH` bytes `start..end` (inclusive) of a blob from `body`; resolves with the next `Location`. */
  async #patch(
    name: string,
    location: URL,
    body: StreamBody,
    label: string,
    start: number,
    end: number,
    signal: AbortSignal | undefined,
  ): Promise<URL> {
    const what = `PATCH blob ${label} of ${name} bytes ${start}-${end}`;
    const res = await this.request({
      method: 'PATCH',
      repository: name,
      path: location.href,
      actions: PUSH,
      headers: { 'content-type': 'application/octet-stream', 'content-range': `${start}-${end}` },
      body,
      signal,
    });
    if (res.statusCode === 416) {
      drain(res);
      throw new UploadRestart(`416 on ${what}`);
    }
    if (res.statusCode !== 202 && res.statusCode !== 204) throw await this.#statusError(res, what);
    drain(res);
    const range = /^(?:bytes=)?0-(\d+)$/.exec(String(res.headers.range ?? '').trim());
    if (range && Number(range[1]) !== end) {
      throw new UploadRestart(`${what}: the registry has bytes 0-${range[1]}`);
    }
    return res.headers.location ? this.#location(res, location, what) : location;
  }

  /**
   * Uploads a blob as it is read (docs/registry.md "Push flow"): `POST`, then one `PATCH` with
   * the whole blob (`Content-Range: 0-<size-1>`, exact `Content-Length`) — or `PATCH` chunks of
   * `chunkBytes` when given — each body taken from the source as it streams, then the body-less
   * `PUT ?digest=` once the source has given its digest. `onBytes` counts bytes as they are
   * handed to the socket. Nothing is kept to send again, so a 416 or an unexpected `Range`
   * (which {@link uploadBlob} answers by starting over) fails the upload, as does a challenge
   * that would need a body re-sent.
   */
  async uploadStreamedBlob(name: string, blob: StreamedBlob, opts: UploadOptions = {}): Promise<string> {
    const chunk = opts.chunkBytes === undefined ? blob.size : Math.max(1, Math.floor(opts.chunkBytes));
    const signal = opts.signal;
    let location = await this.#startUpload(name, signal);
    try {
      for (let offset = 0; offset < blob.size; ) {
        const end = Math.min(blob.size, offset + chunk) - 1;
        const length = end - offset + 1;
        let taken = false;
        const body: StreamBody = {
          length,
          open: () => {
            if (taken) throw new Error(`${blob.label}: a streamed chunk cannot be sent twice`);
            taken = true;
            const part = blob.take(length);
            // #send pipes it in this same tick, so this listener misses nothing.
            const onBytes = opts.onBytes;
            if (onBytes) part.on('data', (c: Buffer) => onBytes(c.length));
            return part;
          },
        };
        location = await this.#patch(name, location, body, `${blob.label} (streamed)`, offset, end, signal);
        offset = end + 1;
      }
      const digest = await blob.digest();
      if (!isDigest(digest)) {
        throw new RegistryError(
          'invalid',
          `upload to ${name}: ${JSON.stringify(digest)} is not a sha256 digest`,
        );
      }
      await this.#finishUpload(name, location, { digest }, undefined, signal);
      return digest;
    } catch (error) {
      if (error instanceof UploadRestart) {
        throw new RegistryError(
          'http',
          `upload of ${blob.label} to ${name}: ${error.message}; a streamed upload cannot start over`,
          { status: 416 },
        );
      }
      throw error;
    }
  }

  /**
   * Sends one request with auth (anonymous or cached credentials first; one retry after a 401
   * challenge) and, when asked, redirects. The caller owns the response body.
   */
  async request(req: RegistryRequest): Promise<IncomingMessage> {
    const actions = req.actions ?? PULL;
    const url = new URL(req.path, this.#origin);
    if (url.host !== this.base.host)
      throw new RegistryError('invalid', `request URL ${url.href} is not on the registry host`);
    const baseHeaders: Record<string, string> = { 'user-agent': `vk-cocoon/${VERSION}`, ...req.headers };
    let authorization = await this.#authorization(req.repository, actions, req.signal);
    let res: IncomingMessage;
    let challenged = false;
    for (let busy = 0; ; ) {
      const headers = authorization ? { ...baseHeaders, authorization } : baseHeaders;
      res = await this.#send(url, req.method, headers, req.signal, req.body);
      if (BUSY_STATUS.has(res.statusCode ?? 0) && busy < BUSY_ATTEMPTS - 1) {
        // The registry asks to come back later: after its Retry-After (at most 30 s), else
        // 0.5, 1, 2 s. Every body is replayable (the 401 path sends it again too).
        const waitMs = busyWaitMs(res.headers['retry-after'], busy, Date.now());
        busy++;
        drain(res);
        this.#log.info(
          { status: res.statusCode, path: url.pathname, waitMs, attempt: busy },
          'registry busy; retrying',
        );
        await sleep(waitMs, undefined, req.signal ? { signal: req.signal } : undefined);
        continue;
      }
      if (res.statusCode !== 401) break;
      const header = res.headers['www-authenticate'];
      if (challenged || header === undefined) {
        throw await this.#statusError(res, `${req.method} ${url.pathname}`, 'auth');
      }
      drain(res);
      const challenges = parseWwwAuthenticate(header);
      const challenge =
        challenges.find((c) => c.scheme === 'bearer') ?? challenges.find((c) => c.scheme === 'basic');
      if (!challenge) {
        throw new RegistryError(
          'auth',
          `${req.method} ${url.pathname}: unsupported challenge ${JSON.stringify(header)}`,
          {
            status: 401,
          },
        );
      }
      challenged = true;
      this.#challenge = challenge;
      this.#tokens.delete(this.#tokenKey(req.repository, actions)); // the one we sent (if any) was refused
      authorization = await this.#authorization(req.repository, actions, req.signal);
      if (!authorization) {
        throw new RegistryError(
          'auth',
          `${req.method} ${url.pathname}: registry ${this.base.host} requires credentials and none are configured`,
          {
            status: 401,
          },
        );
      }
    }
    if (!req.followRedirects) return res;
    let current = url;
    for (let hops = 0; REDIRECTS.has(res.statusCode ?? 0); hops++) {
      const location = res.headers.location;
      drain(res);
      if (location === undefined)
        throw new RegistryError('http', `${req.method} ${current.href}: redirect without Location`, {
          status: res.statusCode,
        });
      if (hops >= MAX_REDIRECTS)
        throw new RegistryError(
          'http',
          `${req.method} ${url.pathname}: more than ${MAX_REDIRECTS} redirects`,
        );
      const next = new URL(location, current);
      if (next.protocol !== 'https:' && next.protocol !== 'http:') {
        throw new RegistryError('http', `redirect to unsupported URL ${next.protocol}//${next.host}`);
      }
      if (next.protocol === 'http:' && this.base.scheme === 'https') {
        throw new RegistryError('http', `redirect from HTTPS to plain HTTP (${next.host}) refused`);
      }
      // Never forward credentials to another host (docs/registry.md "Transport and errors").
      const headers = { ...baseHeaders };
      if (next.host === this.base.host && authorization) headers.authorization = authorization;
      this.#log.debug({ from: current.host, to: next.host, status: res.statusCode }, 'following redirect');
      current = next;
      res = await this.#send(next, req.method === 'HEAD' ? 'HEAD' : 'GET', headers, req.signal, undefined);
    }
    return res;
  }

  async #fetchManifestDocument(
    name: string,
    ref: Reference,
    signal: AbortSignal | undefined,
  ): Promise<{ digest: string; bytes: Buffer; document: ManifestDocument } | 'absent'> {
    const what = this.display(name, ref);
    const res = await this.request({
      method: 'GET',
      repository: name,
      path: manifestPath(name, ref),
      headers: { accept: MANIFEST_ACCEPT },
      signal,
    });
    if (res.statusCode === 404) {
      drain(res);
      return 'absent';
    }
    if (res.statusCode !== 200) throw await this.#statusError(res, `GET ${what}`);
    let bytes: Buffer;
    try {
      bytes = await readBody(res, MAX_MANIFEST_BYTES, what);
    } catch (error) {
      throw networkError(`GET ${what}`, error);
    }
    const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    if (ref.kind === 'digest' && digest !== ref.value) {
      throw new RegistryError('integrity', `${what}: manifest content hashes to ${digest}`);
    }
    const decoded = parseManifestDocument(bytes, String(res.headers['content-type'] ?? ''));
    if (!decoded.ok) throw new RegistryError('invalid', `${what}: ${decoded.error}`);
    return { digest, bytes, document: decoded.value };
  }

  #tokenKey(repository: string, actions: readonly string[]): string {
    return `${repository}|${[...actions].sort().join(',')}`;
  }

  /** Throws when a credential would go over plain HTTP to a non-loopback host (auth.ts). */
  #refusePlainHttp(scheme: string, host: string, what: string): void {
    const refusal = plainHttpCredentialRefusal(scheme, host, what);
    if (refusal === undefined) return;
    this.#log.error({ host, rule: 'no credentials over plain HTTP to a non-loopback host' }, refusal);
    throw new RegistryError('auth', refusal);
  }

  /** The Authorization header for a request, per the last challenge (none before any 401). */
  async #authorization(
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string | undefined> {
    const challenge = this.#challenge;
    if (!challenge) return undefined;
    if (challenge.scheme === 'basic') {
      const cred = await this.#credential();
      if (!cred) return undefined;
      this.#refusePlainHttp(this.base.scheme, this.base.host, 'Basic credentials');
      return basicAuthorization(cred);
    }
    return `Bearer ${await this.#token(challenge, repository, actions, signal)}`;
  }

  /** The registry's credential from the sources; a source that fails (a credential helper) is an auth error naming it. */
  async #credential(): Promise<Credential | undefined> {
    try {
      return await lookupCredential(this.#credentials, this.base.host);
    } catch (error) {
      throw new RegistryError('auth', `credentials for ${this.base.host}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  /** A cached or freshly fetched bearer token; concurrent fetches for one key are shared. */
  async #token(
    challenge: Challenge,
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string> {
    const key = this.#tokenKey(repository, actions);
    const cached = this.#tokens.get(key);
    if (cached && cached.expiresAt > Date.now()) return cached.token;
    const running = this.#tokenFetches.get(key);
    if (running) return await running;
    const fetching = this.#fetchToken(challenge, repository, actions, signal).finally(() => {
      this.#tokenFetches.delete(key);
    });
    this.#tokenFetches.set(key, fetching);
    return await fetching;
  }

  async #fetchToken(
    challenge: Challenge,
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string> {
    let url: URL;
    try {
      url = tokenUrl(challenge, repositoryScope(repository, actions));
    } catch (error) {
      throw new RegistryError('auth', `registry ${this.base.host}: ${(error as Error).message}`);
    }
    if (repository === '') url.searchParams.delete('scope');
    if (url.protocol === 'http:' && this.base.scheme === 'https') {
      throw new RegistryError('auth', `token realm ${url.host} is plain HTTP for an HTTPS registry; refused`);
    }
    const cred = await this.#credential();
    if (cred) {
      // Neither the credential to the realm nor the token it buys to the registry over plain
      // HTTP to a non-loopback host. An anonymous token (no credential) carries no secret of
      // ours and is not refused.
      this.#refusePlainHttp(url.protocol, url.host, `token realm ${url.host}`);
      this.#refusePlainHttp(this.base.scheme, this.base.host, 'a bearer token obtained with credentials');
    }
    const headers: Record<string, string> = {
      'user-agent': `vk-cocoon/${VERSION}`,
      accept: 'application/json',
    };
    if (cred) headers.authorization = basicAuthorization(cred);
    const res = await this.#send(url, 'GET', headers, signal, undefined);
    if (res.statusCode !== 200)
      throw await this.#statusError(res, `token from ${url.host}${url.pathname}`, 'auth');
    let token: string;
    let expiresInSeconds: number;
    try {
      ({ token, expiresInSeconds } = parseTokenResponse(
        (await readBody(res, MAX_TOKEN_BODY, 'token')).toString('utf8'),
      ));
    } catch (error) {
      if (error instanceof RegistryError) throw error;
      throw new RegistryError('auth', `token from ${url.host}${url.pathname}: ${(error as Error).message}`);
    }
    this.#tokens.set(this.#tokenKey(repository, actions), {
      token,
      expiresAt: tokenExpiresAt(Date.now(), expiresInSeconds),
    });
    this.#log.debug(
      { repository, actions, expiresInSeconds, authenticated: cred !== undefined },
      'registry token',
    );
    return token;
  }

  /**
   * One HTTP/1.1 exchange; resolves with the response head. A {@link StreamBody} is piped with
   * backpressure (never buffered whole); a write method without a body sends
   * `Content-Length: 0` rather than chunked encoding.
   */
  #send(
    url: URL,
    method: string,
    headers: Readonly<Record<string, string>>,
    signal: AbortSignal | undefined,
    body: Buffer | StreamBody | undefined,
  ): Promise<IncomingMessage> {
    const what = `${method} ${url.host}${url.pathname}`;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(networkError(what, signal.reason ?? new Error('aborted')));
        return;
      }
      const isHttps = url.protocol === 'https:';
      const length = body !== undefined ? body.length : method === 'GET' || method === 'HEAD' ? undefined : 0;
      const options: Http.RequestOptions = {
        method,
        headers: length === undefined ? headers : { ...headers, 'content-length': String(length) },
        agent: isHttps ? this.#httpsAgent : this.#httpAgent,
        signal,
      };
      const req = (isHttps ? https : http).request(url, options, resolve);
      req.setTimeout(this.#idleTimeoutMs, () => {
        req.destroy(new RegistryError('network', `${what}: no data for ${this.#idleTimeoutMs} ms`));
      });
      req.on('error', (error) => reject(networkError(what, error)));
      if (body === undefined || Buffer.isBuffer(body)) {
        req.end(body);
        return;
      }
      let source: Readable;
      try {
        source = body.open();
      } catch (error) {
        req.destroy(error as Error);
        return;
      }
      source.on('error', (error) => req.destroy(error));
      req.on('close', () => source.destroy());
      source.pipe(req);
    });
  }

  async #statusError(res: IncomingMessage, what: string, kind?: RegistryErrorKind): Promise<RegistryError> {
    const status = res.statusCode ?? 0;
    let detail: { code?: string; text: string } = { text: '' };
    try {
      detail = describeErrorBody(await readBody(res, MAX_ERROR_BODY, what));
    } catch {
      res.destroy();
    }
    const k: RegistryErrorKind = kind ?? (status === 401 || status === 403 ? 'auth' : 'http');
    const message = `${what}: HTTP ${status}${detail.text ? ` (${detail.text})` : ''}`;
    return new RegistryError(k, message, { status, code: detail.code });
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
