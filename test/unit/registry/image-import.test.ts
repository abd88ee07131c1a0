// Run-mode images in the registry (docs/registry.md "Cloud-image artifacts (run mode)"): the
// pure parts (disk layer selection and order, reference parsing, classification), the peek
// against a fake registry (what is looked up at all, what each answer means), and the import
// against a shell script standing in for cocoon (`image import` commits only after reading
// its whole stdin, as the simulator and cocoon do).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { describe, it, type TestContext } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CocoonCli } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { type Descriptor, type ManifestDocument, MEDIA_TYPE } from '../../../src/registry/artifact.ts';
import { RegistryError } from '../../../src/registry/errors.ts';
import {
  type CloudImageArtifact,
  importCloudImage,
  parseRunImageRef,
  RunImageError,
  RunImageImporter,
  type RunImageRegistry,
  resolveRunImage,
  runImageKind,
  selectDiskLayers,
} from '../../../src/registry/image-import.ts';
import { parseRegistryBase, type Reference, repositoryName } from '../../../src/registry/reference.ts';

const sha = (b: Buffer | string) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const QCOW2_PART = `${MEDIA_TYPE.diskQcow2}.part`;

function layer(
  mediaType: string,
  title: string | undefined,
  body: Buffer | string = title ?? 'x',
): Descriptor {
  const bytes = Buffer.from(body);
  return {
    mediaType,
    digest: sha(bytes),
    size: bytes.length,
    annotations: title === undefined ? {} : { 'org.opencontainers.image.title': title },
  };
}

function manifestDoc(
  artifactType: string,
  layers: Descriptor[],
  configType = 'application/vnd.oci.empty.v1+json',
): ManifestDocument {
  return {
    kind: 'manifest',
    manifest: {
      mediaType: MEDIA_TYPE.ociManifest,
      artifactType,
      config: { mediaType: configType, digest: sha('{}'), size: 2, annotations: {} },
      layers,
      annotations: {},
    },
  };
}

describe('selectDiskLayers', () => {
  it('keeps only the disk types (legacy windows ones and parts too) and drops SHA256SUMS and the rest', () => {
    const kept = selectDiskLayers([
      layer('text/plain', 'SHA256SUMS'),
      layer(MEDIA_TYPE.diskQcow2, 'a.qcow2'),
      layer(QCOW2_PART, 'b.qcow2.part.000'),
      layer(MEDIA_TYPE.diskRaw, 'c.raw'),
      layer(`${MEDIA_TYPE.diskRaw}.part`, 'd.raw.part.000'),
      layer('application/vnd.cocoonstack.windows.disk.qcow2', 'e.qcow2'),
      layer('application/vnd.cocoonstack.windows.disk.qcow2.part', 'f.part'),
      layer('application/vnd.cocoonstack.windows.disk.raw', 'g.raw'),
      layer('application/vnd.cocoonstack.windows.disk.raw.part', 'h.part'),
      layer(MEDIA_TYPE.octetStream, 'notes'),
      layer(MEDIA_TYPE.vmConfig, 'config.json'),
      layer(`${MEDIA_TYPE.diskQcow2}+zstd`, 'z.qcow2'),
    ]);
    assert.deepEqual(
      kept.map((l) => l.title),
      ['a.qcow2', 'b.qcow2.part.000', 'c.raw', 'd.raw.part.000', 'e.qcow2', 'f.part', 'g.raw', 'h.part'],
    );
  });

  it('sorts by title in code-unit order, stably (equal titles keep manifest order); no title sorts as empty', () => {
    const kept = selectDiskLayers([
      layer(QCOW2_PART, 'disk.qcow2.part.010', 'ten'),
      layer(QCOW2_PART, 'disk.qcow2.part.001', 'one-a'),
      layer(QCOW2_PART, 'Disk.qcow2.part.999', 'upper'),
      layer(QCOW2_PART, 'disk.qcow2.part.001', 'one-b'),
      layer(QCOW2_PART, 'disk.qcow2.part.002', 'two'),
      layer(QCOW2_PART, undefined, 'untitled'),
    ]);
    assert.deepEqual(
      kept.map((l) => [l.title, l.size]),
      [
        ['', 8],
        ['Disk.qcow2.part.999', 5],
        ['disk.qcow2.part.001', 5],
        ['disk.qcow2.part.001', 5],
        ['disk.qcow2.part.002', 3],
        ['disk.qcow2.part.010', 3],
      ],
    );
    assert.deepEqual(
      kept.filter((l) => l.title === 'disk.qcow2.part.001').map((l) => l.digest),
      [sha('one-a'), sha('one-b')],
    );
  });
});

describe('parseRunImageRef', () => {
  it('registry-relative repo with a tag, no tag (latest) or a digest gives the local name', () => {
    assert.deepEqual(parseRunImageRef('acme/ubuntu:24.04'), {
      kind: 'registry',
      repo: 'acme/ubuntu',
      ref: { kind: 'tag', value: '24.04' },
      localName: 'acme/ubuntu:24.04',
    });
    assert.equal((parseRunImageRef('ubuntu') as { localName: string }).localName, 'ubuntu:latest');
    const d = sha('m');
    assert.deepEqual(parseRunImageRef(`acme/ubuntu:24.04@${d}`), {
      kind: 'registry',
      repo: 'acme/ubuntu',
      ref: { kind: 'digest', value: d },
      localName: `acme/ubuntu@${d}`,
    });
  });

  it('URLs, host-qualified references and malformed tags or digests are never looked up', () => {
    for (const image of [
      'https://cloud-images.ubuntu.com/jammy.img',
      'HTTP://images.example/win.qcow2',
      'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      '127.0.0.1:5000/acme/img:1',
      'localhost/acme/img',
      'acme/img:bad tag',
      'acme/img@sha256:short',
      ':tag',
    ]) {
      assert.equal(parseRunImageRef(image).kind, 'elsewhere', image);
    }
    // A dot in a single component is a repository name, not a host.
    assert.equal(parseRunImageRef('ubuntu.cloud:1').kind, 'registry');
  });
});

describe('runImageKind', () => {
  it('cloud image (both artifact types), snapshot (v1 and v2), everything else is other', () => {
    assert.equal(runImageKind(manifestDoc(MEDIA_TYPE.osImage, [])), 'cloud-image');
    assert.equal(runImageKind(manifestDoc(MEDIA_TYPE.windowsImage, [])), 'cloud-image');
    assert.equal(runImageKind(manifestDoc(MEDIA_TYPE.snapshotV1, [])), 'snapshot');
    assert.equal(runImageKind(manifestDoc(MEDIA_TYPE.snapshotV2, [])), 'snapshot');
    assert.equal(runImageKind(manifestDoc('', [], MEDIA_TYPE.ociImageConfig)), 'other');
    assert.equal(runImageKind(manifestDoc('application/vnd.example+json', [])), 'other');
    assert.equal(runImageKind({ kind: 'index', mediaType: MEDIA_TYPE.ociIndex, children: [] }), 'other');
  });
});

// --- Peek against a fake registry ------------------------------------------------------------

interface FakeRegistry extends RunImageRegistry {
  requests: string[];
}

function fakeRegistry(
  manifests: Record<string, ManifestDocument | Error>,
  blobs: Record<string, Buffer | { bytes: Buffer; fail: Error }> = {},
  opts: { blobDelayMs?: number } = {},
): FakeRegistry {
  const base = parseRegistryBase('127.0.0.1:5000/ns');
  const requests: string[] = [];
  return {
    requests,
    repository: (repo: string) => repositoryName(base, repo),
    display: (name: string, ref: Reference) =>
      `${base.host}/${name}${ref.kind === 'digest' ? '@' : ':'}${ref.value}`,
    getManifest: async (name: string, ref: Reference) => {
      const key = `${name}:${ref.value}`;
      requests.push(`manifest ${key}`);
      const found = manifests[key];
      if (found === undefined) return 'absent';
      if (found instanceof Error) throw found;
      if (found.kind !== 'manifest') throw new Error('index in a fake');
      return {
        digest: sha(JSON.stringify(found.manifest)),
        bytes: Buffer.from(JSON.stringify(found.manifest)),
        document: found,
        manifest: found.manifest,
        indexDigest: undefined,
      };
    },
    getBlob: async (name: string, desc: { digest: string; size: number }) => {
      requests.push(`blob ${name} ${desc.digest}`);
      const b = blobs[desc.digest];
      if (b === undefined)
        throw new RegistryError('http', `blob ${desc.digest}: BLOB_UNKNOWN`, { status: 404 });
      const delay = opts.blobDelayMs ?? 0;
      // Two chunks, so a failure comes after bytes went through (like a digest mismatch).
      const bytes = Buffer.isBuffer(b) ? b : b.bytes;
      const fail = Buffer.isBuffer(b) ? undefined : b.fail;
      return Readable.from(
        (async function* () {
          await sleep(delay);
          yield bytes.subarray(0, Math.ceil(bytes.length / 2));
          yield bytes.subarray(Math.ceil(bytes.length / 2));
          if (fail) throw fail;
        })(),
        { objectMode: false },
      );
    },
  };
}

describe('resolveRunImage', () => {
  const cloud = manifestDoc(MEDIA_TYPE.osImage, [
    layer('text/plain', 'SHA256SUMS'),
    layer(QCOW2_PART, 'img.qcow2.part.001', 'BBBB'),
    layer(QCOW2_PART, 'img.qcow2.part.000', 'AAA'),
  ]);

  it('a cloud-image artifact: disk layers in title order, total size, local name <repo>:<tag>', async () => {
    const reg = fakeRegistry({ 'ns/acme/cloud:1': cloud });
    const r = await resolveRunImage(reg, 'acme/cloud:1');
    assert.equal(r.kind, 'cloud-image');
    const c = r as CloudImageArtifact;
    assert.deepEqual(
      c.layers.map((l) => l.title),
      ['img.qcow2.part.000', 'img.qcow2.part.001'],
    );
    assert.equal(c.totalBytes, 7);
    assert.equal(c.localName, 'acme/cloud:1');
    assert.equal(c.name, 'ns/acme/cloud');
    assert.equal(c.display, '127.0.0.1:5000/ns/acme/cloud:1');
  });

  it('a snapshot artifact is reported as such; absent, container image and unknown artifacts are other', async () => {
    const reg = fakeRegistry({
      'ns/snap:latest': manifestDoc(MEDIA_TYPE.snapshotV1, [layer(MEDIA_TYPE.vmConfig, 'config.json')]),
      'ns/oci:1': manifestDoc('', [], MEDIA_TYPE.ociImageConfig),
      'ns/odd:1': manifestDoc('application/vnd.example+json', []),
    });
    const snap = await resolveRunImage(reg, 'snap');
    assert.equal(snap.kind, 'snapshot');
    assert.equal((snap as { display: string }).display, '127.0.0.1:5000/ns/snap:latest');
    assert.match((await resolveRunImage(reg, 'missing:1')).kind, /^other$/);
    assert.deepEqual(await resolveRunImage(reg, 'missing:1'), {
      kind: 'other',
      reason: 'not in the registry (127.0.0.1:5000/ns/missing:1)',
    });
    assert.deepEqual(await resolveRunImage(reg, 'oci:1'), {
      kind: 'other',
      reason: 'container-image at 127.0.0.1:5000/ns/oci:1',
    });
    assert.equal((await resolveRunImage(reg, 'odd:1')).kind, 'other');
  });

  it('URLs, host-qualified and non-grammar names are other without any request', async () => {
    const reg = fakeRegistry({});
    for (const image of ['https://x.example/a.img', 'ghcr.io/acme/ubuntu:24.04', 'Acme/Upper:1']) {
      assert.equal((await resolveRunImage(reg, image)).kind, 'other', image);
    }
    assert.deepEqual(reg.requests, []);
  });

  it('a registry error is a transient RunImageError, a cloud image without disk layers a permanent one', async () => {
    const reg = fakeRegistry({
      'ns/down:1': new RegistryError('network', 'GET manifest: ECONNREFUSED'),
      'ns/empty:1': manifestDoc(MEDIA_TYPE.osImage, [layer('text/plain', 'SHA256SUMS')]),
    });
    const down = await resolveRunImage(reg, 'down:1').catch((e: unknown) => e);
    assert.ok(down instanceof RunImageError && !down.permanent, String(down));
    assert.match(down.message, /^run image down:1: reading 127\.0\.0\.1:5000\/ns\/down:1: .*ECONNREFUSED/);
    const empty = await resolveRunImage(reg, 'empty:1').catch((e: unknown) => e);
    assert.ok(empty instanceof RunImageError && empty.permanent, String(empty));
    assert.match(empty.message, /has no disk layers/);
  });
});

// --- Import against a stand-in cocoon --------------------------------------------------------

/** A `cocoon` that logs argv; `image import NAME` copies stdin to a partial file and renames it
 * to the image only after EOF; `image inspect NAME` finds such a file. */
function fakeCocoon(t: TestContext): {
  cli: CocoonCli;
  dir: string;
  calls: () => string[];
  image: (n: string) => string;
} {
  const dir = mkdtempSync(join(tmpdir(), 'vk-image-import-'));
  const lifetime = new AbortController();
  t.after(() => {
    lifetime.abort();
    rmSync(dir, { recursive: true, force: true });
  });
  const bin = join(dir, 'cocoon');
  writeFileSync(
    bin,
    [
      '#!/bin/bash',
      `echo "$*" >> '${dir}/calls.log'`,
      `f="${dir}/img-$(printf %s "$3" | tr '/:@' '___')"`,
      'case "$1 $2" in',
      '  "image import") cat > "$f.partial" && mv "$f.partial" "$f" && echo "$3: imported" ;;',
      '  "image inspect") [ -e "$f" ] || { echo "Error: image \\"$3\\" not found in any backend" >&2; exit 1; }; echo "{}" ;;',
      '  *) echo "unexpected $*" >&2; exit 2 ;;',
      'esac',
      '',
    ].join('\n'),
  );
  chmodSync(bin, 0o755);
  return {
    cli: new CocoonCli(bin, lifetime.signal, silentLogger),
    dir,
    calls: () =>
      (existsSync(join(dir, 'calls.log')) ? readFileSync(join(dir, 'calls.log'), 'utf8') : '')
        .split('\n')
        .filter(Boolean),
    image: (n: string) => join(dir, `img-${n.replace(/[/:@]/g, '_')}`),
  };
}

const PART0 = Buffer.alloc(300_000, 'a');
const PART1 = Buffer.alloc(200_001, 'b');
const SUMS = Buffer.from('checksums\n');
const cloudLayers = [
  layer('text/plain', 'SHA256SUMS', SUMS),
  layer(QCOW2_PART, 'img.qcow2.part.001', PART1),
  layer(QCOW2_PART, 'img.qcow2.part.000', PART0),
];

describe('importCloudImage', () => {
  it('streams the disk layers concatenated in title order; SHA256SUMS is never fetched', async (t) => {
    const fake = fakeCocoon(t);
    const reg = fakeRegistry(
      { 'ns/acme/cloud:1': manifestDoc(MEDIA_TYPE.osImage, cloudLayers) },
      { [sha(PART0)]: PART0, [sha(PART1)]: PART1, [sha(SUMS)]: SUMS },
    );
    const image = (await resolveRunImage(reg, 'acme/cloud:1')) as CloudImageArtifact;
    await importCloudImage({ registry: reg, cli: fake.cli, image, localName: image.localName });
    assert.deepEqual(readFileSync(fake.image('acme/cloud:1')), Buffer.concat([PART0, PART1]));
    assert.deepEqual(fake.calls(), ['image import acme/cloud:1']);
    assert.ok(!reg.requests.includes(`blob ns/acme/cloud ${sha(SUMS)}`));
  });

  it('a blob that fails after its bytes went through kills the import before its stdin ends: nothing committed', async (t) => {
    const fake = fakeCocoon(t);
    const reg = fakeRegistry(
      { 'ns/acme/bad:1': manifestDoc(MEDIA_TYPE.osImage, cloudLayers) },
      {
        [sha(PART0)]: PART0,
        [sha(PART1)]: {
          bytes: PART1,
          fail: new RegistryError('integrity', `blob ${sha(PART1)}: digest mismatch (content hashes to x)`),
        },
      },
    );
    const image = (await resolveRunImage(reg, 'acme/bad:1')) as CloudImageArtifact;
    const err = await importCloudImage({
      registry: reg,
      cli: fake.cli,
      image,
      localName: image.localName,
    }).catch((e: unknown) => e);
    assert.ok(err instanceof RunImageError, String(err));
    assert.match(
      err.message,
      /^import 127\.0\.0\.1:5000\/ns\/acme\/bad:1 into acme\/bad:1: .*digest mismatch/,
    );
    assert.equal(existsSync(fake.image('acme/bad:1')), false, 'no image committed');
  });

  it('a missing blob fails the import the same way', async (t) => {
    const fake = fakeCocoon(t);
    const reg = fakeRegistry(
      { 'ns/acme/gone:1': manifestDoc(MEDIA_TYPE.osImage, cloudLayers) },
      { [sha(PART0)]: PART0 },
    );
    const image = (await resolveRunImage(reg, 'acme/gone:1')) as CloudImageArtifact;
    const err = await importCloudImage({
      registry: reg,
      cli: fake.cli,
      image,
      localName: image.localName,
    }).catch((e: unknown) => e);
    assert.ok(err instanceof RunImageError, String(err));
    assert.match(err.message, /BLOB_UNKNOWN/);
    assert.equal(existsSync(fake.image('acme/gone:1')), false);
  });
});

describe('RunImageImporter', () => {
  it('concurrent callers share one import; a later one reuses it (one image inspect); force imports again', async (t) => {
    const fake = fakeCocoon(t);
    const reg = fakeRegistry(
      { 'ns/acme/cloud:1': manifestDoc(MEDIA_TYPE.osImage, cloudLayers) },
      { [sha(PART0)]: PART0, [sha(PART1)]: PART1 },
      { blobDelayMs: 100 },
    );
    const importer = new RunImageImporter({ registry: reg, cli: fake.cli });
    const [a, b] = await Promise.all([importer.ensure('acme/cloud:1'), importer.ensure('acme/cloud:1')]);
    assert.deepEqual(
      [a.kind, b.kind, (a as { localName: string }).localName],
      ['imported', 'imported', 'acme/cloud:1'],
    );
    assert.deepEqual(fake.calls(), ['image import acme/cloud:1']);
    const again = await importer.ensure('acme/cloud:1');
    assert.equal((again as { reused: boolean }).reused, true);
    assert.deepEqual(fake.calls(), ['image import acme/cloud:1', 'image inspect acme/cloud:1']);
    await importer.ensure('acme/cloud:1', { force: true });
    assert.deepEqual(fake.calls().slice(2), ['image import acme/cloud:1']);
  });

  it('a snapshot artifact is refused naming it and mode=clone; other images are pull; registry errors throw', async (t) => {
    const fake = fakeCocoon(t);
    const reg = fakeRegistry({
      'ns/snap:v1': manifestDoc(MEDIA_TYPE.snapshotV1, []),
      'ns/down:1': new RegistryError('http', 'GET manifest: 503 Service Unavailable', { status: 503 }),
    });
    const importer = new RunImageImporter({ registry: reg, cli: fake.cli });
    assert.deepEqual(await importer.ensure('snap:v1'), {
      kind: 'refused',
      message: 'run image snap:v1 is a snapshot artifact (127.0.0.1:5000/ns/snap:v1): use mode=clone',
    });
    assert.equal((await importer.ensure('https://x.example/a.img')).kind, 'pull');
    assert.equal((await importer.ensure('nothing:1')).kind, 'pull');
    await assert.rejects(
      importer.ensure('down:1'),
      (e: unknown) => e instanceof RunImageError && !e.permanent,
    );
    assert.deepEqual(fake.calls(), []);
  });
});
