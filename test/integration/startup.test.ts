// Startup reconcile (docs/contracts/pod-to-vm.md, "Startup reconcile"): runs before the node
// takes work; adopts VMs by ID and by name only as the provenance ledger allows, applies the
// orphan policy to what vk-cocoon made (a hand-made VM is never destroyed nor adopted), and
// indexes kept orphans for adoption by the next CreatePod of the same identity.
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

test('orphan policy destroy (default) removes only VMs vk-cocoon made; a hand-made VM is kept and never adopted by name', async () => {
  // A VM made on the host by hand is not vk-cocoon's (no provenance ledger entry): kept and
  // counted, and a managed pod naming it is refused, never bound to it (docs/security.md).
  const handId = await cloneByHand('vk-st-orphan-1');
  const namedId = await cloneByHand('vk-st-adopt-1');
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod('adopt-1', w.nodeName, annotations('vk-st-adopt-1')),
  });
  await w.restart();
  const p = await waitForPod(w.core, w.namespace, 'adopt-1', 'failed', (x) => lifecycle(x) === 'failed');
  assert.match(
    p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '',
    /rule adopt-unowned/,
  );
  assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '', '', 'not bound');
  const names = await simVmNames();
  assert.ok(names.includes('vk-st-orphan-1'), 'a hand-made orphan is kept under destroy');
  assert.ok(names.includes('vk-st-adopt-1'), 'the named hand-made VM is kept');
  assert.ok(!cliCalls(w).some((c) => c.argv.join(' ') === `vm rm --force ${handId}`));
  assert.ok(!cliCalls(w).some((c) => c.argv.join(' ') === `vm rm --force ${namedId}`));
  assert.equal(await metric('cocoon_vk_reconcile_adopt_by_name_total'), 0);
  // A VM vk-cocoon made whose pod went away while the daemon was down is its to destroy.
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod('made-1', w.nodeName, annotations('vk-st-made-1')),
  });
  const made = await waitForPod(w.core, w.namespace, 'made-1', 'ready', (x) => lifecycle(x) === 'ready');
  const madeId = made.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
  await w.daemon.kill();
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'made-1', gracePeriodSeconds: 0 });
  await w.restart();
  assert.ok(!(await simVmNames()).includes('vk-st-made-1'), 'its own orphan destroyed');
  assert.ok(cliCalls(w).some((c) => c.argv.join(' ') === `vm rm --force ${madeId}`));
  assert.ok((await simVmNames()).includes('vk-st-orphan-1'), 'the hand-made one still kept');
});

test('orphan policy alert keeps and counts the VM; its own pod adopts it back by name', async () => {
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod('adopt-2', w.nodeName, annotations('vk-st-orphan-2')),
  });
  const first = await waitForPod(w.core, w.namespace, 'adopt-2', 'ready', (x) => lifecycle(x) === 'ready');
  const orphanId = first.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
  await w.daemon.kill();
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'adopt-2', gracePeriodSeconds: 0 });
  await w.restart({ VK_ORPHAN_POLICY: 'alert' });
  assert.ok((await simVmNames()).includes('vk-st-orphan-2'), 'kept');
  assert.ok((await metric('cocoon_vk_orphan_vm_total')) >= 1);
  const clonesBefore = clones('vk-st-orphan-2');
  // The same identity (namespace, VM name, no controller) comes back: it adopts its VM.
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
  const p = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'adopt-2' });
  assert.equal(lifecycle(p), 'ready');
});
