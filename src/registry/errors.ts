/**
 * Registry errors (docs/registry.md "Transport and errors"): {@link RegistryError} and its kinds,
 * and how an answer is read: a body capped in size, a body drained so its socket returns to the
 * pool, an unexpected status turned into an error (with the OCI error code of its body), a
 * failed exchange turned into a `network` error.
 */
import type { IncomingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';

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

/** A registry answer as the readers here see it: node:http's IncomingMessage, or a blob
 * body read over a connection of its own (bulk-get.ts). */
export interface RegistryResponse extends Readable {
  readonly statusCode?: number;
  readonly headers: IncomingHttpHeaders;
  /** Every byte of the body arrived. */
  readonly complete: boolean;
}

const MAX_ERROR_BODY = 64 * 1024;

/** Reads a whole body, failing once it grows past `max` bytes. */
export async function readBody(res: RegistryResponse, max: number, what: string): Promise<Buffer> {
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
export function drain(res: RegistryResponse): void {
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

export function networkError(what: string, error: unknown): RegistryError {
  if (error instanceof RegistryError) return error;
  const e = error as NodeJS.ErrnoException;
  const detail = e.name === 'AbortError' ? 'aborted' : `${e.code ? `${e.code} ` : ''}${e.message}`;
  return new RegistryError('network', `${what}: ${detail}`, { cause: error });
}

/** An answer with an unexpected status as a {@link RegistryError} (its body read, capped, for the
 * OCI error code); `kind` defaults to `auth` for 401/403, else `http`. */
export async function statusError(
  res: RegistryResponse,
  what: string,
  kind?: RegistryErrorKind,
): Promise<RegistryError> {
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
