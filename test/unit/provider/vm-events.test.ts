// VMs that die behind the daemon's back, in process (fake Kubernetes client, fake cocoon
// runner; docs/contracts/pod-to-vm.md "VM event watcher and eviction"): restart and its 30 s
// cooldown, eviction with a UID precondition, a failed eviction re-driven, a death while a
// hibernate is asked for. The stream itself and the simulator are in
// test/integration/vm-events.test.ts; the line reader in test/unit/cocoon/events.test.ts.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { FakeVm } from '../fakes/cocoon.ts';
import { FakeCocoon } from '../fakes/cocoon.ts';
import { apiError } from '../fakes/kube.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/vm-events', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const VM_ID = 'vm.cocoonstack.io/id';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const lastState = (hh: Harness, name: string) =>
    hh
      .patches(name)
      .flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []))
      .at(-1);

  async function readyPod(hh: Harness, name: string): Promise<{ pod: V1Pod; vm: FakeVm }> {
    if (!hh.cocoon.snapshots.has('acme/agent')) hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name);
    await hh.provider.createPod(pod);
    await until(`${name} bound`, () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`) as FakeVm;
    hh.lease(vm.nics[0]!.mac, `10.0.1.${hh.cocoon.vms.size}`);
    await until(`${name} ready`, () => lastState(hh, name) === 'ready');
    return { pod, vm };
  }

  const event = (kind: 'MODIFIED' | 'DELETED', vm: FakeVm, state = vm.state) => ({
    event: kind,
    vm: JSON.parse(FakeCocoon.json({ ...vm, state })),
  });

  const deletes = (hh: Harness) => hh.kube.core.callsOf('deleteNamespacedPod');

  describe('VM deaths', () => {
    test('gone behind our back: evicted VMGone with a UID precondition; status Failed', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'g-0');
      h.cocoon.vms.delete(vm.id);
      h.provider.vmEvent(event('DELETED', vm));
      await until('evicted', () => h!.provider.getPod('ns', 'g-0') === undefined);
      const del = deletes(h);
      assert.equal(del.length, 1);
      assert.equal(del[0]!.params.body.preconditions.uid, pod.metadata?.uid);
      const last = h.statuses.filter((p) => p.metadata?.name === 'g-0').at(-1)!;
      assert.equal(last.status?.phase, 'Failed');
      const term = last.status?.containerStatuses?.[0]?.state?.terminated;
      assert.equal(term?.reason, 'VMGone');
      assert.equal(term?.exitCode, 1);
      assert.ok(h.events.some((e) => e.reason === 'Evicted' && e.message.startsWith('VMGone')));
    });

    test('stopped: restarted (vm start), the pod stays; dead again within 30 s: removed, evicted RestartCooldown', async () => {
      h = harness();
      const { vm } = await readyPod(h, 's-0');
      vm.state = 'stopped (stale)';
      h.provider.vmEvent(event('MODIFIED', vm));
      await until('restarted', () => h!.cocoon.callsOf('vm start').length === 1);
      await until('running', () => vm.state === 'running');
      assert.ok(h.provider.getPod('ns', 's-0'), 'same pod');
      assert.equal(deletes(h).length, 0);
      assert.ok(h.events.some((e) => e.reason === 'VMRestarted'));
      vm.state = 'stopped (stale)';
      h.provider.vmEvent(event('MODIFIED', vm));
      await until('evicted', () => h!.provider.getPod('ns', 's-0') === undefined);
      assert.deepEqual(h.cocoon.callsOf('vm rm').at(-1)!.argv, ['vm', 'rm', '--force', vm.id]);
      const term = h.statuses.filter((p) => p.metadata?.name === 's-0').at(-1)!.status?.containerStatuses?.[0]
        ?.state?.terminated;
      assert.equal(term?.reason, 'RestartCooldown');
    });

    test('a start that fails: removed, evicted RestartFailed', async () => {
      h = harness();
      const { vm } = await readyPod(h, 'f-0');
      h.cocoon.on(/^vm start /, (argv) => {
        throw new (class extends Error {})(`cocoon ${argv.join(' ')}: start failed`);
      });
      vm.state = 'error';
      h.provider.vmEvent(event('MODIFIED', vm));
      await until('evicted', () => h!.provider.getPod('ns', 'f-0') === undefined);
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.ok(h.events.some((e) => e.reason === 'Evicted' && e.message.startsWith('RestartFailed')));
    });

    test('running (a false alarm) and ADDED events change nothing', async () => {
      h = harness();
      const { vm } = await readyPod(h, 'n-0');
      h.provider.vmEvent(event('MODIFIED', vm, 'stopped'));
      h.provider.vmEvent({
        event: 'ADDED',
        vm: JSON.parse(FakeCocoon.json({ ...vm, state: 'stopped' })),
      } as never);
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(h.cocoon.callsOf('vm start').length, 0);
      assert.equal(deletes(h).length, 0);
    });

    test('a failed eviction keeps the pod and its VM record, and is re-driven until it lands', async () => {
      h = harness();
      const { pod, vm } = await readyPod(h, 'e-0');
      let refuse = true;
      h.kube.core.on('deleteNamespacedPod', () => {
        if (refuse) throw apiError(500, 'etcd unavailable');
        return {};
      });
      h.cocoon.vms.delete(vm.id);
      h.provider.vmEvent(event('DELETED', vm));
      await until('two attempts', () => deletes(h!).length === 2);
      await new Promise((r) => setTimeout(r, 20));
      assert.ok(h.provider.getPod('ns', 'e-0'), 'the pod is kept');
      refuse = false;
      // The next update (or tick) re-drives the eviction.
      await h.provider.updatePod(withAnnotations(pod, Object.assign({}, ...h.patches('e-0')), '990000'));
      await until('evicted', () => h!.provider.getPod('ns', 'e-0') === undefined, 5000);
    });

    test('hibernate asked for and the VM gone: no restart, no eviction; hibernated when the registry has it', async () => {
      let store: FakeStore | undefined;
      h = harness({
        store: (c) => {
          store = new FakeStore(c);
          return store;
        },
      });
      const { pod, vm } = await readyPod(h, 'hg-0');
      store!.refusePush = true;
      await h.provider.updatePod(
        withAnnotations(
          pod,
          { ...Object.assign({}, ...h.patches('hg-0')), 'vm.cocoonstack.io/hibernate': 'true' },
          '990001',
        ),
      );
      await until('failed', () => lastState(h!, 'hg-0') === 'failed');
      // The snapshot made it after all (another attempt pushed it), then the VM vanished.
      store!.tags.set('vk-hg-0:hibernate', {
        digest: 'sha256:1',
        snapshotId: 's',
        baseImage: 'acme/agent',
        fromNode: '',
      });
      h.cocoon.vms.delete(vm.id);
      h.provider.vmEvent(event('DELETED', vm));
      await until('hibernated', () => lastState(h!, 'hg-0') === 'hibernated', 5000);
      assert.equal(deletes(h).length, 0);
      assert.equal(h.cocoon.callsOf('vm start').length, 0);
    });
  });
});
