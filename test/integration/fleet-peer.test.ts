// The operator's multi-host flows on a fleet of three hosts (ground/fleet.ts), driven with the
// operator's own annotation sequences as test/integration/hibernate-operator.test.ts drives them
// on one host, and peer restore between our hosts (docs/peer-restore.md):
//  - migration A→B: hibernate on A (VM removed only once the state is pushed), pod deleted,
//    recreated on B with restore-from-hibernate; a marker written into the guest before is read
//    after; A holds no VM; the operator deletes the tag;
//  - release-policy suspend and wake: the pod deleted with keep-snapshot-on-delete (seat freed,
//    A's copy kept); a wake on A uses its verified local copy (no pull, no import), a wake on B
//    restores from A's peer server (no import; the `Woken` event and the metric say so), and with
//    A's daemon stopped the wake on C falls back to the registry;
//  - a faulty peer (A's server behind a front that corrupts a slice, or stalls it): the
//    CRC-32C trailer or the stall timeout cuts the restore and the wake falls back to the registry;
//  - a Go pusher (a state without our stamp): found through its Node's InternalIP by a daemon
//    that may read Nodes and fetched over plain HTTP; a node identity may not, and pulls;
//  - the peer server refuses a caller without node credentials, and plain HTTP;
//  - the staging directory is emptied at start;
//  - snapshot CPU classes on differently classed hosts place pods by class.
import assert from 'node:assert/strict';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { connect } from 'node:net';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { type FleetHost, type FleetWorld, fixtureOnEveryHost, useFleet } from '../../ground/fleet.ts';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { deleteSnapshotTag } from '../../src/registry/identity.ts';
import { parseReference } from '../../src/registry/reference.ts';
import { annotate, isReady, lifecycle, mergePatch, vmIdOf } from './helpers.ts';
import { faultyPeer, type GoPusher, goPusher } from './peer-standins.ts';

const HIBERNATE = 'vm.cocoonstack.io/hibernate';
const RESTORE = 'vm.cocoonstack.io/restore-from-hibernate';
const KEEP = 'vm.cocoonstack.io/keep-snapshot-on-delete';
const PEER_ADDRESS = 'vm.cocoonstack.io/peer-address';
const PEER_PIN = 'vm.cocoonstack.io/peer-cert-sha256';
const FROM_NODE = 'cocoonstack.snapshot.from-node';
const IMAGE = 'acme/fleet-agent';
const fleet = useFleet({ hosts: 3 });
let fw: FleetWorld;
let registry: RegistryClient;
let A: FleetHost;
let B: FleetHost;
let C: FleetHost;

before(async () => {
  fw = await fleet();
  [A, B, C] = fw.hosts as [FleetHost, FleetHost, FleetHost];
  registry = new RegistryClient({ base: fw.fleet.registry, credentials: [] });
  await fixtureOnEveryHost(fw.hosts, IMAGE);
});

const read = (name: string) => fw.core.readNamespacedPod({ namespace: fw.namespace, name });

async function create(name: string, host: FleetHost, extra: Record<string, string> = {}): Promise<void> {
  await fw.core.createNamespacedPod({
    namespace: fw.namespace,
    body: vmPod(name, host.name, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': IMAGE,
      'cocoonset.cocoonstack.io/managed': 'true',
      ...extra,
    }),
  });
}

const waitReady = (name: string, timeoutMs = 90_000): Promise<V1Pod> =>
  waitForPod(fw.core, fw.namespace, name, 'ready', (p) => lifecycle(p) === 'ready' && isReady(p), timeoutMs);

async function tagPresent(vmName: string): Promise<boolean> {
  return (await registry.headManifest(registry.repository(vmName), parseReference('hibernate'))) !== 'absent';
}

/** The operator's suspend: hibernate=true, then hibernated with the tag in the registry. */
async function suspend(name: string): Promise<void> {
  await annotate(fw.core, fw.namespace, name, { [HIBERNATE]: 'true' });
  await waitFor(
    `${name} hibernated with vk-${name}:hibernate`,
    async () => lifecycle(await read(name)) === 'hibernated' && (await tagPresent(`vk-${name}`)),
    120_000,
    250,
  );
}

async function remove(name: string): Promise<void> {
  await fw.core.deleteNamespacedPod({ namespace: fw.namespace, name });
  await waitForPodGone(fw.core, fw.namespace, name, 60_000);
}

async function vmNames(h: FleetHost): Promise<string[]> {
  const out = (await h.simulator.run(['vm', 'list', '-o', 'json'])).stdout;
  if (out.startsWith('No VMs found')) return [];
  return (JSON.parse(out) as { config: { name: string } }[]).map((v) => v.config.name).sort();
}

async function snapshotNames(h: FleetHost): Promise<string[]> {
  const out = (await h.simulator.run(['snapshot', 'list', '-o', 'json'])).stdout;
  if (out.startsWith('No snapshots found')) return [];
  return (JSON.parse(out) as { name: string }[]).map((s) => s.name);
}

const callsSince = (h: FleetHost, mark: number) =>
  h.simulator
    .calls()
    .slice(mark)
    .map((c) => ({ cmd: c.argv.join(' '), exit: c.exit }));

async function metric(h: FleetHost, line: RegExp): Promise<number> {
  const text = await (await fetch(`http://${h.ip}:${h.daemon.metricsPort}/metrics`)).text();
  const m = text.split('\n').find((l) => line.test(l));
  return m ? Number(m.split(' ').at(-1)) : 0;
}

/** The `Woken` event of the pod's current incarnation (events of earlier pods of the name are
 * left out by UID). */
async function wokenMessage(name: string): Promise<string> {
  const uid = (await read(name)).metadata?.uid ?? '';
  let message = '';
  await waitFor(
    `${name}: its Woken event`,
    async () => {
      const list = await fw.core.listNamespacedEvent({
        namespace: fw.namespace,
        fieldSelector: `involvedObject.uid=${uid},reason=Woken`,
      });
      message = list.items[0]?.message ?? '';
      return message !== '';
    },
    10_000,
    200,
  );
  return message;
}

/** A ready pod on A with a marker, suspended the release way: hibernated, then deleted with
 * keep-snapshot-on-delete (the seat is freed, A keeps its copy as a warm cache). */
async function released(name: string): Promise<void> {
  await create(name, A);
  await waitReady(name);
  await A.simulator.diskWrite(`vk-${name}`, `marker-${name}`);
  await suspend(name);
  await annotate(fw.core, fw.namespace, name, { [KEEP]: 'true' });
  await remove(name);
  assert.ok((await snapshotNames(A)).includes(`vk-${name}`), 'A keeps its copy');
  assert.deepEqual(await vmNames(A), []);
}

/** Recreates the released pod `name` on `host` with the restore and checks it woke from the peer
 * `node`: the guest marker, no registry import, a clone from the staged directory, the event. */
async function wokenFromPeer(name: string, host: FleetHost, node: string): Promise<void> {
  const mark = host.simulator.calls().length;
  await create(name, host, { [RESTORE]: 'true' });
  await waitReady(name);
  assert.equal(await host.simulator.diskRead(`vk-${name}`), `marker-${name}`);
  const calls = callsSince(host, mark).map((c) => c.cmd);
  assert.ok(!calls.some((c) => c.startsWith('snapshot import')), `no registry import: ${calls.join(' | ')}`);
  assert.ok(
    calls.some((c) => c.startsWith('vm clone') && c.includes('--from-dir')),
    calls.join(' | '),
  );
  assert.equal(await wokenMessage(name), `cloned from peer ${node}`);
}

/** Edits the annotations of the state's manifest (`null` deletes one), as another pusher would
 * have written them. */
async function editAnnotations(vmName: string, edit: Record<string, string | null>): Promise<void> {
  const repo = registry.repository(vmName);
  const got = await registry.getManifest(repo, parseReference('hibernate'));
  assert.notEqual(got, 'absent');
  if (got === 'absent') return;
  const doc = JSON.parse(got.bytes.toString('utf8')) as {
    mediaType: string;
    annotations: Record<string, string>;
  };
  for (const [k, v] of Object.entries(edit)) {
    if (v === null) delete doc.annotations[k];
    else doc.annotations[k] = v;
  }
  await registry.putManifest(repo, 'hibernate', Buffer.from(JSON.stringify(doc)), doc.mediaType);
}

describe('migration', () => {
  test('A→B: hibernated on A, recreated on B from the hibernated state, the guest marker kept, one VM', async () => {
    const name = 'mig-0';
    const vm = `vk-${name}`;
    await create(name, A);
    await waitReady(name);
    await A.simulator.diskWrite(vm, 'marker-before-migration');
    await suspend(name);
    assert.deepEqual(await vmNames(A), [], 'the VM on A is removed once the state is pushed');
    await remove(name);
    const mark = B.simulator.calls().length;
    await create(name, B, { [RESTORE]: 'true' });
    const p = await waitReady(name);
    assert.equal(await B.simulator.diskRead(vm), 'marker-before-migration');
    assert.deepEqual(await vmNames(B), [vm]);
    assert.equal(vmIdOf(p), JSON.parse((await B.simulator.run(['vm', 'inspect', vm])).stdout).id);
    assert.ok(
      callsSince(B, mark).some((c) => c.cmd.startsWith('vm clone') && c.exit === 0),
      'restored on B by a clone',
    );
    assert.deepEqual(await vmNames(A), [], 'no second copy on A');
    // The operator's last step: the tag goes.
    assert.equal(await deleteSnapshotTag(registry, vm, 'hibernate'), 'deleted');
    assert.equal(await tagPresent(vm), false);
    await remove(name);
  });
});

describe('release-policy suspend and wake', () => {
  test('woken on the stashed host: its verified local copy, no pull', async () => {
    const name = 'rel-0';
    await released(name);
    const mark = A.simulator.calls().length;
    await create(name, A, { [RESTORE]: 'true' });
    await waitReady(name);
    assert.equal(await A.simulator.diskRead(`vk-${name}`), `marker-${name}`);
    const calls = callsSince(A, mark).map((c) => c.cmd);
    assert.ok(!calls.some((c) => c.startsWith('snapshot import')), `no import: ${calls.join(' | ')}`);
    assert.ok(
      calls.some((c) => c.startsWith('vm clone') && c.endsWith(` vk-${name}`)),
      calls.join(' | '),
    );
    assert.equal(await wokenMessage(name), `cloned from vk-${name}`);
    await remove(name);
  });

  test('woken on another host: a peer restore from A (no import); then, with the pushing host stopped, the registry', async () => {
    const name = 'rel-1';
    await released(name);
    const okBefore = await metric(B, /^cocoon_vk_snapshot_peer_restore_total\{result="ok"\}/);
    await wokenFromPeer(name, B, A.name);
    assert.equal(await metric(B, /^cocoon_vk_snapshot_peer_restore_total\{result="ok"\}/), okBefore + 1);
    assert.ok((await metric(A, /^cocoon_vk_peer_server_bytes_total/)) > 0, 'A served bytes');
    assert.deepEqual(readdirSync(B.stagingDir), [], 'the staged directory is released');

    // Suspended again on B (the state now names B), released, and A's copy is stale; with B's
    // daemon stopped a wake on C cannot ask B and pulls from the registry.
    await suspend(name);
    await annotate(fw.core, fw.namespace, name, { [KEEP]: 'true' });
    await remove(name);
    await B.daemon.stop();
    try {
      const markC = C.simulator.calls().length;
      await create(name, C, { [RESTORE]: 'true' });
      await waitReady(name);
      assert.equal(await C.simulator.diskRead(`vk-${name}`), `marker-${name}`);
      assert.ok(
        callsSince(C, markC).some(
          (c) => c.cmd === `snapshot import --name vk-${name}-hibernate-import` && c.exit === 0,
        ),
        'the registry fallback',
      );
      assert.equal(await wokenMessage(name), `cloned from vk-${name}:hibernate`);
    } finally {
      await B.restart();
    }
    await remove(name);
  });
});

describe('the peer server', () => {
  test('a caller without node credentials is refused (TLS without a client certificate: 401; plain HTTP: closed)', async () => {
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpsRequest(
        {
          host: A.ip,
          port: fw.fleet.peerPort,
          path: '/v1/snapshot-plan?name=vk-rel-0',
          rejectUnauthorized: false,
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('error', reject);
      req.end();
    });
    assert.equal(status, 401);
    const answer = await new Promise<string>((resolve) => {
      const sock = connect(fw.fleet.peerPort, A.ip, () =>
        sock.write(`GET /v1/snapshot-plan?name=vk-rel-0 HTTP/1.1\r\nHost: ${A.ip}\r\n\r\n`),
      );
      let got = '';
      sock.on('data', (d) => {
        got += d.toString();
      });
      sock.on('close', () => resolve(got));
      sock.on('error', () => resolve(got));
    });
    assert.equal(answer, '', 'closed unanswered without VK_PEER_PLAIN_HTTP');
  });

  test('the staging directory is emptied when the daemon starts', async () => {
    mkdirSync(join(C.stagingDir, 'vk-left-over-123'), { recursive: true });
    writeFileSync(join(C.stagingDir, 'vk-left-over-123', 'memory-range-0'), 'half a restore');
    await C.daemon.stop();
    await C.restart();
    await waitFor('staging emptied', () => readdirSync(C.stagingDir).length === 0, 30_000, 100);
  });
});

describe('a faulty peer', () => {
  for (const [fault, why] of [
    ['corrupt', /checksum mismatch/],
    ['stall', /no body bytes for 30000 ms/],
  ] as const) {
    test(`a ${fault === 'corrupt' ? 'corrupted slice is detected' : 'stalled slice hits the stall timeout'}; the wake falls back to the registry`, {
      timeout: 150_000,
    }, async () => {
      const name = `bad-${fault}`;
      await released(name);
      const peer = await faultyPeer(A, `vk-${name}`, fault);
      try {
        await editAnnotations(`vk-${name}`, { [PEER_ADDRESS]: peer.address });
        const failed = /^cocoon_vk_snapshot_peer_restore_total\{result="failed"\}/;
        const failedBefore = await metric(B, failed);
        const logBefore = readFileSync(B.logFile, 'utf8').length;
        const mark = B.simulator.calls().length;
        await create(name, B, { [RESTORE]: 'true' });
        await waitReady(name, 120_000);
        assert.ok(peer.damaged() >= 1, 'the front damaged a slice');
        assert.equal(await B.simulator.diskRead(`vk-${name}`), `marker-${name}`);
        assert.ok(
          callsSince(B, mark).some(
            (c) => c.cmd === `snapshot import --name vk-${name}-hibernate-import` && c.exit === 0,
          ),
          'the registry fallback',
        );
        assert.equal(await wokenMessage(name), `cloned from vk-${name}:hibernate`);
        assert.equal(await metric(B, failed), failedBefore + 1);
        const logged = readFileSync(B.logFile, 'utf8').slice(logBefore);
        assert.match(logged, why);
        assert.match(logged, /peer restore of vk-bad-\w+ from \S+ failed; falling back to the registry/);
        assert.deepEqual(readdirSync(B.stagingDir), [], 'nothing left staged');
      } finally {
        await peer.close();
      }
      await remove(name);
    });
  }
});

describe('a Go pusher', () => {
  /** The state of `name` as a Go host pushes it: no stamp of ours, `from-node` naming a Node
   * whose InternalIP serves plain HTTP at the fleet's peer port. */
  async function pushedByGo(name: string, goNode: string, goIp: string): Promise<GoPusher> {
    await released(name);
    const pusher = await goPusher(A, `vk-${name}`, goIp, fw.fleet.peerPort);
    await fw.core.createNode({ body: { metadata: { name: goNode } } });
    await fw.core.patchNodeStatus(
      { name: goNode, body: { status: { addresses: [{ type: 'InternalIP', address: goIp }] } } },
      mergePatch,
    );
    await editAnnotations(`vk-${name}`, { [PEER_ADDRESS]: null, [PEER_PIN]: null, [FROM_NODE]: goNode });
    return pusher;
  }

  test('a node identity may not read the Go host’s Node: the wake says so and pulls from the registry', async () => {
    const name = 'go-0';
    const goNode = `go-${fw.namespace}-0`;
    const pusher = await pushedByGo(name, goNode, `${fw.fleet.subnet}.98`);
    try {
      const logBefore = readFileSync(B.logFile, 'utf8').length;
      await create(name, B, { [RESTORE]: 'true' });
      await waitReady(name);
      assert.equal(await B.simulator.diskRead(`vk-${name}`), `marker-${name}`);
      assert.equal(await wokenMessage(name), `cloned from vk-${name}:hibernate`);
      assert.match(
        readFileSync(B.logFile, 'utf8').slice(logBefore),
        new RegExp(`cannot read node ${goNode}`),
      );
      assert.deepEqual(pusher.requests, [], 'the Go host was never asked');
    } finally {
      await pusher.close();
      await fw.core.deleteNode({ name: goNode });
    }
    await remove(name);
  });

  test('a daemon that may read Nodes fetches over plain HTTP from the Node’s InternalIP at its own peer port', async () => {
    const name = 'go-1';
    const goNode = `go-${fw.namespace}-1`;
    const pusher = await pushedByGo(name, goNode, `${fw.fleet.subnet}.99`);
    // deploy/rbac-provider-identity.yaml lets a daemon read Nodes; a node identity may not read
    // another Node on Kubernetes 1.32+.
    await C.daemon.stop();
    await C.restart(undefined, 'provider');
    try {
      await wokenFromPeer(name, C, goNode);
      assert.ok(pusher.requests.includes('plan ok'), pusher.requests.join(', '));
      assert.ok(pusher.requests.includes('slice ok'), pusher.requests.join(', '));
    } finally {
      await pusher.close();
      await fw.core.deleteNode({ name: goNode });
      await C.daemon.stop();
      await C.restart();
    }
    await remove(name);
  });
});

describe('snapshot CPU classes', () => {
  test('pods select their class: each lands on the host of that class and is ready there', async () => {
    await A.daemon.stop();
    await A.restart({ VK_SNAPSHOT_CPU_CLASS: 'icelake' });
    await B.daemon.stop();
    await B.restart({ VK_SNAPSHOT_CPU_CLASS: 'genoa' });
    for (const [h, cls] of [
      [A, 'icelake'],
      [B, 'genoa'],
    ] as const) {
      await waitFor(
        `${h.name} labelled ${cls}`,
        async () =>
          (await fw.core.readNode({ name: h.name })).metadata?.labels?.[
            'cocoonstack.io/snapshot-cpu-class'
          ] === cls,
        30_000,
        200,
      );
    }
    for (const cls of ['icelake', 'genoa']) {
      const pod = vmPod(
        `cls-${cls}`,
        '',
        {
          'vm.cocoonstack.io/name': `vk-cls-${cls}`,
          'cocoonset.cocoonstack.io/image': IMAGE,
          'cocoonset.cocoonstack.io/managed': 'true',
        },
        { nodeSelector: { 'cocoonstack.io/snapshot-cpu-class': cls } },
      );
      if (pod.spec) pod.spec.nodeName = undefined;
      await fw.core.createNamespacedPod({ namespace: fw.namespace, body: pod });
    }
    const icelake = await waitReady('cls-icelake');
    const genoa = await waitReady('cls-genoa');
    assert.equal(icelake.spec?.nodeName, A.name);
    assert.equal(genoa.spec?.nodeName, B.name);
    assert.deepEqual(await vmNames(C), []);
  });
});
