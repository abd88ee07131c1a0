// The registry write path (registry.md §3, §4.1, §4.2, §6.1, §7) against the REAL registry of
// the test ground (CNCF distribution v3 by default, ground/registry.ts) and the cocoon
// simulator: a VM snapshot saved by `cocoon snapshot save`, pushed with pushSnapshot, then
// checked by an independent OCI client — crane (go-containerregistry, built by
// scripts/cranebin.sh) — and pulled back on another simulator root. Faults a real registry will
// not produce on demand (a refused manifest PUT, the registry going away mid-upload) come from
// the fault-injecting proxy of registry-proxy.ts in front of the real registry. The tag delete
// is tested twice: on the ground's registry (v3 deletes a tag itself), and on a standalone
// Debian docker-registry 2.8 (a process, no control plane) that refuses a tag DELETE, through
// which the client's digest fallback is tested.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import tar from 'tar-stream';
import { type Ground, useGround } from '../../ground/ground.ts';
import { type RegistryState, startRegistry, stopRegistry } from '../../ground/registry.ts';
import { newSimRoot, type SimRoot } from '../../sim/client.ts';
import { CocoonCli } from '../../src/cocoon/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { MEDIA_TYPE, parseManifestDocument, validateSnapshotManifest } from '../../src/registry/artifact.ts';
import { parseSnapshotConfig } from '../../src/registry/artifact-config.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { RegistryError } from '../../src/registry/errors.ts';
import { deleteSnapshotTag, readSnapshotIdentity } from '../../src/registry/identity.ts';
import { pullSnapshot } from '../../src/registry/pull.ts';
import { pushSnapshot, SnapshotPushError } from '../../src/registry/push.ts';
import { parseReference } from '../../src/registry/reference.ts';
import { goConfigProblems } from './go-config-schema.ts';
import { RegistryProxy } from './registry-proxy.ts';

const run = promisify(execFile);
const repoRoot = path.resolve(import.meta.dirname, '..', '..');
// The shared ground, whichever registry kind it runs: 2.8's quirk (a tag DELETE is 400
// DIGEST_INVALID) is tested on a standalone 2.8 of this file's own (about 1 s; a private
// ground would cost a control plane, about 20 s).
const ground = useGround();
let g: Ground;
let sim: SimRoot;
let cli: CocoonCli;
let crane: string;
let registry: RegistryClient;
const lifetime = new AbortController();
const IMAGE = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';
const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

/** crane: VK_CRANE_BIN (scripts/test.sh), else built or found by scripts/cranebin.sh. */
async function craneBin(): Promise<string> {
  if (process.env.VK_CRANE_BIN) return process.env.VK_CRANE_BIN;
  const { stdout } = await run('bash', [path.join(repoRoot, 'scripts', 'cranebin.sh')], {
    maxBuffer: 1 << 20,
  });
  return path.join(stdout.trim().split('\n').pop() ?? '', 'crane');
}

async function craneRun(...args: string[]): Promise<string> {
  const { stdout } = await run(crane, [...args, '--insecure'], { maxBuffer: 64 << 20, encoding: 'utf8' });
  return stdout;
}

/** The tags of `<host:port>/<repository>`, as crane lists them. */
async function craneTags(repository: string): Promise<string[]> {
  return (await craneRun('ls', repository)).trim().split('\n').filter(Boolean).sort();
}

/** A raw `DELETE` of `url`: `<status>`, and the first OCI error code when there is one. */
async function rawDelete(url: string): Promise<string> {
  const res = await fetch(url, { method: 'DELETE' });
  const body = await res.text();
  if (res.status < 400) return String(res.status);
  const code = (JSON.parse(body) as { errors?: { code?: string }[] }).errors?.[0]?.code;
  return `${res.status} ${code}`;
}

/** The proxy's requests since `from`, as `METHOD path status`. */
const answered = (proxy: RegistryProxy, from = 0) =>
  proxy.requests.slice(from).map((r) => `${r.method} ${r.path} ${r.status}`);

async function craneBytes(...args: string[]): Promise<Buffer> {
  const { stdout } = await run(crane, [...args, '--insecure'], { maxBuffer: 64 << 20, encoding: 'buffer' });
  return stdout;
}

/** The files of a snapshot as the simulator keeps them (root/snapshot/localfile/<id>). */
const dataDir = (s: SimRoot, id: string) => path.join(s.root, 'snapshot', 'localfile', id);

interface Saved {
  name: string;
  id: string;
  /** Contents written into the snapshot after save (the simulator saves empty placeholders). */
  files: Record<string, Buffer>;
}

/**
 * A running VM's snapshot: `vm clone` from a fixture, `snapshot save --name <name>`, then real
 * bytes written into its memory and cidata files (distinct contents, so every layer has its own
 * digest). The disk (`cow.raw`) stays a 20 GiB all-hole file: the simulator exports it sparse.
 */
async function savedSnapshot(name: string, sizes: { memory?: number } = {}): Promise<Saved> {
  const vm = await sim.json<{ id: string }>(['vm', 'clone', '--output', 'json', '--name', name, 'base']);
  const saved = await sim.run(['snapshot', 'save', '--name', name, vm.id]);
  assert.equal(saved.code, 0, saved.stderr);
  const id = saved.stdout.trim();
  const files = {
    'memory-range-0': randomBytes(sizes.memory ?? 2_500_000),
    'cidata.img': randomBytes(40_000),
  };
  for (const [f, data] of Object.entries(files)) fs.writeFileSync(path.join(dataDir(sim, id), f), data);
  return { name, id, files };
}

before(async () => {
  g = await ground();
  sim = await newSimRoot();
  Object.assign(process.env, sim.env());
  cli = new CocoonCli(sim.cocoonBin, lifetime.signal, silentLogger);
  crane = await craneBin();
  await sim.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
  registry = new RegistryClient({ base: `${g.registry.hostPort}/cocoon`, credentials: [] });
});

after(async () => {
  registry?.close();
  lifetime.abort();
  await sim?.cleanup();
});

describe("push to the ground's registry (real), checked with crane", () => {
  let saved: Saved;
  let digest: string;
  /** A standalone Debian docker-registry 2.8 (the digest fallback's test), when started. */
  let old: RegistryState | undefined;
  const oldDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-push-2.8-'));

  before(async () => {
    saved = await savedSnapshot('vk-push-a');
  });
  after(async () => {
    if (old) await stopRegistry(old);
    fs.rmSync(oldDir, { recursive: true, force: true });
  });

  it('push: crane lists the tag; manifest and config parse as the v1 format; every blob verifies', async () => {
    const spool = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-spool-'));
    const result = await pushSnapshot({
      registry,
      cli,
      localName: saved.name,
      repo: 'vk-push-a',
      tag: 'latest',
      baseImage: IMAGE,
      annotations: { 'org.opencontainers.image.source': 'https://example.com/agent' },
      chunkMiB: 1, // memory-range-0 (2.5 MB) goes up in three PATCH chunks
      concurrency: 2,
      spoolDir: spool,
    });
    digest = result.digest;
    assert.equal(result.snapshotId, saved.id);
    assert.ok(result.uploadedBytes > 2_500_000 && result.uploadedBytes <= result.bytes);
    assert.deepEqual(fs.readdirSync(spool), [], 'spool directory removed');
    fs.rmSync(spool, { recursive: true });
    const ref = `${g.registry.hostPort}/cocoon/vk-push-a:latest`;

    assert.deepEqual((await craneRun('ls', `${g.registry.hostPort}/cocoon/vk-push-a`)).trim().split('\n'), [
      'latest',
    ]);
    assert.equal((await craneRun('digest', ref)).trim(), digest);
    const manifestBytes = await craneBytes('manifest', ref);
    assert.equal(sha(manifestBytes), digest, 'the digest is of the exact bytes sent');
    assert.match(manifestBytes.toString(), /^\{\n {2}"schemaVersion": 2,\n/, 'pretty-printed, 2 spaces');
    const doc = parseManifestDocument(manifestBytes);
    assert.ok(doc.ok);
    const manifest = validateSnapshotManifest(doc.value);
    assert.ok(manifest.ok, manifest.ok ? '' : manifest.error);
    assert.equal(doc.value.kind === 'manifest' && doc.value.manifest.artifactType, MEDIA_TYPE.snapshotV1);
    // Layers in tar order (the simulator exports its directory sorted), media types by name.
    assert.deepEqual(
      manifest.value.layers.map((l) => [l.title, l.mediaType]),
      [
        ['cidata.img', MEDIA_TYPE.vmCidata],
        ['config.json', MEDIA_TYPE.vmConfig],
        ['cow.raw', MEDIA_TYPE.diskRaw],
        ['memory-range-0', MEDIA_TYPE.octetStream],
        ['state.json', MEDIA_TYPE.vmState],
      ],
    );
    const a = manifest.value.annotations;
    assert.deepEqual(Object.keys(a), [
      'org.opencontainers.image.created',
      'cocoonstack.snapshot.baseimage',
      'org.opencontainers.image.source',
    ]);
    assert.match(a['org.opencontainers.image.created'] ?? '', /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.equal(a['cocoonstack.snapshot.baseimage'], IMAGE);

    const configBytes = await craneBytes('config', ref);
    assert.equal(sha(configBytes), manifest.value.config.digest);
    assert.deepEqual(goConfigProblems(configBytes), [], 'cocoonstack’s Go reader decodes it');
    const config = parseSnapshotConfig(configBytes, manifest.value);
    assert.ok(config.ok, config.ok ? '' : config.error);
    const c = config.value;
    assert.equal(c.snapshotId, saved.id);
    assert.equal(c.image, IMAGE);
    assert.equal(c.hypervisor, 'cloud-hypervisor');
    assert.equal(c.imageType, 'oci');
    assert.equal(c.cpu, 2);
    assert.equal((c.raw as Record<string, unknown>).name, undefined, 'the local name is not in the config');
    assert.deepEqual(Object.keys(c.files), [
      'cidata.img',
      'config.json',
      'cow.raw',
      'memory-range-0',
      'state.json',
    ]);
    assert.equal(c.files['memory-range-0']?.size, 2_500_000);
    assert.equal(typeof c.files['memory-range-0']?.mode, 'number');
    // The all-hole disk: no data, its apparent size in the sparse records (the map verbatim,
    // the size a JSON number, as Go's reader decodes it).
    const cow = c.files['cow.raw'];
    assert.equal(cow?.sparseSize, 20 * 2 ** 30);
    assert.equal(typeof cow?.sparseMap, 'string');

    // Every blob, fetched by crane, hashes to its descriptor.
    for (const layer of manifest.value.layers) {
      const blob = await craneBytes('blob', `${g.registry.hostPort}/cocoon/vk-push-a@${layer.digest}`);
      assert.equal(blob.length, layer.size, layer.title);
      assert.equal(sha(blob), layer.digest, layer.title);
      const written = saved.files[layer.title];
      if (written) assert.ok(blob.equals(written), `${layer.title}: the bytes written into the snapshot`);
    }
    // crane's own validation of the artifact (digests and sizes of manifest, config and layers).
    await craneRun('validate', '--remote', ref);
  });

  it('push then pull on another node keeps snapshotId and file contents', async () => {
    const other = await newSimRoot();
    try {
      const otherCli = new CocoonCli(other.cocoonBin, lifetime.signal, silentLogger);
      // CocoonCli passes the provider's environment; the other root's calls need its own.
      const env = { ...process.env };
      Object.assign(process.env, other.env());
      let rec: Awaited<ReturnType<typeof pullSnapshot>>;
      try {
        rec = await pullSnapshot({
          registry,
          cli: otherCli,
          repo: 'vk-push-a',
          tag: 'latest',
          localName: 'vk-push-a-copy',
        });
      } finally {
        for (const k of Object.keys(other.env())) {
          if (env[k] === undefined) delete process.env[k];
          else process.env[k] = env[k];
        }
      }
      assert.equal(rec.id, saved.id);
      assert.equal(rec.image, IMAGE);
      const dst = dataDir(other, rec.id);
      const src = dataDir(sim, saved.id);
      for (const f of fs.readdirSync(src)) {
        const a = fs.statSync(path.join(src, f));
        const b = fs.statSync(path.join(dst, f));
        assert.equal(b.size, a.size, `${f}: apparent size`);
        if (a.size < 64 << 20) {
          assert.ok(fs.readFileSync(path.join(dst, f)).equals(fs.readFileSync(path.join(src, f))), f);
        }
      }
      assert.equal(fs.statSync(path.join(dst, 'cow.raw')).size, 20 * 2 ** 30);
    } finally {
      await other.cleanup();
    }
  });

  it('a re-push uploads nothing the registry has: HEADs only, then the manifest', async () => {
    const proxy = await RegistryProxy.start(g.registry.hostPort);
    const via = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
    try {
      const again = await pushSnapshot({
        registry: via,
        cli,
        localName: saved.name,
        repo: 'vk-push-a',
        tag: 'latest',
        baseImage: IMAGE,
        annotations: { 'org.opencontainers.image.source': 'https://example.com/agent' },
      });
      assert.equal(again.uploadedBytes, 0);
      assert.equal(again.snapshotId, saved.id);
      digest = again.digest; // same content; the created annotation may have moved on a second
      const calls = proxy.since(0);
      assert.ok(!calls.some((c) => c.includes('/blobs/uploads/')), calls.join('\n'));
      const heads = calls.filter((c) => c.startsWith('HEAD ') && c.includes('/blobs/'));
      // one per distinct layer digest, plus the config
      assert.equal(heads.length, 6, calls.join('\n'));
      assert.equal(calls.at(-1), 'PUT /v2/cocoon/vk-push-a/manifests/latest');
    } finally {
      via.close();
      await proxy.stop();
    }
  });

  it('hibernate: the manifest is re-put with cocoonstack.snapshot.from-node; readSnapshotIdentity', async () => {
    assert.equal(await readSnapshotIdentity(registry, 'vk-push-a', 'hibernate'), 'absent');
    const result = await pushSnapshot({
      registry,
      cli,
      localName: saved.name,
      repo: 'vk-push-a',
      tag: 'hibernate',
      baseImage: IMAGE,
      fromNode: 'cocoon-node-2',
      annotations: { team: 'a' },
    });
    const bytes = await craneBytes('manifest', `${g.registry.hostPort}/cocoon/vk-push-a:hibernate`);
    assert.equal(sha(bytes), result.digest, 'the tag points at the re-put manifest');
    const m = JSON.parse(bytes.toString()) as { annotations: Record<string, string> };
    assert.deepEqual(Object.keys(m.annotations), [
      'org.opencontainers.image.created',
      'cocoonstack.snapshot.baseimage',
      'cocoonstack.snapshot.from-node',
      'team',
    ]);
    assert.equal(m.annotations['cocoonstack.snapshot.from-node'], 'cocoon-node-2');
    const identity = await readSnapshotIdentity(registry, 'vk-push-a', 'hibernate');
    assert.ok(identity !== 'absent');
    const { config, ...stamps } = identity;
    assert.deepEqual(stamps, {
      digest: result.digest,
      snapshotId: saved.id,
      baseImage: IMAGE,
      fromNode: 'cocoon-node-2',
      namespace: '', // pushSnapshot alone stamps none; the provider passes its pod's owner stamps
      controllerUid: '',
      peerAddress: '', // the store stamps this host's peer server (peer restore)
      peerPin: '',
      created: m.annotations['org.opencontainers.image.created'], // which state is newer
    });
    // The validated config blob comes along (what a peer restore checks the peer against).
    assert.equal(config.snapshotId, saved.id);
    assert.equal(config.image, IMAGE);
    assert.equal(config.files['memory-range-0']?.size, 2_500_000);
    const latest = await readSnapshotIdentity(registry, 'vk-push-a', 'latest');
    assert.ok(latest !== 'absent');
    assert.equal(latest.fromNode, '');
    assert.equal(latest.digest, digest);
  });

  it("deleteSnapshotTag on Debian's docker-registry 2.8 (standalone): a tag DELETE is refused (400 DIGEST_INVALID), the digest fallback deletes it; then absent", async () => {
    // A registry of its own (a process, no control plane) holding copies of both tags: the
    // ground's registry deletes tags itself (v3), so the fallback is tested here.
    old = await startRegistry(path.join(oldDir, 'registry'), { kind: 'docker-registry' });
    assert.match(old.version, /distribution 2\.8\./);
    const src = `${g.registry.hostPort}/cocoon/vk-push-a`;
    const dst = `${old.hostPort}/cocoon/vk-push-a`;
    for (const tag of ['hibernate', 'latest']) await craneRun('copy', `${src}:${tag}`, `${dst}:${tag}`);
    assert.deepEqual(await craneTags(dst), ['hibernate', 'latest']);
    const proxy = await RegistryProxy.start(old.hostPort);
    const via = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
    try {
      const name = via.repository('vk-push-a');
      const hib = await via.headManifest(name, parseReference('hibernate'));
      assert.ok(hib !== 'absent');
      const onGround = await registry.headManifest(name, parseReference('hibernate'));
      assert.equal(onGround !== 'absent' && onGround.digest, hib.digest, 'the copy is the same manifest');
      assert.equal(
        await rawDelete(`${old.url}/v2/cocoon/vk-push-a/manifests/hibernate`),
        '400 DIGEST_INVALID',
        'what the fallback is for',
      );
      const from = proxy.requests.length;
      assert.equal(await deleteSnapshotTag(via, 'vk-push-a', 'hibernate'), 'deleted');
      assert.deepEqual(answered(proxy, from), [
        'DELETE /v2/cocoon/vk-push-a/manifests/hibernate 400',
        'HEAD /v2/cocoon/vk-push-a/manifests/hibernate 200',
        `DELETE /v2/cocoon/vk-push-a/manifests/${hib.digest} 202`,
      ]);
      assert.equal(await via.headManifest(name, parseReference('hibernate')), 'absent');
      // Deleted by digest: the manifest itself is gone, not only the tag.
      assert.equal(await via.headManifest(name, parseReference(hib.digest)), 'absent');
      assert.equal(await deleteSnapshotTag(via, 'vk-push-a', 'hibernate'), 'absent');
      assert.equal(await deleteSnapshotTag(via, 'never-pushed', 'hibernate'), 'absent');
      assert.equal(await readSnapshotIdentity(via, 'vk-push-a', 'hibernate'), 'absent');
      // The other tag of the repository is untouched.
      const latest = await via.headManifest(name, parseReference('latest'));
      assert.equal(latest !== 'absent' && latest.digest, digest);
      assert.deepEqual(await craneTags(dst), ['latest']);
    } finally {
      via.close();
      await proxy.stop();
    }
  });

  it("deleteSnapshotTag on the ground's registry: distribution v3 deletes the tag itself (202, no fallback), the manifest stays by digest; then absent", async () => {
    // With VK_REGISTRY_KIND=docker-registry the ground is a 2.8: the fallback's answers then.
    const v3 = g.registry.kind === 'distribution';
    const repo = `${g.registry.hostPort}/cocoon/vk-push-a`;
    const name = registry.repository('vk-push-a');
    const hib = await registry.headManifest(name, parseReference('hibernate'));
    assert.ok(hib !== 'absent');
    // What the registry does with a raw tag DELETE, on a copy of the tag.
    await craneRun('tag', `${repo}:hibernate`, 'probe');
    assert.deepEqual(await craneTags(repo), ['hibernate', 'latest', 'probe']);
    assert.equal(
      await rawDelete(`${g.registry.url}/v2/cocoon/vk-push-a/manifests/probe`),
      v3 ? '202' : '400 DIGEST_INVALID',
    );
    assert.deepEqual(await craneTags(repo), v3 ? ['hibernate', 'latest'] : ['hibernate', 'latest', 'probe']);
    const proxy = await RegistryProxy.start(g.registry.hostPort);
    const via = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
    try {
      assert.equal(await deleteSnapshotTag(via, 'vk-push-a', 'hibernate'), 'deleted');
      assert.deepEqual(
        answered(proxy),
        v3
          ? ['DELETE /v2/cocoon/vk-push-a/manifests/hibernate 202']
          : [
              'DELETE /v2/cocoon/vk-push-a/manifests/hibernate 400',
              'HEAD /v2/cocoon/vk-push-a/manifests/hibernate 200',
              `DELETE /v2/cocoon/vk-push-a/manifests/${hib.digest} 202`,
            ],
      );
    } finally {
      via.close();
      await proxy.stop();
    }
    assert.equal(await registry.headManifest(name, parseReference('hibernate')), 'absent');
    // v3 removed the tag only: the manifest stays by digest (2.8's fallback deletes the manifest).
    const byDigest = await registry.headManifest(name, parseReference(hib.digest));
    assert.equal(byDigest === 'absent' ? 'absent' : byDigest.digest, v3 ? hib.digest : 'absent');
    assert.equal(await deleteSnapshotTag(registry, 'vk-push-a', 'hibernate'), 'absent');
    assert.equal(await deleteSnapshotTag(registry, 'never-pushed', 'hibernate'), 'absent');
    assert.equal(await readSnapshotIdentity(registry, 'vk-push-a', 'hibernate'), 'absent');
    // The other tag of the repository is untouched (and the probe is gone either way).
    const latest = await registry.headManifest(name, parseReference('latest'));
    assert.equal(latest !== 'absent' && latest.digest, digest);
    assert.deepEqual(await craneTags(repo), ['latest']);
  });
});

describe('push failures', () => {
  let proxy: RegistryProxy;
  let via: RegistryClient;
  let saved: Saved;

  before(async () => {
    proxy = await RegistryProxy.start(g.registry.hostPort);
    saved = await savedSnapshot('vk-push-b', { memory: 6_000_000 });
  });
  after(async () => {
    via?.close();
    await proxy?.stop();
  });
  const fresh = () => {
    via?.close();
    proxy.clear();
    via = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
    return via;
  };

  it('readSnapshotIdentity: absent, present, and a registry that is down throws RegistryError (not absent)', async () => {
    fresh();
    await proxy.up();
    assert.equal(await readSnapshotIdentity(via, 'vk-push-b', 'hibernate'), 'absent');
    await pushSnapshot({
      registry: via,
      cli,
      localName: saved.name,
      repo: 'vk-push-b',
      tag: 'hibernate',
      baseImage: '',
    });
    const present = await readSnapshotIdentity(via, 'vk-push-b', 'hibernate');
    assert.ok(present !== 'absent');
    assert.equal(present.snapshotId, saved.id);
    assert.equal(present.baseImage, '', 'an empty base image is omitted');
    for (const mode of ['refuse', 'reset'] as const) {
      await proxy.down(mode);
      await assert.rejects(readSnapshotIdentity(fresh(), 'vk-push-b', 'hibernate'), (e: unknown) => {
        assert.ok(e instanceof RegistryError, String(e));
        assert.equal(e.kind, 'network');
        assert.match(e.message, mode === 'refuse' ? /ECONNREFUSED/ : /ECONNRESET|socket hang up/);
        return true;
      });
    }
    await proxy.up();
    assert.equal(await deleteSnapshotTag(fresh(), 'vk-push-b', 'hibernate'), 'deleted');
  });

  it('a refused manifest PUT: SnapshotPushError phase manifest, and the tag stays absent', async () => {
    fresh();
    proxy.refuseManifestPut(400);
    await assert.rejects(
      pushSnapshot({
        registry: via,
        cli,
        localName: saved.name,
        repo: 'vk-push-b',
        tag: 'latest',
        baseImage: IMAGE,
      }),
      (e: unknown) => {
        assert.ok(e instanceof SnapshotPushError, String(e));
        assert.equal(e.phase, 'manifest');
        assert.match(
          e.message,
          new RegExp(
            `^push ${proxy.hostPort}/cocoon/vk-push-b:latest: manifest PUT refused: 400 MANIFEST_INVALID`,
          ),
        );
        return true;
      },
    );
    proxy.clear();
    assert.equal(await readSnapshotIdentity(via, 'vk-push-b', 'latest'), 'absent');
    assert.equal(
      await registry.headManifest(registry.repository('vk-push-b'), parseReference('latest')),
      'absent',
    );
  });

  it('the registry going away mid-upload: the push fails, no manifest, spool files gone', async () => {
    fresh();
    const spool = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-spool-'));
    // Fresh bytes, so the memory file really goes up (not skipped as already present).
    fs.writeFileSync(path.join(dataDir(sim, saved.id), 'memory-range-0'), randomBytes(6_000_000));
    proxy.downAfterUploadBytes(1_500_000);
    const from = proxy.requests.length;
    try {
      await assert.rejects(
        pushSnapshot({
          registry: via,
          cli,
          localName: saved.name,
          repo: 'vk-push-b',
          tag: 'latest',
          baseImage: IMAGE,
          chunkMiB: 1,
          spoolDir: spool,
        }),
        (e: unknown) => {
          assert.ok(e instanceof SnapshotPushError, String(e));
          assert.equal(e.phase, 'upload');
          assert.match(
            e.message,
            /layer memory-range-0 \(sha256:[0-9a-f]{64}\): .*(ECONNRESET|ECONNREFUSED|socket hang up)/,
          );
          return true;
        },
      );
      assert.ok(proxy.since(from).some((c) => c.startsWith('PATCH ')));
      assert.ok(!proxy.since(from).some((c) => c.includes('/manifests/')), 'no manifest request');
      assert.deepEqual(fs.readdirSync(spool), [], 'every spool file removed');
      await proxy.up();
      assert.equal(await readSnapshotIdentity(fresh(), 'vk-push-b', 'latest'), 'absent');
    } finally {
      await proxy.up();
      fs.rmSync(spool, { recursive: true, force: true });
    }
  });

  it('an export that fails (unknown snapshot) or caller annotations under cocoonstack.: no upload, no manifest', async () => {
    fresh();
    const from = proxy.requests.length;
    await assert.rejects(
      pushSnapshot({
        registry: via,
        cli,
        localName: 'no-such-snapshot',
        repo: 'vk-push-b',
        tag: 'latest',
        baseImage: '',
      }),
      (e: unknown) => {
        assert.ok(e instanceof SnapshotPushError, String(e));
        assert.equal(e.phase, 'export');
        assert.match(
          e.message,
          /cocoon snapshot export no-such-snapshot: exit status 1 \(stderr: Error: .*not found/,
        );
        return true;
      },
    );
    await assert.rejects(
      pushSnapshot({
        registry: via,
        cli,
        localName: saved.name,
        repo: 'vk-push-b',
        tag: 'latest',
        baseImage: '',
        annotations: { 'cocoonstack.snapshot.from-node': 'forged' },
      }),
      { name: 'SnapshotPushError', phase: 'manifest', message: /is reserved/ },
    );
    assert.deepEqual(proxy.since(from), []);
  });

  it('an abort mid-push stops everything and removes the spool', async () => {
    fresh();
    const spool = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-spool-'));
    fs.writeFileSync(path.join(dataDir(sim, saved.id), 'memory-range-0'), randomBytes(6_000_000));
    const ac = new AbortController();
    const pushing = pushSnapshot({
      registry: via,
      cli,
      localName: saved.name,
      repo: 'vk-push-b',
      tag: 'latest',
      baseImage: '',
      chunkMiB: 1,
      spoolDir: spool,
      signal: ac.signal,
    });
    const from = proxy.requests.length;
    while (!proxy.since(from).some((c) => c.startsWith('PATCH '))) await new Promise((r) => setTimeout(r, 5));
    ac.abort(new Error('shutting down'));
    await assert.rejects(pushing, { name: 'SnapshotPushError', message: /shutting down/ });
    assert.deepEqual(fs.readdirSync(spool), []);
    fs.rmSync(spool, { recursive: true });
    assert.equal(await readSnapshotIdentity(via, 'vk-push-b', 'latest'), 'absent');
    // No export is left holding the snapshot: cocoon refuses to remove one in use by an export.
    const rm = await sim.run(['snapshot', 'rm', saved.name]);
    assert.equal(rm.code, 0, rm.stderr);
  });
});

describe('export failures (a scripted cocoon export)', () => {
  let scripted: CocoonCli;
  let proxy: RegistryProxy;
  let via: RegistryClient;
  let tarFile: string;

  before(async () => {
    // `snapshot export` prints $FAKE_EXPORT_TAR, says $FAKE_EXPORT_ERR on stderr and exits
    // $FAKE_EXPORT_EXIT; every other verb goes to the simulator.
    tarFile = path.join(sim.dir, 'scripted.tar');
    const shim = path.join(sim.dir, 'scripted-cocoon');
    fs.writeFileSync(
      shim,
      [
        '#!/usr/bin/env bash',
        'if [ "$1" = snapshot ] && [ "$2" = export ]; then',
        '  cat "$FAKE_EXPORT_TAR"',
        '  [ -n "$FAKE_EXPORT_ERR" ] && echo "Error: $FAKE_EXPORT_ERR" >&2',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion
        '  exit "${FAKE_EXPORT_EXIT:-0}"',
        'fi',
        `exec "${sim.cocoonBin}" "$@"`,
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    scripted = new CocoonCli(shim, lifetime.signal, silentLogger);
    process.env.FAKE_EXPORT_TAR = tarFile;
    proxy = await RegistryProxy.start(g.registry.hostPort);
    via = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
  });
  after(async () => {
    via?.close();
    await proxy?.stop();
    for (const k of ['FAKE_EXPORT_TAR', 'FAKE_EXPORT_ERR', 'FAKE_EXPORT_EXIT']) delete process.env[k];
  });

  type Entry = { name: string; data: Buffer | string; mode?: number; pax?: Record<string, string> };
  const envelope = (version = 1) =>
    JSON.stringify({
      version,
      config: { id: 'ZXCVBNMASDFGHJKLQWERTYUIO2', name: 'x', hypervisor: 'firecracker', cpu: 1 },
    });
  async function writeTar(entries: Entry[], opts: { truncateAt?: number } = {}): Promise<void> {
    const pack = tar.pack();
    for (const e of entries)
      pack.entry({ name: e.name, mode: e.mode ?? 0o640, ...(e.pax ? { pax: e.pax } : {}) }, e.data);
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    const all = Buffer.concat(chunks);
    fs.writeFileSync(tarFile, opts.truncateAt === undefined ? all : all.subarray(0, opts.truncateAt));
  }
  const script = (exit: number, err = '') => {
    process.env.FAKE_EXPORT_EXIT = String(exit);
    process.env.FAKE_EXPORT_ERR = err;
  };
  const push = (tag: string) =>
    pushSnapshot({
      registry: via,
      cli: scripted,
      localName: 'scripted',
      repo: 'vk-push-c',
      tag,
      baseImage: '',
    });
  const noManifest = (from: number) =>
    assert.ok(!proxy.since(from).some((c) => c.includes('/manifests/')), proxy.since(from).join('\n'));

  it('sparse PAX records reach the config verbatim; modes and tar order kept', async () => {
    const map = '[{"offset":0,"length":4096},{"offset":1048576,"length":4096}]';
    await writeTar([
      { name: 'snapshot.json', data: envelope(), mode: 0o644 },
      {
        name: './disk.raw',
        data: randomBytes(8192),
        mode: 0o600,
        pax: { 'COCOON.sparse.map': map, 'COCOON.sparse.size': '1073741824' },
      },
      { name: 'state.json', data: '{}' },
    ]);
    script(0);
    const r = await push('sparse');
    assert.equal(r.snapshotId, 'ZXCVBNMASDFGHJKLQWERTYUIO2');
    const configBytes = await craneBytes('config', `${g.registry.hostPort}/cocoon/vk-push-c:sparse`);
    assert.deepEqual(goConfigProblems(configBytes), []);
    const config = JSON.parse(configBytes.toString());
    assert.deepEqual(config.files, {
      'disk.raw': { mode: 0o600, size: 8192, sparseMap: map, sparseSize: 1073741824 },
      'state.json': { mode: 0o640, size: 2 },
    });
    assert.equal(config.hypervisor, 'firecracker');
  });

  it('an entry that is not a plain file name: phase export, no manifest', async () => {
    await writeTar([
      { name: 'snapshot.json', data: envelope() },
      { name: 'sub/file', data: 'x' },
    ]);
    script(0);
    const from = proxy.requests.length;
    await assert.rejects(push('bad-name'), {
      name: 'SnapshotPushError',
      phase: 'export',
      message: /export tar: export entry "sub\/file": name is not a plain file name/,
    });
    noManifest(from);
  });

  it("a tar cut short by a failing export: the export's own error, no manifest", async () => {
    await writeTar(
      [
        { name: 'snapshot.json', data: envelope() },
        { name: 'memory-ranges', data: randomBytes(100_000) },
      ],
      { truncateAt: 50_000 },
    );
    script(1, 'read memory-ranges: input/output error');
    const from = proxy.requests.length;
    await assert.rejects(push('cut'), {
      name: 'SnapshotPushError',
      phase: 'export',
      message:
        /cocoon snapshot export scripted: exit status 1 \(stderr: Error: read memory-ranges: input\/output error\)/,
    });
    noManifest(from);
  });

  it('a complete tar but a non-zero exit, no snapshot.json, or an unsupported version: no manifest', async () => {
    const from = proxy.requests.length;
    await writeTar([
      { name: 'snapshot.json', data: envelope() },
      { name: 'state.json', data: '{}' },
    ]);
    script(1, 'late failure');
    await assert.rejects(push('late'), {
      phase: 'export',
      message: /exit status 1 \(stderr: Error: late failure\)/,
    });
    await writeTar([{ name: 'state.json', data: '{}' }]);
    script(0);
    await assert.rejects(push('no-envelope'), { phase: 'export', message: /export tar: no snapshot.json/ });
    await writeTar([{ name: 'snapshot.json', data: envelope(2) }]);
    await assert.rejects(push('v2'), {
      phase: 'export',
      message: /snapshot.json: unsupported snapshot archive version 2/,
    });
    noManifest(from);
  });
});

describe('a 1 GiB blob read through a connection cut at 50 %', () => {
  it('the read resumes with Range from where it got to, and the bytes match the digest', async () => {
    const GiB = 2 ** 30;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-bigblob-'));
    const proxy = await RegistryProxy.start(g.registry.hostPort);
    try {
      // 1 GiB of a repeated random MiB, hashed as it is written (the registry stores it whole).
      const file = path.join(dir, 'blob');
      const piece = randomBytes(2 ** 20);
      const hash = createHash('sha256');
      const fd = fs.openSync(file, 'w');
      for (let i = 0; i < GiB / piece.length; i++) {
        piece.writeUInt32LE(i, 0); // no two MiB alike: a resume at a wrong offset cannot match
        fs.writeSync(fd, piece);
        hash.update(piece);
      }
      fs.closeSync(fd);
      const digest = `sha256:${hash.digest('hex')}`;
      const repo = registry.repository('bigblob');
      await registry.uploadBlob(repo, { digest, size: GiB, file });
      fs.rmSync(file);

      const viaProxy = new RegistryClient({ base: `${proxy.hostPort}/cocoon`, credentials: [] });
      proxy.cutNextBlobDownloadAt(0.5);
      const from = proxy.requests.length;
      const got = createHash('sha256');
      let bytes = 0;
      for await (const chunk of await viaProxy.getBlob(repo, { digest, size: GiB })) {
        got.update(chunk as Buffer);
        bytes += (chunk as Buffer).length;
      }
      viaProxy.close();
      assert.equal(bytes, GiB);
      assert.equal(`sha256:${got.digest('hex')}`, digest, 'the bytes match');
      const gets = proxy.requests.slice(from).filter((r) => r.method === 'GET' && r.path.includes('/blobs/'));
      assert.equal(gets.length, 2, `one cut, one resume: ${JSON.stringify(gets)}`);
      assert.equal(gets[0]?.cutAfter, GiB / 2, 'cut at 50 %');
      const resumeAt = Number(/^bytes=(\d+)-$/.exec(gets[1]?.range ?? '')?.[1]);
      assert.ok(resumeAt > 0 && resumeAt <= GiB / 2, `resumed at ${gets[1]?.range}`);
      assert.equal(gets[1]?.status, 206);
    } finally {
      await proxy.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
