// DeletePod aborts a bring-up in flight (ops/abort.ts) instead of waiting behind it, with the
// same convergence: whatever the aborted bring-up made (a VM, or the `creating` placeholder of
// a killed clone) is removed by the delete, nothing is recorded as a failure, no VM is left.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { CliCallOptions } from '../../../src/cocoon/runner.ts';
import { hangUntilAborted } from '../fakes/cocoon.ts';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/delete-abort', () => {
  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));

  /** `vm reconcile-stale-create`: collects a placeholder whose creator is gone (cocoon's answer). */
  function collectPlaceholders(hh: Harness): void {
    hh.cocoon.on(/^vm reconcile-stale-create /, (argv) => {
      const id = argv[2] ?? '';
      const vm = hh.cocoon.vms.get(id);
      if (!vm) return { stdout: JSON.stringify({ id, outcome: 'not-found' }), stderr: '' };
      if (vm.state !== 'creating')
        return { stdout: JSON.stringify({ id, outcome: 'not-creating' }), stderr: '' };
      hh.cocoon.vms.delete(id);
      return { stdout: JSON.stringify({ id, outcome: 'collected' }), stderr: '' };
    });
  }

  describe('DeletePod aborts a bring-up in flight', () => {
    test('a clone that hangs: the call is killed, its placeholder collected, the pod deleted; no failure recorded', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      collectPlaceholders(h);
      let killed = false;
      h.cocoon.on(/^vm clone /, (argv: string[], opts: CliCallOptions) => {
        // cocoon reserves the name in a `creating` placeholder, then hangs.
        h!.cocoon.addVm(argv[argv.indexOf('--name') + 1] ?? '', { state: 'creating', pid: 0 });
        return hangUntilAborted(argv, opts).catch((err) => {
          killed = true;
          throw err;
        });
      });
      const pod = clonePod('slow-0');
      await h.provider.createPod(pod);
      await until('clone started', () => h!.cocoon.callsOf('vm clone').length === 1);
      await h.provider.deletePod(h.provider.getPod('ns', 'slow-0') as V1Pod);
      assert.equal(killed, true, 'the clone call was aborted');
      assert.equal(h.cocoon.vms.size, 0, 'no VM, no placeholder left');
      assert.equal(h.cocoon.callsOf('vm reconcile-stale-create').length, 1);
      assert.equal(h.provider.getPod('ns', 'slow-0'), undefined, 'the pod is forgotten');
      assert.deepEqual(states(h, 'slow-0'), ['creating'], 'no failed published');
      assert.deepEqual(
        h.events.filter((e) => e.type === 'Warning'),
        [],
        'no Warning for an aborted bring-up',
      );
    });

    test('a pull that never ends: the delete does not wait for it; a pull ending later makes no VM', async () => {
      let finishPull: () => void = () => {};
      const pulled = new Promise<void>((r) => {
        finishPull = r;
      });
      h = harness({
        puller: {
          ensure: async () => {
            await pulled;
            h?.cocoon.snapshot('acme/agent');
          },
        },
      });
      await h.provider.createPod(clonePod('cold-0'));
      await until('pull started', () => h!.cocoon.callsOf('snapshot inspect').length === 1);
      await h.provider.deletePod(h.provider.getPod('ns', 'cold-0') as V1Pod);
      assert.equal(h.provider.getPod('ns', 'cold-0'), undefined);
      finishPull();
      await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
      assert.equal(h.cocoon.callsOf('vm clone').length, 0, 'the aborted bring-up never clones');
      assert.equal(h.cocoon.vms.size, 0);
    });

    test('a clone that made its VM but is killed settling: the delete removes the VM by name', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      h.cocoon.on(/^vm clone /, (argv: string[], opts: CliCallOptions) => {
        h!.cocoon.addVm(argv[argv.indexOf('--name') + 1] ?? '', { state: 'running' });
        return hangUntilAborted(argv, opts);
      });
      await h.provider.createPod(clonePod('made-0'));
      await until('clone started', () => h!.cocoon.callsOf('vm clone').length === 1);
      const [vm] = [...h.cocoon.vms.values()];
      await h.provider.deletePod(h.provider.getPod('ns', 'made-0') as V1Pod);
      assert.equal(h.cocoon.vms.size, 0);
      assert.deepEqual(
        h.cocoon.callsOf('vm rm').map((c) => c.argv.at(-1)),
        [vm?.id],
      );
    });

    test('a placeholder still busy fails the delete (retried); the retry collects it', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      let busy = true;
      h.cocoon.on(/^vm reconcile-stale-create /, (argv) => {
        const id = argv[2] ?? '';
        if (busy) return { stdout: JSON.stringify({ id, outcome: 'busy' }), stderr: '' };
        h!.cocoon.vms.delete(id);
        return { stdout: JSON.stringify({ id, outcome: 'collected' }), stderr: '' };
      });
      h.cocoon.on(/^vm clone /, (argv: string[], opts: CliCallOptions) => {
        h!.cocoon.addVm(argv[argv.indexOf('--name') + 1] ?? '', { state: 'creating', pid: 0 });
        return hangUntilAborted(argv, opts);
      });
      await h.provider.createPod(clonePod('busy-0'));
      await until('clone started', () => h!.cocoon.callsOf('vm clone').length === 1);
      const copy = h.provider.getPod('ns', 'busy-0') as V1Pod;
      await assert.rejects(h.provider.deletePod(copy), /placeholder .* is not collected yet \(busy\)/);
      assert.equal(h.cocoon.vms.size, 1, 'kept until cocoon collects it');
      busy = false;
      await h.provider.deletePod(copy);
      assert.equal(h.cocoon.vms.size, 0);
      assert.equal(h.provider.getPod('ns', 'busy-0'), undefined);
    });
  });
});
