// Stale creates at startup, in process (fake cocoon runner; docs/contracts/pod-to-vm.md
// "Stale creates"): placeholders are handed to `vm reconcile-stale-create`, never removed by
// the provider; a busy one is asked again in the background until it is collected or turns
// into a VM the pod adopts.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/stale', () => {
  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  test('a collected placeholder frees its name; nothing is removed with vm rm', async () => {
    h = harness();
    const vm = h.cocoon.addVm('vk-stale-0', { state: 'creating', pid: 0 });
    h.cocoon.on(/^vm reconcile-stale-create /, () => {
      h!.cocoon.vms.delete(vm.id);
      return { stdout: JSON.stringify({ id: vm.id, outcome: 'collected' }), stderr: '' };
    });
    await h.provider.startupReconcile([]);
    assert.deepEqual(
      h.cocoon.callsOf('vm reconcile-stale-create').map((c) => c.argv),
      [['vm', 'reconcile-stale-create', vm.id, '-o', 'json']],
    );
    assert.equal(h.cocoon.callsOf('vm rm').length, 0);
    assert.equal(h.cocoon.vms.size, 0);
  });

  test('a busy placeholder is asked again until its clone finishes; then it is indexed for adoption', async () => {
    h = harness();
    // The killed daemon wrote its intent before the clone (the provenance ledger).
    await h.ledger.intend(
      'vm',
      'vk-stale-1',
      { namespace: 'ns', vmName: 'vk-stale-1', controllerUid: '' },
      { key: 'ns/stale-1', uid: 'u' },
    );
    const vm = h.cocoon.addVm('vk-stale-1', { state: 'creating', pid: 0 });
    h.cocoon.on(/^vm reconcile-stale-create /, () => ({
      stdout: JSON.stringify({ id: vm.id, outcome: vm.state === 'creating' ? 'busy' : 'not-creating' }),
      stderr: '',
    }));
    await h.provider.startupReconcile([]);
    assert.equal(h.cocoon.callsOf('vm reconcile-stale-create').length, 1);
    vm.state = 'running'; // the killed daemon's clone finished on its own
    await until('inspected again', () => h!.cocoon.callsOf('vm inspect').length >= 1, 5000);
    assert.equal(h.cocoon.callsOf('vm rm').length, 0, 'never removed by the provider');
    // Its pod adopts it: no second clone of the name.
    h.cocoon.snapshot('acme/agent');
    await h.provider.createPod(clonePod('stale-1'));
    await until(
      'bound',
      () => h!.provider.getPod('ns', 'stale-1')?.metadata?.annotations?.['vm.cocoonstack.io/id'] === vm.id,
    );
    assert.equal(h.cocoon.callsOf('vm clone').length, 0);
  });
});
