// The local snapshot GC (docs/decisions.md "Snapshot GC and the CPU-class gate"): the pure
// selection (what tracked pods use, which names are looked at, staleness) and the pass through
// the fake cocoon runner and the fake store. The real registry and the simulator are in
// test/integration/gc-gate.test.ts.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { SnapshotRecord } from '../../../src/cocoon/records.ts';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { decodeSpec } from '../../../src/provider/cocoon/context.ts';
import { isStale, planGc, usedSnapshots } from '../../../src/provider/cocoon/gc.ts';
import { newRecord, setBringingUp, setWaking } from '../../../src/provider/cocoon/state.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

const STATE = 'vm.cocoonstack.io/lifecycle-state';
const VM_ID = 'vm.cocoonstack.io/id';

const snap = (name: string, id = `snap-${name}`): SnapshotRecord => ({
  id,
  name,
  image: '',
  imageDigest: '',
  imageType: '',
  imageBlobIds: [],
  hypervisor: 'cloud-hypervisor',
  createdAt: '',
});

function record(name: string, extra: Record<string, string> = {}) {
  const pod = clonePod(name, extra);
  const d = decodeSpec(pod);
  return newRecord(`ns/${name}`, pod, d.ok ? d.spec : undefined);
}

describe('usedSnapshots', () => {
  test('hibernate copy, fork, fork source and clone source of every tracked pod', () => {
    const a = record('a');
    const b = record('b', {
      'vm.cocoonstack.io/fork-from': 'vk-a',
      'cocoonset.cocoonstack.io/image': 'acme/base:v2',
    });
    const used = usedSnapshots([a, b]);
    for (const n of ['vk-a', 'fork-vk-a', 'vk-b', 'fork-vk-b', 'acme/agent', 'acme/base:v2'])
      assert.ok(used.has(n), n);
    assert.ok(!used.has('vk-a-hibernate-import'), 'no wake in flight');
  });

  test('a pod whose annotations do not decode still holds its VM name', () => {
    const rec = record('bad', { 'cocoonset.cocoonstack.io/mode': 'nonsense' });
    assert.equal(rec.spec, undefined);
    assert.ok(usedSnapshots([rec]).has('vk-bad'));
  });

  test('the hibernate import is used while a wake or a bring-up is in flight', () => {
    const w = record('w');
    setWaking(w, true);
    const u = record('u');
    setBringingUp(u, true);
    const used = usedSnapshots([w, u]);
    assert.ok(used.has('vk-w-hibernate-import'));
    assert.ok(used.has('vk-u-hibernate-import'));
  });
});

describe('planGc and isStale', () => {
  test('only vk-* names; used kept; import leftovers apart', () => {
    const plan = planGc(
      [snap('acme/agent'), snap('fork-vk-x'), snap('vk-used'), snap('vk-old'), snap('vk-z-hibernate-import')],
      new Set(['vk-used']),
    );
    assert.deepEqual(plan.used, ['vk-used']);
    assert.deepEqual(
      plan.leftovers.map((s) => s.name),
      ['vk-z-hibernate-import'],
    );
    assert.deepEqual(
      plan.candidates.map((s) => s.name),
      ['vk-old'],
    );
  });

  test('stale: tag absent or another snapshot ID', () => {
    const id = { digest: 'sha256:1', snapshotId: 'snap-vk-a', baseImage: '', fromNode: '' };
    assert.equal(isStale(snap('vk-a'), 'absent'), true);
    assert.equal(isStale(snap('vk-a'), id), false);
    assert.equal(isStale(snap('vk-a', 'other'), id), true);
  });
});

describe('the GC pass', () => {
  let h: Harness | undefined;
  let store: FakeStore | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    store = undefined;
  });
  const withStore = () =>
    harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
    });
  const tag = (name: string, snapshotId: string) =>
    store!.tags.set(`${name}:hibernate`, { digest: 'sha256:1', snapshotId, baseImage: '', fromNode: '' });

  async function hibernatedPod(hh: Harness, name: string) {
    hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name);
    await hh.provider.createPod(pod);
    await until('bound', () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`)!;
    hh.lease(vm.nics[0]!.mac, '10.0.0.9');
    const last = () => hh.patches(name).findLast((a) => a[STATE] !== undefined)?.[STATE];
    await until('ready', () => last() === 'ready');
    const api = withAnnotations(
      pod,
      Object.assign({}, ...hh.patches(name), { 'vm.cocoonstack.io/hibernate': 'true' }),
      '9',
    );
    await hh.provider.updatePod(api);
    await until('hibernated', () => last() === 'hibernated');
  }

  test('removes only unused vk-* snapshots stale against :hibernate', async () => {
    h = withStore();
    await hibernatedPod(h, 'sleep');
    // The tracked pod's copy is kept even when its tag went away.
    assert.ok(h.cocoon.snapshots.has('vk-sleep'));
    store!.tags.delete('vk-sleep:hibernate');
    h.cocoon.snapshot('vk-current');
    tag('vk-current', 'snap-vk-current');
    h.cocoon.snapshot('vk-gone');
    h.cocoon.snapshot('vk-replaced');
    tag('vk-replaced', 'snap-something-else');
    h.cocoon.snapshot('vk-x-hibernate-import');
    h.cocoon.snapshot('fork-vk-gone');
    h.cocoon.snapshot('other/base');
    // A vk-* snapshot the daemon did not write (a base image of that name) is never collected.
    h.cocoon.snapshot('vk-base');
    for (const n of ['vk-current', 'vk-gone', 'vk-replaced']) await h.own(n);
    store!.calls.length = 0;
    const r = await h.provider.snapshotGc();
    assert.ok(r);
    assert.deepEqual(r.removed.sort(), ['vk-gone', 'vk-replaced', 'vk-x-hibernate-import']);
    assert.deepEqual(r.current, ['vk-current']);
    assert.ok(r.used.includes('vk-sleep'));
    assert.deepEqual(r.errors, []);
    for (const n of ['vk-sleep', 'vk-current', 'fork-vk-gone', 'other/base', 'acme/agent', 'vk-base'])
      assert.ok(h.cocoon.snapshots.has(n), `${n} kept`);
    for (const n of r.removed) assert.ok(!h.cocoon.snapshots.has(n), `${n} removed`);
    // Registry reads only for the unused vk-* names (not the import, not the tracked pod's copy).
    assert.deepEqual(store!.calls.sort(), [
      'identity vk-current:hibernate',
      'identity vk-gone:hibernate',
      'identity vk-replaced:hibernate',
    ]);
  });

  test('a registry that errors keeps every snapshot it was asked about, and stops after 3', async () => {
    h = withStore();
    for (const n of ['vk-a', 'vk-b', 'vk-c', 'vk-d', 'vk-e']) {
      h.cocoon.snapshot(n);
      await h.own(n);
    }
    store!.down = true;
    const r = await h.provider.snapshotGc();
    assert.ok(r);
    assert.deepEqual(r.removed, []);
    assert.deepEqual(r.errors.map((e) => e.name).sort(), ['vk-a', 'vk-b', 'vk-c', 'vk-d', 'vk-e']);
    assert.equal(store!.calls.length, 3, 'three reads, then the pass ends');
    for (const n of ['vk-a', 'vk-b', 'vk-c', 'vk-d', 'vk-e']) assert.ok(h.cocoon.snapshots.has(n));
  });

  test('a pod claimed during the registry read keeps its name; a leased snapshot is kept', async () => {
    h = withStore();
    h.cocoon.snapshot('acme/agent');
    h.cocoon.snapshot('vk-late');
    h.cocoon.snapshot('vk-leased');
    await h.own('vk-late');
    await h.own('vk-leased');
    const hh = h;
    const read = store!.identity.bind(store);
    store!.identity = async (repo, t) => {
      if (repo === 'vk-late') await hh.provider.createPod(clonePod('late'));
      return read(repo, t);
    };
    h.cocoon.on(/^snapshot rm vk-leased$/, (argv) => {
      throw new CocoonCommandError(
        argv,
        'snapshot rm: is in use by an active clone',
        'is in use by an active clone',
        1,
      );
    });
    const r = await h.provider.snapshotGc();
    assert.ok(r);
    assert.deepEqual(r.removed, []);
    assert.deepEqual(r.used.sort(), ['vk-late', 'vk-leased']);
    assert.ok(h.cocoon.snapshots.has('vk-late'));
    assert.ok(h.cocoon.snapshots.has('vk-leased'));
  });

  test('without a registry there is no pass and no cocoon call', async () => {
    h = harness();
    h.cocoon.snapshot('vk-gone');
    assert.equal(await h.provider.snapshotGc(), undefined);
    h.provider.startLoops();
    await new Promise((r) => setImmediate(r));
    assert.equal(h.cocoon.calls.length, 0);
    assert.ok(h.cocoon.snapshots.has('vk-gone'));
  });

  test('startLoops runs a pass at once', async () => {
    h = withStore();
    h.cocoon.snapshot('vk-gone');
    await h.own('vk-gone');
    h.provider.startLoops();
    await until('removed at start', () => !h!.cocoon.snapshots.has('vk-gone'));
  });
});
