// The registry.md §4.1/§4.2 example manifest and config, and helpers that parse them: shared by the
// artifact and import-plan tests.
import assert from 'node:assert/strict';
import {
  type ManifestDocument,
  MEDIA_TYPE,
  parseManifestDocument,
  type SnapshotManifest,
  validateSnapshotManifest,
} from '../../../src/registry/artifact.ts';

export const d = (n: number) => `sha256:${n.toString(16).padStart(64, '0')}`;

/** The §4.1 example manifest. */
export function exampleManifest(over: Record<string, unknown> = {}): Record<string, unknown> {
  const layer = (mediaType: string, n: number, size: number, title: string) => ({
    mediaType,
    digest: d(n),
    size,
    annotations: { 'org.opencontainers.image.title': title },
  });
  return {
    schemaVersion: 2,
    mediaType: MEDIA_TYPE.ociManifest,
    artifactType: MEDIA_TYPE.snapshotV1,
    config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: d(1), size: 912 },
    layers: [
      layer(MEDIA_TYPE.vmConfig, 2, 4211, 'config.json'),
      layer(MEDIA_TYPE.vmState, 3, 88123, 'state.json'),
      layer(MEDIA_TYPE.vmMemory, 4, 4294967296, 'memory-ranges'),
      layer(MEDIA_TYPE.diskQcow2, 5, 1871052800, 'overlay.qcow2'),
      layer(MEDIA_TYPE.vmCidata, 6, 376832, 'cidata.img'),
    ],
    annotations: {
      'org.opencontainers.image.created': '2026-08-12T09:30:00Z',
      'cocoonstack.snapshot.baseimage': 'cocoon/ubuntu-hot:v1',
      'cocoonstack.snapshot.id': 'legacy-ignored',
    },
    ...over,
  };
}

/** The §4.2 example config. */
export function exampleConfig(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    schemaVersion: 'v1',
    snapshotId: 'D2M6QK7ZP4X3NWB5RT2YHCL7VA',
    image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
    imageDigest: 'sha256:5f1c0d9e7a6b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d',
    imageType: 'oci',
    imageBlobIds: { '9c1e0d': {} },
    hypervisor: 'cloud-hypervisor',
    cpu: 2,
    memory: 2147483648,
    storage: 21474836480,
    nics: 1,
    network: 'cocoon-dhcp',
    files: {
      'memory-ranges': { mode: 420, size: 4294967296 },
      'overlay.qcow2': { mode: 416, size: 1871052800 },
    },
    createdAt: '2026-08-12T09:29:41Z',
    ...over,
  };
}

export function doc(obj: unknown, contentType = ''): ManifestDocument {
  const r = parseManifestDocument(JSON.stringify(obj), contentType);
  assert.ok(r.ok, r.ok ? '' : r.error);
  return r.value;
}

export function snapshot(obj: Record<string, unknown> = exampleManifest()): SnapshotManifest {
  const r = validateSnapshotManifest(doc(obj));
  assert.ok(r.ok, r.ok ? '' : r.error);
  return r.value;
}

export function expectInvalid(obj: unknown, pattern: RegExp): void {
  const parsed = parseManifestDocument(JSON.stringify(obj));
  if (!parsed.ok) {
    assert.match(parsed.error, pattern);
    return;
  }
  const r = validateSnapshotManifest(parsed.value);
  assert.equal(r.ok, false);
  if (!r.ok) assert.match(r.error, pattern);
}
