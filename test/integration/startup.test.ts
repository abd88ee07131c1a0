// Startup reconcile (pod-to-vm.md §6): runs before the node takes work; adopts VMs by ID
// and by name, applies the orphan policy, and indexes kept orphans for adoption by the next
// CreatePod with that VM name.
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { cliCalls, fixture, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;

const annotations = (vm: string) => ({
  'vm.cocoonstack.io/name': vm,
  'cocoonset.cocoonstack.io/image': 'acme/agent',
  'cocoonset.cocoonstack.io/managed': 'true',
});

async function simVmNames(): Promise<string[]> {
  const out = (await w.sim(['vm', 'list', '-o', 'json'])).trim();
  return out.startsWith('[')
    ? (JSON.parse(out) as { config: { name: string } }[]).map((v) => v.config.name)
    : [];
}

async function cloneByHand(name: string): Promise<string> {
  const out = await w.sim(['vm', 'clone', '--output', 'json', '--name', name, '--pull', 'acme/agent']);
  return (JSON.parse(out) as { id: string }).id;
}

/** Clone invocations for a VM name (the hand-made clone counts as one). */
const clones = (vm: string) => cliCalls(w).filter((c) => c.argv[1] === 'clone' && c.argv.includes(vm)).length;

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.split(' ')[1]) : 0;
}

before(async () => {
  w = await world();
  await fixture(w, 'acme/agent', 'linux');
});

test('orphan policy destroy (default) removes unclaimed VMs; a pod without an id is adopted by VM name', async () => {
  const orphanId = await cloneByHand('vk-st-orphan-1');
  const adoptId = await cloneByHand('vk-st-adopt-1');
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod('adopt-1', w.nodeName, annotations('vk-st-adopt-1')),
  });
  const clonesBefore = clones('vk-st-adopt-1');
  await w.restart();
  const p = await waitForPod(w.core, w.namespace, 'adopt-1', 'ready', (x) => lifecycle(x) === 'ready');
  assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'], adoptId, 'adopted the existing VM');
  assert.equal(clones('vk-st-adopt-1'), clonesBefore, 'no second clone');
  const names = await simVmNames();
  assert.ok(!names.includes('vk-st-orphan-1'), 'orphan destroyed');
  assert.ok(cliCalls(w).some((c) => c.argv.join(' ') === `vm rm --force ${orphanId}`));
  assert.equal(await metric('cocoon_vk_reconcile_adopt_by_name_total'), 1);
});

test('orphan policy alert keeps and counts the VM; the next CreatePod with its name adopts it', async () => {
  await w.daemon.kill();
  const orphanId = await cloneByHand('vk-st-orphan-2');
  await w.restart({ VK_ORPHAN_POLICY: 'alert' });
  assert.ok((await simVmNames()).includes('vk-st-orphan-2'), 'kept');
  assert.equal(await metric('cocoon_vk_orphan_vm_total'), 1);
  const clonesBefore = clones('vk-st-orphan-2');
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod('adopt-2', w.nodeName, annotations('vk-st-orphan-2')),
  });
  const p = await waitForPod(w.core, w.namespace, 'adopt-2', 'ready', (x) => lifecycle(x) === 'ready');
  assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'], orphanId);
  assert.equal(clones('vk-st-orphan-2'), clonesBefore, 'adopted, not cloned');
});

test('orphan policy keep keeps the VM silently; a ready pod survives the restart with its VM', async () => {
  await w.daemon.kill();
  await cloneByHand('vk-st-orphan-3');
  await w.restart({ VK_ORPHAN_POLICY: 'keep' });
  assert.ok((await simVmNames()).includes('vk-st-orphan-3'));
  assert.equal(await metric('cocoon_vk_orphan_vm_total'), 0);
  const p = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'adopt-1' });
  assert.equal(lifecycle(p), 'ready');
});
