// A pod evicted by the node's taint while the daemon was away (ops/evicted.ts): not a user's
// delete, so its VM is kept (no snapshot, no push, no removal) and a replacement of the same
// identity on this node adopts it in place; a VM no replacement adopts is removed without a
// push once its wait is over (keptVerdict, the pure half).
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../../src/cocoon/records.ts';
import { EVICTED_KEEP_MS, evictedByTaint, keptVerdict } from '../../../src/provider/cocoon/ops/evicted.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/evicted', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const VM_ID = 'vm.cocoonstack.io/id';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const taintEvicted = (pod: V1Pod): V1Pod => ({
    ...pod,
    metadata: { ...pod.metadata, deletionTimestamp: new Date() },
    status: {
      ...pod.status,
      conditions: [
        {
          type: 'DisruptionTarget',
          status: 'True',
          reason: 'DeletionByTaintManager',
          message: 'Taint manager: deleting due to NoExecute taint',
        },
      ],
    },
  });

  async function readyPod(hh: Harness, name: string, uidSuffix = ''): Promise<V1Pod> {
    if (!hh.cocoon.snapshots.has('acme/agent')) hh.cocoon.snapshot('acme/agent');
    const base = clonePod(name);
    const pod = { ...base, metadata: { ...base.metadata, uid: `${base.metadata?.uid}${uidSuffix}` } };
    await hh.provider.createPod(pod);
    await until(`${name} bound`, () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`);
    if (vm && !vm.nics[0]?.network) hh.lease(vm.nics[0]!.mac, '10.0.0.31');
    await until(`${name} ready`, () =>
      hh.patches(name).some((a) => a[STATE] === 'ready' && a[VM_ID] !== undefined),
    );
    return pod;
  }

  describe('evictedByTaint', () => {
    test("only the taint manager's DisruptionTarget counts", () => {
      const pod = clonePod('x');
      assert.equal(evictedByTaint(taintEvicted(pod)), true);
      assert.equal(evictedByTaint(pod), false);
      const preempted: V1Pod = {
        ...pod,
        status: {
          conditions: [{ type: 'DisruptionTarget', status: 'True', reason: 'PreemptionByScheduler' }],
        },
      };
      assert.equal(evictedByTaint(preempted), false);
    });
  });

  describe('keptVerdict', () => {
    const vm = { id: 'VM1' } as VmRecord;
    test('adopted once it left the index (or another VM holds the name there)', () => {
      assert.equal(keptVerdict({ vmId: 'VM1', at: 0 }, undefined, false, 1), 'adopted');
      assert.equal(keptVerdict({ vmId: 'VM1', at: 0 }, { id: 'VM2' } as VmRecord, false, 1), 'adopted');
    });
    test('a tracked pod claiming the name (an adoption in flight) is never raced by the removal', () => {
      assert.equal(keptVerdict({ vmId: 'VM1', at: 0 }, vm, true, EVICTED_KEEP_MS * 2), 'wait');
    });
    test('waits for a replacement, then is removed', () => {
      assert.equal(keptVerdict({ vmId: 'VM1', at: 1000 }, vm, false, 1000 + EVICTED_KEEP_MS - 1), 'wait');
      assert.equal(keptVerdict({ vmId: 'VM1', at: 1000 }, vm, false, 1000 + EVICTED_KEEP_MS), 'remove');
    });
  });

  describe('DeletePod of a pod the taint evicted', () => {
    test('keeps the VM without a snapshot or a push; a replacement of the same identity adopts it in place', async () => {
      let store: FakeStore | undefined;
      h = harness({
        store: (c) => {
          store = new FakeStore(c);
          return store;
        },
      });
      const pod = await readyPod(h, 'ev-0');
      const vm = [...h.cocoon.vms.values()].find((v) => v.name === 'vk-ev-0')!;
      const copy = withAnnotations(pod, Object.assign({}, ...h.patches('ev-0')), '900000');
      await h.provider.deletePod(taintEvicted(copy));
      assert.ok(h.cocoon.vms.has(vm.id), 'the VM is kept');
      assert.equal(h.cocoon.callsOf('vm rm').length, 0);
      assert.equal(h.cocoon.callsOf('snapshot save').length, 0);
      assert.deepEqual(
        store!.calls.filter((c) => c.startsWith('push')),
        [],
      );
      assert.ok(h.events.some((e) => e.reason === 'VMKeptAfterEviction' && e.message.includes(vm.id)));
      assert.equal(h.provider.getPod('ns', 'ev-0'), undefined);

      // The replacement: same namespace, VM name and controller, a new UID.
      const clones = h.cocoon.callsOf('vm clone').length;
      await readyPod(h, 'ev-0', '-replacement');
      assert.equal(h.cocoon.callsOf('vm clone').length, clones, 'adopted, not cloned');
      assert.equal(
        h.patches('ev-0').findLast((a) => a[VM_ID] !== undefined)?.[VM_ID],
        vm.id,
        'the replacement publishes the kept VM',
      );
      assert.equal(h.cocoon.vms.size, 1);
    });

    test("a user's delete still removes the VM", async () => {
      h = harness();
      const pod = await readyPod(h, 'ev-1');
      const copy = withAnnotations(pod, Object.assign({}, ...h.patches('ev-1')), '900000');
      await h.provider.deletePod(copy);
      assert.equal(h.cocoon.vms.size, 0);
    });
  });
});
