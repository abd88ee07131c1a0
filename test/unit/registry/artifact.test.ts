import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  classifyArtifact,
  type IndexChild,
  layerMediaType,
  MANIFEST_ACCEPT,
  MAX_CONFIG_BYTES,
  MEDIA_TYPE,
  parseManifestDocument,
  selectIndexChild,
  validateSnapshotManifest,
} from '../../../src/registry/artifact.ts';
import { parseSnapshotConfig, snapshotEnvelope } from '../../../src/registry/artifact-config.ts';
import { d, doc, exampleConfig, exampleManifest, expectInvalid, snapshot } from './artifact-fixtures.ts';

describe('media types (registry.md §3, §4.1)', () => {
  it('the Accept header lists OCI and Docker manifests and indexes', () => {
    assert.equal(
      MANIFEST_ACCEPT,
      'application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, ' +
        'application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json',
    );
  });

  it('layer media type by file name', () => {
    assert.equal(layerMediaType('config.json'), 'application/vnd.cocoonstack.vm.config+json');
    assert.equal(layerMediaType('state.json'), 'application/vnd.cocoonstack.vm.state+json');
    assert.equal(layerMediaType('memory-ranges'), 'application/vnd.cocoonstack.vm.memory');
    assert.equal(layerMediaType('cidata.img'), 'application/vnd.cocoonstack.vm.cidata');
    assert.equal(layerMediaType('overlay.qcow2'), 'application/vnd.cocoonstack.disk.qcow2');
    assert.equal(layerMediaType('data.qcow2'), 'application/vnd.cocoonstack.disk.qcow2');
    assert.equal(layerMediaType('cow.raw'), 'application/vnd.cocoonstack.disk.raw');
    assert.equal(layerMediaType('memory-range-0'), 'application/octet-stream');
    assert.equal(layerMediaType('other.json'), 'application/octet-stream');
  });
});

describe('parseManifestDocument', () => {
  it('decodes an image manifest and keeps annotations', () => {
    const m = doc(exampleManifest());
    assert.equal(m.kind, 'manifest');
    if (m.kind !== 'manifest') return;
    assert.equal(m.manifest.layers.length, 5);
    assert.equal(m.manifest.layers[2]!.size, 4294967296);
    assert.equal(m.manifest.annotations['cocoonstack.snapshot.baseimage'], 'cocoon/ubuntu-hot:v1');
  });

  it('takes the media type from Content-Type when the body has none', () => {
    const { mediaType: _drop, ...noType } = exampleManifest();
    const m = doc(noType, 'application/vnd.oci.image.manifest.v1+json; charset=utf-8');
    assert.equal(m.kind === 'manifest' && m.manifest.mediaType, MEDIA_TYPE.ociManifest);
  });

  it('decodes an index (by media type, Content-Type or shape)', () => {
    const index = {
      schemaVersion: 2,
      manifests: [
        {
          mediaType: MEDIA_TYPE.ociManifest,
          digest: d(9),
          size: 10,
          platform: { os: 'linux', architecture: 'amd64' },
        },
      ],
    };
    const byShape = doc(index);
    assert.equal(byShape.kind, 'index');
    assert.equal(doc(index, MEDIA_TYPE.dockerManifestList).kind, 'index');
    if (byShape.kind === 'index')
      assert.deepEqual(byShape.children[0], {
        mediaType: MEDIA_TYPE.ociManifest,
        digest: d(9),
        size: 10,
        os: 'linux',
        architecture: 'amd64',
      });
  });

  it('rejects non-JSON, non-objects, schemaVersion ≠ 2, bad digests and sizes', () => {
    assert.equal(parseManifestDocument('nope').ok, false);
    assert.equal(parseManifestDocument('[1]').ok, false);
    expectInvalid(exampleManifest({ schemaVersion: 1 }), /schemaVersion/);
    expectInvalid(
      exampleManifest({ config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: 'md5:00', size: 1 } }),
      /config\.digest/,
    );
    expectInvalid(
      exampleManifest({ config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: d(1), size: -1 } }),
      /config\.size/,
    );
    expectInvalid(
      exampleManifest({ config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: d(1), size: 1.5 } }),
      /config\.size/,
    );
  });
});

describe('selectIndexChild (registry.md §4.3)', () => {
  const child = (digest: number, os: string, architecture: string): IndexChild => ({
    mediaType: MEDIA_TYPE.ociManifest,
    digest: d(digest),
    size: 1,
    os,
    architecture,
  });

  it('linux/amd64 first, wherever it is', () => {
    assert.equal(
      selectIndexChild([
        child(1, 'linux', 'arm64'),
        child(2, 'unknown', 'unknown'),
        child(3, 'linux', 'amd64'),
      ])?.digest,
      d(3),
    );
  });

  it('else the first child whose architecture is not unknown', () => {
    assert.equal(
      selectIndexChild([child(1, 'unknown', 'unknown'), child(2, 'linux', 'arm64')])?.digest,
      d(2),
    );
    assert.equal(selectIndexChild([child(1, '', '')])?.digest, d(1));
    assert.equal(selectIndexChild([child(1, 'unknown', 'unknown')]), undefined);
    assert.equal(selectIndexChild([]), undefined);
  });
});

describe('classifyArtifact (registry.md §4.3 order)', () => {
  const withType = (artifactType: string | undefined, configType: string = MEDIA_TYPE.snapshotConfig) =>
    classifyArtifact(
      doc(
        exampleManifest({
          artifactType,
          config: { mediaType: configType, digest: d(1), size: 1 },
        }),
      ),
    );

  it('artifactType first', () => {
    assert.deepEqual(withType(MEDIA_TYPE.snapshotV1), { kind: 'snapshot', version: 1 });
    assert.deepEqual(withType(MEDIA_TYPE.snapshotV2), { kind: 'snapshot', version: 2 });
    assert.equal(withType(MEDIA_TYPE.osImage).kind, 'cloud-image');
    assert.equal(withType(MEDIA_TYPE.windowsImage).kind, 'cloud-image');
    // artifactType beats an image config media type
    assert.equal(withType(MEDIA_TYPE.snapshotV1, MEDIA_TYPE.ociImageConfig).kind, 'snapshot');
  });

  it('then the config media type: container images are never consumed', () => {
    assert.equal(withType(undefined, MEDIA_TYPE.ociImageConfig).kind, 'container-image');
    assert.equal(withType(undefined, MEDIA_TYPE.dockerImageConfig).kind, 'container-image');
  });

  it('then index types, else unknown', () => {
    assert.equal(
      classifyArtifact(doc({ schemaVersion: 2, mediaType: MEDIA_TYPE.ociIndex, manifests: [] })).kind,
      'index',
    );
    assert.equal(withType(undefined).kind, 'unknown');
    assert.equal(withType('application/vnd.example+json').kind, 'unknown');
  });
});

describe('validateSnapshotManifest (fail closed, registry.md §4.3)', () => {
  it('accepts the §4.1 example and ignores unknown annotations', () => {
    const m = snapshot();
    assert.equal(m.version, 1);
    assert.deepEqual(
      m.layers.map((l) => l.title),
      ['config.json', 'state.json', 'memory-ranges', 'overlay.qcow2', 'cidata.img'],
    );
    assert.equal(m.layers[3]!.digest, d(5));
  });

  it('requires a snapshot artifact', () => {
    expectInvalid(
      exampleManifest({ artifactType: MEDIA_TYPE.osImage }),
      /not a snapshot artifact \(classified as cloud-image\)/,
    );
    expectInvalid(exampleManifest({ artifactType: undefined }), /classified as unknown/);
    const r = validateSnapshotManifest(
      doc({ schemaVersion: 2, mediaType: MEDIA_TYPE.ociIndex, manifests: [] }),
    );
    assert.equal(r.ok, false);
  });

  it('requires the snapshot config media type and caps its size', () => {
    expectInvalid(
      exampleManifest({ config: { mediaType: MEDIA_TYPE.ociImageConfig, digest: d(1), size: 1 } }),
      /config media type/,
    );
    expectInvalid(
      exampleManifest({
        config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: d(1), size: MAX_CONFIG_BYTES + 1 },
      }),
      /exceeds/,
    );
  });

  it('requires §4.1 layer types; +zstd only under v2', () => {
    const layers = (mediaType: string) => [
      {
        mediaType,
        digest: d(2),
        size: 1,
        annotations: { 'org.opencontainers.image.title': 'memory-ranges' },
      },
    ];
    expectInvalid(
      exampleManifest({ layers: layers('application/vnd.oci.image.layer.v1.tar+gzip') }),
      /not a snapshot layer type/,
    );
    expectInvalid(
      exampleManifest({ layers: layers(`${MEDIA_TYPE.vmMemory}+zstd`) }),
      /layer 0: zstd-compressed but manifest is not v2/,
    );
    expectInvalid(
      exampleManifest({ layers: layers('application/x-unknown+zstd') }),
      /not a snapshot layer type/,
    );
    const v2 = validateSnapshotManifest(
      doc(
        exampleManifest({
          artifactType: MEDIA_TYPE.snapshotV2,
          layers: layers(`${MEDIA_TYPE.vmMemory}+zstd`),
        }),
      ),
    );
    assert.ok(v2.ok);
    assert.equal(v2.ok && v2.value.version, 2);
    assert.ok(validateSnapshotManifest(doc(exampleManifest({ layers: layers(MEDIA_TYPE.octetStream) }))).ok);
    assert.ok(validateSnapshotManifest(doc(exampleManifest({ layers: layers(MEDIA_TYPE.diskRaw) }))).ok);
  });

  it('requires a safe, unique title on every layer', () => {
    const titled = (...titles: (string | undefined)[]) =>
      titles.map((title, i) => ({
        mediaType: MEDIA_TYPE.octetStream,
        digest: d(i + 2),
        size: 1,
        annotations: title === undefined ? {} : { 'org.opencontainers.image.title': title },
      }));
    expectInvalid(
      exampleManifest({ layers: titled(undefined) }),
      /missing org\.opencontainers\.image\.title/,
    );
    for (const bad of ['', '.', '..', '../x', 'a/b', 'a\\b', 'a\0b']) {
      expectInvalid(exampleManifest({ layers: titled(bad) }), /title/);
    }
    expectInvalid(
      exampleManifest({ layers: titled('snapshot.json') }),
      /collides with the snapshot\.json envelope/,
    );
    expectInvalid(exampleManifest({ layers: titled('a', 'b', 'a') }), /layer 2: duplicate title "a"/);
  });
});

describe('parseSnapshotConfig (registry.md §4.2)', () => {
  const m = () => snapshot();
  const parse = (obj: unknown) => parseSnapshotConfig(JSON.stringify(obj), m());

  it('decodes the §4.2 example; unknown fields pass through', () => {
    const r = parse(exampleConfig({ windows: false, description: 'golden', extra: { a: 1 } }));
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.equal(r.value.snapshotId, 'D2M6QK7ZP4X3NWB5RT2YHCL7VA');
    assert.equal(r.value.files['overlay.qcow2']?.mode, 416);
    assert.equal(r.value.description, 'golden');
    assert.deepEqual(r.value.raw.extra, { a: 1 });
  });

  it('schemaVersion must agree with the artifact type', () => {
    const r = parse(exampleConfig({ schemaVersion: 'v2' }));
    assert.equal(r.ok, false);
    if (!r.ok) assert.match(r.error, /schemaVersion "v2" disagrees with the artifact type \(expected v1\)/);
  });

  it('rejects a missing snapshotId, wrong field types and non-objects', () => {
    for (const bad of [
      exampleConfig({ snapshotId: '' }),
      exampleConfig({ snapshotId: undefined }),
      exampleConfig({ cpu: '2' }),
      exampleConfig({ memory: -1 }),
      exampleConfig({ windows: 'yes' }),
      exampleConfig({ imageBlobIds: ['x'] }),
      exampleConfig({ files: { a: { mode: 'rw' } } }),
      exampleConfig({ files: { a: { mode: 0o10000 } } }),
      exampleConfig({ files: { a: { sparseMap: {} } } }),
    ]) {
      assert.equal(parse(bad).ok, false, JSON.stringify(bad));
    }
    assert.equal(parseSnapshotConfig('[]', m()).ok, false);
    assert.equal(parseSnapshotConfig('{', m()).ok, false);
  });
});

describe('snapshotEnvelope (registry.md §5 step 3, cocoon-cli.md §3.4)', () => {
  it('translates camelCase config into the snake_case envelope, id = snapshotId, name = local', () => {
    const c = parseSnapshotConfig(
      JSON.stringify(exampleConfig({ windows: true, description: 'd' })),
      snapshot(),
    );
    assert.ok(c.ok);
    const env = snapshotEnvelope(c.value, 'acme/agent:v3');
    assert.deepEqual(env, {
      version: 1,
      config: {
        id: 'D2M6QK7ZP4X3NWB5RT2YHCL7VA',
        name: 'acme/agent:v3',
        image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
        image_digest: 'sha256:5f1c0d9e7a6b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d',
        image_type: 'oci',
        image_blob_ids: { '9c1e0d': {} },
        hypervisor: 'cloud-hypervisor',
        cpu: 2,
        memory: 2147483648,
        storage: 21474836480,
        nics: 1,
        network: 'cocoon-dhcp',
        windows: true,
      },
    });
    // exact key order (the Go struct's field order)
    assert.deepEqual(Object.keys(env.config), [
      'id',
      'name',
      'image',
      'image_digest',
      'image_type',
      'image_blob_ids',
      'hypervisor',
      'cpu',
      'memory',
      'storage',
      'nics',
      'network',
      'windows',
    ]);
  });

  it('omits what the config does not carry; never copies description or files', () => {
    const c = parseSnapshotConfig(
      JSON.stringify({ schemaVersion: 'v1', snapshotId: 'X', description: 'd' }),
      snapshot(),
    );
    assert.ok(c.ok);
    assert.deepEqual(snapshotEnvelope(c.value, 'n'), { version: 1, config: { id: 'X', name: 'n' } });
  });
});
