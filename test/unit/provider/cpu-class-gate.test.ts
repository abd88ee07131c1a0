// The snapshot CPU-class gate in the provider (docs/decisions.md "Snapshot GC and the CPU-class
// gate"): CreatePod (and an UpdatePod of an untracked pod) refuses a mismatching pod with
// lifecycle `failed` and the Warning `snapshot_cpu_class_mismatch`, never a VM; startup refuses
// when a non-terminal pod mismatches, naming it, before any cocoon call.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/cpu-class-gate', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
  const LABEL = 'cocoonstack.io/snapshot-cpu-class';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  function classPod(name: string, cls: string, phase?: string): V1Pod {
    const pod = clonePod(name);
    return {
      ...pod,
      spec: { ...pod.spec!, nodeSelector: { [LABEL]: cls } },
      ...(phase ? { status: { phase } } : {}),
    };
  }

  const last = (hh: Harness, name: string, key: string) =>
    hh.patches(name).findLast((a) => a[key] !== undefined)?.[key];

  describe('CreatePod', () => {
    test('a mismatching pod is failed with the reason and never cloned', async () => {
      h = harness({ env: { VK_SNAPSHOT_CPU_CLASS: 'skylake' } });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(classPod('ice', 'icelake'));
      await until('failed', () => last(h!, 'ice', STATE) === 'failed');
      assert.match(
        String(last(h, 'ice', MESSAGE)),
        /snapshot-cpu-class="icelake".*VK_SNAPSHOT_CPU_CLASS \("skylake"\)/,
      );
      const ev = h.events.filter((e) => e.pod === 'ns/ice');
      assert.deepEqual(
        ev.map((e) => [e.type, e.reason]),
        [['Warning', 'snapshot_cpu_class_mismatch']],
      );
      assert.match(ev[0]!.message, /^create: /);
      assert.ok(!h.cocoon.calls.some((c) => c.argv[1] === 'clone'), 'no clone');
      assert.equal(h.cocoon.vms.size, 0);
      // An update of the same pod (our own writes echoed) does not re-run it.
      await h.provider.updatePod(classPod('ice', 'icelake'));
      assert.equal(h.cocoon.vms.size, 0);
    });

    test('an unset node class refuses any pod that names a class', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(classPod('any', 'skylake'));
      await until('failed', () => last(h!, 'any', STATE) === 'failed');
      assert.match(String(last(h, 'any', MESSAGE)), /\(unset\)/);
    });

    test('the matching class boots', async () => {
      h = harness({ env: { VK_SNAPSHOT_CPU_CLASS: 'skylake' } });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(classPod('sky', 'skylake'));
      await until('a VM', () => h!.cocoon.vms.size === 1);
      assert.ok(!h.events.some((e) => e.reason === 'snapshot_cpu_class_mismatch'));
    });
  });

  describe('startup', () => {
    test('a mismatching non-terminal pod refuses the startup, naming every such pod', async () => {
      h = harness({ env: { VK_SNAPSHOT_CPU_CLASS: 'skylake' } });
      await assert.rejects(
        h.provider.startupReconcile([
          classPod('a', 'icelake', 'Running'),
          classPod('b', 'zen4'),
          classPod('ok', 'skylake', 'Running'),
          classPod('done', 'icelake', 'Succeeded'),
        ]),
        (err: Error) =>
          /ns\/a \("icelake"\), ns\/b \("zen4"\)/.test(err.message) &&
          /VK_SNAPSHOT_CPU_CLASS \("skylake"\)/.test(err.message) &&
          !/ns\/ok|ns\/done/.test(err.message),
      );
      assert.equal(h.cocoon.calls.length, 0, 'refused before any cocoon call');
    });

    test('terminal mismatching pods do not block it', async () => {
      h = harness({ env: { VK_SNAPSHOT_CPU_CLASS: 'skylake' } });
      await h.provider.startupReconcile([
        classPod('done', 'icelake', 'Succeeded'),
        classPod('gone', 'icelake', 'Failed'),
      ]);
    });
  });
});
