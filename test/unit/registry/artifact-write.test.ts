import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  MEDIA_TYPE,
  parseManifestDocument,
  validateSnapshotManifest,
} from '../../../src/registry/artifact.ts';
import { parseSnapshotConfig } from '../../../src/registry/artifact-config.ts';
import {
  buildSnapshotManifest,
  checkCallerAnnotations,
  exportEntryTitle,
  exportedFileInfo,
  parseExportEnvelope,
  rfc3339Utc,
  snapshotConfigFromEnvelope,
} from '../../../src/registry/artifact-write.ts';
import { planTarEntries } from '../../../src/registry/import-plan.ts';

const ID = 'D2M6QK7ZP4X3NWB5RT2YHCL7VA';
const digest = (s: string) => `sha256:${createHash('sha256').update(s).digest('hex')}`;

/** The envelope the simulator (and cocoon) writes into an export tar. */
const envelope = (config: Record<string, unknown> = {}) =>
  JSON.stringify({
    version: 1,
    config: {
      id: ID,
      name: 'vk-team-a-agent-0',
      description: '',
      image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      image_digest: `sha256:${'5f'.repeat(32)}`,
      image_type: 'oci',
      image_blob_ids: { '9c1e0d': {} },
      hypervisor: 'cloud-hypervisor',
      cpu: 2,
      memory: 2147483648,
      storage: 21474836480,
      nics: 1,
      network: '',
      windows: false,
      ...config,
    },
  });

describe('parseExportEnvelope (docs/registry.md "Push flow")', () => {
  it('reads version 1 and the id', () => {
    const e = parseExportEnvelope(envelope());
    assert.ok(e.ok);
    assert.equal(e.value.id, ID);
    assert.equal(e.value.config.hypervisor, 'cloud-hypervisor');
  });

  it('refuses other versions, non-objects and a missing id, with cocoon-style messages', () => {
    const bad = (body: string) => {
      const r = parseExportEnvelope(body);
      assert.ok(!r.ok);
      return r.error;
    };
    assert.equal(
      bad(JSON.stringify({ version: 2, config: { id: ID } })),
      'snapshot.json: unsupported snapshot archive version 2',
    );
    assert.match(bad('{'), /^snapshot.json: invalid JSON/);
    assert.equal(bad('[]'), 'snapshot.json: not a JSON object');
    assert.equal(
      bad(JSON.stringify({ version: 1, config: [] })),
      'snapshot.json: config is not a JSON object',
    );
    assert.equal(
      bad(JSON.stringify({ version: 1, config: { id: '' } })),
      'snapshot.json: config.id is missing or empty',
    );
  });
});

describe('snapshotConfigFromEnvelope (docs/registry.md "Config blob")', () => {
  const files = {
    'config.json': { mode: 0o644, size: 4211 },
    'overlay.qcow2': { mode: 0o640, size: 70_000, sparseMap: '0,4096,65536,4464', sparseSize: '10485760' },
  };

  it('translates snake_case to camelCase, omits empty fields and the local name, keeps files in order', () => {
    const e = parseExportEnvelope(envelope({ description: 'hot agent', created_at: '2026-08-12T09:29:41Z' }));
    assert.ok(e.ok);
    const c = snapshotConfigFromEnvelope(e.value, files);
    assert.ok(c.ok);
    assert.deepEqual(JSON.parse(c.value.toString()), {
      schemaVersion: 'v1',
      snapshotId: ID,
      image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      imageDigest: `sha256:${'5f'.repeat(32)}`,
      imageType: 'oci',
      imageBlobIds: { '9c1e0d': {} },
      hypervisor: 'cloud-hypervisor',
      cpu: 2,
      memory: 2147483648,
      storage: 21474836480,
      nics: 1,
      description: 'hot agent',
      files,
      createdAt: '2026-08-12T09:29:41Z',
    });
  });

  it('passes unknown envelope fields through in camelCase; windows and network when set', () => {
    const e = parseExportEnvelope(envelope({ windows: true, network: 'cocoon-dhcp', boot_mode: 'uefi' }));
    assert.ok(e.ok);
    const c = snapshotConfigFromEnvelope(e.value, {});
    assert.ok(c.ok);
    const json = JSON.parse(c.value.toString()) as Record<string, unknown>;
    assert.equal(json.windows, true);
    assert.equal(json.network, 'cocoon-dhcp');
    assert.equal(json.bootMode, 'uefi');
    assert.deepEqual(json.files, {});
  });

  it('refuses an envelope whose fields a reader would refuse (fail at push, not at pull)', () => {
    const e = parseExportEnvelope(envelope({ cpu: 'two' }));
    assert.ok(e.ok);
    const c = snapshotConfigFromEnvelope(e.value, {});
    assert.ok(!c.ok);
    assert.match(c.error, /does not translate into a valid config: snapshot config: cpu/);
  });

  it('round trip: the pull plans the same sparse PAX records and modes the export had', () => {
    const e = parseExportEnvelope(envelope());
    assert.ok(e.ok);
    const c = snapshotConfigFromEnvelope(e.value, files);
    assert.ok(c.ok);
    const manifest = buildSnapshotManifest({
      config: { digest: digest(c.value.toString()), size: c.value.length },
      layers: [
        { title: 'config.json', mediaType: MEDIA_TYPE.vmConfig, digest: digest('a'), size: 4211 },
        { title: 'overlay.qcow2', mediaType: MEDIA_TYPE.diskQcow2, digest: digest('b'), size: 70_000 },
      ],
      created: new Date(),
      baseImage: '',
    });
    const doc = parseManifestDocument(manifest);
    assert.ok(doc.ok);
    const m = validateSnapshotManifest(doc.value);
    assert.ok(m.ok);
    const config = parseSnapshotConfig(c.value, m.value);
    assert.ok(config.ok);
    assert.equal(config.value.snapshotId, ID);
    const plan = planTarEntries(m.value, config.value);
    assert.ok(plan.ok);
    assert.deepEqual(
      plan.value.map((p) => [p.name, p.mode.toString(8), p.size, p.pax ?? null]),
      [
        ['config.json', '644', 4211, null],
        [
          'overlay.qcow2',
          '640',
          70_000,
          { 'COCOON.sparse.map': '0,4096,65536,4464', 'COCOON.sparse.size': '10485760' },
        ],
      ],
    );
  });
});

describe('exportEntryTitle and exportedFileInfo', () => {
  it('accepts plain names (a leading ./ dropped); refuses paths, dot names and snapshot.json', () => {
    assert.deepEqual(exportEntryTitle('./overlay.qcow2'), { ok: true, value: 'overlay.qcow2' });
    assert.deepEqual(exportEntryTitle('memory-ranges'), { ok: true, value: 'memory-ranges' });
    for (const bad of ['dir/file', '..', '.', '', './', 'snapshot.json', 'a\\b']) {
      assert.equal(exportEntryTitle(bad).ok, false, bad);
    }
  });

  it('keeps the permission bits, the size, the sparse map verbatim and the sparse size as a JSON number', () => {
    assert.deepEqual(exportedFileInfo('a', 0o100644, 12, null), {
      ok: true,
      value: { mode: 0o644, size: 12 },
    });
    assert.deepEqual(exportedFileInfo('a', undefined, 0, {}), { ok: true, value: { size: 0 } });
    const info = exportedFileInfo('cow.raw', 0o640, 4096, {
      'COCOON.sparse.map': '[{"offset":0,"length":4096}]',
      'COCOON.sparse.size': '21474836480',
      mtime: '1.5',
    });
    assert.deepEqual(info, {
      ok: true,
      value: { mode: 0o640, size: 4096, sparseMap: '[{"offset":0,"length":4096}]', sparseSize: 21474836480 },
    });
    // What cocoonstack's Go reader decodes: `"sparseSize":21474836480`, never the PAX text.
    assert.match(JSON.stringify(info.ok && info.value), /"sparseSize":21474836480[,}]/);
  });

  it('refuses a sparse size that is not a decimal byte count, naming the entry', () => {
    for (const bad of ['', '-1', '1e9', ' 12', '0x10', '99999999999999999', '12a']) {
      const r = exportedFileInfo('cow.raw', 0o640, 1, { 'COCOON.sparse.size': bad });
      assert.equal(r.ok, false, bad);
      assert.match(
        r.ok ? '' : r.error,
        /export entry "cow\.raw": COCOON\.sparse\.size .* is not a byte count/,
      );
    }
  });
});

describe('buildSnapshotManifest (docs/registry.md "Manifest")', () => {
  const input = {
    config: { digest: digest('config'), size: 912 },
    layers: [
      { title: 'config.json', mediaType: MEDIA_TYPE.vmConfig, digest: digest('c'), size: 4211 },
      { title: 'memory-ranges', mediaType: MEDIA_TYPE.vmMemory, digest: digest('m'), size: 4294967296 },
    ],
    created: new Date('2026-08-12T09:30:00.123Z'),
    baseImage: 'cocoon/ubuntu-hot:v1',
    annotations: { 'org.opencontainers.image.source': 'https://example.com/x', team: 'a' },
  };

  it('writes the v1 artifact, pretty-printed with 2 spaces, annotations in their fixed order', () => {
    const bytes = buildSnapshotManifest(input);
    const text = bytes.toString();
    assert.ok(
      text.startsWith(
        '{\n  "schemaVersion": 2,\n  "mediaType": "application/vnd.oci.image.manifest.v1+json",',
      ),
    );
    const json = JSON.parse(text) as Record<string, unknown>;
    assert.deepEqual(json, {
      schemaVersion: 2,
      mediaType: MEDIA_TYPE.ociManifest,
      artifactType: MEDIA_TYPE.snapshotV1,
      config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: digest('config'), size: 912 },
      layers: [
        {
          mediaType: MEDIA_TYPE.vmConfig,
          digest: digest('c'),
          size: 4211,
          annotations: { 'org.opencontainers.image.title': 'config.json' },
        },
        {
          mediaType: MEDIA_TYPE.vmMemory,
          digest: digest('m'),
          size: 4294967296,
          annotations: { 'org.opencontainers.image.title': 'memory-ranges' },
        },
      ],
      annotations: {
        'org.opencontainers.image.created': '2026-08-12T09:30:00Z',
        'cocoonstack.snapshot.baseimage': 'cocoon/ubuntu-hot:v1',
        'org.opencontainers.image.source': 'https://example.com/x',
        team: 'a',
      },
    });
    assert.deepEqual(Object.keys(json.annotations as object), [
      'org.opencontainers.image.created',
      'cocoonstack.snapshot.baseimage',
      'org.opencontainers.image.source',
      'team',
    ]);
  });

  it('the from-node re-put adds only that annotation (before the caller ones); no base image ⇒ omitted', () => {
    const a = JSON.parse(buildSnapshotManifest(input).toString()) as Record<string, unknown>;
    const b = JSON.parse(buildSnapshotManifest({ ...input, fromNode: 'cocoon-node-2' }).toString()) as {
      annotations: Record<string, string>;
    };
    assert.deepEqual(Object.keys(b.annotations), [
      'org.opencontainers.image.created',
      'cocoonstack.snapshot.baseimage',
      'cocoonstack.snapshot.from-node',
      'org.opencontainers.image.source',
      'team',
    ]);
    const { 'cocoonstack.snapshot.from-node': node, ...rest } = b.annotations;
    assert.equal(node, 'cocoon-node-2');
    assert.deepEqual({ ...b, annotations: rest }, a);
    const none = JSON.parse(
      buildSnapshotManifest({ ...input, baseImage: '', annotations: {} }).toString(),
    ) as {
      annotations: Record<string, string>;
    };
    assert.deepEqual(none.annotations, { 'org.opencontainers.image.created': '2026-08-12T09:30:00Z' });
  });

  it('is deterministic for the same input (same bytes, same digest)', () => {
    assert.ok(buildSnapshotManifest(input).equals(buildSnapshotManifest(input)));
  });

  it('rfc3339Utc: whole seconds, Z', () => {
    assert.equal(rfc3339Utc(new Date(Date.UTC(2026, 0, 2, 3, 4, 5, 999))), '2026-01-02T03:04:05Z');
  });
});

describe('checkCallerAnnotations', () => {
  it('accepts string maps and nothing at all', () => {
    assert.deepEqual(checkCallerAnnotations(undefined), { ok: true, value: {} });
    assert.deepEqual(checkCallerAnnotations({ 'org.opencontainers.image.revision': 'abc', team: 'a' }), {
      ok: true,
      value: { 'org.opencontainers.image.revision': 'abc', team: 'a' },
    });
  });

  it('rejects the reserved cocoonstack. prefix, empty keys, non-strings and non-objects', () => {
    const err = (v: unknown) => {
      const r = checkCallerAnnotations(v);
      assert.ok(!r.ok);
      return r.error;
    };
    assert.match(
      err({ 'cocoonstack.snapshot.from-node': 'x' }),
      /"cocoonstack.snapshot.from-node" is reserved/,
    );
    assert.match(err({ 'cocoonstack.anything': 'x' }), /is reserved/);
    assert.match(err({ '': 'x' }), /empty key/);
    assert.match(err({ n: 1 }), /value of "n" is not a string/);
    assert.match(err(['a']), /expected a JSON object/);
    assert.match(err('a=b'), /expected a JSON object/);
  });
});
