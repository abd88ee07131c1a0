// A delete during a registry outage (docs/registry.md, "Delete during a registry outage") on a
// fleet of two hosts: host A reaches the registry through a proxy that the tests take down.
//  - the pod with `snapshot-policy: always` goes within its grace period, its state is kept
//    as a local snapshot and in A's ledger, and `<vm>:latest` appears once the registry is
//    back; host B clones from it with the guest marker intact;
//  - the same across a restart of A's daemon (the push lands at its start);
//  - not pushed when the identity was recreated on B meanwhile, ran, hibernated and woke
//    there: A's deferred push is dropped and its local copy removed.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { type FleetHost, type FleetWorld, fixtureOnEveryHost, useFleet } from '../../ground/fleet.ts';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { readSnapshotIdentity } from '../../src/registry/identity.ts';
import { annotate, isReady, lifecycle } from './helpers.ts';
import { RegistryProxy } from './registry-proxy.ts';

const IMAGE = 'acme/deferred-agent';
const POLICY = { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' };
const HIBERNATE = 'vm.cocoonstack.io/hibernate';
const GRACE_SECONDS = 20;
const fleet = useFleet({ hosts: 2 });
let fw: FleetWorld;
let A: FleetHost;
let B: FleetHost;
let proxy: RegistryProxy;
let registry: RegistryClient;
/** A's daemon reaches the registry through the proxy. */
let startA: () => Promise<unknown>;

before(async () => {
  fw = await fleet();
  [A, B] = fw.hosts as [FleetHost, FleetHost];
  await fixtureOnEveryHost(fw.hosts, IMAGE);
  const base = fw.fleet.registry; // <host:port>/fleet-<id>
  const slash = base.indexOf('/');
  proxy = await RegistryProxy.start(base.slice(0, slash));
  registry = new RegistryClient({ base, credentials: [] });
  startA = () => A.restart({ OCI_REGISTRY: `${proxy.hostPort}${base.slice(slash)}` });
  await A.daemon.stop();
  await startA();
});

after(async () => {
  await proxy?.stop();
});

const read = (name: string) => fw.core.readNamespacedPod({ namespace: fw.namespace, name });

async function create(
  name: string,
  host: FleetHost,
  extra: Record<string, string> = {},
  vmName = `vk-${name}`,
): Promise<void> {
  await fw.core.createNamespacedPod({
    namespace: fw.namespace,
    body: vmPod(name, host.name, {
      'vm.cocoonstack.io/name': vmName,
      'cocoonset.cocoonstack.io/image': IMAGE,
      'cocoonset.cocoonstack.io/managed': 'true',
      ...extra,
    }),
  });
}

const waitReady = (name: string, timeoutMs = 90_000): Promise<V1Pod> =>
  waitForPod(fw.core, fw.namespace, name, 'ready', (p) => lifecycle(p) === 'ready' && isReady(p), timeoutMs);

async function snapshotNames(h: FleetHost): Promise<string[]> {
  const out = (await h.simulator.run(['snapshot', 'list', '-o', 'json'])).stdout;
  if (out.startsWith('No snapshots found')) return [];
  return (JSON.parse(out) as { name: string }[]).map((s) => s.name);
}

async function metric(h: FleetHost, line: RegExp): Promise<number> {
  const text = await (await fetch(`http://${h.ip}:${h.daemon.metricsPort}/metrics`)).text();
  const m = text.split('\n').find((l) => line.test(l));
  return m ? Number(m.split(' ').at(-1)) : 0;
}

const latest = (vmName: string) => readSnapshotIdentity(registry, vmName, 'latest');

/** Deletes the pod with the registry down: it must be gone by its deletion timestamp. */
async function deleteDuringOutage(name: string): Promise<void> {
  await fw.core.deleteNamespacedPod({ namespace: fw.namespace, name, gracePeriodSeconds: GRACE_SECONDS });
  const ts = (await read(name).catch(() => undefined))?.metadata?.deletionTimestamp;
  const deadline = ts ? new Date(ts).getTime() : Date.now();
  await waitForPodGone(fw.core, fw.namespace, name, (GRACE_SECONDS + 30) * 1000);
  // waitForPodGone polls: a second of slack for its period.
  const late = Date.now() - deadline;
  assert.ok(late <= 1500, `the pod went ${late} ms after its grace period ended`);
}

/** A ready pod on A deleted during an outage, then A's daemon stopped and the registry back:
 * the push is pending in A's ledger. */
async function deferredThenStopped(name: string): Promise<void> {
  await create(name, A, POLICY);
  await waitReady(name);
  await proxy.down();
  try {
    await deleteDuringOutage(name);
    await A.daemon.stop();
  } finally {
    await proxy.up();
  }
}

test('the registry down at delete: the pod goes within its grace period, the state is pushed when the registry returns', async () => {
  const name = 'out-0';
  const vm = `vk-${name}`;
  await create(name, A, POLICY);
  await waitReady(name);
  await A.simulator.diskWrite(vm, 'marker-out-0');
  await proxy.down();
  try {
    await deleteDuringOutage(name);
    assert.ok((await snapshotNames(A)).includes(vm), 'the state is kept as a local snapshot');
    assert.equal(await metric(A, /^cocoon_vk_snapshot_deferred_pushes /), 1);
    assert.equal(await latest(vm), 'absent');
  } finally {
    await proxy.up();
  }
  // First retry 5 s after the delete, then doubling: well inside a minute.
  await waitFor(`${vm}:latest pushed`, async () => (await latest(vm)) !== 'absent', 90_000, 500);
  const id = await latest(vm);
  assert.ok(id !== 'absent' && id.namespace === fw.namespace, 'stamped with the owner namespace');
  await waitFor('the local copy removed', async () => !(await snapshotNames(A)).includes(vm), 30_000, 250);
  assert.equal(await metric(A, /^cocoon_vk_snapshot_deferred_pushes /), 0);
  assert.equal(await metric(A, /^cocoon_vk_snapshot_deferred_push_total\{result="pushed"\}/), 1);
  // The pushed state is the guest's: B clones a new VM from it with the marker intact.
  await create('out-0-check', B, { 'cocoonset.cocoonstack.io/image': vm }, 'vk-out-0-check');
  await waitReady('out-0-check');
  assert.equal(await B.simulator.diskRead('vk-out-0-check'), 'marker-out-0');
});

test('across a restart: the pending push survives the daemon and lands at its start', async () => {
  const name = 'out-1';
  const vm = `vk-${name}`;
  await deferredThenStopped(name);
  assert.equal(await latest(vm), 'absent', 'nothing pushed while the daemon was down');
  await startA();
  await waitFor(
    `${vm}:latest pushed after the restart`,
    async () => (await latest(vm)) !== 'absent',
    60_000,
    500,
  );
  await waitFor('the local copy removed', async () => !(await snapshotNames(A)).includes(vm), 30_000, 250);
});

test('not pushed when the identity was recreated on another host and woke there meanwhile', async () => {
  const name = 'out-2';
  const vm = `vk-${name}`;
  await deferredThenStopped(name);
  // The identity lives on on B: recreated, hibernated (B pushes <vm>:hibernate), woken.
  await create(name, B);
  await waitReady(name);
  await annotate(fw.core, fw.namespace, name, { [HIBERNATE]: 'true' });
  await waitForPod(fw.core, fw.namespace, name, 'hibernated', (p) => lifecycle(p) === 'hibernated', 120_000);
  await annotate(fw.core, fw.namespace, name, { [HIBERNATE]: 'false' });
  await waitReady(name);
  await startA();
  await waitFor(
    "A's deferred push dropped",
    async () => (await metric(A, /^cocoon_vk_snapshot_deferred_push_total\{result="dropped"\}/)) === 1,
    60_000,
    500,
  );
  assert.equal(await latest(vm), 'absent', 'no :latest written over the newer state');
  assert.ok(!(await snapshotNames(A)).includes(vm), "A's obsolete copy is removed");
  const events = await fw.core.listNamespacedEvent({
    namespace: fw.namespace,
    fieldSelector: `involvedObject.name=${name},reason=SnapshotPushDropped`,
  });
  assert.match(events.items[0]?.message ?? '', /rule push-newer-state/);
});
