// Run mode with artifacts in the registry (docs/contracts/pod-to-vm.md "Bring-up: run";
// docs/registry.md "Cloud-image artifacts (run mode)"): the real apiserver, the real
// registry of the ground (this world pushes under its own namespace path), the cocoon simulator.
// A cloud-image artifact (a qcow2 split in two `.part` layers plus SHA256SUMS) is streamed
// into `cocoon image import <repo:tag>` and booted under that name; a snapshot artifact is
// refused naming it; a layer whose stored bytes do not hash to its digest fails the import
// with nothing imported; an image the registry does not have is pulled as before; and a
// registry failing the peek never makes a pod boot anything.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { MEDIA_TYPE } from '../../src/registry/artifact.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { cliCalls, isReady, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
let registry: RegistryClient;
let base: string;

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const TITLE = 'org.opencontainers.image.title';
const EMPTY_CONFIG = Buffer.from('{}');

before(async () => {
  w = await world();
  base = `${w.ground.registry.hostPort}/${w.namespace}`;
  registry = new RegistryClient({ base, credentials: [] });
  await w.restart({ OCI_REGISTRY: base });
});

interface Layer {
  mediaType: string;
  title: string;
  bytes: Buffer;
}

/** Uploads the blobs and puts an OCI manifest with `artifactType` under `repo:tag`. */
async function pushArtifact(
  repo: string,
  tag: string,
  artifactType: string,
  config: { mediaType: string; bytes: Buffer },
  layers: Layer[],
): Promise<void> {
  const name = registry.repository(repo);
  for (const b of [config.bytes, ...layers.map((l) => l.bytes)]) {
    await registry.uploadBlob(name, { digest: sha(b), size: b.length, bytes: b });
  }
  const manifest = {
    schemaVersion: 2,
    mediaType: MEDIA_TYPE.ociManifest,
    artifactType,
    config: { mediaType: config.mediaType, digest: sha(config.bytes), size: config.bytes.length },
    layers: layers.map((l) => ({
      mediaType: l.mediaType,
      digest: sha(l.bytes),
      size: l.bytes.length,
      annotations: { [TITLE]: l.title },
    })),
  };
  await registry.putManifest(
    name,
    tag,
    Buffer.from(JSON.stringify(manifest, null, 2)),
    MEDIA_TYPE.ociManifest,
  );
}

/** A split qcow2 cloud image: the parts listed out of title order, plus SHA256SUMS. */
async function pushCloudImage(repo: string, tag: string): Promise<{ part0: Buffer; part1: Buffer }> {
  const part0 = randomBytes(1024 * 1024 + 17);
  const part1 = randomBytes(600_001);
  const disk = Buffer.concat([part0, part1]);
  await pushArtifact(
    repo,
    tag,
    MEDIA_TYPE.osImage,
    { mediaType: 'application/vnd.oci.empty.v1+json', bytes: EMPTY_CONFIG },
    [
      { mediaType: `${MEDIA_TYPE.diskQcow2}.part`, title: 'disk.qcow2.part.001', bytes: part1 },
      {
        mediaType: 'text/plain',
        title: 'SHA256SUMS',
        bytes: Buffer.from(`${sha(disk).slice(7)}  disk.qcow2\n`),
      },
      { mediaType: `${MEDIA_TYPE.diskQcow2}.part`, title: 'disk.qcow2.part.000', bytes: part0 },
    ],
  );
  return { part0, part1 };
}

function createRunPod(name: string, image: string): Promise<unknown> {
  return w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': image,
      'cocoonset.cocoonstack.io/mode': 'run',
      'cocoonset.cocoonstack.io/managed': 'true',
    }),
  });
}

async function events(name: string): Promise<{ type: string; reason: string; message: string }[]> {
  const list = await w.core.listNamespacedEvent({
    namespace: w.namespace,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => ({ type: e.type ?? '', reason: e.reason ?? '', message: e.message ?? '' }));
}

const message = (p: { metadata?: { annotations?: Record<string, string> } }) =>
  p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
/** The message of the CreateBackoff condition (a transient create failure). */
const backoff = (p: V1Pod) => p.status?.conditions?.find((c) => c.reason === 'CreateBackoff')?.message ?? '';
const callsOf = (...prefix: string[]) =>
  cliCalls(w).filter((c) => prefix.every((word, i) => c.argv[i] === word));

async function simImage(ref: string): Promise<{ id: string; size: number; type: string } | undefined> {
  const r = await w.simulator.run(['image', 'inspect', ref]);
  return r.code === 0 ? JSON.parse(r.stdout) : undefined;
}

describe('run mode with registry artifacts', () => {
  test('a cloud-image artifact is imported as <repo>:<tag> (disk parts concatenated in title order) and booted', async () => {
    const image = 'img/ubuntu-cloud:24.04';
    const { part0, part1 } = await pushCloudImage('img/ubuntu-cloud', '24.04');
    await createRunPod('cloud', image);
    await waitForPod(
      w.core,
      w.namespace,
      'cloud',
      'ready',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      90_000,
    );

    const imports = callsOf('image', 'import');
    assert.deepEqual(
      imports.map((c) => [c.argv.join(' '), c.exit, c.stdinBytes]),
      [[`image import ${image}`, 0, part0.length + part1.length]],
    );
    const imported = await simImage(image);
    assert.equal(
      imported?.id,
      sha(Buffer.concat([part0, part1])),
      'the bytes cocoon read: part 000 then 001',
    );
    assert.equal(imported?.type, 'cloudimg');
    const run = callsOf('vm', 'run').find((c) => c.argv.includes('vk-cloud'));
    assert.equal(run?.argv.at(-1), image);
    assert.equal(run?.exit, 0);
    assert.deepEqual(callsOf('image', 'pull'), [], 'no image pull for an artifact');
  });

  test('a snapshot artifact as a run image fails naming it and saying use mode=clone', async () => {
    const config = Buffer.from(JSON.stringify({ schemaVersion: 'v1', snapshotId: 'SNAPRUNMODE' }));
    await pushArtifact(
      'snap/agent',
      'v1',
      MEDIA_TYPE.snapshotV1,
      { mediaType: MEDIA_TYPE.snapshotConfig, bytes: config },
      [{ mediaType: MEDIA_TYPE.vmConfig, title: 'config.json', bytes: Buffer.from('{"vm":"config"}') }],
    );
    await createRunPod('snap', 'snap/agent:v1');
    const p = await waitForPod(
      w.core,
      w.namespace,
      'snap',
      'failed',
      (x) => lifecycle(x) === 'failed',
      60_000,
    );
    assert.equal(
      message(p),
      `run image snap/agent:v1 is a snapshot artifact (${base}/snap/agent:v1): use mode=clone`,
    );
    assert.ok(
      (await events('snap')).some((e) => e.type === 'Warning' && e.message.includes('use mode=clone')),
    );
    assert.equal(
      cliCalls(w).some((c) => c.argv.includes('snap/agent:v1') || c.argv.includes('vk-snap')),
      false,
      'no pull, import or run',
    );
  });

  test('a layer whose bytes do not match its digest fails the import: nothing imported, no VM, retried', async () => {
    const image = 'img/broken:1';
    const { part1 } = await pushCloudImage('img/broken', '1');
    // Same size, other bytes, behind the registry's back: only the streaming hash can tell.
    const hex = sha(part1).slice(7);
    const data = join(
      w.ground.registry.dir,
      'storage',
      'docker',
      'registry',
      'v2',
      'blobs',
      'sha256',
      hex.slice(0, 2),
      hex,
      'data',
    );
    writeFileSync(data, randomBytes(part1.length));
    await createRunPod('broken', image);
    await waitFor(
      'a digest-mismatch Warning',
      async () =>
        (await events('broken')).some((e) => e.type === 'Warning' && /digest mismatch/.test(e.message)),
      60_000,
    );
    const p = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'broken' });
    assert.equal(lifecycle(p), 'creating', 'a failed import is retried on the backoff schedule');
    assert.match(backoff(p), /digest mismatch/);
    assert.equal(await simImage(image), undefined, 'nothing left imported');
    assert.deepEqual(
      callsOf('image', 'import', image).filter((c) => c.exit === 0),
      [],
    );
    assert.equal(
      callsOf('vm', 'run').some((c) => c.argv.includes('vk-broken')),
      false,
    );
  });

  test('an image the registry does not have is pulled with image pull, as before', async () => {
    await createRunPod('absent', 'acme/not-in-registry:2');
    await waitForPod(w.core, w.namespace, 'absent', 'ready', (p) => lifecycle(p) === 'ready', 60_000);
    assert.deepEqual(
      callsOf('image', 'pull').map((c) => c.argv.join(' ')),
      ['image pull acme/not-in-registry:2'],
    );
    assert.equal(
      callsOf('vm', 'run')
        .find((c) => c.argv.includes('vk-absent'))
        ?.argv.at(-1),
      'acme/not-in-registry:2',
    );
  });

  test('a registry failing the peek (503): the create backs off, nothing is pulled or booted', async () => {
    // Answers the hibernate-evidence HEAD (absent) so the bring-up reaches the run image peek;
    // every other manifest request gets 503.
    const server = http.createServer((req, res) => {
      const json = { 'content-type': 'application/json' };
      if (req.url === '/v2/') res.writeHead(200, json).end('{}');
      else if (req.url?.endsWith('/manifests/hibernate'))
        res.writeHead(404, json).end('{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}');
      else
        res.writeHead(503, json).end('{"errors":[{"code":"UNAVAILABLE","message":"down for maintenance"}]}');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const port = (server.address() as { port: number }).port;
      await w.daemon.stop();
      await w.restart({ OCI_REGISTRY: `127.0.0.1:${port}/${w.namespace}` });
      const before = cliCalls(w).length;
      await createRunPod('down', 'img/ubuntu-cloud:24.04');
      await waitFor(
        'a registry Warning',
        async () => (await events('down')).some((e) => e.type === 'Warning' && /UNAVAILABLE/.test(e.message)),
        60_000,
      );
      const p = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'down' });
      assert.equal(lifecycle(p), 'creating');
      assert.match(backoff(p), /failed: run image img\/ubuntu-cloud:24\.04: reading .*UNAVAILABLE/);
      const mine = cliCalls(w)
        .slice(before)
        .filter((c) => c.argv.includes('vk-down') || c.argv[0] === 'image');
      assert.deepEqual(mine, [], 'no image pull, no import, no vm run');
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});
