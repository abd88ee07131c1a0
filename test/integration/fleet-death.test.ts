// Hosts that die (docs/contracts/pod-to-vm.md, "When a host dies"), on a fleet of three hosts and
// a private ground whose nodes die fast (16 s node-monitor grace, 5 s default tolerations):
//  - (1) host A dies whole (daemon and VMs): its node goes Unknown and is tainted; the operator's
//    pod (it tolerates unreachable forever) stays, a pod with the default 5 s is evicted; the
//    admin force-deletes the operator's pod and its replacement on C wakes from the registry
//    state (A's peer server is gone) with the guest marker; when A comes back its copy is
//    removed without a push and never started;
//  - (2) only B's daemon dies (VMs run on): the evictable pod is evicted by the taint, its VM
//    survives the returning daemon's delete and the replacement of its identity adopts it in
//    place (same VM ID, same disk); the operator's pod on B is adopted as it was;
//  - no pod of C changes meanwhile;
//  - a host killed in the middle of a migration (state pushed, old VM not yet removed) converges
//    to one VM: the replacement on B wakes from the pushed state, A's copy goes without a push.
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import type { V1Pod, V1Toleration } from '@kubernetes/client-node';
import { type FleetHost, type FleetWorld, fixtureOnEveryHost, useFleet } from '../../ground/fleet.ts';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { parseReference } from '../../src/registry/reference.ts';
import { annotate, isReady, lifecycle, vmIdOf } from './helpers.ts';

const HIBERNATE = 'vm.cocoonstack.io/hibernate';
const RESTORE = 'vm.cocoonstack.io/restore-from-hibernate';
const IMAGE = 'acme/death-agent';
/** What cocoon-operator writes on its pods: they ride out a node that stops answering. */
const FOREVER: V1Toleration[] = [
  { key: 'node.kubernetes.io/unreachable', operator: 'Exists', effect: 'NoExecute' },
  { key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute' },
];
const fleet = useFleet({ hosts: 3, ground: { fastNodeDeath: true } });
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

async function create(
  name: string,
  host: FleetHost,
  o: { operator?: boolean; annotations?: Record<string, string> } = {},
): Promise<void> {
  const pod = vmPod(name, host.name, {
    'vm.cocoonstack.io/name': `vk-${name}`,
    'cocoonset.cocoonstack.io/image': IMAGE,
    'cocoonset.cocoonstack.io/managed': 'true',
    ...o.annotations,
  });
  if (o.operator) pod.spec?.tolerations?.push(...FOREVER);
  await fw.core.createNamespacedPod({ namespace: fw.namespace, body: pod });
}

const waitReady = (name: string, timeoutMs = 90_000): Promise<V1Pod> =>
  waitForPod(fw.core, fw.namespace, name, 'ready', (p) => lifecycle(p) === 'ready' && isReady(p), timeoutMs);

async function hibernateDigest(vmName: string): Promise<string> {
  const head = await registry.headManifest(registry.repository(vmName), parseReference('hibernate'));
  return head === 'absent' ? '' : head.digest;
}

async function vms(h: FleetHost): Promise<Map<string, string>> {
  const out = (await h.simulator.run(['vm', 'list', '-o', 'json'])).stdout;
  if (out.startsWith('No VMs found')) return new Map();
  return new Map(
    (JSON.parse(out) as { id: string; config: { name: string } }[]).map((v) => [v.config.name, v.id]),
  );
}

const cmdsSince = (h: FleetHost, mark: number) =>
  h.simulator
    .calls()
    .slice(mark)
    .map((c) => c.argv.join(' '));

async function forceDelete(name: string): Promise<void> {
  await fw.core.deleteNamespacedPod({ namespace: fw.namespace, name, gracePeriodSeconds: 0 });
  await waitForPodGone(fw.core, fw.namespace, name, 30_000);
}

async function nodeUnreachable(h: FleetHost): Promise<boolean> {
  const node = await fw.core.readNode({ name: h.name });
  const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
  return (
    ready?.status === 'Unknown' &&
    (node.spec?.taints ?? []).some((t) => t.key === 'node.kubernetes.io/unreachable')
  );
}

const evicted = (p: V1Pod) =>
  p.metadata?.deletionTimestamp !== undefined &&
  (p.status?.conditions ?? []).some(
    (c) => c.type === 'DisruptionTarget' && c.reason === 'DeletionByTaintManager',
  );

async function reasons(name: string): Promise<string[]> {
  const list = await fw.core.listNamespacedEvent({
    namespace: fw.namespace,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => e.reason ?? '');
}

describe('a host that dies', () => {
  test('(1) A dies whole, (2) only B’s daemon dies; replacements wake, VMs are adopted in place, C is untouched', {
    timeout: 300_000,
  }, async () => {
    // Before: an operator pod woken once on A (its hibernated state stays in the registry), an
    // evictable pod on A, the same two kinds on B, one pod on C.
    await create('a-op', A, { operator: true });
    await create('a-ev', A);
    await create('b-op', B, { operator: true });
    await create('b-ev', B);
    await create('c-0', C);
    await Promise.all(['a-op', 'a-ev', 'b-op', 'b-ev', 'c-0'].map((n) => waitReady(n)));
    await A.simulator.diskWrite('vk-a-op', 'a-op-state');
    await annotate(fw.core, fw.namespace, 'a-op', { [HIBERNATE]: 'true' });
    await waitFor(
      'a-op hibernated with its state pushed',
      async () => lifecycle(await read('a-op')) === 'hibernated' && (await hibernateDigest('vk-a-op')) !== '',
      120_000,
      250,
    );
    const stateDigest = await hibernateDigest('vk-a-op');
    await annotate(fw.core, fw.namespace, 'a-op', { [HIBERNATE]: null });
    await waitReady('a-op');
    await B.simulator.diskWrite('vk-b-ev', 'b-ev-state');
    const bVms = await vms(B);
    const before = await read('c-0');

    // A dies whole; only B's daemon dies.
    await Promise.all([A.killHost(), B.kill()]);
    await waitFor(
      'A and B unreachable and tainted',
      async () => (await nodeUnreachable(A)) && (await nodeUnreachable(B)),
      60_000,
      500,
    );
    await waitFor(
      'a-ev and b-ev evicted by the taint',
      async () => evicted(await read('a-ev')) && evicted(await read('b-ev')),
      30_000,
      250,
    );
    for (const name of ['a-op', 'b-op']) {
      const p = await read(name);
      assert.equal(
        p.metadata?.deletionTimestamp,
        undefined,
        `${name} tolerates the unreachable node forever`,
      );
    }

    // (1) The admin force-deletes the operator's pod on the dead host; its replacement goes to C
    // and wakes from the registry (A's peer server is gone).
    await forceDelete('a-op');
    const markC = C.simulator.calls().length;
    await create('a-op', C, { operator: true, annotations: { [RESTORE]: 'true' } });
    await waitReady('a-op');
    assert.equal(await C.simulator.diskRead('vk-a-op'), 'a-op-state');
    assert.ok(
      cmdsSince(C, markC).includes('snapshot import --name vk-a-op-hibernate-import'),
      'C woke it from the registry',
    );

    // (2) B's daemon comes back: the evicted pod's delete keeps its VM, the replacement adopts it.
    await B.restart();
    await waitForPodGone(fw.core, fw.namespace, 'b-ev', 60_000);
    assert.ok((await reasons('b-ev')).includes('VMKeptAfterEviction'));
    assert.equal((await vms(B)).get('vk-b-ev'), bVms.get('vk-b-ev'), 'the VM survives its pod');
    const markB = B.simulator.calls().length;
    await create('b-ev', B);
    const adopted = await waitReady('b-ev');
    assert.equal(vmIdOf(adopted), bVms.get('vk-b-ev'), 'adopted in place');
    assert.equal(await B.simulator.diskRead('vk-b-ev'), 'b-ev-state');
    assert.ok(!cmdsSince(B, markB).some((c) => c.startsWith('vm clone')), 'no new VM');
    assert.equal(vmIdOf(await waitReady('b-op')), bVms.get('vk-b-op'), 'the operator pod keeps its VM');

    // A comes back: the operator pod's copy (its identity runs on C) is removed without a push
    // and never started; the evicted pod's VM is kept for a replacement on A.
    const aVms = await vms(A);
    const markA = A.simulator.calls().length;
    await A.restart();
    await waitForPodGone(fw.core, fw.namespace, 'a-ev', 60_000);
    await waitFor(
      'A removed its stale copy of vk-a-op',
      async () => !(await vms(A)).has('vk-a-op'),
      30_000,
      250,
    );
    const aCmds = cmdsSince(A, markA);
    assert.ok(aCmds.includes(`vm rm --force ${aVms.get('vk-a-op')}`), aCmds.join(' | '));
    for (const verb of ['vm start', 'snapshot save', 'snapshot export'])
      assert.ok(!aCmds.some((c) => c.startsWith(verb)), `A ran no ${verb}: ${aCmds.join(' | ')}`);
    assert.equal(await hibernateDigest('vk-a-op'), stateDigest, 'no push over the state');
    assert.equal((await vms(A)).get('vk-a-ev'), aVms.get('vk-a-ev'), 'the evicted pod’s VM is kept');
    assert.ok((await reasons('a-ev')).includes('VMKeptAfterEviction'));
    assert.equal((await vms(C)).get('vk-a-op'), vmIdOf(await read('a-op')), 'one VM of a-op, on C');

    // C's own pod did not change at all.
    const after = await read('c-0');
    assert.equal(after.metadata?.resourceVersion, before.metadata?.resourceVersion);
    assert.equal(vmIdOf(after), vmIdOf(before));
    await Promise.all(['a-op', 'b-op', 'b-ev', 'c-0'].map((name) => forceDelete(name)));
  });

  test('a host killed in the middle of a migration converges to one VM', { timeout: 180_000 }, async () => {
    const name = 'mig-k';
    const vm = `vk-${name}`;
    await create(name, A, { operator: true });
    await waitReady(name);
    await A.simulator.diskWrite(vm, 'before-the-crash');
    // The hibernate on A pushes its state, then hangs removing the VM; the host dies there.
    await A.simulator.mergeKnobs({ faults: [{ argvRegex: '^vm rm ', match: `^${vm}$`, hang: true }] });
    await annotate(fw.core, fw.namespace, name, { [HIBERNATE]: 'true' });
    // The push comes before the removal (the VM goes only once its state is in the registry).
    await waitFor(`${vm}:hibernate pushed`, async () => (await hibernateDigest(vm)) !== '', 60_000, 250);
    await A.killHost();
    await A.simulator.mergeKnobs({ faults: null });
    const stateDigest = await hibernateDigest(vm);

    // The operator (here the test) gives up on A: force-delete, recreate on B with the restore.
    await forceDelete(name);
    await create(name, B, { operator: true, annotations: { [RESTORE]: 'true' } });
    const woken = await waitReady(name);
    assert.equal(await B.simulator.diskRead(vm), 'before-the-crash');

    const markA = A.simulator.calls().length;
    const stale = (await vms(A)).get(vm);
    assert.ok(stale, 'A still holds its copy while it is down');
    await A.restart();
    await waitFor(`A removed its copy of ${vm}`, async () => !(await vms(A)).has(vm), 30_000, 250);
    const aCmds = cmdsSince(A, markA);
    assert.ok(aCmds.includes(`vm rm --force ${stale}`), aCmds.join(' | '));
    assert.ok(
      !aCmds.some((c) => c.startsWith('vm start') || c.startsWith('snapshot save')),
      aCmds.join(' | '),
    );
    assert.equal(await hibernateDigest(vm), stateDigest, 'no push over the state');
    assert.equal((await vms(B)).get(vm), vmIdOf(woken), 'one VM, on B');
    assert.equal((await vms(C)).has(vm), false);
    await forceDelete(name);
  });
});
