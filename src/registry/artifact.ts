/**
 * Snapshot artifacts, pure (docs/registry.md "Snapshot artifact format"): media types, manifest classification and reader
 * validation (docs/registry.md "Reader validation"), image-index resolution, the config blob, and the translation into the
 * `cocoon snapshot import` tar (docs/registry.md "Pull flow" step 3: the snapshot.json envelope; the entry plan is
 * import-plan.ts).
 * Nothing here does I/O; every check fails closed before a byte is streamed.
 */
import * as v from 'valibot';
import type { Decoded } from '../cocoon/records.ts';

// --- Media types ------------------------------------------------------------------------

export const MEDIA_TYPE = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerManifestList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  ociImageConfig: 'application/vnd.oci.image.config.v1+json',
  dockerImageConfig: 'application/vnd.docker.container.image.v1+json',
  snapshotV1: 'application/vnd.cocoonstack.snapshot.v1+json',
  snapshotV2: 'application/vnd.cocoonstack.snapshot.v2+json',
  snapshotConfig: 'application/vnd.cocoonstack.snapshot.config.v1+json',
  osImage: 'application/vnd.cocoonstack.os-image.v1+json',
  windowsImage: 'application/vnd.cocoonstack.windows-image.v1+json',
  vmConfig: 'application/vnd.cocoonstack.vm.config+json',
  vmState: 'application/vnd.cocoonstack.vm.state+json',
  vmMemory: 'application/vnd.cocoonstack.vm.memory',
  vmCidata: 'application/vnd.cocoonstack.vm.cidata',
  diskQcow2: 'application/vnd.cocoonstack.disk.qcow2',
  diskRaw: 'application/vnd.cocoonstack.disk.raw',
  octetStream: 'application/octet-stream',
} as const;

/**
 * The `Accept` header of every manifest GET/HEAD (docs/registry.md "Distribution API subset"): CNCF distribution 2.x
 * answers 404 for an OCI manifest when the header does not list its media type.
 */
export const MANIFEST_ACCEPT = [
  MEDIA_TYPE.ociManifest,
  MEDIA_TYPE.ociIndex,
  MEDIA_TYPE.dockerManifest,
  MEDIA_TYPE.dockerManifestList,
].join(', ');

/** The annotation that names a layer's file. */
export const TITLE_ANNOTATION = 'org.opencontainers.image.title';

/** Largest config blob a reader accepts (docs/registry.md "Config blob"). */
export const MAX_CONFIG_BYTES = 64 * 1024 * 1024;
/** Largest manifest a reader accepts (distribution's own limit is 4 MiB). */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

/** A v2 layer type's suffix for a zstd-compressed blob (docs/registry.md "The v2 format"). */
export const ZSTD_SUFFIX = '+zstd';

/** Snapshot layer media types (docs/registry.md "Media types"). */
export const SNAPSHOT_LAYER_TYPES: ReadonlySet<string> = new Set([
  MEDIA_TYPE.vmConfig,
  MEDIA_TYPE.vmState,
  MEDIA_TYPE.vmMemory,
  MEDIA_TYPE.vmCidata,
  MEDIA_TYPE.diskQcow2,
  MEDIA_TYPE.diskRaw,
  MEDIA_TYPE.octetStream,
]);

/** The layer media type a writer uses for a file name (docs/registry.md "Media types" table). */
export function layerMediaType(fileName: string): string {
  switch (fileName) {
    case 'config.json':
      return MEDIA_TYPE.vmConfig;
    case 'state.json':
      return MEDIA_TYPE.vmState;
    case 'memory-ranges':
      return MEDIA_TYPE.vmMemory;
    case 'cidata.img':
      return MEDIA_TYPE.vmCidata;
  }
  if (fileName.endsWith('.qcow2')) return MEDIA_TYPE.diskQcow2;
  if (fileName.endsWith('.raw')) return MEDIA_TYPE.diskRaw;
  return MEDIA_TYPE.octetStream;
}

/** True for an OCI index or Docker manifest list media type. */
export function isIndexMediaType(mediaType: string): boolean {
  return mediaType === MEDIA_TYPE.ociIndex || mediaType === MEDIA_TYPE.dockerManifestList;
}

// --- Documents ------------------------------------------------------------------------------

const DIGEST = v.pipe(v.string(), v.regex(/^sha256:[a-f0-9]{64}$/, 'expected a sha256 digest'));
const SIZE = v.pipe(v.number(), v.safeInteger(), v.minValue(0));
const ANNOTATIONS = v.optional(v.nullable(v.record(v.string(), v.string())));

const DescriptorSchema = v.object({
  mediaType: v.string(),
  digest: DIGEST,
  size: SIZE,
  annotations: ANNOTATIONS,
});

const ManifestSchema = v.object({
  schemaVersion: v.literal(2),
  mediaType: v.optional(v.string()),
  artifactType: v.optional(v.string()),
  config: DescriptorSchema,
  layers: v.nullish(v.array(DescriptorSchema), []),
  annotations: ANNOTATIONS,
});

const IndexSchema = v.object({
  schemaVersion: v.literal(2),
  mediaType: v.optional(v.string()),
  manifests: v.array(
    v.object({
      mediaType: v.optional(v.string(), ''),
      digest: DIGEST,
      size: SIZE,
      platform: v.nullish(
        v.object({ os: v.optional(v.string(), ''), architecture: v.optional(v.string(), '') }),
      ),
    }),
  ),
});

/** A content descriptor. */
export interface Descriptor {
  readonly mediaType: string;
  readonly digest: string;
  readonly size: number;
  readonly annotations: Readonly<Record<string, string>>;
}

/** An image manifest (OCI or Docker v2), decoded but not yet classified. */
export interface ImageManifest {
  readonly mediaType: string;
  readonly artifactType: string;
  readonly config: Descriptor;
  readonly layers: readonly Descriptor[];
  readonly annotations: Readonly<Record<string, string>>;
}

/** A child of an image index. */
export interface IndexChild {
  readonly mediaType: string;
  readonly digest: string;
  readonly size: number;
  readonly os: string;
  readonly architecture: string;
}

function describeIssues(what: string, issues: readonly v.BaseIssue<unknown>[]): string {
  const text = issues
    .slice(0, 3)
    .map((issue) => {
      const path = v.getDotPath(issue);
      return path === null ? issue.message : `${path}: ${issue.message}`;
    })
    .join('; ');
  return `${what}: ${text}`;
}

function toDescriptor(d: v.InferOutput<typeof DescriptorSchema>): Descriptor {
  return { mediaType: d.mediaType, digest: d.digest, size: d.size, annotations: d.annotations ?? {} };
}

function parseJsonObject(what: string, body: string | Uint8Array): Decoded<Record<string, unknown>> {
  let json: unknown;
  try {
    json = JSON.parse(typeof body === 'string' ? body : Buffer.from(body).toString('utf8'));
  } catch (error) {
    return { ok: false, error: `${what}: invalid JSON: ${(error as Error).message}` };
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    return { ok: false, error: `${what}: not a JSON object` };
  }
  return { ok: true, value: json as Record<string, unknown> };
}

/** A fetched manifest document: either an index or an image manifest. */
export type ManifestDocument =
  | { readonly kind: 'index'; readonly mediaType: string; readonly children: readonly IndexChild[] }
  | { readonly kind: 'manifest'; readonly manifest: ImageManifest };

/**
 * Decodes a manifest body. The media type is the body's `mediaType`, else the response's
 * `Content-Type` (without parameters); a body with `manifests` and no `config` is an index.
 */
export function parseManifestDocument(
  body: string | Uint8Array,
  contentType = '',
): Decoded<ManifestDocument> {
  const obj = parseJsonObject('manifest', body);
  if (!obj.ok) return obj;
  const header = contentType.split(';')[0]!.trim();
  const mediaType = typeof obj.value.mediaType === 'string' ? obj.value.mediaType : header;
  if (isIndexMediaType(mediaType) || (obj.value.manifests !== undefined && obj.value.config === undefined)) {
    const parsed = v.safeParse(IndexSchema, obj.value);
    if (!parsed.success) return { ok: false, error: describeIssues('image index', parsed.issues) };
    return {
      ok: true,
      value: {
        kind: 'index',
        mediaType: mediaType || MEDIA_TYPE.ociIndex,
        children: parsed.output.manifests.map((m) => ({
          mediaType: m.mediaType,
          digest: m.digest,
          size: m.size,
          os: m.platform?.os ?? '',
          architecture: m.platform?.architecture ?? '',
        })),
      },
    };
  }
  const parsed = v.safeParse(ManifestSchema, obj.value);
  if (!parsed.success) return { ok: false, error: describeIssues('manifest', parsed.issues) };
  const m = parsed.output;
  return {
    ok: true,
    value: {
      kind: 'manifest',
      manifest: {
        mediaType,
        artifactType: m.artifactType ?? '',
        config: toDescriptor(m.config),
        layers: m.layers.map(toDescriptor),
        annotations: m.annotations ?? {},
      },
    },
  };
}

/**
 * The index child to follow (docs/registry.md "Reader validation"): the `linux/amd64` child, else the first child
 * whose architecture is not `unknown` (attestation manifests use `unknown/unknown`).
 */
export function selectIndexChild(children: readonly IndexChild[]): IndexChild | undefined {
  return (
    children.find((c) => c.os === 'linux' && c.architecture === 'amd64') ??
    children.find((c) => c.architecture !== 'unknown')
  );
}

// --- Classification (docs/registry.md "Reader validation") --------------------------------------------------------------

export type ArtifactKind = 'snapshot' | 'cloud-image' | 'container-image' | 'index' | 'unknown';

export interface Classification {
  readonly kind: ArtifactKind;
  /** Snapshot format version (1 or 2); 0 for other kinds. */
  readonly version: number;
}

/**
 * Classifies a manifest document (docs/registry.md "Reader validation"): `artifactType` first (snapshot v1/v2,
 * cloud image incl. the legacy windows-image type), then the config media type (an OCI or
 * Docker image config is a container image, never consumed here), then index types, else
 * unknown.
 */
export function classifyArtifact(doc: ManifestDocument): Classification {
  if (doc.kind === 'index') return { kind: 'index', version: 0 };
  const { artifactType, config } = doc.manifest;
  if (artifactType === MEDIA_TYPE.snapshotV1) return { kind: 'snapshot', version: 1 };
  if (artifactType === MEDIA_TYPE.snapshotV2) return { kind: 'snapshot', version: 2 };
  if (artifactType === MEDIA_TYPE.osImage || artifactType === MEDIA_TYPE.windowsImage) {
    return { kind: 'cloud-image', version: 0 };
  }
  if (config.mediaType === MEDIA_TYPE.ociImageConfig || config.mediaType === MEDIA_TYPE.dockerImageConfig) {
    return { kind: 'container-image', version: 0 };
  }
  if (isIndexMediaType(doc.manifest.mediaType)) return { kind: 'index', version: 0 };
  return { kind: 'unknown', version: 0 };
}

// --- Snapshot manifest validation (docs/registry.md "Reader validation") ------------------------------------------------

/** A validated snapshot layer: its descriptor and its file name (the title annotation). */
export interface SnapshotLayer extends Descriptor {
  readonly title: string;
}

export interface SnapshotManifest {
  readonly version: 1 | 2;
  readonly config: Descriptor;
  readonly layers: readonly SnapshotLayer[];
  readonly annotations: Readonly<Record<string, string>>;
}

/**
 * A title that is safe as a tar entry name in the snapshot directory: one path component,
 * not `.`/`..`, no NUL, and not `snapshot.json` (the envelope's own name). The writer
 * (artifact-write.ts) applies the same rule to the files it exports.
 */
export function titleProblem(title: string): string | undefined {
  if (title === '') return 'is empty';
  if (
    title === '.' ||
    title === '..' ||
    title.includes('/') ||
    title.includes('\\') ||
    title.includes('\0')
  ) {
    return 'is not a plain file name';
  }
  if (title === 'snapshot.json') return 'collides with the snapshot.json envelope';
  if (Buffer.byteLength(title, 'utf8') > 255) return 'is longer than 255 bytes';
  return undefined;
}

/**
 * Validates a manifest as a snapshot artifact (docs/registry.md "Reader validation"): snapshot `artifactType`,
 * the snapshot config media type, every layer of a docs/registry.md "Media types" type (the `+zstd` form only under v2),
 * and every layer titled with a safe, (v1:) unique file name.
 */
export function validateSnapshotManifest(doc: ManifestDocument): Decoded<SnapshotManifest> {
  const cls = classifyArtifact(doc);
  if (doc.kind !== 'manifest' || cls.kind !== 'snapshot') {
    return { ok: false, error: `not a snapshot artifact (classified as ${cls.kind})` };
  }
  const m = doc.manifest;
  const version = cls.version as 1 | 2;
  if (m.config.mediaType !== MEDIA_TYPE.snapshotConfig) {
    return {
      ok: false,
      error: `snapshot config media type ${JSON.stringify(m.config.mediaType)}, expected ${MEDIA_TYPE.snapshotConfig}`,
    };
  }
  if (m.config.size > MAX_CONFIG_BYTES) {
    return {
      ok: false,
      error: `snapshot config of ${m.config.size} bytes exceeds the ${MAX_CONFIG_BYTES}-byte cap`,
    };
  }
  const layers: SnapshotLayer[] = [];
  const seen = new Set<string>();
  for (const [i, layer] of m.layers.entries()) {
    const zstd = layer.mediaType.endsWith(ZSTD_SUFFIX);
    const base = zstd ? layer.mediaType.slice(0, -ZSTD_SUFFIX.length) : layer.mediaType;
    if (zstd && version === 1 && SNAPSHOT_LAYER_TYPES.has(base))
      return { ok: false, error: `layer ${i}: zstd-compressed but manifest is not v2` };
    if (!SNAPSHOT_LAYER_TYPES.has(base)) {
      return {
        ok: false,
        error: `layer ${i}: media type ${JSON.stringify(layer.mediaType)} is not a snapshot layer type`,
      };
    }
    const title = layer.annotations[TITLE_ANNOTATION];
    if (title === undefined)
      return { ok: false, error: `layer ${i}: missing ${TITLE_ANNOTATION} annotation` };
    const problem = titleProblem(title);
    if (problem) return { ok: false, error: `layer ${i}: title ${JSON.stringify(title)} ${problem}` };
    if (version === 1) {
      if (seen.has(title))
        return { ok: false, error: `layer ${i}: duplicate title ${JSON.stringify(title)}` };
      seen.add(title);
    }
    layers.push({ ...layer, title });
  }
  return { ok: true, value: { version, config: m.config, layers, annotations: m.annotations } };
}

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
