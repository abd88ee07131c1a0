// Hibernate, wake, restore, fork-from and the delete-time snapshot in process (fake
// Kubernetes client, fake cocoon runner, fake snapshot store; docs/decisions.md "Hibernate and
// wake"): the order of the writes and calls, rollback and the retry gate, a withdrawn request,
// wake source verification, the evidence guard and name ownership. The real registry, crane
// and the simulator are in test/integration/hibernate*.test.ts.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { FakeVm } from '../fakes/cocoon.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/hibernate', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
  const VM_ID = 'vm.cocoonstack.io/id';
  const HIBERNATE = 'vm.cocoonstack.io/hibernate';

  let h: Harness | undefined;
  let store: FakeStore | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    store = undefined;
  });

  function withStore(): Harness {
    return harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
    });
  }

  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));
  const lastState = (hh: Harness, name: string) => states(hh, name).at(-1);
  const messageOf = (hh: Harness, name: string) =>
    String(hh.patches(name).findLast((a) => a[MESSAGE] !== undefined)?.[MESSAGE] ?? '');

  let rv = 900_000;
  /** The pod as the API holds it after the provider's patches, with `changes`. */
  function apiCopy(hh: Harness, pod: V1Pod, changes: Record<string, string | null> = {}): V1Pod {
    return withAnnotations(
      pod,
      { ...Object.assign({}, ...hh.patches(pod.metadata!.name!)), ...changes },
      String(++rv),
    );
  }

  async function readyPod(hh: Harness, name: string, extra: Record<string, string> = {}, ns = 'ns') {
    if (!hh.cocoon.snapshots.has('acme/agent')) hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name, extra, ns);
    await hh.provider.createPod(pod);
    await until(`${name} bound`, () => !!hh.provider.getPod(ns, name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`) as FakeVm;
    hh.lease(vm.nics[0]!.mac, `10.0.0.${hh.cocoon.vms.size + 10}`);
    await until(`${name} ready`, () => lastState(hh, name) === 'ready');
    return { pod, vm };
  }

  async function hibernated(hh: Harness, name: string): Promise<{ pod: V1Pod; vm: FakeVm }> {
    const { pod, vm } = await readyPod(hh, name);
    await hh.provider.updatePod(apiCopy(hh, pod, { [HIBERNATE]: 'true' }));
    await until(`${name} hibernated`, () => lastState(hh, name) === 'hibernated');
    return { pod, vm };
  }

  describe('hibernate with a registry', () => {
    test('save, push with from-node, id cleared, VM removed, hibernated', async () => {
      h = withStore();
      const { vm } = await hibernated(h, 'h-0');
      assert.deepEqual(states(h, 'h-0').slice(-2), ['hibernating', 'hibernated']);
      const tag = store!.tags.get('vk-h-0:hibernate');
      assert.equal(tag?.snapshotId, 'snap-vk-h-0');
      assert.equal(tag?.baseImage, 'acme/agent');
      assert.ok(tag?.fromNode, 'from-node stamped');
      assert.ok(!h.cocoon.vms.has(vm.id));
      assert.match(h.events.find((e) => e.reason === 'Hibernated')?.message ?? '', /pushed to registry/);
    });

    test('a refused push rolls back: VM kept, id re-published, failed hibernate:, no new attempt before the retry is due', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'h-1');
      store!.refusePush = true;
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: 'true' }));
      await until('failed', () => lastState(h!, 'h-1') === 'failed');
      assert.match(messageOf(h, 'h-1'), /^hibernate: push vk-h-1:hibernate: .*MANIFEST_INVALID/);
      assert.ok(h.events.some((e) => e.type === 'Warning' && e.reason === 'HibernatePushFailed'));
      assert.ok(h.cocoon.vms.has(vm.id), 'VM kept');
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      assert.equal(h.provider.getPod('ns', 'h-1')?.metadata?.annotations?.[VM_ID], vm.id);
      // Our own failure write coming back as an update does not start another attempt.
      store!.refusePush = false;
      const pushes = store!.calls.filter((c) => c.startsWith('push')).length;
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: 'true' }));
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(store!.calls.filter((c) => c.startsWith('push')).length, pushes);
      // Withdrawn: lifted back to ready on the same VM.
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: null }));
      await until('ready again', () => lastState(h!, 'h-1') === 'ready');
      assert.ok(h.cocoon.vms.has(vm.id));
    });

    test('withdrawn while the push is in flight: the VM stays, goes back to ready, the pushed tag is deleted', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'h-2');
      let release!: () => void;
      store!.hold = new Promise((r) => {
        release = r;
      });
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: 'true' }));
      await until('push started', () => store!.calls.includes('push vk-h-2:hibernate'));
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: null }));
      release();
      await until(
        'ready again',
        () => lastState(h!, 'h-2') === 'ready' && states(h!, 'h-2').includes('hibernating'),
      );
      assert.ok(h.cocoon.vms.has(vm.id));
      assert.equal(store!.tags.has('vk-h-2:hibernate'), false);
      assert.ok(!states(h, 'h-2').includes('hibernated'));
    });

    test('a hibernated pod holds its VM name: another pod (any namespace) cannot take it', async () => {
      h = withStore();
      await hibernated(h, 'h-3');
      const thief = clonePod('thief', { 'vm.cocoonstack.io/name': 'vk-h-3' }, 'other');
      await h.provider.createPod(thief);
      await until('thief failed', () => lastState(h!, 'thief') === 'failed');
      assert.match(messageOf(h, 'thief'), /VM name vk-h-3 is already used by pod ns\/h-3/);
      assert.equal(store!.calls.filter((c) => c.startsWith('pull')).length, 0);
    });
  });

  describe('wake', () => {
    test('a verified local copy is used: clone from it, Woken, ready; the tag is kept', async () => {
      h = withStore();
      const { pod } = await hibernated(h, 'w-0');
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: null }));
      await until('woken', () => h!.events.some((e) => e.reason === 'Woken'));
      const clone = h.cocoon.callsOf('vm clone').at(-1)!.argv;
      assert.equal(clone.at(-1), 'vk-w-0');
      const vm = [...h.cocoon.vms.values()].find((v) => v.name === 'vk-w-0')!;
      h.lease(vm.nics[0]!.mac, '10.0.0.99');
      await until('ready', () => lastState(h!, 'w-0') === 'ready');
      assert.ok(store!.tags.has('vk-w-0:hibernate'));
      assert.equal(store!.calls.filter((c) => c.startsWith('delete')).length, 0);
    });

    test('registry unreachable with a local copy: the wake fails (wake:), the copy is not used', async () => {
      h = withStore();
      const { pod } = await hibernated(h, 'w-1');
      const clones = h.cocoon.callsOf('vm clone').length;
      store!.down = true;
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: null }));
      await until('failed', () => lastState(h!, 'w-1') === 'failed');
      assert.match(messageOf(h, 'w-1'), /^wake: cannot verify the local snapshot vk-w-1/);
      assert.ok(h.events.some((e) => e.reason === 'WakePullFailed'));
      assert.equal(h.cocoon.callsOf('vm clone').length, clones);
    });

    test('a stale local copy is removed and the registry copy is pulled, cloned, and its import removed', async () => {
      h = withStore();
      const { pod } = await hibernated(h, 'w-2');
      store!.tags.set('vk-w-2:hibernate', { ...store!.tags.get('vk-w-2:hibernate')!, snapshotId: 'another' });
      await h.provider.updatePod(apiCopy(h, pod, { [HIBERNATE]: null }));
      await until('woken', () => h!.events.some((e) => e.reason === 'Woken'));
      assert.ok(h.cocoon.callsOf('snapshot rm vk-w-2').length >= 1, 'stale copy removed');
      assert.equal(h.cocoon.callsOf('vm clone').at(-1)!.argv.at(-1), 'vk-w-2-hibernate-import');
      await until('import removed', () => !h!.cocoon.snapshots.has('vk-w-2-hibernate-import'));
    });
  });

  describe('another namespace', () => {
    test('a hibernate push stamps the pod namespace; a pod of another namespace with that VM name never restores it', async () => {
      h = withStore();
      const { pod } = await hibernated(h, 'ns-0');
      assert.equal(store!.tags.get('vk-ns-0:hibernate')?.namespace, 'ns');
      // The owner goes away (deleted while hibernated); its state stays in the registry.
      await h.provider.deletePod(apiCopy(h, pod));
      const clones = h.cocoon.callsOf('vm clone').length;
      // Evidence on create: refused.
      await h.provider.createPod(clonePod('taker', { 'vm.cocoonstack.io/name': 'vk-ns-0' }, 'other'));
      await until('refused', () => lastState(h!, 'taker') === 'failed');
      assert.match(messageOf(h, 'taker'), /belongs to a pod of namespace ns, not other/);
      // An explicit restore: refused too.
      await h.provider.createPod(
        clonePod(
          'taker2',
          { 'vm.cocoonstack.io/name': 'vk-ns-0', 'vm.cocoonstack.io/restore-from-hibernate': 'true' },
          'other2',
        ),
      );
      await until('refused', () => lastState(h!, 'taker2') === 'failed');
      assert.match(messageOf(h, 'taker2'), /belongs to a pod of namespace ns, not other2/);
      assert.equal(h.cocoon.callsOf('vm clone').length, clones, 'nothing restored');
      assert.equal(store!.calls.filter((c) => c.startsWith('pull')).length, 0);
    });
  });

  describe('evidence on create', () => {
    test('an image conflict fails the create and says what to delete', async () => {
      h = withStore();
      store!.tags.set('vk-e-0:hibernate', {
        digest: 'sha256:1',
        snapshotId: 's',
        baseImage: 'acme/old',
        fromNode: '',
      });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('e-0'));
      await until('failed', () => lastState(h!, 'e-0') === 'failed');
      assert.match(messageOf(h, 'e-0'), /taken from image acme\/old .* delete the vk-e-0:hibernate tag/);
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
    });

    test('fork-from over hibernated state is a source conflict', async () => {
      h = withStore();
      store!.tags.set('vk-e-1:hibernate', {
        digest: 'sha256:1',
        snapshotId: 's',
        baseImage: '',
        fromNode: '',
      });
      await h.provider.createPod(clonePod('e-1', { 'vm.cocoonstack.io/fork-from': 'vk-main' }));
      await until('failed', () => lastState(h!, 'e-1') === 'failed');
      assert.match(messageOf(h, 'e-1'), /still owns hibernated state .* fork-from vk-main/);
    });

    test('an unreachable registry fails closed: HibernateEvidenceUnavailable, no fresh boot, still creating', async () => {
      h = withStore();
      store!.down = true;
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('e-2'));
      await until('warned', () => h!.events.some((e) => e.reason === 'HibernateEvidenceUnavailable'));
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
      assert.ok(!states(h, 'e-2').includes('failed'));
    });

    test('evidence without a conflict restores instead of booting fresh (HibernateSnapshotExists)', async () => {
      h = withStore();
      store!.tags.set('vk-e-3:hibernate', {
        digest: 'sha256:1',
        snapshotId: 's',
        baseImage: 'acme/agent',
        fromNode: '',
      });
      await h.provider.createPod(clonePod('e-3'));
      await until('bound', () => !!h!.provider.getPod('ns', 'e-3')?.metadata?.annotations?.[VM_ID]);
      assert.ok(h.events.some((e) => e.reason === 'HibernateSnapshotExists'));
      assert.equal(h.cocoon.callsOf('vm clone').at(-1)!.argv.at(-1), 'vk-e-3-hibernate-import');
    });
  });

  describe('fork-from and the delete-time snapshot', () => {
    test('three concurrent forks of one main: one save of fork-<main>, three clones of it', async () => {
      h = harness();
      await readyPod(h, 'main');
      await Promise.all(
        ['f-1', 'f-2', 'f-3'].map((n) =>
          h!.provider.createPod(clonePod(n, { 'vm.cocoonstack.io/fork-from': 'vk-main' })),
        ),
      );
      await until(
        'three forks',
        () => h!.cocoon.callsOf('vm clone').filter((c) => c.argv.at(-1) === 'fork-vk-main').length === 3,
      );
      assert.equal(h.cocoon.callsOf('snapshot save').length, 1);
      assert.deepEqual(h.cocoon.callsOf('snapshot save')[0]!.argv.slice(0, 4), [
        'snapshot',
        'save',
        '--name',
        'fork-vk-main',
      ]);
    });

    test('delete with a registry: save and push :latest before vm rm', async () => {
      h = withStore();
      const { pod, vm } = await readyPod(h, 'd-0');
      await h.provider.deletePod(pod);
      assert.ok(store!.tags.has('vk-d-0:latest'));
      assert.ok(!h.cocoon.vms.has(vm.id));
      const save = h.cocoon.callsOf('snapshot save').at(-1)!.at;
      const push = store!.calls.indexOf('push vk-d-0:latest');
      assert.ok(push >= 0 && save < h.cocoon.callsOf('vm rm').at(-1)!.at);
      assert.ok(!h.cocoon.snapshots.has('vk-d-0'), 'the local copy goes with the pod');
      assert.equal(h.ledger.size().pushes, 0, 'nothing deferred');
      // The registry down at delete: test/unit/provider/deferred-push.test.ts.
    });

    test('snapshot-policy never: no snapshot on delete', async () => {
      h = withStore();
      const { pod } = await readyPod(h, 'd-1', { 'cocoonset.cocoonstack.io/snapshot-policy': 'never' });
      await h.provider.deletePod(pod);
      assert.equal(h.cocoon.callsOf('snapshot save').length, 0);
      assert.equal(store!.tags.size, 0);
    });
  });

  describe('restart', () => {
    test('a hibernate requested while the daemon was down: ResumedAfterRestart, vm start first, then hibernated', async () => {
      const first = withStore();
      const { pod, vm } = await readyPod(first, 'r-0');
      const api = apiCopy(first, pod, { [HIBERNATE]: 'true' });
      first.close();
      h = withStore();
      h.cocoon.vms.set(vm.id, { ...vm, state: 'stopped' });
      await h.provider.startupReconcile([api]);
      await until('hibernated', () => lastState(h!, 'r-0') === 'hibernated');
      assert.ok(h.events.some((e) => e.reason === 'ResumedAfterRestart' && e.message === 'op=hibernate'));
      const start = h.cocoon.callsOf('vm start')[0]!;
      assert.ok(start.at < h.cocoon.callsOf('snapshot save')[0]!.at, 'vm start before the save');
      assert.ok(store!.tags.has('vk-r-0:hibernate'));
    });
  });
});
