/**
 * Snapshot artifacts, write side, pure (docs/registry.md "Push flow", docs/registry.md "Snapshot
 * artifact format"): the `snapshot.json` envelope of `cocoon snapshot export` read and
 * translated into the camelCase v1 config blob, per-file metadata from the tar headers
 * (mode, the opaque `COCOON.sparse.*` PAX records), the manifest (pretty-printed, annotations
 * in a fixed order) and the caller-annotation check. Nothing here does I/O.
 */
import type { Decoded } from '../cocoon/records.ts';
import { type Descriptor, MEDIA_TYPE, TITLE_ANNOTATION, titleProblem } from './artifact.ts';
import {
  parseSnapshotConfig,
  type SnapshotFileInfo,
  SPARSE_MAP_PAX,
  SPARSE_SIZE_PAX,
} from './artifact-config.ts';

/** Manifest annotations the provider writes itself (docs/registry.md "Manifest annotations"). */
export const ANNOTATION = {
  created: 'org.opencontainers.image.created',
  baseImage: 'cocoonstack.snapshot.baseimage',
  fromNode: 'cocoonstack.snapshot.from-node',
  /** TS addition: the namespace of the pod whose VM was saved (outside the reserved prefix, so
   * it travels as a caller annotation; readers that do not know it ignore it). */
  namespace: 'vm.cocoonstack.io/namespace',
  /** Owner stamps beside the namespace (docs/security.md, "Registry stamps"). */
  controllerUid: 'vm.cocoonstack.io/controller-uid',
  pod: 'vm.cocoonstack.io/pod',
  podUid: 'vm.cocoonstack.io/pod-uid',
  /** TS addition (docs/peer-restore.md): where the pushing host serves this state to its peers
   * (`ip:port`) and the SHA-256 of its peer certificate, which a waking host pins. */
  peerAddress: 'vm.cocoonstack.io/peer-address',
  peerPin: 'vm.cocoonstack.io/peer-cert-sha256',
} as const;

/** Caller annotations may not use this prefix: it is the provider's own. */
export const RESERVED_ANNOTATION_PREFIX = 'cocoonstack.';

/** Largest `snapshot.json` the push reads (the envelope is a few hundred bytes). */
export const MAX_ENVELOPE_BYTES = 1024 * 1024;

/**
 * Checks caller annotations (the pod's snapshot-annotations JSON): an object of non-empty
 * string keys and string values, none under the reserved `cocoonstack.` prefix.
 */
export function checkCallerAnnotations(input: unknown): Decoded<Readonly<Record<string, string>>> {
  if (input === undefined || input === null) return { ok: true, value: {} };
  if (typeof input !== 'object' || Array.isArray(input)) {
    return { ok: false, error: 'annotations: expected a JSON object of strings' };
  }
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(input as Record<string, unknown>)) {
    if (key === '') return { ok: false, error: 'annotations: empty key' };
    if (key.startsWith(RESERVED_ANNOTATION_PREFIX)) {
      return {
        ok: false,
        error: `annotations: key ${JSON.stringify(key)} is reserved (keys starting with "${RESERVED_ANNOTATION_PREFIX}" are the provider's)`,
      };
    }
    if (typeof value !== 'string') {
      return { ok: false, error: `annotations: value of ${JSON.stringify(key)} is not a string` };
    }
    out[key] = value;
  }
  return { ok: true, value: out };
}

/** The `snapshot.json` of an export tar: `{"version":1,"config":{...}}` in snake_case. */
export interface ExportEnvelope {
  readonly version: 1;
  readonly config: Readonly<Record<string, unknown>>;
  /** `config.id`: the snapshot's identity anchor. */
  readonly id: string;
}

/** Decodes the export's `snapshot.json` (docs/contracts/cocoon-cli.md "Small shapes"). */
export function parseExportEnvelope(body: string | Uint8Array): Decoded<ExportEnvelope> {
  let json: unknown;
  try {
    json = JSON.parse(typeof body === 'string' ? body : Buffer.from(body).toString('utf8'));
  } catch (error) {
    return { ok: false, error: `snapshot.json: invalid JSON: ${(error as Error).message}` };
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    return { ok: false, error: 'snapshot.json: not a JSON object' };
  }
  const o = json as Record<string, unknown>;
  if (o.version !== 1) {
    return { ok: false, error: `snapshot.json: unsupported snapshot archive version ${String(o.version)}` };
  }
  const config = o.config;
  if (typeof config !== 'object' || config === null || Array.isArray(config)) {
    return { ok: false, error: 'snapshot.json: config is not a JSON object' };
  }
  const id = (config as Record<string, unknown>).id;
  if (typeof id !== 'string' || id === '') {
    return { ok: false, error: 'snapshot.json: config.id is missing or empty' };
  }
  return { ok: true, value: { version: 1, config: config as Record<string, unknown>, id } };
}

/**
 * The layer title of an export tar entry: the entry name without a leading `./`, which must be
 * a plain file name (readers refuse anything else, docs/registry.md "Reader validation").
 */
export function exportEntryTitle(name: string): Decoded<string> {
  const title = name.replace(/^(\.\/)+/, '');
  const problem = titleProblem(title);
  if (problem) return { ok: false, error: `export entry ${JSON.stringify(name)}: name ${problem}` };
  return { ok: true, value: title };
}

/**
 * `files[title]` of a tar entry: its permission bits, its size (the bytes of the entry, which
 * is the layer), and for a sparse file the PAX records `COCOON.sparse.map` (a string, verbatim)
 * and `COCOON.sparse.size` as a JSON number: cocoonstack's Go reader decodes `sparseSize` as an
 * int64 and refuses the whole config when it finds the PAX text (docs/registry.md "Config
 * blob"). A size that is not a decimal byte count refuses the export.
 */
export function exportedFileInfo(
  title: string,
  mode: number | undefined,
  size: number,
  pax: Readonly<Record<string, string>> | null | undefined,
): Decoded<SnapshotFileInfo> {
  const info: { mode?: number; size: number; sparseMap?: string; sparseSize?: number } =
    mode !== undefined ? { mode: mode & 0o7777, size } : { size };
  const map = pax?.[SPARSE_MAP_PAX];
  const sparseSize = pax?.[SPARSE_SIZE_PAX];
  if (map !== undefined) info.sparseMap = map;
  if (sparseSize !== undefined) {
    const n = /^\d{1,16}$/.test(sparseSize) ? Number(sparseSize) : Number.NaN;
    if (!Number.isSafeInteger(n))
      return {
        ok: false,
        error: `export entry ${JSON.stringify(title)}: ${SPARSE_SIZE_PAX} ${JSON.stringify(sparseSize.slice(0, 40))} is not a byte count`,
      };
    info.sparseSize = n;
  }
  return { ok: true, value: info };
}

/** Envelope keys with a fixed place and name in the config blob (snake_case ⇒ camelCase). */
const KNOWN_KEYS: readonly (readonly [string, string])[] = [
  ['image', 'image'],
  ['image_digest', 'imageDigest'],
  ['image_type', 'imageType'],
  ['image_blob_ids', 'imageBlobIds'],
  ['hypervisor', 'hypervisor'],
  ['cpu', 'cpu'],
  ['memory', 'memory'],
  ['storage', 'storage'],
  ['nics', 'nics'],
  ['network', 'network'],
  ['windows', 'windows'],
  ['description', 'description'],
];
/** Envelope keys that never reach the config: the identity (as `snapshotId`) and the local name. */
const DROPPED_KEYS = new Set(['id', 'name', 'created_at']);

/** Empty in the `omitempty` sense: absent, null, '', 0, false, [] or {}. */
function isEmpty(value: unknown): boolean {
  if (value === undefined || value === null || value === '' || value === 0 || value === false) return true;
  if (Array.isArray(value)) return value.length === 0;
  if (typeof value === 'object') return Object.keys(value).length === 0;
  return false;
}

function camelCase(key: string): string {
  return key.replace(/_([a-z0-9])/g, (_m, c: string) => c.toUpperCase());
}

/**
 * The v1 config blob of an exported snapshot (docs/registry.md "Config blob"): `schemaVersion`
 * `v1`, `snapshotId` = the envelope's `id`, the envelope's fields in camelCase (empty ones
 * omitted; unknown ones passed through in camelCase; the local `name` dropped), `files` in
 * tar order, and `createdAt` when the envelope carries `created_at`. The result is checked
 * with the reader's own validation, so a push never writes a config a pull would refuse.
 */
export function snapshotConfigFromEnvelope(
  envelope: ExportEnvelope,
  files: Readonly<Record<string, SnapshotFileInfo>>,
  version: 1 | 2 = 1,
): Decoded<Buffer> {
  const c = envelope.config;
  const out: Record<string, unknown> = { schemaVersion: `v${version}`, snapshotId: envelope.id };
  const known = new Set(KNOWN_KEYS.map(([k]) => k));
  for (const [from, to] of KNOWN_KEYS) if (!isEmpty(c[from])) out[to] = c[from];
  for (const [key, value] of Object.entries(c)) {
    if (known.has(key) || DROPPED_KEYS.has(key) || isEmpty(value)) continue;
    const to = camelCase(key);
    if (to === 'files' || to === 'schemaVersion' || to === 'snapshotId' || to === 'createdAt') continue;
    out[to] = value;
  }
  out.files = files;
  if (typeof c.created_at === 'string' && c.created_at !== '') out.createdAt = c.created_at;
  const bytes = Buffer.from(JSON.stringify(out));
  const check = parseSnapshotConfig(bytes, {
    version,
    config: CHECK_DESCRIPTOR,
    layers: [],
    annotations: {},
  });
  if (!check.ok)
    return { ok: false, error: `snapshot.json does not translate into a valid config: ${check.error}` };
  return { ok: true, value: bytes };
}

const CHECK_DESCRIPTOR: Descriptor = {
  mediaType: MEDIA_TYPE.snapshotConfig,
  digest: `sha256:${'0'.repeat(64)}`,
  size: 0,
  annotations: {},
};

/** `2026-08-12T09:30:00Z`: RFC 3339, UTC, whole seconds. */
export function rfc3339Utc(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** One layer of the manifest being written. */
export interface WrittenLayer {
  readonly title: string;
  readonly mediaType: string;
  readonly digest: string;
  readonly size: number;
  /** After the title (v2 chunks: `cocoonstack.chunk.index` / `.count`). */
  readonly annotations?: Readonly<Record<string, string>>;
}

export interface SnapshotManifestInput {
  readonly config: { readonly digest: string; readonly size: number };
  /** In tar order. */
  readonly layers: readonly WrittenLayer[];
  readonly created: Date;
  /** The pod image at push time; `''` omits the annotation. */
  readonly baseImage: string;
  /** Hibernate re-put only. */
  readonly fromNode?: string;
  /** Already checked with {@link checkCallerAnnotations}. */
  readonly annotations?: Readonly<Record<string, string>>;
  /** The format (default 1): the artifact type, `...snapshot.v<version>+json`. */
  readonly version?: 1 | 2;
}

/**
 * The OCI manifest of a snapshot (docs/registry.md "Manifest annotations"): artifactType, config
 * descriptor, one titled layer per blob (v1: per file), and annotations in this order — `created` (always),
 * `baseimage` (when set), `from-node` (hibernate re-put), then the caller's. Pretty-printed with
 * 2-space indentation; the digest is of exactly these bytes.
 */
export function buildSnapshotManifest(m: SnapshotManifestInput): Buffer {
  const annotations: Record<string, string> = { [ANNOTATION.created]: rfc3339Utc(m.created) };
  if (m.baseImage !== '') annotations[ANNOTATION.baseImage] = m.baseImage;
  if (m.fromNode !== undefined && m.fromNode !== '') annotations[ANNOTATION.fromNode] = m.fromNode;
  for (const [k, v] of Object.entries(m.annotations ?? {})) {
    if (k.startsWith(RESERVED_ANNOTATION_PREFIX)) continue; // checked by the caller; never overrides ours
    annotations[k] = v;
  }
  const doc = {
    schemaVersion: 2,
    mediaType: MEDIA_TYPE.ociManifest,
    artifactType: m.version === 2 ? MEDIA_TYPE.snapshotV2 : MEDIA_TYPE.snapshotV1,
    config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: m.config.digest, size: m.config.size },
    layers: m.layers.map((l) => ({
      mediaType: l.mediaType,
      digest: l.digest,
      size: l.size,
      annotations: { [TITLE_ANNOTATION]: l.title, ...l.annotations },
    })),
    annotations,
  };
  return Buffer.from(JSON.stringify(doc, null, 2));
}
