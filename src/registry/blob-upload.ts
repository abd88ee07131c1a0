/**
 * Blob uploads (docs/registry.md "Push flow", docs/registry.md "Distribution API subset"): blob
 * HEAD; an upload (POST, then one PUT for a small blob, or PATCH chunks streamed from a file and
 * a final PUT; 416 restarts the upload, {@link UploadRestart}); a streamed upload (one PATCH, or
 * chunks, taken from a source as it is read, the digest last; nothing to restart from).
 */
import type { Readable } from 'node:stream';
import { drain, RegistryError, type RegistryResponse, statusError } from './errors.ts';
import { blobPath, isDigest } from './reference.ts';
import { PUSH, type RegistryTransport, type StreamBody } from './transport.ts';

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

/** A 416 or an unexpected upload offset: the upload session is started over. */
class UploadRestart extends Error {}

/**
 * `HEAD` a blob: true when the repository has it, false on 404 (the push then uploads it).
 * Asks for the push scope: its only use is deciding what a push uploads, so one token serves
 * the whole push.
 */
export async function headBlob(
  t: RegistryTransport,
  name: string,
  digest: string,
  signal?: AbortSignal,
): Promise<boolean> {
  const what = `HEAD blob ${digest} of ${name}`;
  const res = await t.request({
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
  if (res.statusCode !== 200) throw await statusError(res, what);
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
export async function uploadBlob(
  t: RegistryTransport,
  name: string,
  blob: BlobSource,
  opts: UploadOptions = {},
): Promise<void> {
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
      if ('bytes' in blob || blob.size <= chunk) await uploadWhole(t, name, blob, opts.signal, onBytes);
      else await uploadChunked(t, name, blob, chunk, opts.signal, onBytes);
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
      t.log.info({ digest: blob.digest, repository: name, why: error.message }, 'restarting blob upload');
    }
  }
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
export async function uploadStreamedBlob(
  t: RegistryTransport,
  name: string,
  blob: StreamedBlob,
  opts: UploadOptions = {},
): Promise<string> {
  const chunk = opts.chunkBytes === undefined ? blob.size : Math.max(1, Math.floor(opts.chunkBytes));
  const signal = opts.signal;
  let location = await startUpload(t, name, signal);
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
      location = await patch(t, name, location, body, `${blob.label} (streamed)`, offset, end, signal);
      offset = end + 1;
    }
    const digest = await blob.digest();
    if (!isDigest(digest)) {
      throw new RegistryError(
        'invalid',
        `upload to ${name}: ${JSON.stringify(digest)} is not a sha256 digest`,
      );
    }
    await finishUpload(t, name, location, { digest }, undefined, signal);
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

/** `POST /v2/<name>/blobs/uploads/` ⇒ the absolute upload URL. */
async function startUpload(
  t: RegistryTransport,
  name: string,
  signal: AbortSignal | undefined,
): Promise<URL> {
  const path = `/v2/${name}/blobs/uploads/`;
  const res = await t.request({ method: 'POST', repository: name, path, actions: PUSH, signal });
  if (res.statusCode !== 202) throw await statusError(res, `POST ${path}`);
  drain(res);
  return uploadLocation(t, res, new URL(path, t.origin), `POST ${path}`);
}

/** The `Location` of an upload answer, resolved against the request URL. */
function uploadLocation(t: RegistryTransport, res: RegistryResponse, current: URL, what: string): URL {
  const location = res.headers.location;
  if (location === undefined || location === '') {
    throw new RegistryError('http', `${what}: answer ${res.statusCode} without Location`, {
      status: res.statusCode,
    });
  }
  const url = new URL(location, current);
  if (url.host !== t.base.host || url.protocol !== `${t.base.scheme}:`) {
    throw new RegistryError(
      'http',
      `${what}: upload location ${url.protocol}//${url.host} is not the registry`,
    );
  }
  return url;
}

/** The upload URL with `digest=` added, keeping whatever query the registry put there. */
function withDigest(url: URL, digest: string): string {
  const query = url.search.length > 1 ? `${url.search}&` : '?';
  return `${url.origin}${url.pathname}${query}digest=${digest}`;
}

async function finishUpload(
  t: RegistryTransport,
  name: string,
  location: URL,
  blob: Pick<BlobSource, 'digest'>,
  body: Buffer | StreamBody | undefined,
  signal: AbortSignal | undefined,
): Promise<void> {
  const what = `PUT blob ${blob.digest} of ${name}`;
  const headers: Record<string, string> = body ? { 'content-type': 'application/octet-stream' } : {};
  const res = await t.request({
    method: 'PUT',
    repository: name,
    path: withDigest(location, blob.digest),
    actions: PUSH,
    headers,
    body,
    signal,
  });
  if (res.statusCode === 416) {
    drain(res);
    throw new UploadRestart('416 on the final PUT');
  }
  if (res.statusCode !== 201 && res.statusCode !== 204) throw await statusError(res, what);
  drain(res);
  const echoed = res.headers['docker-content-digest'];
  if (typeof echoed === 'string' && echoed !== '' && echoed !== blob.digest) {
    throw new RegistryError('integrity', `${what}: the registry stored ${echoed}`);
  }
}

async function uploadWhole(
  t: RegistryTransport,
  name: string,
  blob: BlobSource,
  signal: AbortSignal | undefined,
  onBytes: (n: number) => void,
): Promise<void> {
  const location = await startUpload(t, name, signal);
  const body: Buffer | StreamBody =
    'bytes' in blob ? blob.bytes : { length: blob.size, file: blob.file, start: 0 };
  await finishUpload(t, name, location, blob, body, signal);
  onBytes(blob.size);
}

async function uploadChunked(
  t: RegistryTransport,
  name: string,
  blob: Extract<BlobSource, { file: string }>,
  chunk: number,
  signal: AbortSignal | undefined,
  onBytes: (n: number) => void,
): Promise<void> {
  let location = await startUpload(t, name, signal);
  for (let offset = 0; offset < blob.size; ) {
    const end = Math.min(blob.size, offset + chunk) - 1;
    const body: StreamBody = { length: end - offset + 1, file: blob.file, start: offset };
    location = await patch(t, name, location, body, blob.digest, offset, end, signal);
    onBytes(end - offset + 1);
    offset = end + 1;
  }
  await finishUpload(t, name, location, blob, undefined, signal);
}

/** `PATCH` bytes `start..end` (inclusive) of a blob from `body`; resolves with the next `Location`. */
async function patch(
  t: RegistryTransport,
  name: string,
  location: URL,
  body: StreamBody,
  label: string,
  start: number,
  end: number,
  signal: AbortSignal | undefined,
): Promise<URL> {
  const what = `PATCH blob ${label} of ${name} bytes ${start}-${end}`;
  const res = await t.request({
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
  if (res.statusCode !== 202 && res.statusCode !== 204) throw await statusError(res, what);
  drain(res);
  const range = /^(?:bytes=)?0-(\d+)$/.exec(String(res.headers.range ?? '').trim());
  if (range && Number(range[1]) !== end) {
    throw new UploadRestart(`${what}: the registry has bytes 0-${range[1]}`);
  }
  return res.headers.location ? uploadLocation(t, res, location, what) : location;
}
