// The v2 snapshot format against tools nobody here wrote (issue 20, docs/registry.md "The v2
// format"). A simulator snapshot with a guest marker is exported; Debian's `split` cuts its files
// and `zstd` compresses the pieces; the config and manifest are written here by hand from the
// spec; `oras` (built from the Go module proxy, scripts/orasbin.sh) uploads every blob and the
// manifest. Our daemon then clones from it and wakes from it (stamped with the pod's namespace),
// with the marker and the snapshot id intact and every file byte-equal; a corrupt chunk, chunks
// listed out of order and a truncated zstd stream fail the pod with the reason and leave no
// snapshot behind. oras also lists and fetches what our daemon pushed, v1 and v2 (our v2 writer's
// chunks decompressed by Debian's zstd), and our v2 pushes are cloned and woken from.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import tar from 'tar-stream';
import { repoRoot } from '../../ground/cluster.ts';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { run } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { CocoonCli } from '../../src/cocoon/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { pushSnapshot } from '../../src/registry/push.ts';
import { annotate, fixture, lifecycle, lifecycleMessage, managedAnnotations } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
let oras: string;
let work: string;
/** The exported source: its files' bytes, its tar headers' sparse PAX records, its snapshot.json. */
let files: Map<string, Buffer>;
let pax: Map<string, Record<string, string>>;
let envelope: {
  id: string;
  image?: string;
  image_digest?: string;
  hypervisor?: string;
  cpu?: number;
  memory?: number;
  storage?: number;
  nics?: number;
};
const MARKER = 'marker-v2-vector';

const sha256 = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const MT = {
  manifest: 'application/vnd.oci.image.manifest.v1+json',
  v2: 'application/vnd.cocoonstack.snapshot.v2+json',
  config: 'application/vnd.cocoonstack.snapshot.config.v1+json',
};
/** docs/registry.md "Media types" by file name. */
const layerType = (title: string) =>
  title === 'config.json'
    ? 'application/vnd.cocoonstack.vm.config+json'
    : title === 'state.json'
      ? 'application/vnd.cocoonstack.vm.state+json'
      : title.endsWith('.raw')
        ? 'application/vnd.cocoonstack.disk.raw'
        : 'application/octet-stream';

/** The files of a `cocoon snapshot export` tar, with the PAX records of each entry. */
async function untar(
  bytes: Buffer,
): Promise<{ files: Map<string, Buffer>; pax: Map<string, Record<string, string>> }> {
  const out = { files: new Map<string, Buffer>(), pax: new Map<string, Record<string, string>>() };
  const ex = tar.extract();
  const done = new Promise<void>((resolve, reject) => {
    ex.on('entry', (h, stream, next) => {
      const chunks: Buffer[] = [];
      stream.on('data', (c: unknown) => chunks.push(c as Buffer));
      stream.on('end', () => {
        out.files.set(h.name, Buffer.concat(chunks));
        if (h.pax) out.pax.set(h.name, h.pax as Record<string, string>);
        next();
      });
    });
    ex.on('finish', resolve);
    ex.on('error', reject);
  });
  ex.end(bytes);
  await done;
  return out;
}

/** `cocoon snapshot import --name <name>` of the source files (memory-range-0 grown). */
async function importSource(name: string): Promise<void> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  pack.on('data', (c: unknown) => chunks.push(c as Buffer));
  const ended = new Promise<void>((resolve) => pack.on('end', () => resolve()));
  for (const [title, bytes] of files)
    pack.entry(
      { name: title, size: bytes.length, mode: 0o644, ...(pax.has(title) ? { pax: pax.get(title) } : {}) },
      bytes,
    );
  pack.finalize();
  await ended;
  await run(w.cocoonBin, ['snapshot', 'import', '--name', name], {
    env: { ...process.env, ...w.simulator.env() },
    input: Buffer.concat(chunks),
  });
}

/** The imported snapshot's files equal the source's, byte for byte (sparse PAX records too). */
async function assertSameFiles(localName: string) {
  const got = await untar(await exportSnapshot(localName));
  for (const [title, bytes] of files) {
    if (title === 'snapshot.json') continue;
    assert.equal(sha256(got.files.get(title) ?? Buffer.alloc(0)), sha256(bytes), `${title} byte-equal`);
    assert.deepEqual(got.pax.get(title), pax.get(title), `${title} PAX records`);
  }
}

/** `cocoon snapshot export <name>` as a buffer. */
async function exportSnapshot(name: string): Promise<Buffer> {
  const { stdout } = await run(
    'bash',
    ['-c', `"$0" snapshot export "$1" --output - | base64 -w0`, w.cocoonBin, name],
    {
      env: { ...process.env, ...w.simulator.env() },
    },
  );
  return Buffer.from(stdout, 'base64');
}

async function orasRun(args: string[]): Promise<string> {
  return (await run(oras, args, { cwd: work })).stdout;
}

interface Blob {
  title: string;
  bytes: Buffer;
  mediaType: string;
  annotations?: Record<string, string>;
}

/** Uploads the config and every layer with `oras blob push`, then the hand-written manifest with
 * `oras manifest push`, as `<ns>/<repo>:<tag>` of the ground's registry. */
async function orasPush(
  repo: string,
  tag: string,
  config: object,
  layers: Blob[],
  annotations: Record<string, string> = {},
) {
  const ref = `${w.ground.registry.hostPort}/${w.namespace}/${repo}`;
  const configBytes = Buffer.from(JSON.stringify(config));
  const blobs = [{ bytes: configBytes }, ...layers];
  for (const [i, b] of blobs.entries()) {
    const file = join(work, `${repo}-${tag}-blob-${i}`);
    writeFileSync(file, b.bytes);
    await orasRun(['blob', 'push', '--plain-http', `${ref}@${sha256(b.bytes)}`, file]);
  }
  const manifest = {
    schemaVersion: 2,
    mediaType: MT.manifest,
    artifactType: MT.v2,
    config: { mediaType: MT.config, digest: sha256(configBytes), size: configBytes.length },
    layers: layers.map((l) => ({
      mediaType: l.mediaType,
      digest: sha256(l.bytes),
      size: l.bytes.length,
      annotations: { 'org.opencontainers.image.title': l.title, ...l.annotations },
    })),
    annotations: { 'org.opencontainers.image.created': '2026-12-05T00:00:00Z', ...annotations },
  };
  const file = join(work, `${repo}-${tag}-manifest.json`);
  writeFileSync(file, JSON.stringify(manifest, null, 2));
  await orasRun(['manifest', 'push', '--plain-http', '--media-type', MT.manifest, `${ref}:${tag}`, file]);
}

/** `split -b <size>` then `zstd` of each piece: the chunks of one file, in order. */
async function splitAndCompress(title: string, chunkBytes: number): Promise<Buffer[]> {
  const dir = mkdtempSync(join(work, 'split-'));
  writeFileSync(join(dir, title), files.get(title)!);
  await run('split', ['-b', String(chunkBytes), '-d', '-a', '3', title, 'part.'], { cwd: dir });
  const parts = readdirSync(dir)
    .filter((n) => n.startsWith('part.'))
    .sort();
  for (const p of parts) await run('zstd', ['-q', '-3', p, '-o', `${p}.zst`], { cwd: dir });
  return parts.map((p) => readFileSync(join(dir, `${p}.zst`)));
}

/** A v2 vector of the source: the large file (memory-range-0) cut into 1 MiB chunks, each zstd;
 * cow.raw (sparse) cut into 1 KiB chunks, each zstd; the rest raw. Layers are listed with the
 * memory chunks reversed: the config's `chunks` order is the one that counts. `edit` may damage it. */
async function vector(edit: (chunks: Map<string, Buffer[]>) => void = () => {}) {
  const chunks = new Map([
    ['memory-range-0', await splitAndCompress('memory-range-0', 1 << 20)],
    ['cow.raw', await splitAndCompress('cow.raw', 1024)],
  ]);
  edit(chunks);
  const layers: Blob[] = [];
  const fileInfo: Record<string, object> = {};
  for (const [title, bytes] of files) {
    if (title === 'snapshot.json') continue;
    const p = pax.get(title) ?? {};
    const sparse = {
      ...(p['COCOON.sparse.map'] !== undefined ? { sparseMap: p['COCOON.sparse.map'] } : {}),
      ...(p['COCOON.sparse.size'] !== undefined ? { sparseSize: Number(p['COCOON.sparse.size']) } : {}),
    };
    const parts = chunks.get(title);
    if (!parts) {
      layers.push({ title, bytes, mediaType: layerType(title) });
      fileInfo[title] = { mode: 0o644, size: bytes.length, ...sparse };
      continue;
    }
    const chunkLayers = parts.map((b, i) => ({
      title,
      bytes: b,
      mediaType: `${layerType(title)}+zstd`,
      annotations: { 'cocoonstack.chunk.index': String(i), 'cocoonstack.chunk.count': String(parts.length) },
    }));
    layers.push(...(title === 'memory-range-0' ? [...chunkLayers].reverse() : chunkLayers));
    fileInfo[title] = { mode: 0o644, size: bytes.length, ...sparse, chunks: parts.map(sha256) };
  }
  const config = {
    schemaVersion: 'v2',
    snapshotId: envelope.id,
    image: envelope.image,
    imageDigest: envelope.image_digest,
    hypervisor: envelope.hypervisor,
    cpu: envelope.cpu,
    memory: envelope.memory,
    storage: envelope.storage,
    nics: envelope.nics,
    files: fileInfo,
    createdAt: '2026-12-05T00:00:00Z',
  };
  return { config, layers };
}

const create = (name: string, annotations: Record<string, string>) =>
  w.core.createNamespacedPod({ namespace: w.namespace, body: vmPod(name, w.nodeName, annotations) });
const waitState = (name: string, state: string, timeoutMs = 90_000) =>
  waitForPod(w.core, w.namespace, name, `lifecycle ${state}`, (p) => lifecycle(p) === state, timeoutMs);
const localSnapshots = async () => {
  const out = (await w.sim(['snapshot', 'list', '--output', 'json'])).trim();
  // cocoon prints "No snapshots found." instead of an empty list.
  return out.startsWith('[') ? (JSON.parse(out) as { name: string }[]).map((s) => s.name) : [];
};

/** The imported snapshot equals the source: its id, and every file byte for byte. */
async function assertSameSnapshot(localName: string) {
  const got = await untar(await exportSnapshot(localName));
  const env = JSON.parse(got.files.get('snapshot.json')!.toString()) as { config: { id: string } };
  assert.equal(env.config.id, envelope.id, 'the snapshot id');
  await assertSameFiles(localName);
}

before(async () => {
  w = await world();
  oras =
    process.env.VK_ORAS_BIN ??
    `${(await run('bash', [join(repoRoot, 'scripts', 'orasbin.sh')])).stdout.trim().split('\n').pop()}/oras`;
  work = mkdtempSync(join(tmpdir(), 'vk-v2-'));
  // CocoonCli hands cocoon this process's environment (docs/contracts/cocoon-cli.md).
  Object.assign(process.env, w.simulator.env());
  await fixture(w, 'acme/agent', 'linux');
  await w.restart({ OCI_REGISTRY: `${w.ground.registry.hostPort}/${w.namespace}` });
  // The source: a VM with a marker on its disk, saved; its memory file grown to 2.5 MiB of a
  // pattern so that chunking and compression have something to cut (cocoon treats it as opaque).
  await w.sim(['vm', 'clone', '--output', 'json', '--name', 'v2-src', '--pull', 'acme/agent']);
  await w.simulator.diskWrite('v2-src', MARKER);
  await w.sim(['snapshot', 'save', '--name', 'v2-src-snap', 'v2-src']);
  const src = await untar(await exportSnapshot('v2-src-snap'));
  // Gone from this host, so the import keeps the snapshot id (cocoon gives an import a new id
  // when the one it carries is taken).
  await w.sim(['vm', 'rm', '--force', 'v2-src']);
  await w.sim(['snapshot', 'rm', 'v2-src-snap']);
  files = src.files;
  pax = src.pax;
  files.set('memory-range-0', Buffer.from(Array.from({ length: 5 << 19 }, (_, i) => (i % 251) ^ (i >> 12))));
  envelope = (JSON.parse(files.get('snapshot.json')!.toString()) as { config: typeof envelope }).config;
  assert.ok(pax.get('cow.raw')?.['COCOON.sparse.map'], 'the source disk is sparse');
});

after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

test('a v2 vector made by split, zstd and oras: the daemon clones from it; marker, snapshot id and every file intact', async () => {
  const v = await vector();
  await orasPush('v2-golden', 'v1', v.config, v.layers);
  await create('clone-0', managedAnnotations('vk-v2-clone', 'v2-golden:v1'));
  const p = await waitState('clone-0', 'ready');
  assert.equal(await w.simulator.diskRead(`vk-v2-clone`), MARKER, 'the guest marker');
  assert.ok(p.metadata?.annotations?.['vm.cocoonstack.io/id']);
  const local = (await localSnapshots()).find((n) => n.includes('v2-golden'));
  assert.ok(local, 'imported under its local name');
  await assertSameSnapshot(local);
});

test('stamped with the pod`s namespace under <vm>:hibernate, it is woken from', async () => {
  const v = await vector();
  await orasPush('vk-v2-wake', 'hibernate', v.config, v.layers, {
    'cocoonstack.snapshot.baseimage': 'acme/agent',
    'vm.cocoonstack.io/namespace': w.namespace,
  });
  await create(
    'wake-0',
    managedAnnotations('vk-v2-wake', 'acme/agent', { 'vm.cocoonstack.io/restore-from-hibernate': 'true' }),
  );
  await waitState('wake-0', 'ready');
  assert.equal(await w.simulator.diskRead('vk-v2-wake'), MARKER, 'woken with the guest marker');
});

interface Damage {
  name: string;
  pod: string;
  /** Edits the compressed chunks before the layers are made. */
  chunks?: (chunks: Map<string, Buffer[]>) => void;
  /** Edits the config's file list after. */
  files?: (files: Record<string, { chunks?: string[] }>) => void;
  reason: RegExp;
}

const DAMAGES: Damage[] = [
  {
    name: 'a corrupt chunk (its digest recomputed, so the registry takes it)',
    pod: 'bad-corrupt',
    chunks: (c) => {
      const bad = Buffer.from(c.get('memory-range-0')![1]!);
      bad[Math.floor(bad.length / 2)]! ^= 0xff;
      c.get('memory-range-0')![1] = bad;
    },
    reason: /memory-range-0 chunk 1 \(sha256:[0-9a-f]{64}\): not a valid zstd stream/,
  },
  {
    name: 'chunks listed out of order (the layers keep their index annotations)',
    pod: 'bad-order',
    files: (f) => {
      const list = f['cow.raw']!.chunks!;
      [list[0], list[1]] = [list[1]!, list[0]!];
    },
    reason:
      /files\[cow\.raw\]\.chunks\[0\] is the layer annotated cocoonstack\.chunk\.index=1: the chunk order disagrees/,
  },
  {
    name: 'a truncated zstd stream',
    pod: 'bad-truncated',
    chunks: (c) => {
      const list = c.get('memory-range-0')!;
      list[2] = list[2]!.subarray(0, list[2]!.length - 7);
    },
    reason: /memory-range-0 chunk 2 \(sha256:[0-9a-f]{64}\): the zstd stream is truncated/,
  },
];

for (const d of DAMAGES) {
  test(`${d.name}: the pod fails at once with the reason; no snapshot is left`, async () => {
    const v = await vector(d.chunks);
    d.files?.(v.config.files as Record<string, { chunks?: string[] }>);
    const repo = `v2-${d.pod}`;
    await orasPush(repo, 'v1', v.config, v.layers);
    await create(d.pod, managedAnnotations(`vk-${d.pod}`, `${repo}:v1`));
    const p: V1Pod = await waitState(d.pod, 'failed', 60_000);
    assert.match(lifecycleMessage(p), d.reason);
    assert.ok(!(await localSnapshots()).some((n) => n.includes(repo)), 'no half-imported snapshot');
  });
}

test('oras lists and fetches what the daemon pushed (a hibernate, v1)', async () => {
  await create('push-0', managedAnnotations('vk-v2-push'));
  await waitState('push-0', 'ready');
  await w.simulator.diskWrite('vk-v2-push', 'pushed-marker');
  await annotate(w.core, w.namespace, 'push-0', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitState('push-0', 'hibernated');
  const ref = `${w.ground.registry.hostPort}/${w.namespace}/vk-v2-push`;
  assert.match(await orasRun(['repo', 'tags', '--plain-http', ref]), /^hibernate$/m);
  const out = mkdtempSync(join(work, 'pulled-'));
  await orasRun(['pull', '--plain-http', '-o', out, `${ref}:hibernate`]);
  const pulled = readdirSync(out).sort();
  assert.ok(pulled.includes('cow.raw') && pulled.includes('config.json'), pulled.join(', '));
  const manifest = JSON.parse(await orasRun(['manifest', 'fetch', '--plain-http', `${ref}:hibernate`])) as {
    artifactType: string;
    layers: { digest: string; annotations: Record<string, string> }[];
  };
  assert.equal(manifest.artifactType, 'application/vnd.cocoonstack.snapshot.v1+json');
  for (const l of manifest.layers) {
    const title = l.annotations['org.opencontainers.image.title']!;
    assert.equal(sha256(readFileSync(join(out, title))), l.digest, `${title}: oras's bytes match the digest`);
  }
  assert.ok(
    readFileSync(join(out, 'cow.raw')).includes(Buffer.from('pushed-marker')),
    'the marker in the pushed disk',
  );
});

test('our v2 writer (zstd 3, 1 MiB chunks): oras and zstd read it; the daemon clones from it byte-equal', async () => {
  await importSource('v2-local');
  const cli = new CocoonCli(w.cocoonBin, AbortSignal.timeout(120_000), silentLogger);
  const registry = new RegistryClient({
    base: `${w.ground.registry.hostPort}/${w.namespace}`,
    credentials: [],
  });
  try {
    await pushSnapshot({
      registry,
      cli,
      localName: 'v2-local',
      repo: 'v2-ours',
      tag: 'v1',
      baseImage: '',
      v2: { zstdLevel: 3, chunkBytes: 1 << 20 },
    });
  } finally {
    registry.close();
  }
  const ref = `${w.ground.registry.hostPort}/${w.namespace}/v2-ours`;
  const manifest = JSON.parse(await orasRun(['manifest', 'fetch', '--plain-http', `${ref}:v1`])) as {
    artifactType: string;
    config: { digest: string };
    layers: { mediaType: string; digest: string; annotations: Record<string, string> }[];
  };
  assert.equal(manifest.artifactType, MT.v2);
  const memory = manifest.layers.filter(
    (l) => l.annotations['org.opencontainers.image.title'] === 'memory-range-0',
  );
  assert.deepEqual(
    memory.map((l) => [
      l.mediaType,
      l.annotations['cocoonstack.chunk.index'],
      l.annotations['cocoonstack.chunk.count'],
    ]),
    [0, 1, 2].map((k) => ['application/octet-stream+zstd', String(k), '3']),
  );
  const config = JSON.parse(
    await orasRun(['blob', 'fetch', '--plain-http', '--output', '-', `${ref}@${manifest.config.digest}`]),
  ) as {
    schemaVersion: string;
    files: Record<string, { size: number; chunks?: string[]; sparseSize?: unknown }>;
  };
  assert.equal(config.schemaVersion, 'v2');
  assert.equal(
    config.files['memory-range-0']?.size,
    files.get('memory-range-0')!.length,
    'the uncompressed size',
  );
  assert.deepEqual(
    config.files['memory-range-0']?.chunks,
    memory.map((l) => l.digest),
  );
  assert.equal(typeof config.files['cow.raw']?.sparseSize, 'number');
  // Each chunk, fetched by oras and decompressed by Debian's zstd, is its 1 MiB of the file.
  const parts: Buffer[] = [];
  for (const l of memory) {
    const z = join(work, `ours-${l.annotations['cocoonstack.chunk.index']}.zst`);
    await orasRun(['blob', 'fetch', '--plain-http', '--output', z, `${ref}@${l.digest}`]);
    await run('zstd', ['-q', '-d', '-f', z, '-o', `${z}.raw`]);
    parts.push(readFileSync(`${z}.raw`));
  }
  assert.ok(
    Buffer.concat(parts).equals(files.get('memory-range-0')!),
    'zstd -d of the chunks, in order, is the file',
  );
  await create('ours-0', managedAnnotations('vk-v2-ours', 'v2-ours:v1'));
  await waitState('ours-0', 'ready');
  assert.equal(await w.simulator.diskRead('vk-v2-ours'), MARKER, 'the guest marker');
  const local = (await localSnapshots()).find((n) => n.includes('v2-ours'));
  assert.ok(local);
  await assertSameFiles(local);
});

test('the daemon with SNAPSHOT_ZSTD_LEVEL and SNAPSHOT_CHUNK_SIZE_MIB hibernates as v2 and wakes from it', async () => {
  await w.daemon.stop();
  await w.restart({
    OCI_REGISTRY: `${w.ground.registry.hostPort}/${w.namespace}`,
    SNAPSHOT_ZSTD_LEVEL: '3',
    SNAPSHOT_CHUNK_SIZE_MIB: '1',
  });
  await create('hib-0', managedAnnotations('vk-v2-hib'));
  await waitState('hib-0', 'ready');
  await w.simulator.diskWrite('vk-v2-hib', 'hibernated-as-v2');
  await annotate(w.core, w.namespace, 'hib-0', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitState('hib-0', 'hibernated');
  const ref = `${w.ground.registry.hostPort}/${w.namespace}/vk-v2-hib`;
  const manifest = JSON.parse(await orasRun(['manifest', 'fetch', '--plain-http', `${ref}:hibernate`])) as {
    artifactType: string;
  };
  assert.equal(manifest.artifactType, MT.v2);
  await annotate(w.core, w.namespace, 'hib-0', { 'vm.cocoonstack.io/hibernate': null });
  await waitState('hib-0', 'ready');
  assert.equal(await w.simulator.diskRead('vk-v2-hib'), 'hibernated-as-v2');
});
