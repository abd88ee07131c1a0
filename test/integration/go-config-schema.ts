// The snapshot config as cocoonstack's Go reader decodes it (cocoon-common v0.3.0
// `manifest.SnapshotConfig`; docs/registry.md "Config blob"): every field with the JSON type
// of its Go field. A value of another type makes that reader refuse the whole config, so a
// config we push must pass this schema exactly (our own reader, src/registry/artifact-config.ts, is
// lenient on purpose: it also reads older artifacts, e.g. a `sparseSize` string).
import * as v from 'valibot';

const int = v.pipe(v.number(), v.safeInteger());
const FileSchema = v.strictObject({
  mode: v.optional(int),
  size: v.optional(int),
  sparseMap: v.optional(v.string()),
  sparseSize: v.optional(int),
  chunks: v.optional(v.array(v.string())),
});
const GoConfig = v.looseObject({
  schemaVersion: v.string(),
  snapshotId: v.string(),
  description: v.optional(v.string()),
  image: v.optional(v.string()),
  imageDigest: v.optional(v.string()),
  imageType: v.optional(v.string()),
  imageBlobIds: v.optional(v.record(v.string(), v.strictObject({}))),
  hypervisor: v.optional(v.string()),
  cpu: v.optional(int),
  memory: v.optional(int),
  storage: v.optional(int),
  nics: v.optional(int),
  network: v.optional(v.string()),
  windows: v.optional(v.boolean()),
  files: v.optional(v.record(v.string(), FileSchema)),
  createdAt: v.optional(v.pipe(v.string(), v.isoTimestamp())),
});

/** What Go's reader would refuse in these config bytes (empty: it decodes). */
export function goConfigProblems(bytes: Buffer): string[] {
  const r = v.safeParse(GoConfig, JSON.parse(bytes.toString('utf8')));
  return r.success ? [] : r.issues.map((i) => `${v.getDotPath(i) ?? '(root)'}: ${i.message}`);
}
