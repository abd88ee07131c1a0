// Deferred delete-time pushes in process (fake Kubernetes client, fake cocoon runner, fake
// snapshot store; src/provider/cocoon/deferred-push.ts, ops/delete-snapshot.ts): a delete
// whose push fails or would outlast the grace period lets the pod go with the state kept
// locally; the schedule pushes it later, never over newer state, never losing it to the GC.
// The real registry, the simulator and a restart are in test/integration/hibernate-operator.test.ts.
import assert from 'node:assert/strict';
import { afterEach, describe, mock, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { ownerOf } from '../../../src/authority/owner.ts';
import { CocoonCommandError, POD_OP_QUEUE_MS } from '../../../src/cocoon/runner.ts';
import { noMetrics } from '../../../src/provider/cocoon/metrics.ts';
import type { FakeVm } from '../fakes/cocoon.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/deferred-push', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const VM_ID = 'vm.cocoonstack.io/id';

  let h: Harness | undefined;
  let store: FakeStore | undefined;
  afterEach(() => {
    mock.timers.reset();
    h?.close();
    h = undefined;
    store = undefined;
  });

  const deferred: string[] = [];
  function withStore(): Harness {
    return harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
      metrics: {
        ...noMetrics,
        deferredPush: (result, pending) => void deferred.push(`${result}:${pending}`),
      },
    });
  }

  const lastState = (hh: Harness, name: string) =>
    hh
      .patches(name)
      .flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []))
      .at(-1);

  async function readyPod(hh: Harness, name: string): Promise<{ pod: V1Pod; vm: FakeVm }> {
    if (!hh.cocoon.snapshots.has('acme/agent')) hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name, { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' });
    await hh.provider.createPod(pod);
    await until(`${name} bound`, () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`) as FakeVm;
    hh.lease(vm.nics[0]!.mac, `10.0.0.${hh.cocoon.vms.size + 10}`);
    await until(`${name} ready`, () => lastState(hh, name) === 'ready');
    return { pod, vm };
  }

  /** The pod as DeletePod sees it: a deletion timestamp `graceMs` from now. */
  const deleting = (pod: V1Pod, graceMs: number): V1Pod => ({
    ...pod,
    metadata: { ...pod.metadata, deletionTimestamp: new Date(Date.now() + graceMs) },
  });

  describe('delete during a registry outage', () => {
    test('the pod goes, the state stays local and in the ledger, the GC keeps it, the push lands later', async () => {
      deferred.length = 0;
      h = withStore();
      const { pod, vm } = await readyPod(h, 'o-0');
      store!.down = true;
      await h.provider.deletePod(deleting(pod, 30_000));
      assert.equal(h.provider.getPod('ns', 'o-0'), undefined, 'the delete completed');
      assert.ok(!h.cocoon.vms.has(vm.id), 'the VM is removed');
      assert.ok(h.cocoon.snapshots.has('vk-o-0'), 'its state is kept as a local snapshot');
      const pending = h.ledger.pendingPush('vk-o-0');
      assert.equal(pending?.repo, 'vk-o-0');
      assert.equal(pending?.tag, 'latest');
      assert.deepEqual(pending?.owner, ownerOf(pod, 'vk-o-0'));
      assert.match(pending?.lastError ?? '', /ECONNREFUSED/);
      const ev = h.events.find((e) => e.reason === 'SnapshotPushDeferred');
      assert.match(ev?.message ?? '', /vk-o-0:latest push deferred .*kept as local snapshot vk-o-0/);
      assert.deepEqual(deferred, ['deferred:1']);

      // The registry answers again, without a hibernate tag: the GC would call the copy stale.
      store!.down = false;
      const gc = await h.provider.snapshotGc();
      assert.ok(gc?.used.includes('vk-o-0'), 'the GC keeps a snapshot a deferred push needs');
      assert.ok(h.cocoon.snapshots.has('vk-o-0'));

      await h.provider.deferredPushesNow();
      const tag = store!.tags.get('vk-o-0:latest');
      assert.equal(tag?.namespace, 'ns', 'pushed with the owner stamps');
      assert.equal(h.ledger.pendingPush('vk-o-0'), undefined);
      assert.ok(!h.cocoon.snapshots.has('vk-o-0'), 'the local copy goes once pushed');
      assert.ok(h.events.some((e) => e.reason === 'SnapshotPushed' && e.pod === 'ns/o-0'));
      assert.deepEqual(deferred, ['deferred:1', 'pushed:0']);
    });

    test('the pushed copy is removed with the wait of a pod operation: a busy call pool delays it, never leaves it', async () => {
      h = withStore();
      const { pod } = await readyPod(h, 'o-3');
      store!.down = true;
      await h.provider.deletePod(deleting(pod, 30_000));
      store!.down = false;
      const removals: (number | undefined)[] = [];
      h.cocoon.on(/^snapshot rm vk-o-3$/, (argv, opts) => {
        removals.push(opts.queueTimeoutMs);
        h!.cocoon.snapshots.delete(argv[2]!);
        return { stdout: '', stderr: '' };
      });
      await h.provider.deferredPushesNow();
      assert.equal(h.ledger.pendingPush('vk-o-3'), undefined, 'pushed');
      assert.deepEqual(removals, [POD_OP_QUEUE_MS], 'one snapshot rm, with the pod-operation queue bound');
      assert.ok(!h.cocoon.snapshots.has('vk-o-3'));
    });

    test('a failed try keeps the push with its error and count', async () => {
      deferred.length = 0;
      h = withStore();
      const { pod } = await readyPod(h, 'o-1');
      store!.down = true;
      await h.provider.deletePod(deleting(pod, 30_000));
      await h.provider.deferredPushesNow();
      await h.provider.deferredPushesNow();
      const p = h.ledger.pendingPush('vk-o-1');
      assert.equal(p?.attempts, 2);
      assert.match(p?.lastError ?? '', /ECONNREFUSED/);
      assert.ok(h.cocoon.snapshots.has('vk-o-1'));
      assert.deepEqual(deferred, ['deferred:1', 'failed:1', 'failed:1']);
    });

    test('a save that fails keeps the VM and the pod Terminating (nothing to defer)', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'o-2');
      h.cocoon.on(/^snapshot save /, (argv) => {
        throw new CocoonCommandError(argv, 'cocoon snapshot save: no space left on device', '', 1);
      });
      await assert.rejects(h.provider.deletePod(deleting(pod, 30_000)), /kept VM .*snapshot save/);
      assert.ok(h.cocoon.vms.has(vm.id));
      assert.equal(h.ledger.size().pushes, 0);
    });
  });

  describe('a push that would outlast the grace period', () => {
    test('too little time left: deferred without a try', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'g-0');
      await h.provider.deletePod(deleting(pod, 5_500));
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.ok(!store!.calls.some((c) => c.startsWith('push ')), 'no push started');
      assert.match(h.ledger.pendingPush('vk-g-0')?.lastError ?? '', /grace period leaves no time/);
    });

    test('a push still running at the end of the window is abandoned and deferred', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'g-1');
      let release = () => {};
      store!.hold = new Promise<void>((r) => {
        release = r;
      });
      // 6.2 s of grace less the 5 s reserve: a 1.2 s window, ticked rather than waited.
      mock.timers.enable({ apis: ['setTimeout'] });
      const deleted = h.provider.deletePod(deleting(pod, 6_200));
      await until('pushing', () => store!.calls.includes('push vk-g-1:latest'));
      assert.ok(h.cocoon.vms.has(vm.id), 'the VM waits for the push while the window is open');
      mock.timers.tick(1_300);
      await deleted;
      mock.timers.reset();
      assert.ok(!h.cocoon.vms.has(vm.id), 'the pod went without waiting for the push');
      assert.match(h.ledger.pendingPush('vk-g-1')?.lastError ?? '', /not done within the grace period/);
      release();
      store!.hold = undefined;
      await h.provider.deferredPushesNow();
      assert.ok(store!.tags.has('vk-g-1:latest'));
    });
  });

  describe('a force-deleted pod that holds a VM (grace period 0)', () => {
    test('the VM is removed at once; with a snapshot policy its state is saved and the push deferred', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'f-0');
      const forced = {
        ...deleting(pod, 0),
        metadata: { ...deleting(pod, 0).metadata, deletionGracePeriodSeconds: 0 },
      };
      await h.provider.deletePod(forced);
      assert.ok(!h.cocoon.vms.has(vm.id), 'the VM is removed');
      assert.equal(h.provider.getPod('ns', 'f-0'), undefined);
      assert.ok(!store!.calls.some((c) => c.startsWith('push ')), 'no push waited for');
      assert.ok(h.cocoon.snapshots.has('vk-f-0'), 'the state is saved first');
      assert.match(h.ledger.pendingPush('vk-f-0')?.lastError ?? '', /grace period leaves no time/);
    });

    test('without a snapshot policy nothing is saved: the VM and its leases go', async () => {
      h = withStore();
      if (!h.cocoon.snapshots.has('acme/agent')) h.cocoon.snapshot('acme/agent');
      const pod = clonePod('f-1', { 'cocoonset.cocoonstack.io/snapshot-policy': 'never' });
      await h.provider.createPod(pod);
      await until('bound', () => !!h!.provider.getPod('ns', 'f-1')?.metadata?.annotations?.[VM_ID]);
      const vm = [...h.cocoon.vms.values()].find((v) => v.name === 'vk-f-1') as FakeVm;
      await h.provider.deletePod(deleting(pod, 0));
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.equal(h.cocoon.callsOf('snapshot save').length, 0);
      assert.equal(h.ledger.size().pushes, 0);
    });
  });

  describe('never over newer state', () => {
    async function pendingFor(name: string): Promise<Harness> {
      const hh = withStore();
      h = hh;
      const { pod } = await readyPod(hh, name);
      store!.down = true;
      await hh.provider.deletePod(deleting(pod, 30_000));
      store!.down = false;
      assert.ok(hh.ledger.pendingPush(`vk-${name}`));
      return hh;
    }
    const stamp = (created: string) => ({
      digest: `sha256:${'e'.repeat(64)}`,
      snapshotId: 'elsewhere',
      baseImage: 'acme/agent',
      fromNode: 'node-b',
      namespace: 'ns',
      controllerUid: '',
      created,
    });

    test('the identity hibernated elsewhere after the save: dropped, its tag untouched', async () => {
      const hh = await pendingFor('n-0');
      const later = new Date(Date.now() + 60_000).toISOString();
      store!.tags.set('vk-n-0:hibernate', stamp(later));
      await hh.provider.deferredPushesNow();
      assert.ok(!store!.tags.has('vk-n-0:latest'), 'not pushed');
      assert.equal(hh.ledger.pendingPush('vk-n-0'), undefined);
      assert.ok(!hh.cocoon.snapshots.has('vk-n-0'), 'the obsolete local copy is removed');
      const ev = hh.events.find((e) => e.reason === 'SnapshotPushDropped');
      assert.match(
        ev?.message ?? '',
        /vk-n-0:hibernate .* is newer than the state saved at .*rule push-newer-state/,
      );
    });

    test('a newer :latest of the identity: dropped, not overwritten', async () => {
      const hh = await pendingFor('n-1');
      const newer = stamp(new Date(Date.now() + 60_000).toISOString());
      store!.tags.set('vk-n-1:latest', newer);
      await hh.provider.deferredPushesNow();
      assert.equal(store!.tags.get('vk-n-1:latest'), newer);
      assert.equal(hh.ledger.pendingPush('vk-n-1'), undefined);
    });

    test('the local snapshot replaced by newer state: dropped, the new snapshot kept', async () => {
      const hh = await pendingFor('n-2');
      const was = hh.ledger.snapshot('vk-n-2')!;
      await hh.ledger.confirm('snapshot', 'vk-n-2', 'a-newer-save', was.owner, { key: was.pod, uid: 'u2' });
      await hh.provider.deferredPushesNow();
      assert.ok(!store!.tags.has('vk-n-2:latest'));
      assert.ok(hh.cocoon.snapshots.has('vk-n-2'), 'newer state is never removed here');
      assert.ok(
        hh.events.some((e) => e.reason === 'SnapshotPushDropped' && /push-superseded/.test(e.message)),
      );
    });

    test('the identity recreated on this host after the save: dropped', async () => {
      const hh = await pendingFor('n-3');
      await new Promise((r) => setTimeout(r, 2)); // the recreated VM's intent is later than the save
      const again = clonePod('n-3', { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' });
      await hh.provider.createPod(again);
      await until('recreated', () => !!hh.provider.getPod('ns', 'n-3')?.metadata?.annotations?.[VM_ID]);
      await hh.provider.deferredPushesNow();
      assert.ok(!store!.tags.has('vk-n-3:latest'));
      assert.ok(
        hh.events.some((e) => e.reason === 'SnapshotPushDropped' && /push-recreated/.test(e.message)),
      );
    });
  });
});
