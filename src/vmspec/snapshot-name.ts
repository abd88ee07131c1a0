/** Clone image split and the tag-aware local snapshot name (docs/contracts/pod-to-vm.md "Local snapshot name" steps 1–2). */
import { createHash } from 'node:crypto';
import { truncateUtf8 } from '../util/text.ts';

/** Longest local snapshot name cocoon accepts. */
export const MAX_SNAPSHOT_NAME_LENGTH = 63;
/** Characters kept from an over-long name before `-` and the hash. */
const KEPT_PREFIX_LENGTH = 50;
/** Lower-case hex digits of the SHA-256 appended to an over-long name. */
const HASH_HEX_LENGTH = 12;

/** A registry-relative clone image `repo[:tag]`. */
export interface CloneImage {
  readonly repo: string;
  /** `latest` when the image has no tag or an empty one. */
  readonly tag: string;
}

/** Splits a clone image at the first `:` (docs/contracts/pod-to-vm.md "Local snapshot name" step 1); an empty tag ⇒ `latest`. */
export function splitCloneImage(image: string): CloneImage {
  const colon = image.indexOf(':');
  if (colon < 0) return { repo: image, tag: 'latest' };
  const tag = image.slice(colon + 1);
  return { repo: image.slice(0, colon), tag: tag === '' ? 'latest' : tag };
}

/**
 * The local snapshot name of a clone image (docs/contracts/pod-to-vm.md "Local snapshot name" step 2): `repo` for tag
 * `latest` (or none), else `repo:tag`. A name longer than 63 characters becomes its first 50
 * characters + `-` + the first 12 lowercase hex digits of SHA-256(full name), 63 in total.
 *
 * Byte-identical to the Go implementation for ASCII names (the only ones cocoon accepts:
 * snapshot names match `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`). Go counts bytes; for a
 * non-ASCII name this counts UTF-8 bytes too but never splits a code point, so such a name
 * (which cocoon rejects anyway) may differ from Go's byte slice.
 */
export function localSnapshotName(image: string): string {
  const { repo, tag } = splitCloneImage(image);
  const name = tag === 'latest' ? repo : `${repo}:${tag}`;
  if (Buffer.byteLength(name, 'utf8') <= MAX_SNAPSHOT_NAME_LENGTH) return name;
  const digest = createHash('sha256').update(name, 'utf8').digest('hex').slice(0, HASH_HEX_LENGTH);
  return `${truncateUtf8(name, KEPT_PREFIX_LENGTH)}-${digest}`;
}
