// The fleet ground (ground/fleet.ts): three vk-cocoon hosts against one ground, each its own
// node with its own loopback InternalIP (a random /24 inside 127/8), kubelet port, simulator
// root, staging and snapshot dirs; a pod pinned to each host becomes `ready` there and the
// apiserver reaches each host at its own address for logs and exec; `kill` leaves a host's VMs
// running, `killHost` takes them too, and `stopFleet` leaves no process behind. Then the two
// registries of ground/registry.ts: distribution v3 deletes a tag, Debian's 2.8 refuses to.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { kubectl } from '../../ground/cluster.ts';
import { type FleetHost, type FleetWorld, stopFleet, useFleet } from '../../ground/fleet.ts';
import { readGround } from '../../ground/ground.ts';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { isAlive, procStart, registeredProcesses, waitFor } from '../../ground/proc.ts';
import {
  defaultRegistryKind,
  type RegistryKind,
  type RegistryState,
  startRegistry,
  stopRegistry,
} from '../../ground/registry.ts';
import { lifecycle } from './helpers.ts';

const HOSTS = 3;
const SNAPSHOT = 'acme/fleet';
const fleet = useFleet({ hosts: HOSTS });
let fw: FleetWorld;

/** Live processes whose environment names the host's simulator root: its daemon, the
 * simulator's server, reaper and VM stand-ins (everything of that host). */
function hostProcesses(h: FleetHost): { pid: number; start: number }[] {
  const marker = `COCOON_ROOT_DIR=${h.simRoot}`;
  const out: { pid: number; start: number }[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const pid = Number(name);
    const start = procStart(pid);
    if (start === undefined || pid === process.pid) continue;
    try {
      if (!readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes(marker)) continue;
    } catch {
      continue;
    }
    out.push({ pid, start });
  }
  return out;
}

const gone = (ps: { pid: number; start: number }[]) => ps.filter((p) => procStart(p.pid) === p.start);

describe('a fleet of three hosts', () => {
  before(async () => {
    fw = await fleet();
    await Promise.all(
      fw.hosts.map((h) =>
        h.simulator.fixtureSnapshot(SNAPSHOT, {
          backend: 'cloud-hypervisor',
          os: 'linux',
          image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
        }),
      ),
    );
  });

  test('every host is its own Ready node with its own InternalIP, kubelet port and dirs', async () => {
    const ips = fw.hosts.map((h) => h.ip);
    assert.equal(new Set(ips).size, HOSTS, ips.join(' '));
    assert.equal(new Set(fw.hosts.map((h) => h.kubeletPort)).size, HOSTS);
    assert.match(fw.fleet.subnet, /^127\.(\d+)\.(\d+)$/);
    assert.notEqual(fw.fleet.subnet.split('.')[1], '0', 'never 127.0.0.0/24');
    for (const h of fw.hosts) {
      assert.equal(h.ip, `${fw.fleet.subnet}.${h.index + 2}`);
      await waitFor(
        `node ${h.name} Ready`,
        async () => {
          const n = await fw.core.readNode({ name: h.name });
          return n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
        },
        30_000,
        200,
      );
      const node = await fw.core.readNode({ name: h.name });
      assert.deepEqual(
        node.status?.addresses?.filter((a) => a.type === 'InternalIP').map((a) => a.address),
        [h.ip],
      );
      assert.equal(node.status?.daemonEndpoints?.kubeletEndpoint?.Port, h.kubeletPort);
      const env = readFileSync(`/proc/${h.daemon.pid}/environ`, 'utf8').split('\0');
      for (const kv of [
        `VK_NODE_IP=${h.ip}`,
        `VK_PEER_ADDR=${h.ip}:${fw.fleet.peerPort}`,
        `VK_STAGING_DIR=${join(h.dir, 'staging')}`,
        `VK_COCOON_SNAPSHOT_DIR=${join(h.simRoot, 'snapshot', 'localfile')}`,
        `COCOON_ROOT_DIR=${h.simRoot}`,
        `OCI_REGISTRY=${fw.fleet.registry}`,
      ])
        assert.ok(env.includes(kv), `${h.name}: ${kv}`);
    }
  });

  test('a pod pinned to each host becomes ready there; logs and exec reach each host at its IP', async () => {
    await Promise.all(
      fw.hosts.map((h) =>
        fw.core.createNamespacedPod({
          namespace: fw.namespace,
          body: vmPod(`on-${h.name}`, h.name, {
            'vm.cocoonstack.io/name': `vk-fleet-${h.name}`,
            'cocoonset.cocoonstack.io/image': SNAPSHOT,
            'cocoonset.cocoonstack.io/managed': 'true',
          }),
        }),
      ),
    );
    await Promise.all(
      fw.hosts.map((h) =>
        waitForPod(fw.core, fw.namespace, `on-${h.name}`, 'ready', (p) => lifecycle(p) === 'ready', 60_000),
      ),
    );
    for (const h of fw.hosts) {
      const vms = JSON.parse((await h.simulator.run(['vm', 'list', '-o', 'json'])).stdout) as {
        config: { name: string };
      }[];
      assert.deepEqual(
        vms.map((v) => v.config.name),
        [`vk-fleet-${h.name}`],
        `${h.name} runs its own pod's VM and no other`,
      );
      const c = fw.ground.cluster;
      assert.match(
        await kubectl(c, ['-n', fw.namespace, 'logs', `on-${h.name}`]),
        new RegExp(`vk-fleet-${h.name}`),
      );
      assert.equal(
        await kubectl(c, ['-n', fw.namespace, 'exec', `on-${h.name}`, '--', 'echo', h.ip]),
        `${h.ip}\n`,
      );
    }
  });

  test('kill() leaves the VMs running; killHost() takes every process of that host, the others stay', async () => {
    const [a, b] = [fw.hosts[HOSTS - 1] as FleetHost, fw.hosts[0] as FleetHost];
    const before = hostProcesses(a);
    const daemon = a.daemon.pid;
    assert.ok(before.some((p) => p.pid === daemon));
    assert.ok(before.length >= 2, `the daemon and the VM's processes: ${before.map((p) => p.pid)}`);
    await a.kill();
    assert.equal(isAlive(daemon), false);
    const vmProcs = hostProcesses(a);
    assert.ok(vmProcs.length >= 1, 'the VM stand-in outlives the daemon');
    await a.killHost();
    await waitFor(
      `every process of ${a.name} gone`,
      () => gone(before.concat(vmProcs)).length === 0,
      10_000,
      50,
    );
    assert.deepEqual(hostProcesses(a), []);
    const other = hostProcesses(b);
    assert.ok(other.some((p) => p.pid === b.daemon.pid) && other.length >= 2, 'another host is untouched');
  });

  test('stopFleet stops every daemon, simulator server and VM stand-in of the fleet', async () => {
    const all = fw.hosts.flatMap(hostProcesses);
    assert.ok(all.length >= 2 * (HOSTS - 1), `processes of the live hosts: ${all.length}`);
    // Inside npm test every one of them is the run's (PID registry: recorded or marked).
    const registry = process.env.VK_GROUND_PIDS;
    if (registry) {
      const run = new Set(registeredProcesses(registry).map((p) => p.pid));
      const outside = all.filter((p) => !run.has(p.pid));
      assert.deepEqual(outside, [], 'every host process is in the run PID registry');
    }
    await stopFleet(fw.fleet);
    await waitFor('no process of the fleet', () => gone(all).length === 0, 10_000, 50);
    for (const h of fw.hosts) {
      assert.deepEqual(hostProcesses(h), [], h.name);
      assert.equal(isAlive(h.daemon.pid), false);
    }
  });
});

// --- the registries -------------------------------------------------------------------------

const OCI_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';

/** Pushes an empty-config OCI manifest with one layer; returns the manifest's digest. */
async function pushManifest(r: RegistryState, repo: string, tag: string): Promise<string> {
  const base = `${r.url}/v2/${repo}`;
  const blob = async (data: Buffer) => {
    const digest = `sha256:${createHash('sha256').update(data).digest('hex')}`;
    const start = await fetch(`${base}/blobs/uploads/`, { method: 'POST' });
    assert.equal(start.status, 202);
    const loc = new URL(start.headers.get('location') ?? '', r.url);
    loc.searchParams.set('digest', digest);
    assert.equal((await fetch(loc, { method: 'PUT', body: data })).status, 201);
    return { digest, size: data.length };
  };
  const config = await blob(Buffer.from('{}'));
  const layer = await blob(Buffer.from(`layer of ${repo}`));
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: OCI_MANIFEST,
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
    layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...layer }],
  });
  const put = await fetch(`${base}/manifests/${tag}`, {
    method: 'PUT',
    body: manifest,
    headers: { 'content-type': OCI_MANIFEST },
  });
  assert.equal(put.status, 201);
  return put.headers.get('docker-content-digest') ?? '';
}

const status = async (url: string, method = 'GET') => {
  const res = await fetch(url, { method, headers: { accept: OCI_MANIFEST } });
  const body = await res.text();
  const code = body.startsWith('{')
    ? (JSON.parse(body) as { errors?: { code: string }[] }).errors?.[0]?.code
    : '';
  return `${res.status}${code ? ` ${code}` : ''}`;
};

describe('registries', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vk-registries-'));
  const started: RegistryState[] = [];
  const start = async (kind: RegistryKind) => {
    const r = await startRegistry(join(dir, kind), { kind });
    started.push(r);
    return r;
  };
  after(async () => {
    for (const r of started) await stopRegistry(r);
    rmSync(dir, { recursive: true, force: true });
  });

  test('the ground runs the default registry kind and records it in ground.json', async () => {
    const g = fw?.ground ?? (await fleet()).ground;
    assert.equal(g.registry.kind, defaultRegistryKind());
    assert.equal(readGround(g.dir)?.registry.kind, g.registry.kind);
    assert.equal((await fetch(`${g.registry.url}/v2/`)).status, 200);
  });

  test('distribution v3 deletes a tag (202) and only the tag: the manifest stays by digest', async () => {
    const r = await start('distribution');
    assert.match(r.version, /distribution\/v3 v3\./);
    const digest = await pushManifest(r, 'cocoon/tags', 'v1');
    assert.match(digest, /^sha256:/);
    const tag = `${r.url}/v2/cocoon/tags/manifests/v1`;
    assert.equal(await status(tag), '200');
    assert.equal(await status(tag, 'DELETE'), '202');
    assert.equal(await status(tag), '404 MANIFEST_UNKNOWN');
    const tags = (await (await fetch(`${r.url}/v2/cocoon/tags/tags/list`)).json()) as {
      tags: string[] | null;
    };
    assert.deepEqual(tags.tags ?? [], []);
    assert.equal(await status(`${r.url}/v2/cocoon/tags/manifests/${digest}`), '200');
    assert.equal(await status(tag, 'DELETE'), '404 MANIFEST_UNKNOWN', 'a second delete finds no tag');
  });

  test("Debian's docker-registry 2.8 refuses a tag delete (DIGEST_INVALID) and keeps the tag", async () => {
    const r = await start('docker-registry');
    assert.match(r.version, /2\.8\./);
    await pushManifest(r, 'cocoon/tags', 'v1');
    const tag = `${r.url}/v2/cocoon/tags/manifests/v1`;
    assert.equal(await status(tag, 'DELETE'), '400 DIGEST_INVALID');
    assert.equal(await status(tag), '200');
  });

  test('stopRegistry stops both', async () => {
    assert.equal(started.length, 2);
    for (const r of started) {
      assert.ok(isAlive(r.pid));
      await stopRegistry(r);
      assert.equal(isAlive(r.pid), false);
    }
  });
});
