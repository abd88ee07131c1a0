/**
 * Snapshot artifacts, manifest side, pure (docs/registry.md "Snapshot artifact format"): media types, manifest classification and reader
 * validation (docs/registry.md "Reader validation"), image-index resolution. The config blob and the
 * `cocoon snapshot import` tar's snapshot.json envelope are artifact-config.ts; the entry plan is
 * import-plan.ts.
 * Nothing here does I/O; every check fails closed before a byte is streamed.
 */
import * as v from 'valibot';
import type { Decoded } from '../cocoon/records.ts';

/** Re-exported for src/provider/cocoon/context.ts, which still imports it from here; its home is
 * artifact-config.ts. */

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

/** A `sha256:` digest (also the config blob's `chunks`, artifact-config.ts). */
export const DIGEST = v.pipe(v.string(), v.regex(/^sha256:[a-f0-9]{64}$/, 'expected a sha256 digest'));
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

/** valibot issues as one message (at most three), prefixed with `what`. */
export function describeIssues(what: string, issues: readonly v.BaseIssue<unknown>[]): string {
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

/** A JSON object, or an error naming `what`. */
export function parseJsonObject(what: string, body: string | Uint8Array): Decoded<Record<string, unknown>> {
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
