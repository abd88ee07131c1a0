// The cocoon provider's UpdatePod and DeletePod, in process (fake Kubernetes client, fake
// cocoon runner, real lease file): generation echo, stale copies (R6), annotations that stop
// decoding, `managed` turned off, unmanaged pods re-pointed, a local hibernate; and what a
// delete removes (docs/decisions.md: "Lifecycle", "VM ownership", "Create failures").
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { NotFoundError } from '../../../src/pods/ports.ts';
import type { FakeVm } from '../fakes/cocoon.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/update-delete', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const OBSERVED = 'vm.cocoonstack.io/lifecycle-observed-generation';
  const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
  const GENERATION = 'cocoonset.cocoonstack.io/generation';
  const VM_ID = 'vm.cocoonstack.io/id';
  const VM_IP = 'vm.cocoonstack.io/ip';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));

  /** The pod as the API holds it after every patch the provider sent. */
  function apiCopy(hh: Harness, pod: V1Pod, rv: string, changes: Record<string, string | null> = {}): V1Pod {
    return withAnnotations(pod, { ...Object.assign({}, ...hh.patches(pod.metadata!.name!)), ...changes }, rv);
  }

  /** Lets queued reconciles and publications run. */
  async function settle(ms = 30): Promise<void> {
    await new Promise((r) => setTimeout(r, ms));
  }

  /** A managed clone pod brought to `ready` (DHCP lease written once the VM exists). */
  async function readyPod(
    hh: Harness,
    name: string,
    extra: Record<string, string> = {},
    ip = '10.0.0.7',
  ): Promise<{ pod: V1Pod; vm: FakeVm }> {
    if (!hh.cocoon.snapshots.has('acme/agent')) hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name, extra);
    await hh.provider.createPod(pod);
    await until(`${name} bound`, () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`)!;
    hh.lease(vm.nics[0]!.mac, ip);
    await until(`${name} ready`, () => states(hh, name).includes('ready'));
    await settle();
    return { pod, vm };
  }

  describe('UpdatePod', () => {
    test('a generation bump on a ready pod is echoed with one patch: ready at the new observed generation', async () => {
      h = harness();
      const { pod } = await readyPod(h, 'gen-0');
      const before = h.patches('gen-0').length;
      await h.provider.updatePod(apiCopy(h, pod, '900000', { [GENERATION]: '3' }));
      await settle();
      const added = h.patches('gen-0').slice(before);
      assert.equal(added.length, 1, JSON.stringify(added));
      assert.equal(added[0]![STATE], 'ready');
      assert.equal(added[0]![OBSERVED], '3');
      assert.equal(added[0]![VM_IP], '10.0.0.7');
      // The same generation again (our echo coming back) writes nothing.
      await h.provider.updatePod(apiCopy(h, pod, '900001', { [GENERATION]: '3' }));
      await settle();
      assert.equal(h.patches('gen-0').length, before + 1);
    });

    test('a stale copy (older than our last write) is not re-asserted; a newer copy that lost the lifecycle annotations is', async () => {
      h = harness();
      const { pod } = await readyPod(h, 'stale-0');
      const before = h.patches('stale-0').length;
      const lost = { [STATE]: null, [OBSERVED]: null };
      // Watch lag: a copy from before our own writes (resourceVersion 2 < the patch's 10xx).
      await h.provider.updatePod(apiCopy(h, pod, '2', lost));
      await settle();
      assert.equal(h.patches('stale-0').length, before, 'watch lag is not re-asserted');
      // Someone removed the annotations after our write: re-asserted.
      await h.provider.updatePod(apiCopy(h, pod, '900000', lost));
      await settle();
      const added = h.patches('stale-0').slice(before);
      assert.equal(added.length, 1, JSON.stringify(added));
      assert.equal(added[0]![STATE], 'ready');
      assert.equal(added[0]![OBSERVED], '0');
      // The tracked copy kept our annotations throughout.
      assert.equal(h.provider.getPod('ns', 'stale-0')?.metadata?.annotations?.[STATE], 'ready');
    });

    test('annotations that stop decoding on a pod with a VM: Warning UpdateInvalidAnnotations, the VM and the spec are kept', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'inv-0');
      const before = h.patches('inv-0').length;
      // An invalid OS together with a hibernate request: neither is applied.
      await h.provider.updatePod(
        apiCopy(h, pod, '900000', {
          'cocoonset.cocoonstack.io/os': 'beos',
          'vm.cocoonstack.io/hibernate': 'true',
        }),
      );
      await settle();
      const warn = h.events.filter((e) => e.reason === 'UpdateInvalidAnnotations');
      assert.equal(warn.length, 1);
      assert.equal(warn[0]!.type, 'Warning');
      assert.match(warn[0]!.message, /^update: invalid VM annotations: .*cocoonset\.cocoonstack\.io\/os/);
      assert.match(warn[0]!.message, /the VM is kept and the change is not applied/);
      assert.ok(h.cocoon.vms.has(vm.id), 'VM kept');
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      // The old spec still rules: hibernate was not seen, nothing was failed or re-published.
      assert.ok(!h.events.some((e) => e.reason === 'HibernateUnsupported'));
      assert.ok(!states(h, 'inv-0').includes('failed'));
      assert.equal(h.patches('inv-0').length, before);
    });

    test('managed turned off on a live pod: Warning ManagedFlagRemoved; the delete still removes the VM', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'unm-0');
      const off = apiCopy(h, pod, '900000', { 'cocoonset.cocoonstack.io/managed': 'false' });
      await h.provider.updatePod(off);
      await h.provider.updatePod(apiCopy(h, pod, '900001', { 'cocoonset.cocoonstack.io/managed': 'false' }));
      await settle();
      const warn = h.events.filter((e) => e.reason === 'ManagedFlagRemoved');
      assert.equal(warn.length, 1, 'once per VM');
      assert.equal(warn[0]!.type, 'Warning');
      assert.match(warn[0]!.message, new RegExp(`keeps managing VM ${vm.name} and removes it`));
      assert.ok(h.cocoon.vms.has(vm.id));
      await h.provider.deletePod(off);
      assert.deepEqual(
        h.cocoon.callsOf('vm rm').map((c) => c.argv),
        [['vm', 'rm', '--force', vm.id]],
      );
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.equal(h.provider.getPod('ns', 'unm-0'), undefined);
    });

    test('an unmanaged pod re-pointed to another VM ID is validated again', async () => {
      h = harness();
      const first = h.cocoon.addVm('hand-made-1');
      const second = h.cocoon.addVm('hand-made-2');
      const pod = clonePod('ext-0', {
        'cocoonset.cocoonstack.io/managed': 'false',
        [VM_ID]: first.id,
        [VM_IP]: '10.0.1.1',
      });
      await h.provider.createPod(pod);
      await until('ready', () => states(h!, 'ext-0').includes('ready'));
      assert.equal(h.cocoon.callsOf(`vm inspect ${first.id}`).length, 1);
      // Re-pointed to another VM on this node: inspected, accepted.
      await h.provider.updatePod(withAnnotations(pod, { [VM_ID]: second.id, [VM_IP]: '10.0.1.2' }, '900000'));
      await settle();
      assert.equal(h.cocoon.callsOf(`vm inspect ${second.id}`).length, 1);
      assert.ok(!states(h, 'ext-0').includes('failed'));
      assert.equal(h.provider.getPodStatus('ns', 'ext-0')?.podIP, '10.0.1.2');
      // Re-pointed to an ID no VM on this node has: failed, naming it.
      const unknown = 'Z'.repeat(26);
      await h.provider.updatePod(withAnnotations(pod, { [VM_ID]: unknown, [VM_IP]: '10.0.1.3' }, '900001'));
      await settle();
      assert.equal(h.cocoon.callsOf(`vm inspect ${unknown}`).length, 1);
      const failed = h.patches('ext-0').find((a) => a[STATE] === 'failed');
      assert.match(String(failed?.[MESSAGE]), new RegExp(`no VM with id ${unknown} exists on this node`));
      // Neither VM was touched.
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      assert.ok(h.cocoon.vms.has(first.id) && h.cocoon.vms.has(second.id));
    });

    test('hibernate on a ready pod without a registry: saved locally, the id cleared before the VM is removed, hibernated', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'hib-0');
      await h.provider.updatePod(apiCopy(h, pod, '900000', { 'vm.cocoonstack.io/hibernate': 'true' }));
      await until('hibernated', () => states(h!, 'hib-0').includes('hibernated'));
      assert.deepEqual(states(h, 'hib-0').slice(-2), ['hibernating', 'hibernated']);
      assert.deepEqual(
        h.cocoon.callsOf('snapshot save').map((c) => c.argv),
        [['snapshot', 'save', '--name', 'vk-hib-0', vm.id]],
      );
      assert.ok(!h.cocoon.vms.has(vm.id), 'VM removed');
      assert.ok(h.cocoon.snapshots.has('vk-hib-0'), 'local copy kept');
      const cleared = h.writes('hib-0').find((w) => w.annotations && w.annotations[VM_ID] === null);
      const rm = h.cocoon.callsOf('vm rm')[0]!;
      assert.ok(cleared && cleared.at < rm.at, 'the id is cleared before the VM is removed');
      const ev = h.events.find((e) => e.reason === 'Hibernated');
      assert.equal(ev?.type, 'Normal');
      assert.match(ev?.message ?? '', /saved locally/);
      assert.equal(h.provider.getPod('ns', 'hib-0')?.metadata?.annotations?.[VM_ID], undefined);
    });
  });

  describe('DeletePod', () => {
    test("removes the VM and the snapshots named after it, not the clone source's", async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'del-0');
      h.cocoon.snapshot('vk-del-0');
      h.cocoon.snapshot('fork-vk-del-0');
      h.cocoon.snapshot('vk-other');
      // vk-del-0 was saved by the daemon for this pod; fork-vk-del-0 was not (the ledger has
      // no entry for it: made by hand, a base image) and is never removed.
      await h.own('vk-del-0', pod);
      await h.provider.deletePod(apiCopy(h, pod, '900000'));
      assert.deepEqual(
        h.cocoon.callsOf('vm rm').map((c) => c.argv),
        [['vm', 'rm', '--force', vm.id]],
      );
      assert.deepEqual(
        h.cocoon.callsOf('snapshot rm').map((c) => c.argv.at(-1)),
        ['vk-del-0'],
      );
      assert.deepEqual([...h.cocoon.snapshots.keys()].sort(), ['acme/agent', 'fork-vk-del-0', 'vk-other']);
      assert.equal(h.ledger.snapshot('vk-del-0'), undefined);
      assert.equal(h.ledger.vm('vk-del-0'), undefined);
      assert.equal(h.cocoon.vms.size, 0);
      assert.equal(h.provider.getPod('ns', 'del-0'), undefined);
    });

    test('keep-snapshot-on-delete: "true" keeps the snapshots', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'keep-0', {
        'vm.cocoonstack.io/keep-snapshot-on-delete': 'true',
      });
      h.cocoon.snapshot('vk-keep-0');
      h.cocoon.snapshot('fork-vk-keep-0');
      await h.provider.deletePod(apiCopy(h, pod, '900000'));
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.equal(h.cocoon.callsOf('snapshot rm').length, 0);
      assert.ok(h.cocoon.snapshots.has('vk-keep-0') && h.cocoon.snapshots.has('fork-vk-keep-0'));
    });

    test('a pod that never held a VM removes nothing', async () => {
      h = harness();
      // A failed create (its snapshot does not exist)…
      const missing = clonePod('none-0', { 'cocoonset.cocoonstack.io/image': 'acme/absent' });
      await h.provider.createPod(missing);
      await until('failed', () => states(h!, 'none-0').includes('failed'));
      // …and a pod asking for a VM name another pod holds.
      const { vm } = await readyPod(h, 'holder-0');
      const dup = clonePod('dup-0', { 'vm.cocoonstack.io/name': 'vk-holder-0' });
      await h.provider.createPod(dup);
      await until('dup failed', () => states(h!, 'dup-0').includes('failed'));
      h.cocoon.snapshot('vk-holder-0');
      await h.provider.deletePod(missing);
      await h.provider.deletePod(dup);
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      assert.equal(h.cocoon.callsOf('snapshot rm').length, 0);
      assert.ok(h.cocoon.vms.has(vm.id) && h.cocoon.snapshots.has('vk-holder-0'));
      assert.equal(h.provider.getPod('ns', 'none-0'), undefined);
      assert.equal(h.provider.getPod('ns', 'dup-0'), undefined);
      assert.ok(h.provider.getPod('ns', 'holder-0'));
    });

    test('a failing vm rm keeps the pod and the VM (the delete throws and is retried)', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'rmfail-0');
      let broken = true;
      h.cocoon.on(/^vm rm /, (argv) => {
        if (broken) throw new CocoonCommandError(argv, 'cocoon vm rm: device busy', 'device busy', 1);
        h!.cocoon.vms.delete(argv.at(-1)!);
        return { stdout: '', stderr: '' };
      });
      const copy = apiCopy(h, pod, '900000');
      await assert.rejects(h.provider.deletePod(copy), new RegExp(`^Error: kept VM ${vm.id}: .*device busy`));
      assert.ok(h.cocoon.vms.has(vm.id));
      assert.ok(h.provider.getPod('ns', 'rmfail-0'), 'still tracked');
      assert.equal(h.cocoon.callsOf('snapshot rm').length, 0, 'snapshots only after a confirmed removal');
      broken = false;
      await h.provider.deletePod(copy);
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.equal(h.provider.getPod('ns', 'rmfail-0'), undefined);
    });

    test('"vm not found" on rm counts as removed', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'gone-0');
      h.cocoon.vms.delete(vm.id); // removed by hand meanwhile
      h.cocoon.snapshot('vk-gone-0');
      await h.own('vk-gone-0', pod);
      await h.provider.deletePod(apiCopy(h, pod, '900000'));
      assert.equal(h.cocoon.callsOf('vm rm').length, 1);
      assert.equal(h.provider.getPod('ns', 'gone-0'), undefined);
      assert.ok(!h.cocoon.snapshots.has('vk-gone-0'), 'and the rest of the delete ran');
    });

    test('an unknown pod is NotFoundError; a superseded incarnation is a no-op success', async () => {
      h = harness();
      await assert.rejects(h.provider.deletePod(clonePod('nobody-0')), NotFoundError);
      const { pod, vm } = await readyPod(h, 'inc-0');
      const older = { ...pod, metadata: { ...pod.metadata, uid: 'uid-an-older-incarnation' } };
      await h.provider.deletePod(older);
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      assert.ok(h.cocoon.vms.has(vm.id));
      assert.equal(h.provider.getPod('ns', 'inc-0')?.metadata?.uid, pod.metadata?.uid);
    });
  });
});
