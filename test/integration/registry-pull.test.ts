// The registry read path and the snapshot pull (registry.md §2–§5, §7) against the REAL
// registry of the test ground (CNCF distribution v3 by default; Debian's 2.8 with
// VK_REGISTRY_KIND=docker-registry: both behave alike here) and the cocoon simulator,
// plus a small in-process fake registry for what a real registry will not do on demand:
// Bearer/Basic challenges, a redirect to another host, 5xx, truncated bodies and digest
// mismatches.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import tar from 'tar-stream';
import { issueCert, makeCa } from '../../ground/certs.ts';
import { type Ground, useGround } from '../../ground/ground.ts';
import { waitFor } from '../../ground/proc.ts';
import { startRegistry, stopRegistry } from '../../ground/registry.ts';
import { newSimRoot, type SimRoot } from '../../sim/client.ts';
import { CocoonCli } from '../../src/cocoon/runner.ts';
import { loadConfig } from '../../src/config/env.ts';
import { createLogger, silentLogger } from '../../src/log.ts';
import { MEDIA_TYPE } from '../../src/registry/artifact.ts';
import { RegistryClient, registryFromConfig } from '../../src/registry/client.ts';
import { RegistryError } from '../../src/registry/errors.ts';
import { pullSnapshot, SnapshotPullError } from '../../src/registry/pull.ts';
import { parseReference } from '../../src/registry/reference.ts';
import { SnapshotPuller } from '../../src/registry/snapshot-puller.ts';

const ground = useGround();
let g: Ground;
let sim: SimRoot;
let cli: CocoonCli;
/** The same simulator behind a shim that keeps a copy of every import tar (see {@link capturedTar}). */
let teeCli: CocoonCli;
let captureDir: string;
const lifetime = new AbortController();
/** A docker config dir with credentials for the fake registry (set per test). */
let dockerDir: string;

before(async () => {
  g = await ground();
  sim = await newSimRoot();
  // CocoonCli passes the provider's own environment to cocoon (cocoon-cli.md §1).
  Object.assign(process.env, sim.env());
  dockerDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-docker-'));
  process.env.DOCKER_CONFIG = dockerDir;
  cli = new CocoonCli(sim.cocoonBin, lifetime.signal, silentLogger);
  // The simulator does not keep the tars it imports; this shim tees the stdin of
  // `snapshot import --name <n>` to <captureDir>/<n with / and : as _>.tar, then runs it.
  captureDir = path.join(sim.dir, 'captured');
  fs.mkdirSync(captureDir);
  const shim = path.join(sim.dir, 'tee-cocoon');
  fs.writeFileSync(
    shim,
    [
      '#!/usr/bin/env bash',
      'if [ "$1" = snapshot ] && [ "$2" = import ] && [ "$3" = --name ]; then',
      `  tee "${captureDir}/$(printf %s "$4" | tr /: __).tar" | "${sim.cocoonBin}" "$@"`,
      // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion
      '  exit "${PIPESTATUS[1]}"',
      'fi',
      `exec "${sim.cocoonBin}" "$@"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  teeCli = new CocoonCli(shim, lifetime.signal, silentLogger);
});

after(async () => {
  lifetime.abort();
  await sim?.cleanup();
  if (dockerDir) fs.rmSync(dockerDir, { recursive: true, force: true });
});

// --- Artifact building --------------------------------------------------------------------

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
const newSnapshotId = () => Array.from(randomBytes(26), (b) => B32[b % 32]).join('');

interface Artifact {
  snapshotId: string;
  files: { title: string; data: Buffer; mediaType: string }[];
  config: Buffer;
  manifest: Buffer;
  digest: string;
  blobs: Map<string, Buffer>;
}

/** A v1 snapshot artifact (registry.md §4.1, §4.2) with the five usual files. */
function buildArtifact(
  opts: {
    files?: Record<string, object>;
    extraConfig?: Record<string, unknown>;
    memorySize?: number;
    overlaySize?: number;
  } = {},
) {
  const snapshotId = newSnapshotId();
  const files = [
    {
      title: 'config.json',
      data: Buffer.from(JSON.stringify({ cpus: { boot_vcpus: 2 } })),
      mediaType: MEDIA_TYPE.vmConfig,
    },
    {
      title: 'state.json',
      data: Buffer.from(JSON.stringify({ state: 'paused', id: snapshotId })),
      mediaType: MEDIA_TYPE.vmState,
    },
    { title: 'memory-ranges', data: randomBytes(opts.memorySize ?? 300_000), mediaType: MEDIA_TYPE.vmMemory },
    {
      title: 'overlay.qcow2',
      data: randomBytes(opts.overlaySize ?? 70_000),
      mediaType: MEDIA_TYPE.diskQcow2,
    },
    { title: 'cidata.img', data: randomBytes(4096), mediaType: MEDIA_TYPE.vmCidata },
  ];
  const config = Buffer.from(
    JSON.stringify({
      schemaVersion: 'v1',
      snapshotId,
      image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      imageDigest: `sha256:${'5f'.repeat(32)}`,
      imageType: 'oci',
      imageBlobIds: { '9c1e0d': {} },
      hypervisor: 'cloud-hypervisor',
      cpu: 2,
      memory: 2147483648,
      storage: 21474836480,
      nics: 1,
      network: 'cocoon-dhcp',
      files: opts.files ?? {
        'memory-ranges': { mode: 0o644, size: 300_000 },
        'overlay.qcow2': { mode: 0o600 },
      },
      createdAt: '2026-08-12T09:29:41Z',
      ...opts.extraConfig,
    }),
  );
  const manifest = Buffer.from(
    JSON.stringify(
      {
        schemaVersion: 2,
        mediaType: MEDIA_TYPE.ociManifest,
        artifactType: MEDIA_TYPE.snapshotV1,
        config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: sha(config), size: config.length },
        layers: files.map((f) => ({
          mediaType: f.mediaType,
          digest: sha(f.data),
          size: f.data.length,
          annotations: { 'org.opencontainers.image.title': f.title },
        })),
        annotations: {
          'org.opencontainers.image.created': '2026-08-12T09:30:00Z',
          'cocoonstack.snapshot.baseimage': 'cocoon/ubuntu-hot:v1',
          'cocoonstack.snapshot.id': 'legacy, ignored',
        },
      },
      null,
      2,
    ),
  );
  const blobs = new Map<string, Buffer>([
    [sha(config), config],
    ...files.map((f) => [sha(f.data), f.data] as const),
  ]);
  return { snapshotId, files, config, manifest, digest: sha(manifest), blobs } satisfies Artifact;
}

// --- Pushing to the real registry by plain HTTP -------------------------------------------

async function pushBlob(name: string, data: Buffer): Promise<void> {
  const start = await fetch(`${g.registry.url}/v2/${name}/blobs/uploads/`, { method: 'POST' });
  assert.equal(start.status, 202);
  const location = new URL(start.headers.get('location') ?? '', g.registry.url);
  location.searchParams.set('digest', sha(data));
  const put = await fetch(location, {
    method: 'PUT',
    body: data,
    headers: { 'content-type': 'application/octet-stream' },
  });
  assert.equal(put.status, 201, await put.text());
}

async function pushManifest(
  name: string,
  ref: string,
  body: Buffer,
  mediaType: string = MEDIA_TYPE.ociManifest,
) {
  const put = await fetch(`${g.registry.url}/v2/${name}/manifests/${ref}`, {
    method: 'PUT',
    body,
    headers: { 'content-type': mediaType },
  });
  assert.equal(put.status, 201, await put.text());
}

async function pushArtifact(name: string, tag: string, a: Artifact): Promise<void> {
  for (const blob of a.blobs.values()) await pushBlob(name, blob);
  await pushManifest(name, tag, a.manifest);
}

// --- Assertions on the simulator ------------------------------------------------------------

interface SnapshotJson {
  id: string;
  name: string;
  hypervisor: string;
  image: string;
  image_digest: string;
  cpu: number;
  network?: string;
}

async function inspect(name: string): Promise<SnapshotJson | undefined> {
  const r = await sim.run(['snapshot', 'inspect', name]);
  return r.code === 0 ? (JSON.parse(r.stdout) as SnapshotJson) : undefined;
}

async function snapshotNames(): Promise<string[]> {
  const r = await sim.run(['snapshot', 'list', '-o', 'json']);
  const out = r.stdout.trim();
  if (out === '' || !out.startsWith('[')) return [];
  return (JSON.parse(out) as SnapshotJson[]).map((s) => s.name);
}

const dataDir = (id: string) => path.join(sim.root, 'snapshot', 'localfile', id);
const localDirs = () => {
  try {
    return fs.readdirSync(path.join(sim.root, 'snapshot', 'localfile')).sort();
  } catch {
    return [];
  }
};

/** `cocoon` argv of the simulator's calls since `from`, as `verb noun args...` strings. */
const callsSince = (from: number) =>
  sim
    .calls()
    .slice(from)
    .map((c) => c.argv.join(' '));

interface TarEntry {
  name: string;
  type: string;
  mode: number;
  size: number;
  mtime: Date;
  pax: Record<string, string> | null;
  body: Buffer;
}

/** The entries of the tar the import of `localName` received (through the tee shim). */
async function capturedTar(localName: string): Promise<TarEntry[]> {
  const file = path.join(captureDir, `${localName.replace(/[/:]/g, '_')}.tar`);
  const extract = tar.extract();
  const entries: TarEntry[] = [];
  const reading = (async () => {
    for await (const entry of extract) {
      const chunks: Buffer[] = [];
      for await (const c of entry) chunks.push(c as Buffer);
      const h = entry.header;
      entries.push({
        name: h.name,
        type: h.type,
        mode: h.mode,
        size: h.size,
        mtime: h.mtime,
        pax: (h.pax as Record<string, string> | null) ?? null,
        body: Buffer.concat(chunks),
      });
    }
  })();
  extract.end(fs.readFileSync(file));
  await reading;
  return entries;
}

function logCapture() {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.trim() !== '') lines.push(JSON.parse(l));
      cb();
    },
  });
  return { log: createLogger('debug', sink), lines };
}

// --- The real registry (test-ground.md §6) --------------------------------------------------

describe("the ground's registry (real)", () => {
  let registry: RegistryClient;
  before(() => {
    registry = new RegistryClient({ base: `${g.registry.hostPort}/cocoon`, credentials: [] });
  });
  after(() => registry.close());

  it('pins: OCI manifests need the Accept header; absent tag and unknown repo are "absent"; blobs 404 BLOB_UNKNOWN', async () => {
    const a = buildArtifact();
    const name = registry.repository('pins/agent');
    await pushArtifact(name, 'v1', a);
    await registry.ping();
    // Without Accept the registry answers 404 for an OCI manifest; the client always sends it.
    assert.equal((await fetch(`${g.registry.url}/v2/${name}/manifests/v1`)).status, 404);
    const head = await registry.headManifest(name, parseReference('v1'));
    assert.notEqual(head, 'absent');
    assert.equal(head !== 'absent' && head.digest, a.digest);
    assert.equal(head !== 'absent' && head.mediaType, MEDIA_TYPE.ociManifest);
    // Custom artifactType and config media type are stored verbatim (same bytes, same digest).
    const got = await registry.getManifest(name, parseReference('v1'));
    assert.ok(got !== 'absent');
    assert.equal(got.digest, a.digest);
    assert.deepEqual(got.bytes, a.manifest);
    assert.equal(got.manifest.artifactType, MEDIA_TYPE.snapshotV1);
    assert.equal(got.manifest.config.mediaType, MEDIA_TYPE.snapshotConfig);
    const byDigest = await registry.getManifest(name, parseReference(a.digest));
    assert.equal(byDigest !== 'absent' && byDigest.digest, a.digest);
    // Absent: unknown tag and unknown repository, HEAD and GET. v3 and 2.8 answer MANIFEST_UNKNOWN for
    // both (not NAME_UNKNOWN for the repository); the client takes any manifest 404 as absent.
    const code = async (path: string) => {
      const r = await fetch(`${g.registry.url}${path}`, { headers: { accept: MEDIA_TYPE.ociManifest } });
      return `${r.status} ${((await r.json()) as { errors: { code: string }[] }).errors[0]?.code}`;
    };
    assert.equal(await code(`/v2/${name}/manifests/nope`), '404 MANIFEST_UNKNOWN');
    assert.equal(await code('/v2/cocoon/never/pushed/manifests/hibernate'), '404 MANIFEST_UNKNOWN');
    assert.equal(await registry.headManifest(name, parseReference('nope')), 'absent');
    assert.equal(await registry.getManifest(name, parseReference('nope')), 'absent');
    const unknownRepo = registry.repository('never/pushed');
    assert.equal(await registry.headManifest(unknownRepo, parseReference('hibernate')), 'absent');
    assert.equal(await registry.getManifest(unknownRepo, parseReference('hibernate')), 'absent');
    // A missing blob is an error, not absence.
    const missing = `sha256:${'0'.repeat(64)}`;
    await assert.rejects(registry.getBlob(name, { digest: missing, size: 1 }), (e: unknown) => {
      assert.ok(e instanceof RegistryError);
      assert.equal(e.status, 404);
      assert.equal(e.code, 'BLOB_UNKNOWN');
      return true;
    });
    // Blobs stream verified.
    const layer = a.files[2]!;
    const bytes = await registry.getBlobBytes(
      name,
      { digest: sha(layer.data), size: layer.data.length },
      1 << 20,
    );
    assert.deepEqual(bytes, layer.data);
    await assert.rejects(
      registry.getBlobBytes(name, { digest: sha(layer.data), size: layer.data.length + 1 }, 1 << 20),
      /Content-Length 300000 but the descriptor says 300001/,
    );
  });

  it('pulls a v1 snapshot into the simulator: snapshot.json first, files, modes, inspect record', async () => {
    const a = buildArtifact();
    const repo = 'acme/agent';
    const name = registry.repository(repo);
    await pushArtifact(name, 'v3', a);
    const from = sim.calls().length;
    const { log, lines } = logCapture();
    const started = Date.now();
    const rec = await pullSnapshot({
      registry,
      cli: teeCli,
      repo,
      tag: 'v3',
      localName: 'acme/agent:v3',
      log,
      progressIntervalMs: 20,
    });
    const calls = callsSince(from);
    assert.equal(rec.id, a.snapshotId);
    assert.equal(rec.name, 'acme/agent:v3');
    assert.equal(rec.hypervisor, 'cloud-hypervisor');
    assert.equal(rec.image, 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04');
    const shown = await inspect('acme/agent:v3');
    assert.equal(shown?.id, a.snapshotId);
    assert.equal(shown?.name, 'acme/agent:v3');
    assert.equal(shown?.hypervisor, 'cloud-hypervisor');
    assert.equal(shown?.image, 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04');
    assert.equal(shown?.cpu, 2);
    assert.equal(shown?.network, 'cocoon-dhcp');
    // rm (idempotency) → import → inspect, exact argv (cocoon-cli.md §2).
    assert.deepEqual(calls, [
      'snapshot rm acme/agent:v3',
      'snapshot import --name acme/agent:v3',
      'snapshot inspect acme/agent:v3',
    ]);
    const importCall = sim.calls()[from + 1]!;
    assert.equal(importCall.exit, 0);
    // The tar cocoon received: snapshot.json (0644, the translated envelope) first, then every
    // layer in manifest order with title, blob size, mode and a current mtime.
    const entries = await capturedTar('acme/agent:v3');
    assert.deepEqual(
      entries.map((e) => [e.name, e.type, e.mode.toString(8), e.size]),
      [
        ['snapshot.json', 'file', '644', entries[0]!.body.length],
        ['config.json', 'file', '640', a.files[0]!.data.length],
        ['state.json', 'file', '640', a.files[1]!.data.length],
        ['memory-ranges', 'file', '644', a.files[2]!.data.length],
        ['overlay.qcow2', 'file', '600', a.files[3]!.data.length],
        ['cidata.img', 'file', '640', a.files[4]!.data.length],
      ],
    );
    assert.deepEqual(JSON.parse(entries[0]!.body.toString()), {
      version: 1,
      config: {
        id: a.snapshotId,
        name: 'acme/agent:v3',
        image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
        image_digest: `sha256:${'5f'.repeat(32)}`,
        image_type: 'oci',
        image_blob_ids: { '9c1e0d': {} },
        hypervisor: 'cloud-hypervisor',
        cpu: 2,
        memory: 2147483648,
        storage: 21474836480,
        nics: 1,
        network: 'cocoon-dhcp',
      },
    });
    for (const [i, f] of a.files.entries()) assert.deepEqual(entries[i + 1]!.body, f.data, f.title);
    for (const e of entries) {
      assert.equal(e.pax, null, `${e.name}: no PAX records without sparse metadata`);
      assert.ok(e.mtime.getTime() >= Math.floor(started / 1000) * 1000 - 1000, `${e.name} mtime = now`);
    }
    // Every layer landed byte-for-byte with its mode (files[].mode, else 0640).
    const dir = dataDir(a.snapshotId);
    for (const f of a.files) assert.deepEqual(fs.readFileSync(path.join(dir, f.title)), f.data, f.title);
    const mode = (f: string) => (fs.statSync(path.join(dir, f)).mode & 0o777).toString(8);
    assert.equal(mode('memory-ranges'), '644');
    assert.equal(mode('overlay.qcow2'), '600');
    assert.equal(mode('config.json'), '640');
    // stdin carried the tar: snapshot.json (512 + data, padded) + every layer.
    const payload = a.files.reduce((s, f) => s + f.data.length, 0);
    assert.ok(importCall.stdinBytes > payload, `${importCall.stdinBytes} <= ${payload}`);
    assert.ok(lines.some((l) => l.msg === 'snapshot pull: done' && l.totalBytes === payload));
  });

  it('a blob of many MiB: read into reused buffers once the import took their bytes, every byte intact', async () => {
    // bulk-get.ts reads into 1 MiB slabs; the pull hands each piece back after cocoon's stdin took
    // it (slab-pool.ts), so slabs are read into again. This shows reuse happens and the imported
    // bytes stay right end to end through the real registry and the simulator. It does not catch
    // a piece handed back too early: that timing did not corrupt anything here when tried (the
    // head's socket is paused while the pipe is full); test/unit/registry/pump-tar.test.ts pins
    // that a piece goes back only after its write completed.
    const a = buildArtifact({ memorySize: 24 * 1024 * 1024 + 123, overlaySize: 16 * 1024 * 1024 + 7 });
    const name = registry.repository('acme/big');
    await pushArtifact(name, 'v1', a);
    const before = registry.readBuffers;
    const rec = await pullSnapshot({ registry, cli, repo: 'acme/big', tag: 'v1', localName: 'acme/big:v1' });
    assert.equal(rec.id, a.snapshotId);
    const after = registry.readBuffers;
    const dir = dataDir(a.snapshotId);
    for (const f of a.files) assert.ok(fs.readFileSync(path.join(dir, f.title)).equals(f.data), f.title);
    // (Pieces of a blob read ahead and spilled to a file do not come back: their slabs are new.)
    assert.ok(after.reused - before.reused > 0, `no slab reused (${after.made - before.made} made)`);
  });

  it('writes COCOON.sparse.* PAX records the importer honours', async () => {
    const a = buildArtifact({
      files: { 'overlay.qcow2': { mode: 0o640, sparseMap: '0,4096,65536,4464', sparseSize: 10_485_760 } },
    });
    const name = registry.repository('acme/sparse');
    await pushArtifact(name, 'latest', a);
    await pullSnapshot({
      registry,
      cli: teeCli,
      repo: 'acme/sparse',
      tag: 'latest',
      localName: 'acme/sparse',
    });
    const entries = await capturedTar('acme/sparse');
    const overlay = entries.find((e) => e.name === 'overlay.qcow2');
    assert.equal(overlay?.pax?.['COCOON.sparse.map'], '0,4096,65536,4464');
    assert.equal(overlay?.pax?.['COCOON.sparse.size'], '10485760');
    assert.equal(overlay?.size, 70_000);
    assert.equal(entries.find((e) => e.name === 'memory-ranges')?.pax, null);
    // The simulator extends a file to its COCOON.sparse.size, so this proves the record arrived.
    assert.equal(fs.statSync(path.join(dataDir(a.snapshotId), 'overlay.qcow2')).size, 10_485_760);
    assert.equal(fs.statSync(path.join(dataDir(a.snapshotId), 'memory-ranges')).size, 300_000);
  });

  it('resolves an image index (linux/amd64, skipping an unknown/unknown attestation)', async () => {
    const a = buildArtifact();
    const name = registry.repository('acme/indexed');
    await pushArtifact(name, a.digest, a);
    const attest = buildArtifact();
    await pushArtifact(name, attest.digest, attest);
    const index = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MEDIA_TYPE.ociIndex,
        manifests: [
          {
            mediaType: MEDIA_TYPE.ociManifest,
            digest: attest.digest,
            size: attest.manifest.length,
            platform: { os: 'unknown', architecture: 'unknown' },
          },
          {
            mediaType: MEDIA_TYPE.ociManifest,
            digest: a.digest,
            size: a.manifest.length,
            platform: { os: 'linux', architecture: 'amd64' },
          },
        ],
      }),
    );
    await pushManifest(name, 'multi', index, MEDIA_TYPE.ociIndex);
    const got = await registry.getManifest(name, parseReference('multi'));
    assert.ok(got !== 'absent');
    assert.equal(got.digest, a.digest);
    assert.equal(got.indexDigest, sha(index));
    const rec = await pullSnapshot({
      registry,
      cli,
      repo: 'acme/indexed',
      tag: 'multi',
      localName: 'acme/indexed:multi',
    });
    assert.equal(rec.id, a.snapshotId);
  });

  it('absent tag: a clear error, nothing imported', async () => {
    const from = sim.calls().length;
    await assert.rejects(
      pullSnapshot({ registry, cli, repo: 'acme/agent', tag: 'missing', localName: 'acme/agent:missing' }),
      (e: unknown) => {
        assert.ok(e instanceof SnapshotPullError);
        assert.equal(e.absent, true);
        assert.equal(e.undecodable, false, 'an absent tag is no verdict on bytes');
        assert.equal(
          e.message,
          `pull snapshot ${g.registry.hostPort}/cocoon/acme/agent:missing into acme/agent:missing: not found in the registry`,
        );
        return true;
      },
    );
    assert.deepEqual(callsSince(from), []);
  });

  it('refuses a container image and a config whose schemaVersion disagrees, before any cocoon call', async () => {
    const name = registry.repository('acme/wrong');
    const cfg = Buffer.from('{}');
    const layer = Buffer.from('layer');
    await pushBlob(name, cfg);
    await pushBlob(name, layer);
    const containerManifest = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MEDIA_TYPE.ociManifest,
        config: { mediaType: MEDIA_TYPE.ociImageConfig, digest: sha(cfg), size: cfg.length },
        layers: [
          { mediaType: 'application/vnd.oci.image.layer.v1.tar', digest: sha(layer), size: layer.length },
        ],
      }),
    );
    await pushManifest(name, 'container', containerManifest);
    const a = buildArtifact({ extraConfig: { schemaVersion: 'v2' } });
    await pushArtifact(name, 'skewed', a);
    const from = sim.calls().length;
    // Both are this reader's verdict on the bytes (undecodable: the pod fails at once, no retry).
    const undecodable = (re: RegExp) => (e: unknown) =>
      e instanceof SnapshotPullError && e.undecodable && !e.absent && re.test(e.message);
    await assert.rejects(
      pullSnapshot({ registry, cli, repo: 'acme/wrong', tag: 'container', localName: 'w1' }),
      undecodable(/not a snapshot artifact \(classified as container-image\)/),
    );
    await assert.rejects(
      pullSnapshot({ registry, cli, repo: 'acme/wrong', tag: 'skewed', localName: 'w2' }),
      undecodable(/schemaVersion "v2" disagrees with the artifact type/),
    );
    assert.deepEqual(callsSince(from), []);
  });

  it('SnapshotPuller: one pull per local name for concurrent callers; later callers hit the local copy', async () => {
    const a = buildArtifact();
    await pushArtifact(registry.repository('acme/dedup'), 'v7', a);
    const pulls: string[] = [];
    const puller = new SnapshotPuller({ registry, cli, onPullDone: (result) => pulls.push(result) });
    const from = sim.calls().length;
    const waiter = new AbortController();
    const results = await Promise.all([
      puller.ensure('acme/dedup:v7'),
      puller.ensure('acme/dedup:v7'),
      puller.ensure('acme/dedup:v7'),
      // A caller that stops waiting does not stop the pull.
      puller.ensure('acme/dedup:v7', { signal: waiter.signal }).catch((e: unknown) => e),
      (async () => {
        await new Promise((r) => setTimeout(r, 50));
        waiter.abort(new Error('caller gone'));
      })(),
    ]);
    for (const r of results.slice(0, 3)) assert.equal((r as { id: string }).id, a.snapshotId);
    const imports = callsSince(from).filter((c) => c.startsWith('snapshot import'));
    assert.deepEqual(imports, ['snapshot import --name acme/dedup:v7']);
    assert.deepEqual(pulls, ['ok']);
    const again = sim.calls().length;
    assert.equal((await puller.ensure('acme/dedup:v7')).id, a.snapshotId);
    assert.deepEqual(callsSince(again), ['snapshot inspect acme/dedup:v7']);
  });

  it('SnapshotPuller without a registry: the pod-to-vm.md §2.3 error', async () => {
    const puller = new SnapshotPuller({
      registry: registryFromConfig({ ociRegistry: undefined, registryPlainHttp: false }),
      cli,
    });
    await assert.rejects(puller.ensure('acme/none:v1'), {
      message: 'snapshot acme/none:v1 not found locally and no registry configured',
    });
  });
});

// --- The in-process fake registry (fault injection) -----------------------------------------

/** `drop-once`: the first GET of the blob is cut at half (the connection dropped), later ones are served;
 * `truncate` cuts every one. A `Range: bytes=<n>-` request is answered 206 unless the fault is `norange`. */
type Fault = 'truncate' | 'drop-once' | 'norange' | 'mismatch' | 'slow' | 'stall' | number | undefined;

interface SeenRequest {
  method: string;
  path: string;
  authorization: string | undefined;
}

/** A tiny OCI distribution read API (registry.md §3) with knobs; `other` is a second host. */
class FakeRegistry {
  readonly blobs = new Map<string, Buffer>();
  readonly manifests = new Map<string, Buffer>();
  readonly seen: SeenRequest[] = [];
  readonly seenOther: SeenRequest[] = [];
  readonly tokenRequests: { query: string; authorization: string | undefined }[] = [];
  auth: 'none' | 'bearer' | 'basic' = 'none';
  basic = { username: 'puller', password: 'pw' };
  tokenTtl = 300;
  redirectBlobs = false;
  fault: (method: string, path: string) => Fault = () => undefined;
  #tokens = new Set<string>();

  /** Every token issued so far stops working (revoked, or the token server restarted). */
  revokeTokens(): void {
    this.#tokens.clear();
  }
  #main = http.createServer((req, res) => this.#serve(req, res));
  #other = http.createServer((req, res) => this.#serveOther(req, res));
  port = 0;
  otherPort = 0;

  async start(): Promise<this> {
    for (const [srv, set] of [
      [this.#main, (p: number) => (this.port = p)],
      [this.#other, (p: number) => (this.otherPort = p)],
    ] as const) {
      await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
      set((srv.address() as { port: number }).port);
    }
    return this;
  }

  get host(): string {
    return `127.0.0.1:${this.port}`;
  }

  async stop(): Promise<void> {
    for (const srv of [this.#main, this.#other]) {
      srv.closeAllConnections();
      await new Promise((r) => srv.close(r));
    }
  }

  add(name: string, tag: string, a: Artifact): void {
    for (const [d, b] of a.blobs) this.blobs.set(d, b);
    this.manifests.set(`${name}:${tag}`, a.manifest);
    this.manifests.set(`${name}:${a.digest}`, a.manifest);
  }

  #authorized(req: http.IncomingMessage): boolean {
    const h = req.headers.authorization;
    if (this.auth === 'none') return true;
    if (this.auth === 'basic') {
      return h === `Basic ${Buffer.from(`${this.basic.username}:${this.basic.password}`).toString('base64')}`;
    }
    return h?.startsWith('Bearer ') === true && this.#tokens.has(h.slice(7));
  }

  #serve(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', `http://${this.host}`);
    this.seen.push({
      method: req.method ?? '',
      path: url.pathname,
      authorization: req.headers.authorization,
    });
    if (url.pathname === '/token') {
      this.tokenRequests.push({ query: url.search, authorization: req.headers.authorization });
      const expected = `Basic ${Buffer.from(`${this.basic.username}:${this.basic.password}`).toString('base64')}`;
      if (req.headers.authorization !== expected) {
        res.writeHead(401).end();
        return;
      }
      const token = `tok-${this.tokenRequests.length}`;
      this.#tokens.add(token);
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ token, expires_in: this.tokenTtl }));
      return;
    }
    if (!this.#authorized(req)) {
      const m = /^\/v2\/(.+)\/(manifests|blobs)\//.exec(url.pathname);
      const challenge =
        this.auth === 'bearer'
          ? `Bearer realm="http://${this.host}/token",service="fake-registry",scope="repository:${m?.[1] ?? ''}:pull"`
          : 'Basic realm="fake"';
      res.writeHead(401, { 'www-authenticate': challenge, 'content-type': 'application/json' });
      res.end(JSON.stringify({ errors: [{ code: 'UNAUTHORIZED', message: 'authentication required' }] }));
      return;
    }
    const fault = this.fault(req.method ?? '', url.pathname);
    if (typeof fault === 'number') {
      res.writeHead(fault, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ errors: [{ code: 'UNKNOWN', message: 'injected failure' }] }));
      return;
    }
    if (url.pathname === '/v2/') {
      res.writeHead(200).end('{}');
      return;
    }
    const manifest = /^\/v2\/(.+)\/manifests\/([^/]+)$/.exec(url.pathname);
    if (manifest) {
      const body = this.manifests.get(`${manifest[1]}:${manifest[2]}`);
      if (!body) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ errors: [{ code: 'MANIFEST_UNKNOWN', message: 'manifest unknown' }] }));
        return;
      }
      res.writeHead(200, { 'content-type': MEDIA_TYPE.ociManifest, 'docker-content-digest': sha(body) });
      res.end(req.method === 'HEAD' ? undefined : body);
      return;
    }
    const blob = /^\/v2\/(.+)\/blobs\/(sha256:[a-f0-9]{64})$/.exec(url.pathname);
    if (blob) {
      const digest = blob[2]!;
      if (!this.blobs.has(digest)) {
        res
          .writeHead(404)
          .end(JSON.stringify({ errors: [{ code: 'BLOB_UNKNOWN', message: 'blob unknown' }] }));
        return;
      }
      if (this.redirectBlobs) {
        res.writeHead(307, { location: `http://127.0.0.1:${this.otherPort}/storage/${digest}?sig=x` }).end();
        return;
      }
      this.#sendBlob(res, digest, fault, req.headers.range);
      return;
    }
    res.writeHead(404).end();
  }

  #serveOther(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', `http://127.0.0.1:${this.otherPort}`);
    this.seenOther.push({
      method: req.method ?? '',
      path: url.pathname,
      authorization: req.headers.authorization,
    });
    const digest = url.pathname.replace('/storage/', '');
    if (!this.blobs.has(digest)) {
      res.writeHead(404).end();
      return;
    }
    this.#sendBlob(res, digest, this.fault(req.method ?? '', `/v2/x/blobs/${digest}`), req.headers.range);
  }

  /** Range headers of blob GETs, in order (undefined: none). */
  readonly ranges: (string | undefined)[] = [];
  /** Blobs already cut once by `drop-once`. */
  readonly #dropped = new Set<string>();

  /** Blob bodies being sent now, and the most at once. */
  activeBlobs = 0;
  peakBlobs = 0;

  #sendBlob(res: http.ServerResponse, digest: string, fault: Fault, range?: string): void {
    const whole = this.blobs.get(digest)!;
    this.ranges.push(range);
    this.activeBlobs++;
    this.peakBlobs = Math.max(this.peakBlobs, this.activeBlobs);
    res.once('close', () => this.activeBlobs--);
    const from = /^bytes=(\d+)-$/.exec(range ?? '');
    let data = whole;
    if (from && fault !== 'norange') {
      data = whole.subarray(Number(from[1]));
      res.writeHead(206, {
        'content-type': 'application/octet-stream',
        'content-length': String(data.length),
        'content-range': `bytes ${from[1]}-${whole.length - 1}/${whole.length}`,
      });
    } else {
      res.writeHead(200, {
        'content-type': 'application/octet-stream',
        'content-length': String(data.length),
      });
    }
    if (fault === 'drop-once' && !this.#dropped.has(digest)) {
      this.#dropped.add(digest);
      fault = 'truncate';
    }
    if (fault === 'truncate' || (fault === 'norange' && !this.#dropped.has(digest))) {
      this.#dropped.add(digest);
      // Half the body in 16 KiB pieces a few ms apart (so the client takes several reads, as
      // from a real network), then the connection drops.
      const half = Math.floor(data.length / 2);
      let off = 0;
      const next = () => {
        if (off >= half) return void res.destroy();
        const piece = data.subarray(off, Math.min(half, off + 16 * 1024));
        off += piece.length;
        res.write(piece, () => setTimeout(next, 2));
      };
      next();
      return;
    }
    if (fault === 'stall') {
      res.write(data.subarray(0, 1000)); // then nothing until the client gives up
      return;
    }
    if (fault === 'mismatch') {
      res.end(Buffer.alloc(data.length, 0x78));
      return;
    }
    if (fault === 'slow') {
      let off = 0;
      const step = Math.ceil(data.length / 10);
      const timer = setInterval(() => {
        res.write(data.subarray(off, off + step));
        off += step;
        if (off >= data.length) {
          clearInterval(timer);
          res.end();
        }
      }, 30);
      return;
    }
    res.end(data);
  }
}

describe('a registry with a private CA (OCI_REGISTRY_CA_FILE)', () => {
  it('untrusted without the bundle (the error names the certificate); trusted with it, the system CAs kept', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-private-ca-'));
    const ca = await makeCa(dir, 'private-ca', 'vk-test private registry CA');
    const server = await issueCert(dir, 'registry', ca, '/CN=registry', 'serverAuth', ['IP:127.0.0.1']);
    const reg = await startRegistry(path.join(dir, 'registry'), {
      kind: 'distribution',
      tls: { host: '127.0.0.1', certFile: server.cert, keyFile: server.key },
    });
    const clients: RegistryClient[] = [];
    try {
      const client = (extra: Parameters<typeof registryFromConfig>[0]) => {
        const c = registryFromConfig(extra) as RegistryClient;
        clients.push(c);
        return c;
      };
      const untrusted = client({ ociRegistry: `https://${reg.hostPort}/cocoon`, registryPlainHttp: false });
      await assert.rejects(untrusted.headManifest('cocoon/x', parseReference('v1')), (e: unknown) => {
        assert.ok(e instanceof RegistryError);
        assert.equal(e.kind, 'network');
        assert.match(e.message, /certificate/i);
        return true;
      });
      const bundle = fs.readFileSync(ca.cert, 'utf8');
      const trusted = client({
        ociRegistry: `https://${reg.hostPort}/cocoon`,
        registryPlainHttp: false,
        registryCa: bundle,
      });
      assert.equal(await trusted.headManifest('cocoon/x', parseReference('v1')), 'absent');
      // A blob body over TLS on a connection of its own (bulk-get.ts), with the same trust.
      const blob = randomBytes(3 * 1024 * 1024 + 17);
      await trusted.uploadBlob('cocoon/x', { digest: sha(blob), size: blob.length, bytes: blob });
      const desc = { digest: sha(blob), size: blob.length };
      assert.ok((await trusted.getBlobBytes('cocoon/x', desc, blob.length)).equals(blob));
      await assert.rejects(untrusted.getBlobBytes('cocoon/x', desc, blob.length), /certificate/i);
      // The setting as the daemon reads it.
      const cfg = loadConfig({
        VK_NODE_NAME: 'n',
        OCI_REGISTRY: `https://${reg.hostPort}/cocoon`,
        OCI_REGISTRY_CA_FILE: ca.cert,
      });
      assert.equal(cfg.registryCa, bundle);
      assert.equal(await client(cfg).headManifest('cocoon/x', parseReference('v1')), 'absent');
    } finally {
      for (const c of clients) c.close();
      await stopRegistry(reg);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('fake registry (fault injection)', () => {
  let fake: FakeRegistry;
  let registry: RegistryClient;
  const memoryPath = (a: Artifact) => `/v2/cocoon/x/blobs/${sha(a.files[2]!.data)}`;

  before(async () => {
    fake = await new FakeRegistry().start();
  });
  after(async () => {
    await fake.stop();
  });

  const fresh = () => {
    registry?.close();
    registry = new RegistryClient({ base: `${fake.host}/cocoon` });
    fake.seen.length = 0;
    fake.seenOther.length = 0;
    fake.tokenRequests.length = 0;
    fake.fault = () => undefined;
    fake.redirectBlobs = false;
    fake.auth = 'none';
    return registry;
  };
  after(() => registry?.close());

  const writeDockerConfig = (host: string, user: string, password: string) =>
    fs.writeFileSync(
      path.join(dockerDir, 'config.json'),
      JSON.stringify({ auths: { [host]: { auth: Buffer.from(`${user}:${password}`).toString('base64') } } }),
    );

  it('Bearer challenge: token from the realm with docker-config Basic credentials, cached per repository', async () => {
    fresh();
    fake.auth = 'bearer';
    writeDockerConfig(fake.host, 'puller', 'pw');
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    const rec = await pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/bearer' });
    assert.equal(rec.id, a.snapshotId);
    assert.equal(fake.tokenRequests.length, 1, 'one token for the whole pull');
    const tr = fake.tokenRequests[0]!;
    assert.equal(new URLSearchParams(tr.query).get('scope'), 'repository:cocoon/x:pull');
    assert.equal(new URLSearchParams(tr.query).get('service'), 'fake-registry');
    assert.equal(tr.authorization, `Basic ${Buffer.from('puller:pw').toString('base64')}`);
    // Anonymous first, then every request carries the token.
    assert.equal(fake.seen[0]!.authorization, undefined);
    const after401 = fake.seen.filter((r) => r.path !== '/token').slice(1);
    assert.ok(after401.length >= 7);
    for (const r of after401) assert.equal(r.authorization, 'Bearer tok-1', r.path);
    // A second read of the same repository reuses the cached token; another repository gets its own.
    assert.notEqual(await registry.headManifest('cocoon/x', parseReference('v1')), 'absent');
    assert.equal(fake.tokenRequests.length, 1);
    assert.equal(await registry.headManifest('cocoon/y', parseReference('v1')), 'absent');
    assert.equal(fake.tokenRequests.length, 2);
    assert.equal(new URLSearchParams(fake.tokenRequests[1]!.query).get('scope'), 'repository:cocoon/y:pull');
  });

  it('Bearer challenge with the credential in a helper (credsStore): docker-credential-<name> get, its answer to the token server', async () => {
    fresh();
    fake.auth = 'bearer';
    const bin = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-helper-'));
    const helper = path.join(bin, 'docker-credential-vktest');
    fs.writeFileSync(
      helper,
      `#!/bin/sh\n[ "$1" = get ] || exit 3\nread -r host\nprintf %s "$host" >> "${bin}/asked"\nprintf '{"ServerURL":"%s","Username":"helper-user","Secret":"helper-pw"}' "$host"\n`,
    );
    fs.chmodSync(helper, 0o755);
    const savedPath = process.env.PATH;
    const savedBasic = fake.basic;
    // The token server takes only what the helper holds.
    fake.basic = { username: 'helper-user', password: 'helper-pw' };
    process.env.PATH = `${bin}:${savedPath}`;
    // The auths entry names the host only (as `docker login` with a store writes it).
    fs.writeFileSync(
      path.join(dockerDir, 'config.json'),
      JSON.stringify({ credsStore: 'vktest', auths: { [fake.host]: {} } }),
    );
    try {
      const a = buildArtifact();
      fake.add('cocoon/x', 'v1', a);
      const rec = await pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/helper' });
      assert.equal(rec.id, a.snapshotId);
      assert.equal(
        fake.tokenRequests[0]?.authorization,
        `Basic ${Buffer.from('helper-user:helper-pw').toString('base64')}`,
      );
      assert.equal(
        fs.readFileSync(path.join(bin, 'asked'), 'utf8'),
        fake.host,
        'the helper was asked for the host',
      );
    } finally {
      process.env.PATH = savedPath;
      fake.basic = savedBasic;
      fs.rmSync(bin, { recursive: true, force: true });
    }
  });

  it('Google ADC through google-auth-library against a loopback metadata server; `auto` keeps it from a registry that is not Google', async () => {
    const issued: string[] = [];
    const metadataHits: string[] = [];
    const google = http.createServer((req, res) => {
      const url = new URL(req.url ?? '/', 'http://x');
      if (url.pathname === '/token') {
        issued.push(req.method ?? '');
        return void res.writeHead(400).end();
      }
      if (url.pathname.startsWith('/computeMetadata/v1/')) {
        metadataHits.push(url.pathname);
        if (req.headers['metadata-flavor'] !== 'Google') return void res.writeHead(403).end();
        res.setHeader('metadata-flavor', 'Google');
        if (url.pathname.endsWith('/service-accounts/default/token')) {
          return void res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ access_token: 'ya29.metadata-1', expires_in: 3600, token_type: 'Bearer' }));
        }
        return void res.writeHead(200, { 'content-type': 'text/plain' }).end('');
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((r) => google.listen(0, '127.0.0.1', r));
    const gport = (google.address() as { port: number }).port;
    const keyDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-adc-'));
    const keyFile = path.join(keyDir, 'key.json');
    // Only its presence matters here: `auto` must not use it for a registry that is not Google.
    fs.writeFileSync(
      keyFile,
      JSON.stringify({ type: 'service_account', token_uri: `http://127.0.0.1:${gport}/token` }),
    );

    const saved = { ...process.env };
    // The metadata server's address must never be contacted here: every path points at the fake.
    process.env.GCE_METADATA_HOST = `127.0.0.1:${gport}`;
    process.env.GCE_METADATA_IP = `127.0.0.1:${gport}`;
    process.env.HOME = keyDir; // no gcloud user credentials
    // A `gcloud` first on PATH that leaves a mark: the library must not run it (it would to look
    // up a project id, which a registry token does not need).
    const gcloudMark = path.join(keyDir, 'gcloud-ran');
    fs.writeFileSync(path.join(keyDir, 'gcloud'), `#!/bin/sh\ntouch '${gcloudMark}'\nexit 1\n`, {
      mode: 0o755,
    });
    process.env.PATH = `${keyDir}:${process.env.PATH}`;
    const clients: RegistryClient[] = [];
    try {
      fresh();
      fake.auth = 'basic';
      fake.add('cocoon/x', 'v1', buildArtifact());
      fs.rmSync(path.join(dockerDir, 'config.json'), { force: true });
      // No key file: the metadata server (the fake at GCE_METADATA_HOST) gives the token.
      delete process.env.GOOGLE_APPLICATION_CREDENTIALS;
      fake.basic = { username: 'oauth2accesstoken', password: 'ya29.metadata-1' };
      const fromMetadata = new RegistryClient({ base: `${fake.host}/cocoon`, googleAdc: 'true' });
      clients.push(fromMetadata);
      assert.notEqual(await fromMetadata.headManifest('cocoon/x', parseReference('v1')), 'absent');
      assert.ok(
        metadataHits.some((p) => p.endsWith('/service-accounts/default/token')),
        metadataHits.join(', '),
      );
      assert.ok(!metadataHits.some((p) => p.includes('project-id')), 'no project id asked for');
      // `auto` and a registry that is not Google: no Google credential is even fetched.
      process.env.GOOGLE_APPLICATION_CREDENTIALS = keyFile;
      const auto = new RegistryClient({ base: `${fake.host}/cocoon`, googleAdc: 'auto' });
      clients.push(auto);
      const hits = metadataHits.length;
      await assert.rejects(
        auto.headManifest('cocoon/x', parseReference('v1')),
        /requires credentials and none are configured/,
      );
      assert.equal(metadataHits.length, hits, 'nothing asked of the metadata server');
      assert.equal(issued.length, 0, 'nor of a token endpoint');
      assert.ok(!fs.existsSync(gcloudMark), 'gcloud was never run (no project id lookup)');
    } finally {
      for (const c of clients) c.close();
      for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
      Object.assign(process.env, saved);
      fake.basic = { username: 'puller', password: 'pw' };
      await new Promise((r) => google.close(r));
      fs.rmSync(keyDir, { recursive: true, force: true });
    }
  });

  it("Google ADC from a key file (external_account): the token exchange goes to the key's token_url, a loopback fake, with the subject token read from its file; an expiring token is exchanged again", async () => {
    // A workload-identity-federation key: google-auth-library honours its token_url (a
    // service-account key's exchange goes to a fixed https://oauth2.googleapis.com/token,
    // docs/registry.md "Authentication"). Nothing here may reach Google or a metadata server.
    const exchanges: URLSearchParams[] = [];
    const other: string[] = [];
    let expiresIn = 3600;
    const sts = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => {
        body += c.toString();
      });
      req.on('end', () => {
        if (req.method !== 'POST' || req.url !== '/v1/token') {
          other.push(`${req.method} ${req.url}`);
          return void res.writeHead(404).end();
        }
        exchanges.push(new URLSearchParams(body));
        res.writeHead(200, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            access_token: `ya29.sts-${exchanges.length}`,
            issued_token_type: 'urn:ietf:params:oauth:token-type:access_token',
            token_type: 'Bearer',
            expires_in: expiresIn,
          }),
        );
      });
    });
    await new Promise<void>((r) => sts.listen(0, '127.0.0.1', r));
    const port = (sts.address() as { port: number }).port;
    const keyDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-adc-ext-'));
    const subject = path.join(keyDir, 'subject-token');
    const keyFile = path.join(keyDir, 'key.json');
    const audience = '//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/q';
    fs.writeFileSync(subject, 'subject-1');
    fs.writeFileSync(
      keyFile,
      JSON.stringify({
        type: 'external_account',
        audience,
        subject_token_type: 'urn:ietf:params:oauth:token-type:jwt',
        token_url: `http://127.0.0.1:${port}/v1/token`,
        credential_source: { file: subject },
      }),
    );
    const saved = { ...process.env };
    process.env.GOOGLE_APPLICATION_CREDENTIALS = keyFile;
    process.env.GCE_METADATA_HOST = `127.0.0.1:${port}`; // answered 404 and counted, were it asked
    process.env.GCE_METADATA_IP = `127.0.0.1:${port}`;
    process.env.HOME = keyDir;
    const client = new RegistryClient({ base: `${fake.host}/cocoon`, googleAdc: 'true' });
    try {
      fresh();
      fake.auth = 'basic';
      fake.add('cocoon/x', 'v1', buildArtifact());
      fs.rmSync(path.join(dockerDir, 'config.json'), { force: true });
      fake.basic = { username: 'oauth2accesstoken', password: 'ya29.sts-1' };
      assert.notEqual(await client.headManifest('cocoon/x', parseReference('v1')), 'absent');
      assert.equal(exchanges.length, 1);
      assert.equal(exchanges[0]?.get('grant_type'), 'urn:ietf:params:oauth:grant-type:token-exchange');
      assert.equal(exchanges[0]?.get('subject_token'), 'subject-1', 'the subject token, from its file');
      assert.equal(exchanges[0]?.get('audience'), audience);
      assert.equal(exchanges[0]?.get('scope'), 'https://www.googleapis.com/auth/cloud-platform');
      // Valid for an hour: the library's cached token serves the next request.
      assert.notEqual(await client.headManifest('cocoon/x', parseReference('v1')), 'absent');
      assert.equal(exchanges.length, 1, 'a cached token, no second exchange');

      // A second client (a library instance of its own) gets a token valid for 60 s, inside the
      // library's 5-minute refresh margin: its next request exchanges again, each time with the
      // subject token the file holds then (rotated by whatever writes it).
      expiresIn = 60;
      fake.basic = { username: 'oauth2accesstoken', password: 'ya29.sts-2' }; // ya29.sts-1 now refused
      fs.writeFileSync(subject, 'subject-2');
      const second = new RegistryClient({ base: `${fake.host}/cocoon`, googleAdc: 'true' });
      try {
        assert.notEqual(await second.headManifest('cocoon/x', parseReference('v1')), 'absent');
        assert.equal(exchanges.length, 2);
        fake.basic = { username: 'oauth2accesstoken', password: 'ya29.sts-3' };
        fs.writeFileSync(subject, 'subject-3');
        assert.notEqual(await second.headManifest('cocoon/x', parseReference('v1')), 'absent');
        assert.equal(exchanges.length, 3, 'the expiring token was not reused');
        assert.deepEqual(
          exchanges.map((e) => e.get('subject_token')),
          ['subject-1', 'subject-2', 'subject-3'],
        );
      } finally {
        second.close();
      }
      assert.deepEqual(other, [], 'no metadata server or other endpoint asked');
    } finally {
      client.close();
      for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
      Object.assign(process.env, saved);
      fake.basic = { username: 'puller', password: 'pw' };
      await new Promise((r) => sts.close(r));
      fs.rmSync(keyDir, { recursive: true, force: true });
    }
  });

  it('an expired token is fetched again', async () => {
    fresh();
    fake.auth = 'bearer';
    fake.tokenTtl = 1; // retired 100 ms early
    writeDockerConfig(fake.host, 'puller', 'pw');
    fake.add('cocoon/x', 'v1', buildArtifact());
    try {
      await registry.headManifest('cocoon/x', parseReference('v1'));
      await new Promise((r) => setTimeout(r, 1000));
      await registry.headManifest('cocoon/x', parseReference('v1'));
      assert.equal(fake.tokenRequests.length, 2);
    } finally {
      fake.tokenTtl = 300;
    }
  });

  it('a token refused before its expiry (revoked): the 401 drops it and one fresh token is fetched', async () => {
    fresh();
    fake.auth = 'bearer';
    writeDockerConfig(fake.host, 'puller', 'pw');
    fake.add('cocoon/x', 'v1', buildArtifact());
    assert.notEqual(await registry.headManifest('cocoon/x', parseReference('v1')), 'absent');
    assert.equal(fake.tokenRequests.length, 1);
    fake.revokeTokens();
    assert.notEqual(await registry.headManifest('cocoon/x', parseReference('v1')), 'absent');
    assert.equal(fake.tokenRequests.length, 2, 'one new token');
    const last = fake.seen.filter((r) => r.path.includes('/manifests/')).slice(-2);
    assert.deepEqual(
      last.map((r) => r.authorization),
      ['Bearer tok-1', 'Bearer tok-2'],
      'the refused token, then the fresh one',
    );
  });

  it('Basic challenge: credentials from the docker config; none configured is an auth error', async () => {
    fresh();
    fake.auth = 'basic';
    writeDockerConfig(fake.host, 'puller', 'pw');
    fake.add('cocoon/x', 'v1', buildArtifact());
    assert.notEqual(await registry.headManifest('cocoon/x', parseReference('v1')), 'absent');
    assert.equal(fake.seen.at(-1)!.authorization, `Basic ${Buffer.from('puller:pw').toString('base64')}`);
    fs.rmSync(path.join(dockerDir, 'config.json'));
    fresh();
    fake.auth = 'basic';
    await assert.rejects(registry.headManifest('cocoon/x', parseReference('v1')), (e: unknown) => {
      assert.ok(e instanceof RegistryError);
      assert.equal(e.kind, 'auth');
      assert.match(e.message, /requires credentials and none are configured/);
      return true;
    });
    writeDockerConfig(fake.host, 'puller', 'wrong');
    fresh();
    fake.auth = 'basic';
    await assert.rejects(registry.headManifest('cocoon/x', parseReference('v1')), {
      kind: 'auth',
      status: 401,
    });
  });

  it('blob GET follows a 307 to another host without forwarding Authorization', async () => {
    fresh();
    fake.auth = 'bearer';
    fake.redirectBlobs = true;
    writeDockerConfig(fake.host, 'puller', 'pw');
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    const rec = await pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/redirect' });
    assert.equal(rec.id, a.snapshotId);
    assert.equal(fake.seenOther.length, 6, 'config + 5 layers from the storage host');
    for (const r of fake.seenOther) assert.equal(r.authorization, undefined, r.path);
    assert.ok(fake.seen.some((r) => r.path.includes('/blobs/') && r.authorization === 'Bearer tok-1'));
  });

  it('5xx and connection refused are errors, not absence; no import starts', async () => {
    fresh();
    fake.add('cocoon/x', 'v1', buildArtifact());
    fake.fault = (_m, p) => (p.includes('/manifests/') ? 503 : undefined);
    const from = sim.calls().length;
    await assert.rejects(registry.headManifest('cocoon/x', parseReference('v1')), {
      kind: 'http',
      status: 503,
    });
    await assert.rejects(
      pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/5xx' }),
      (e: unknown) => {
        assert.ok(e instanceof SnapshotPullError);
        assert.equal(e.absent, false);
        assert.match(e.message, /HTTP 503 \(UNKNOWN: injected failure\)/);
        return true;
      },
    );
    const refused = new RegistryClient({ base: '127.0.0.1:1/cocoon', credentials: [] });
    await assert.rejects(refused.headManifest('cocoon/x', parseReference('v1')), (e: unknown) => {
      assert.ok(e instanceof RegistryError);
      assert.equal(e.kind, 'network');
      assert.match(e.message, /ECONNREFUSED/);
      return true;
    });
    refused.close();
    assert.deepEqual(callsSince(from), []);
  });

  it('digest mismatch in a streamed layer aborts the import and leaves no partial snapshot', async () => {
    fresh();
    const a = buildArtifact({ memorySize: 2_000_000 });
    fake.add('cocoon/x', 'v1', a);
    fake.fault = (_m, p) => (p === memoryPath(a) ? 'mismatch' : undefined);
    const dirs = localDirs();
    const from = sim.calls().length;
    await assert.rejects(
      // budget 0: every layer streams straight into the tar, so cocoon already got the bad bytes
      pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/mismatch', budgetMiB: 0 }),
      (e: unknown) => {
        assert.ok(e instanceof SnapshotPullError);
        assert.match(e.message, new RegExp(`blob ${sha(a.files[2]!.data)}: digest mismatch`));
        return true;
      },
    );
    const calls = callsSince(from);
    assert.equal(calls[0], 'snapshot rm fake/mismatch');
    assert.equal(calls.at(-1), 'snapshot rm fake/mismatch', calls.join('\n'));
    assert.equal(await inspect('fake/mismatch'), undefined);
    assert.ok(!(await snapshotNames()).includes('fake/mismatch'));
    assert.deepEqual(localDirs(), dirs, 'no snapshot data left behind');
  });

  it('a truncated body (read ahead) aborts and cleans up; a stale local copy is replaced only on success', async () => {
    fresh();
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    await sim.fixtureSnapshot('fake/truncated', {
      image: 'ghcr.io/acme/old:1',
      backend: 'cloud-hypervisor',
      os: 'linux',
    });
    fake.fault = (_m, p) => (p === memoryPath(a) ? 'truncate' : undefined);
    const dirs = localDirs();
    await assert.rejects(
      pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/truncated' }),
      /after \d+ of 300000 bytes|got \d+ of 300000 bytes/,
    );
    assert.equal(
      await inspect('fake/truncated'),
      undefined,
      'import removes the name first; failure leaves nothing',
    );
    assert.ok(localDirs().length < dirs.length, 'the replaced copy and the partial import are both gone');
  });

  it('a connection dropped mid-blob: the read resumes with Range from the byte it reached; without ranges, from the start', async () => {
    for (const fault of ['drop-once', 'norange'] as const) {
      fresh();
      fake.ranges.length = 0;
      const a = buildArtifact();
      fake.add('cocoon/x', 'v1', a);
      fake.fault = (_m, p) => (p === memoryPath(a) ? fault : undefined);
      const rec = await pullSnapshot({
        registry,
        cli,
        repo: 'x',
        tag: 'v1',
        localName: `fake/resume-${fault}`,
      });
      assert.equal(rec.id, a.snapshotId, fault);
      const asked = fake.ranges.filter((r) => r !== undefined);
      assert.equal(asked.length, 1, `${fault}: one resume (${asked.join(', ')})`);
      const at = Number(/^bytes=(\d+)-$/.exec(asked[0]!)?.[1]);
      assert.ok(at > 0 && at <= 150_000, `${fault}: resumed at ${at}, at most where the cut was`);
      // Success means the verifier saw every byte once, in order: size and digest matched.
    }
  });

  it('a cut while the reader is not reading: the resume starts after the bytes already handed over, none twice', async () => {
    fresh();
    fake.ranges.length = 0;
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    const memory = a.files[2]!.data;
    fake.fault = (_m, p) => (p === memoryPath(a) ? 'drop-once' : undefined);
    const stream = await registry.getBlob('cocoon/x', { digest: sha(memory), size: memory.length });
    // Nothing read until the first connection has been cut and the resume asked for.
    await waitFor('the resume', () => fake.ranges.some((r) => r !== undefined), 10_000, 10);
    const chunks: Buffer[] = [];
    for await (const c of stream) chunks.push(c as Buffer);
    assert.ok(Buffer.concat(chunks).equals(memory), 'every byte once, in order');
  });

  it('reads ahead in parallel within the budget, sequentially with a zero budget; logs progress', async () => {
    fresh();
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    fake.fault = (m, p) => (m === 'GET' && p.includes('/blobs/') ? 'slow' : undefined);
    fake.peakBlobs = 0;
    const { log, lines } = logCapture();
    await pullSnapshot({
      registry,
      cli,
      repo: 'x',
      tag: 'v1',
      localName: 'fake/par',
      log,
      progressIntervalMs: 50,
    });
    assert.ok(fake.peakBlobs >= 3, `peak ${fake.peakBlobs}`);
    const progress = lines.filter((l) => l.msg === 'snapshot pull: progress');
    assert.ok(progress.length >= 2, `${progress.length} progress lines`);
    const total = a.files.reduce((s, f) => s + f.data.length, 0);
    for (const p of progress) {
      assert.equal(p.totalBytes, total);
      assert.equal(p.snapshot, 'fake/par');
      assert.ok(typeof p.bytes === 'number' && p.bytes <= total);
    }
    fake.peakBlobs = 0;
    await pullSnapshot({ registry, cli, repo: 'x', tag: 'v1', localName: 'fake/seq', budgetMiB: 0 });
    assert.equal(fake.peakBlobs, 1);
  });

  it('the 30-minute cap (shortened) aborts a stalled pull and cleans up', async () => {
    fresh();
    const a = buildArtifact();
    fake.add('cocoon/x', 'v1', a);
    fake.fault = (_m, p) => (p === memoryPath(a) ? 'stall' : undefined);
    const pulls: string[] = [];
    const puller = new SnapshotPuller({ registry, cli, capMs: 1500, onPullDone: (r) => pulls.push(r) });
    const from = sim.calls().length;
    await assert.rejects(puller.ensure('x:v1'), {
      name: 'SnapshotPullError',
      message: 'snapshot pull of x:v1 into x:v1 exceeded its 1500 ms cap',
    });
    assert.deepEqual(pulls, ['failed']);
    assert.equal(callsSince(from).at(-1), 'snapshot rm x:v1');
    assert.equal(await inspect('x:v1'), undefined);
  });
});
