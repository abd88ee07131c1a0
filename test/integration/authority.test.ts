// VM authority (docs/security.md): two tenants on one node, each attack of a pod author
// against the other tenant or the host tried through the real apiserver and the simulator,
// and the legitimate flows (hibernate, wake, rebuild under the same name, restart) still
// working. No registry here: the local-snapshot paths (the registry's are unit-tested and in
// the hibernate integration files).
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { newNamespace, vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { annotate, cliCalls, fixture, lifecycle, managedAnnotations } from './helpers.ts';

const world = useWorld();
let w: World;
let nsA: string;
let nsB: string;

const MANAGED = managedAnnotations;
const create = (name: string, ns: string, annotations: Record<string, string>) =>
  w.core.createNamespacedPod({ namespace: ns, body: vmPod(name, w.nodeName, annotations) });
const message = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
const vmId = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
const waitState = (name: string, ns: string, state: string, timeoutMs = 60_000) =>
  waitForPod(w.core, ns, name, `lifecycle ${state}`, (p) => lifecycle(p) === state, timeoutMs);

async function vmNames(): Promise<Map<string, string>> {
  const out = (await w.sim(['vm', 'list', '-o', 'json'])).trim();
  const list = out.startsWith('[') ? (JSON.parse(out) as { id: string; config: { name: string } }[]) : [];
  return new Map(list.map((v) => [v.config.name, v.id]));
}
async function snapshotNames(): Promise<string[]> {
  const out = (await w.sim(['snapshot', 'list', '-o', 'json'])).trim();
  return out.startsWith('[') ? (JSON.parse(out) as { name: string }[]).map((s) => s.name) : [];
}

before(async () => {
  w = await world();
  await fixture(w, 'acme/agent', 'linux');
  // A shared base image whose name is also a valid VM name.
  await fixture(w, 'golden', 'linux');
  // Base images are on the host before the daemon starts (its snapshot index is listed then).
  await w.daemon.kill();
  await w.restart();
  nsA = await newNamespace(w.core, 'tenant-a');
  nsB = await newNamespace(w.core, 'tenant-b');
  await create('main-0', nsA, MANAGED('vk-a-main'));
  await create('hib-0', nsA, MANAGED('vk-a-hib'));
  await waitState('main-0', nsA, 'ready');
  await waitState('hib-0', nsA, 'ready');
  await annotate(w.core, nsA, 'hib-0', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitState('hib-0', nsA, 'hibernated');
});

test('takeover by name: tenant B naming tenant A`s VM, a base image or a reserved shape is refused', async () => {
  const before = await vmNames();
  await create('steal-vm', nsB, MANAGED('vk-a-main'));
  await create('steal-hib', nsB, MANAGED('vk-a-hib'));
  await create('poison-base', nsB, MANAGED('golden'));
  await create('poison-fork', nsB, MANAGED('fork-vk-a-main'));
  await create('poison-import', nsB, MANAGED('vk-a-hib-hibernate-import'));
  const expect: [string, RegExp][] = [
    ['steal-vm', /already used by pod|rule name-owned/],
    ['steal-hib', /already used by pod|rule name-owned/],
    ['poison-base', /rule name-unowned/],
    ['poison-fork', /rule reserved-name/],
    ['poison-import', /rule reserved-name/],
  ];
  for (const [name, re] of expect) {
    const p = await waitState(name, nsB, 'failed');
    assert.match(message(p), re, name);
    assert.equal(vmId(p), '', `${name} bound nothing`);
  }
  const after = await vmNames();
  assert.equal(after.get('vk-a-main'), before.get('vk-a-main'), "A's VM untouched");
  assert.ok((await snapshotNames()).includes('golden'), 'the base image is still there');
  assert.ok((await snapshotNames()).includes('vk-a-hib'), "A's hibernated state is still there");
  // Deleting the refused pods removes nothing of A's or the host's.
  for (const [name] of expect) await w.core.deleteNamespacedPod({ namespace: nsB, name });
  for (const [name] of expect) await waitForPodGone(w.core, nsB, name);
  assert.equal((await vmNames()).get('vk-a-main'), before.get('vk-a-main'));
  const snaps = await snapshotNames();
  assert.ok(snaps.includes('golden') && snaps.includes('vk-a-hib'));
});

test('cross-namespace clone by image name: tenant B cloning A`s hibernated snapshot is refused', async () => {
  const clones = cliCalls(w).filter((c) => c.argv[1] === 'clone').length;
  await create('copy-hib', nsB, MANAGED('vk-b-copy', 'vk-a-hib'));
  const p = await waitState('copy-hib', nsB, 'failed');
  assert.match(message(p), /rule source-foreign/);
  assert.equal(cliCalls(w).filter((c) => c.argv[1] === 'clone').length, clones, 'no clone ran');
  // The same image in A's own namespace is A's to use.
  await create('copy-own', nsA, MANAGED('vk-a-copy', 'vk-a-hib'));
  await waitState('copy-own', nsA, 'ready');
});

test('legitimate flows: A wakes its hibernated VM, rebuilds a pod under the same name and keeps its VM', async () => {
  await annotate(w.core, nsA, 'hib-0', { 'vm.cocoonstack.io/hibernate': null });
  const woken = await waitState('hib-0', nsA, 'ready');
  assert.ok(vmId(woken));
  // Rebuild: the pod is deleted with keep-snapshot-on-delete and recreated under the same
  // VM name in the same namespace (the same identity): it restores A's own state.
  await annotate(w.core, nsA, 'hib-0', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitState('hib-0', nsA, 'hibernated');
  await annotate(w.core, nsA, 'hib-0', { 'vm.cocoonstack.io/keep-snapshot-on-delete': 'true' });
  await w.core.deleteNamespacedPod({ namespace: nsA, name: 'hib-0' });
  await waitForPodGone(w.core, nsA, 'hib-0');
  assert.ok((await snapshotNames()).includes('vk-a-hib'), 'kept for the rebuild');
  await create(
    'hib-0',
    nsA,
    MANAGED('vk-a-hib', 'acme/agent', { 'vm.cocoonstack.io/restore-from-hibernate': 'true' }),
  );
  const rebuilt = await waitState('hib-0', nsA, 'ready');
  assert.ok(vmId(rebuilt));
});

test('restart with a ledger: every VM re-bound to its owner, none to another; a SIGKILL mid-create recovers', async () => {
  const main = await w.core.readNamespacedPod({ namespace: nsA, name: 'main-0' });
  // Tenant B pre-writes A's VM ID while the daemon is down: the startup adoption by ID is
  // decided by the ledger, not by the annotation.
  await w.daemon.kill();
  await create('steal-id', nsB, { ...MANAGED('vk-a-main'), 'vm.cocoonstack.io/id': vmId(main) });
  await w.restart();
  const stolen = await waitState('steal-id', nsB, 'failed');
  assert.match(message(stolen), /already used by pod|rule name-owned|rule adopt-foreign/);
  const again = await waitState('main-0', nsA, 'ready');
  assert.equal(vmId(again), vmId(main), "A's pod keeps its VM");
  // A create killed mid-clone: its own identity recovers the VM, with no second clone.
  await w.simulator.mergeKnobs({ latency: { 'vm clone': 3000 } });
  try {
    await create('mid-0', nsA, MANAGED('vk-a-mid'));
    // Killed while the clone's placeholder exists (the clone sleeps after reserving its name).
    const until = Date.now() + 30_000;
    while (!(await vmNames()).has('vk-a-mid')) {
      assert.ok(Date.now() < until, 'the clone never started');
      await new Promise((r) => setTimeout(r, 100));
    }
    await w.daemon.kill();
  } finally {
    await w.simulator.mergeKnobs({ latency: null });
  }
  await w.restart();
  const mid = await waitState('mid-0', nsA, 'ready', 90_000);
  assert.equal((await vmNames()).get('vk-a-mid'), vmId(mid), 'bound to the VM of its interrupted clone');
});

test('the Go-upgrade rule: a node without a ledger takes over the VMs its pods name by ID, one pod per VM; a hand-made VM stays unowned', async () => {
  const main = await w.core.readNamespacedPod({ namespace: nsA, name: 'main-0' });
  const out = await w.sim([
    'vm',
    'clone',
    '--output',
    'json',
    '--name',
    'vk-hand-upgrade',
    '--pull',
    'acme/agent',
  ]);
  const handId = (JSON.parse(out) as { id: string }).id;
  // (A VM two live pods name by ID stays unowned at an upgrade: tenant B's pre-written ID from
  // the previous test would make A's VM ambiguous, so that pod goes first.)
  await w.core.deleteNamespacedPod({ namespace: nsB, name: 'steal-id' });
  await waitForPodGone(w.core, nsB, 'steal-id');
  await w.daemon.kill();
  // A node upgraded from the Go daemon: no ledger file yet.
  rmSync(join(w.simRoot, 'vk-state', 'ledger.json'));
  await w.restart();
  const again = await waitState('main-0', nsA, 'ready');
  assert.equal(vmId(again), vmId(main), 'the VM its pod names by ID is taken over and re-bound');
  const vms = await vmNames();
  assert.equal(vms.get('vk-hand-upgrade'), handId, 'a VM no pod names is kept (never destroyed)');
  // Taken over, it is the pod's identity's: tenant B still cannot claim it.
  await create('steal-upgraded', nsB, MANAGED('vk-a-main'));
  assert.match(
    message(await waitState('steal-upgraded', nsB, 'failed')),
    /already used by pod|rule name-owned/,
  );
  // And unowned, the hand-made VM is refused to a managed pod naming it.
  await create('claim-hand', nsA, MANAGED('vk-hand-upgrade'));
  assert.match(message(await waitState('claim-hand', nsA, 'failed')), /rule adopt-unowned/);
});

test('a SIGKILL before and after the clone: the intent alone is dropped, a made VM is recovered by its own identity', async () => {
  // Before: the ledger intent is written, the clone not started (its source inspect held).
  await w.simulator.mergeKnobs({ latency: { 'snapshot inspect': 4000 } });
  try {
    await create('before-0', nsA, MANAGED('vk-a-before'));
    await new Promise((r) => setTimeout(r, 1500));
    await w.daemon.kill();
  } finally {
    await w.simulator.mergeKnobs({ latency: null });
  }
  assert.equal((await vmNames()).has('vk-a-before'), false, 'no VM made before the kill');
  await w.restart();
  const before = await waitState('before-0', nsA, 'ready', 90_000);
  assert.equal((await vmNames()).get('vk-a-before'), vmId(before));
  // After: the clone made the VM, the daemon dies in its settle inspect before confirming.
  await w.simulator.mergeKnobs({ quirks: { clonePidZero: true }, latency: { 'vm inspect': 4000 } });
  try {
    await create('after-0', nsA, MANAGED('vk-a-after'));
    const until = Date.now() + 30_000;
    while (!(await vmNames()).has('vk-a-after')) {
      assert.ok(Date.now() < until, 'the clone never ran');
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 500));
    await w.daemon.kill();
  } finally {
    await w.simulator.mergeKnobs({ quirks: { clonePidZero: false }, latency: null });
  }
  const made = (await vmNames()).get('vk-a-after');
  await w.restart();
  const after = await waitState('after-0', nsA, 'ready', 90_000);
  assert.equal(vmId(after), made, 'its own identity adopted the VM of the interrupted create');
  assert.equal(
    cliCalls(w).filter((c) => c.argv[1] === 'clone' && c.argv.includes('vk-a-after')).length,
    1,
    'never cloned twice',
  );
});
