import { isLoopbackHost } from '../util/loopback.ts';

/**
 * Registry naming (docs/registry.md "Naming", docs/registry.md "Transport and errors"), pure: the `OCI_REGISTRY` base (host plus optional path
 * prefix), repository names under it, and tag/digest references.
 */

/** Where the registry lives and how to reach it. */
export interface RegistryBase {
  /** `http` only for loopback hosts, an explicit `http://` base, or `VK_REGISTRY_PLAIN_HTTP`. */
  readonly scheme: 'http' | 'https';
  /** `host[:port]` as in a URL (`[::1]:5000` for IPv6). */
  readonly host: string;
  /** Path prefix under which every repository lives, without slashes at the ends (may be `''`). */
  readonly prefix: string;
}

/** A manifest reference: a tag, or a `sha256:` digest (docs/registry.md "Naming"). */
export type Reference =
  | { readonly kind: 'tag'; readonly value: string }
  | { readonly kind: 'digest'; readonly value: string };

export class InvalidReferenceError extends Error {
  override readonly name = 'InvalidReferenceError';
}

const HOST_RE = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?$/;
/** One path component of an OCI distribution repository name. */
const COMPONENT = '[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*';
const NAME_RE = new RegExp(`^${COMPONENT}(?:/${COMPONENT})*$`);
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;
/** The longest repository name many registries accept (distribution's limit). */
const MAX_NAME_LENGTH = 255;

/** Loopback (`localhost`, 127.0.0.0/8, `[::1]`) with any port (docs/registry.md "Transport and
 * errors"; the one definition is src/util/loopback.ts). */
export { isLoopbackHost };

/**
 * Parses `OCI_REGISTRY` (`host[:port][/path]`, optionally with an explicit `http://` or
 * `https://`). Without an explicit scheme the registry is HTTPS except for loopback hosts or
 * when `plainHttp` (`VK_REGISTRY_PLAIN_HTTP=true`) is set.
 */
export function parseRegistryBase(value: string, opts: { plainHttp?: boolean } = {}): RegistryBase {
  let rest = value.trim();
  let scheme: 'http' | 'https' | undefined;
  const explicit = /^(https?):\/\//i.exec(rest);
  if (explicit) {
    scheme = explicit[1]!.toLowerCase() as 'http' | 'https';
    rest = rest.slice(explicit[0].length);
  }
  rest = rest.replace(/\/+$/, '');
  const slash = rest.indexOf('/');
  const host = slash < 0 ? rest : rest.slice(0, slash);
  const prefix = slash < 0 ? '' : rest.slice(slash + 1);
  if (!HOST_RE.test(host))
    throw new InvalidReferenceError(`registry base ${JSON.stringify(value)}: invalid host`);
  if (prefix !== '' && !NAME_RE.test(prefix)) {
    throw new InvalidReferenceError(
      `registry base ${JSON.stringify(value)}: invalid path prefix ${JSON.stringify(prefix)}`,
    );
  }
  scheme ??= opts.plainHttp === true || isLoopbackHost(host) ? 'http' : 'https';
  return { scheme, host, prefix };
}

/** `scheme://host` of the registry. */
export function registryOrigin(base: RegistryBase): string {
  return `${base.scheme}://${base.host}`;
}

/**
 * The repository name of a registry-relative `repo` under the base's path prefix
 * (`<prefix>/<repo>`). Throws for names the distribution grammar rejects (upper case, empty
 * components, `..`), so nothing malformed reaches a URL.
 */
export function repositoryName(base: RegistryBase, repo: string): string {
  const trimmed = repo.replace(/^\/+|\/+$/g, '');
  if (!NAME_RE.test(trimmed)) {
    throw new InvalidReferenceError(
      `repository ${JSON.stringify(repo)}: expected lower-case path components of [a-z0-9] separated by '.', '_', '__' or '-'`,
    );
  }
  const name = base.prefix === '' ? trimmed : `${base.prefix}/${trimmed}`;
  if (name.length > MAX_NAME_LENGTH) {
    throw new InvalidReferenceError(
      `repository ${JSON.stringify(name)}: longer than ${MAX_NAME_LENGTH} characters`,
    );
  }
  return name;
}

/** True when `value` is a `sha256:<64 hex>` digest. */
export function isDigest(value: string): boolean {
  return DIGEST_RE.test(value);
}

/**
 * Parses a tag or digest. `sha256:<hex>` is a digest; anything else must be a valid tag
 * (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`). An empty reference means `latest`.
 */
export function parseReference(ref: string): Reference {
  if (ref === '') return { kind: 'tag', value: 'latest' };
  if (ref.startsWith('sha256:')) {
    if (!DIGEST_RE.test(ref))
      throw new InvalidReferenceError(`reference ${JSON.stringify(ref)}: invalid sha256 digest`);
    return { kind: 'digest', value: ref };
  }
  if (!TAG_RE.test(ref)) throw new InvalidReferenceError(`reference ${JSON.stringify(ref)}: invalid tag`);
  return { kind: 'tag', value: ref };
}

/** `<name>:<tag>` or `<name>@<digest>` (docs/registry.md "Naming"). */
export function joinReference(name: string, ref: Reference): string {
  return ref.kind === 'digest' ? `${name}@${ref.value}` : `${name}:${ref.value}`;
}

/** The full, human-readable reference `host/name:tag` (or `@digest`) for logs and errors. */
export function displayReference(base: RegistryBase, name: string, ref: Reference): string {
  return `${base.host}/${joinReference(name, ref)}`;
}

/** `/v2/<name>/manifests/<ref>`. */
export function manifestPath(name: string, ref: Reference): string {
  return `/v2/${name}/manifests/${ref.value}`;
}

/** `/v2/<name>/blobs/<digest>`. */
export function blobPath(name: string, digest: string): string {
  if (!DIGEST_RE.test(digest))
    throw new InvalidReferenceError(`blob digest ${JSON.stringify(digest)}: not a sha256 digest`);
  return `/v2/${name}/blobs/${digest}`;
}
