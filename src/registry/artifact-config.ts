/**
 * Snapshot artifacts, config side, pure (docs/registry.md "Config blob"): the config blob's
 * schema and its validation against the manifest, and what the `cocoon snapshot import` tar takes
 * from it (docs/registry.md "Pull flow" step 3): the snapshot.json envelope, file modes and the
 * sparse-file PAX keys. The manifest side is artifact.ts.
 */
import * as v from 'valibot';
import type { Decoded } from '../cocoon/records.ts';
import { DIGEST, describeIssues, parseJsonObject, type SnapshotManifest } from './artifact.ts';

// --- Config blob (docs/registry.md "Config blob") -----------------------------------------------------------------

const OPAQUE = v.union([v.string(), v.number()]);

const FileInfoSchema = v.looseObject({
  mode: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0o7777))),
  size: v.optional(v.pipe(v.number(), v.safeInteger(), v.minValue(0))),
  sparseMap: v.optional(OPAQUE),
  sparseSize: v.optional(OPAQUE),
  chunks: v.optional(v.array(DIGEST)),
});

const COUNT = v.optional(v.pipe(v.number(), v.safeInteger(), v.minValue(0)));

const ConfigSchema = v.looseObject({
  schemaVersion: v.string(),
  snapshotId: v.pipe(v.string(), v.minLength(1, 'must not be empty')),
  image: v.optional(v.string()),
  imageDigest: v.optional(v.string()),
  imageType: v.optional(v.string()),
  imageBlobIds: v.optional(v.record(v.string(), v.unknown())),
  hypervisor: v.optional(v.string()),
  cpu: COUNT,
  memory: COUNT,
  storage: COUNT,
  nics: COUNT,
  network: v.optional(v.string()),
  windows: v.optional(v.boolean()),
  description: v.optional(v.string()),
  files: v.optional(v.record(v.string(), FileInfoSchema)),
  createdAt: v.optional(v.string()),
});

/** Per-file metadata of the config blob (`files[title]`). */
export interface SnapshotFileInfo {
  readonly mode?: number;
  readonly size?: number;
  /** Opaque PAX value, written back verbatim as `COCOON.sparse.map`. */
  readonly sparseMap?: string | number;
  /** Opaque PAX value, written back verbatim as `COCOON.sparse.size`. */
  readonly sparseSize?: string | number;
  /** v2: the file's blobs in order (authoritative over layer order and annotations). */
  readonly chunks?: readonly string[];
}

/** The snapshot config blob (camelCase; unknown fields are kept in `raw`). */
export interface SnapshotConfig {
  readonly schemaVersion: string;
  /** Identity anchor (docs/registry.md "Config blob"). */
  readonly snapshotId: string;
  readonly image?: string;
  readonly imageDigest?: string;
  readonly imageType?: string;
  readonly imageBlobIds?: Readonly<Record<string, unknown>>;
  readonly hypervisor?: string;
  readonly cpu?: number;
  readonly memory?: number;
  readonly storage?: number;
  readonly nics?: number;
  readonly network?: string;
  readonly windows?: boolean;
  readonly description?: string;
  readonly files: Readonly<Record<string, SnapshotFileInfo>>;
  readonly createdAt?: string;
  readonly raw: Readonly<Record<string, unknown>>;
}

/**
 * Decodes and validates the config blob against its manifest: JSON object, known fields of the
 * right type, a non-empty `snapshotId`, and `schemaVersion` agreeing with the artifact type
 * (`v1` ↔ `...snapshot.v1+json`).
 */
export function parseSnapshotConfig(
  body: string | Uint8Array,
  manifest: SnapshotManifest,
): Decoded<SnapshotConfig> {
  const obj = parseJsonObject('snapshot config', body);
  if (!obj.ok) return obj;
  // valibot's record() also takes arrays; these two must be JSON objects.
  for (const key of ['imageBlobIds', 'files']) {
    if (Array.isArray(obj.value[key]))
      return { ok: false, error: `snapshot config: ${key}: expected a JSON object` };
  }
  const parsed = v.safeParse(ConfigSchema, obj.value);
  if (!parsed.success) return { ok: false, error: describeIssues('snapshot config', parsed.issues) };
  const c = parsed.output;
  const expected = `v${manifest.version}`;
  if (c.schemaVersion !== expected) {
    return {
      ok: false,
      error: `snapshot config schemaVersion ${JSON.stringify(c.schemaVersion)} disagrees with the artifact type (expected ${expected})`,
    };
  }
  return {
    ok: true,
    value: {
      schemaVersion: c.schemaVersion,
      snapshotId: c.snapshotId,
      image: c.image,
      imageDigest: c.imageDigest,
      imageType: c.imageType,
      imageBlobIds: c.imageBlobIds,
      hypervisor: c.hypervisor,
      cpu: c.cpu,
      memory: c.memory,
      storage: c.storage,
      nics: c.nics,
      network: c.network,
      windows: c.windows,
      description: c.description,
      files: c.files ?? {},
      createdAt: c.createdAt,
      raw: obj.value,
    },
  };
}

// --- Import tar (docs/registry.md "Pull flow" step 3) -------------------------------------------------------------

/** The `snapshot.json` envelope of `cocoon snapshot import` (docs/registry.md "Pull flow"). */
export interface SnapshotEnvelope {
  readonly version: 1;
  readonly config: Readonly<Record<string, unknown>>;
}

/**
 * Translates the config blob into the snake_case envelope: `id` = `snapshotId`, `name` = the
 * local name, then `image`, `image_digest`, `image_type`, `image_blob_ids`, `hypervisor`, `cpu`,
 * `memory`, `storage`, `nics`, `network`, `windows` — each only when the config carries it
 * (cocoon's zero value and an omitted key mean the same). The description travels as
 * `--description`, not in the envelope.
 */
export function snapshotEnvelope(config: SnapshotConfig, localName: string): SnapshotEnvelope {
  const out: Record<string, unknown> = { id: config.snapshotId, name: localName };
  for (const [key, value] of ENVELOPE_FIELDS) {
    // The import passes the description as `--description`, not in the envelope.
    if (key === 'description') continue;
    const v = value(config);
    if (v !== undefined) out[key] = v;
  }
  return { version: 1, config: out };
}

/** The envelope's config keys after `id` and `name`, in the order of cocoon's Go struct, and
 * where each comes from in the registry config: the one list the import tar's envelope (above)
 * and a peer restore's `snapshot.json` (src/peer/wire.ts) are written from. */
export const ENVELOPE_FIELDS: readonly (readonly [key: string, value: (c: SnapshotConfig) => unknown])[] = [
  ['description', (c) => c.description],
  ['image', (c) => c.image],
  ['image_digest', (c) => c.imageDigest],
  ['image_type', (c) => c.imageType],
  ['image_blob_ids', (c) => c.imageBlobIds],
  ['hypervisor', (c) => c.hypervisor],
  ['cpu', (c) => c.cpu],
  ['memory', (c) => c.memory],
  ['storage', (c) => c.storage],
  ['nics', (c) => c.nics],
  ['network', (c) => c.network],
  ['windows', (c) => c.windows],
];

/** Mode of a layer file the config does not describe. */
export const DEFAULT_FILE_MODE = 0o640;
/** Mode of the snapshot.json entry. */
export const ENVELOPE_MODE = 0o644;
export const SPARSE_MAP_PAX = 'COCOON.sparse.map';
export const SPARSE_SIZE_PAX = 'COCOON.sparse.size';
