/**
 * Manifests (docs/registry.md "Distribution API subset"): HEAD and GET (with the mandatory
 * `Accept` header; an index resolved to one child, docs/registry.md "Reader validation"), PUT
 * under a tag, and DELETE with the tag ⇒ digest fallback (docs/registry.md "Tag delete").
 * "Absent" (404 on a manifest) is a result value, not an error.
 */
import { createHash } from 'node:crypto';
import {
  type ImageManifest,
  MANIFEST_ACCEPT,
  MAX_MANIFEST_BYTES,
  type ManifestDocument,
  parseManifestDocument,
  selectIndexChild,
} from './artifact.ts';
import { drain, networkError, RegistryError, readBody, statusError } from './errors.ts';
import { displayReference, isDigest, manifestPath, type Reference } from './reference.ts';
import { DELETE, PUSH, type RegistryTransport } from './transport.ts';

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

/** `HEAD` a manifest: `{digest}` when it exists, `'absent'` on 404 (docs/registry.md "Transport and errors"). */
export async function headManifest(
  t: RegistryTransport,
  name: string,
  ref: Reference,
  signal?: AbortSignal,
): Promise<ManifestHead | 'absent'> {
  const res = await t.request({
    method: 'HEAD',
    repository: name,
    path: manifestPath(name, ref),
    headers: { accept: MANIFEST_ACCEPT },
    signal,
  });
  if (res.statusCode !== 200 && res.statusCode !== 404) {
    throw await statusError(res, `HEAD ${displayReference(t.base, name, ref)}`);
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
export async function getManifest(
  t: RegistryTransport,
  name: string,
  ref: Reference,
  signal?: AbortSignal,
): Promise<FetchedManifest | 'absent'> {
  const top = await fetchManifestDocument(t, name, ref, signal);
  if (top === 'absent') return 'absent';
  if (top.document.kind === 'manifest') {
    return { ...top, document: top.document, manifest: top.document.manifest, indexDigest: undefined };
  }
  const child = selectIndexChild(top.document.children);
  if (!child) {
    throw new RegistryError(
      'invalid',
      `${displayReference(t.base, name, ref)}: image index has no usable child manifest`,
    );
  }
  const childRef: Reference = { kind: 'digest', value: child.digest };
  const sub = await fetchManifestDocument(t, name, childRef, signal);
  if (sub === 'absent') {
    throw new RegistryError(
      'http',
      `${displayReference(t.base, name, childRef)}: index child manifest not found`,
      {
        status: 404,
        code: 'MANIFEST_UNKNOWN',
      },
    );
  }
  if (sub.document.kind !== 'manifest') {
    throw new RegistryError('invalid', `${displayReference(t.base, name, childRef)}: nested image index`);
  }
  return { ...sub, document: sub.document, manifest: sub.document.manifest, indexDigest: top.digest };
}

/** `PUT` a manifest under a tag; resolves with the digest of the exact bytes sent. */
export async function putManifest(
  t: RegistryTransport,
  name: string,
  tag: string,
  bytes: Buffer,
  mediaType: string,
  signal?: AbortSignal,
): Promise<string> {
  const ref: Reference = { kind: 'tag', value: tag };
  const what = `PUT ${displayReference(t.base, name, ref)}`;
  const res = await t.request({
    method: 'PUT',
    repository: name,
    path: manifestPath(name, ref),
    actions: PUSH,
    headers: { 'content-type': mediaType },
    body: bytes,
    signal,
  });
  if (res.statusCode !== 201 && res.statusCode !== 200) throw await statusError(res, what);
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
export async function deleteManifest(
  t: RegistryTransport,
  name: string,
  ref: Reference,
  signal?: AbortSignal,
): Promise<'deleted' | 'absent'> {
  const first = await deleteOnce(t, name, ref, signal);
  if (first !== 'refused') return first;
  if (ref.kind === 'digest') {
    throw new RegistryError(
      'http',
      `DELETE ${displayReference(t.base, name, ref)}: refused by the registry`,
      {
        status: 405,
      },
    );
  }
  const head = await headManifest(t, name, ref, signal);
  if (head === 'absent') return 'absent';
  let digest = head.digest;
  if (!isDigest(digest)) {
    // No Docker-Content-Digest on HEAD: hash the manifest itself.
    const got = await getManifest(t, name, ref, signal);
    if (got === 'absent') return 'absent';
    digest = got.indexDigest ?? got.digest;
  }
  t.log.debug({ repository: name, tag: ref.value, digest }, 'tag delete refused; deleting by digest');
  const second = await deleteOnce(t, name, { kind: 'digest', value: digest }, signal);
  if (second === 'refused') {
    throw new RegistryError(
      'http',
      `DELETE ${displayReference(t.base, name, { kind: 'digest', value: digest })}: refused by the registry`,
      {
        status: 405,
      },
    );
  }
  return second;
}

async function deleteOnce(
  t: RegistryTransport,
  name: string,
  ref: Reference,
  signal: AbortSignal | undefined,
): Promise<'deleted' | 'absent' | 'refused'> {
  const res = await t.request({
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
  throw await statusError(res, `DELETE ${displayReference(t.base, name, ref)}`);
}

async function fetchManifestDocument(
  t: RegistryTransport,
  name: string,
  ref: Reference,
  signal: AbortSignal | undefined,
): Promise<{ digest: string; bytes: Buffer; document: ManifestDocument } | 'absent'> {
  const what = displayReference(t.base, name, ref);
  const res = await t.request({
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
  if (res.statusCode !== 200) throw await statusError(res, `GET ${what}`);
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
