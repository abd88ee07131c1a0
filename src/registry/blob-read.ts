/**
 * Blob reads (docs/registry.md "Distribution API subset"): a blob streamed and verified against
 * its descriptor as it arrives ({@link VerifyingStream}), a body cut short resumed with a `Range`
 * request (at most {@link BLOB_RESUMES} times per read), redirects followed without forwarding
 * `Authorization`; and a small blob (a config) read whole.
 */
import { createHash, type Hash } from 'node:crypto';
import { type Readable, Transform, type TransformCallback } from 'node:stream';
import type { Descriptor } from './artifact.ts';
import { networkError, RegistryError, type RegistryResponse, statusError } from './errors.ts';
import { blobPath } from './reference.ts';
import { PIECE_BYTES } from './transfer.ts';
import type { RegistryTransport } from './transport.ts';

/** Range requests after a blob body was cut short, per blob read. */
export const BLOB_RESUMES = 3;

/**
 * Verifies a blob while it streams: counts bytes (failing at the first byte past the
 * descriptor size — no trailing data), hashes with SHA-256, and at the end fails unless both
 * the size and the digest match. The failure arrives before `end`, so a consumer never takes
 * an unverified blob for complete. Small chunks (node:http reads 64 KiB at a time) are gathered
 * into pieces of {@link PIECE_BYTES}, each cut to the blob's end, so a piece is full once the
 * blob's bytes are in; a chunk of a piece or more (bulk-get.ts reads up to 1 MiB) goes on as it is.
 */
class VerifyingStream extends Transform {
  readonly #digest: string;
  readonly #size: number;
  readonly #hash: Hash = createHash('sha256');
  #seen = 0;
  /** The piece being gathered, and how much of it is filled. */
  #piece: Buffer | undefined;
  #filled = 0;

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
    if (chunk.length >= PIECE_BYTES) {
      // A chunk as large as a piece goes on as it is (the same buffer: the pull hands it back
      // to the read buffers once written, slab-pool.ts), after what was gathered before it.
      if (this.#piece !== undefined) this.push(this.#piece.subarray(0, this.#filled));
      this.#piece = undefined;
      cb(null, chunk);
      return;
    }
    let at = 0;
    while (at < chunk.length) {
      if (this.#piece === undefined) {
        this.#piece = Buffer.allocUnsafe(
          Math.min(PIECE_BYTES, this.#size - (this.#seen - chunk.length + at)),
        );
        this.#filled = 0;
      }
      const n = chunk.copy(this.#piece, this.#filled, at);
      this.#filled += n;
      at += n;
      if (this.#filled === this.#piece.length) {
        this.push(this.#piece);
        this.#piece = undefined;
      }
    }
    cb();
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
    // Every byte is in: the last piece, cut to the blob's end, has gone out full.
    cb();
  }
}

/**
 * Streams a blob, verified against its descriptor: the returned stream errors (before `end`)
 * on a digest or size mismatch, extra bytes, a truncated body or a network failure. 404 is an
 * error (`BLOB_UNKNOWN`). Redirects are followed without forwarding `Authorization`.
 */
export async function getBlob(
  t: RegistryTransport,
  name: string,
  desc: Pick<Descriptor, 'digest' | 'size'>,
  signal?: AbortSignal,
): Promise<Readable> {
  const what = `blob ${desc.digest} of ${name}`;
  const res = await t.request({
    method: 'GET',
    repository: name,
    path: blobPath(name, desc.digest),
    followRedirects: true,
    bulk: true,
    signal,
  });
  if (res.statusCode !== 200) throw await statusError(res, `GET ${what}`);
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
  const feed = (body: RegistryResponse, skip: number) => {
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
      t.log.warn(
        { blob: desc.digest, bytes: seen, size: desc.size, attempt: resumes, err: error?.message },
        'registry blob read cut short; resuming with a Range request',
      );
      t.request({
        method: 'GET',
        repository: name,
        path: blobPath(name, desc.digest),
        headers: { range: `bytes=${seen}-` },
        followRedirects: true,
        bulk: true,
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
          } else verifier.destroy(await statusError(next, `GET ${what} (resumed at ${seen})`));
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
export async function getBlobBytes(
  t: RegistryTransport,
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
  const stream = await getBlob(t, name, desc, signal);
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}
