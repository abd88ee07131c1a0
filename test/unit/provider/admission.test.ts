// CreatePod admission in process (src/provider/cocoon/admit.ts): a pod that does not fit is
// rejected like the kubelet rejects it (Failed, OutOf<resource>, no VM), counted on the VMs'
// real sizes; and the VK_MAX_VM_STORAGE cap.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/admission', () => {
  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const GiB = 1024 ** 3;
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));
  const rejection = (hh: Harness, name: string) =>
    hh.statuses.filter((p) => p.metadata?.name === name && p.status?.phase === 'Failed').at(-1)?.status;
  const clones = (hh: Harness) => hh.cocoon.callsOf('vm clone').length;
  const withCpu = (pod: V1Pod, cpu: string): V1Pod => ({
    ...pod,
    spec: {
      ...pod.spec,
      containers: [{ name: 'agent', image: 'acme/agent', resources: { requests: { cpu } } }],
    },
  });

  describe('admission', () => {
    test('past VK_NODE_PODS a pod is rejected OutOfpods: Failed status, Warning, no VM; a repeat says the same', async () => {
      h = harness({ env: { VK_NODE_PODS: '2' } });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('a'));
      await h.provider.createPod(clonePod('b'));
      await until('two clones', () => clones(h!) === 2);
      const c = clonePod('c');
      await h.provider.createPod(c);
      const s = rejection(h, 'c');
      assert.equal(s?.phase, 'Failed');
      assert.equal(s?.reason, 'OutOfpods');
      assert.equal(
        s?.message,
        "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
      );
      assert.deepEqual(
        h.events.filter((e) => e.pod === 'ns/c').map((e) => [e.type, e.reason]),
        [['Warning', 'OutOfpods']],
      );
      assert.equal(h.provider.getPod('ns', 'c'), undefined);
      assert.deepEqual(states(h, 'c'), []);
      // A repeated CreatePod of the rejected pod repeats the verdict, even once room is made.
      await h.provider.deletePod(h.provider.getPod('ns', 'a') as V1Pod);
      await h.provider.createPod(c);
      assert.equal(
        h.statuses.filter((p) => p.metadata?.name === 'c' && p.status?.phase === 'Failed').length,
        2,
      );
      assert.equal(h.events.filter((e) => e.pod === 'ns/c').length, 1);
      // A new pod takes the freed place.
      await h.provider.createPod(clonePod('d'));
      await until('d cloned', () => clones(h!) === 3);
      assert.equal(rejection(h, 'd'), undefined);
    });

    test('a clone counts at its source snapshot size once known: OutOfcpu with the kubelet message', async () => {
      h = harness({ allocatable: { pods: 100, cpuMilli: 3000n, memoryBytes: 64n * BigInt(GiB) } });
      h.cocoon.snapshot('acme/agent', { cpu: 2, memory: GiB });
      // The pod asks for 100m, but its VM is the snapshot's 2 vCPUs.
      await h.provider.createPod(withCpu(clonePod('first'), '100m'));
      await until(
        'first bound',
        () => !!h!.provider.getPod('ns', 'first')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
      );
      await h.provider.createPod(withCpu(clonePod('second'), '100m'));
      const s = rejection(h, 'second');
      assert.equal(s?.reason, 'OutOfcpu');
      assert.equal(
        s?.message,
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 2000, capacity: 3000",
      );
      assert.equal(clones(h), 1);
    });

    test('OutOfmemory on the clone source memory', async () => {
      h = harness({ allocatable: { pods: 100, cpuMilli: 100_000n, memoryBytes: 3n * BigInt(GiB) } });
      h.cocoon.snapshot('acme/agent', { cpu: 1, memory: 2 * GiB });
      await h.provider.createPod(clonePod('m1'));
      await until('m1 cloned', () => clones(h!) === 1);
      await h.provider.createPod(clonePod('m2'));
      assert.equal(rejection(h, 'm2')?.reason, 'OutOfmemory');
    });

    test('a failed create without a VM counts as a pod but not its cpu; a deleted pod not at all', async () => {
      h = harness({ allocatable: { pods: 2, cpuMilli: 2000n, memoryBytes: undefined } });
      h.cocoon.snapshot('acme/agent');
      // No registry: the absent source fails the create for good; it held 2 cpu at admission.
      await h.provider.createPod(
        withCpu(clonePod('broken', { 'cocoonset.cocoonstack.io/image': 'acme/absent' }), '2'),
      );
      await until('broken failed', () => states(h!, 'broken').includes('failed'));
      await h.provider.createPod(withCpu(clonePod('next'), '2'));
      await until('next cloned', () => clones(h!) === 1);
      assert.equal(rejection(h, 'next'), undefined);
      // Two pods tracked: a third is out of pods until one is deleted.
      await h.provider.createPod(clonePod('third'));
      assert.equal(rejection(h, 'third')?.reason, 'OutOfpods');
      await h.provider.deletePod(h.provider.getPod('ns', 'broken') as V1Pod);
      await h.provider.createPod(clonePod('fourth'));
      assert.equal(rejection(h, 'fourth'), undefined);
    });
  });

  describe('VK_MAX_VM_STORAGE', () => {
    const runPod = (name: string, storage: string) =>
      clonePod(name, {
        'cocoonset.cocoonstack.io/mode': 'run',
        'cocoonset.cocoonstack.io/image': 'ghcr.io/acme/agent:1',
        'cocoonset.cocoonstack.io/storage': storage,
      });

    test('a run pod asking for more than the cap fails naming the cap; no vm run', async () => {
      h = harness({ env: { VK_MAX_VM_STORAGE: '100Gi' } });
      await h.provider.createPod(runPod('big', '200Gi'));
      await until('big failed', () => states(h!, 'big').includes('failed'));
      const msg = h.patches('big').find((a) => a['vm.cocoonstack.io/lifecycle-state-message'])?.[
        'vm.cocoonstack.io/lifecycle-state-message'
      ];
      assert.match(String(msg), /VK_MAX_VM_STORAGE=107374182400 bytes/);
      assert.equal(h.cocoon.callsOf('vm run').length, 0);
    });

    test('at the cap it runs; the default cap is 1Ti and 0 disables it', async () => {
      h = harness({ env: { VK_MAX_VM_STORAGE: '100Gi' } });
      h.cocoon.on(/^vm run /, (argv) => ({ stdout: '', stderr: `${argv.length}` }));
      await h.provider.createPod(runPod('fits', '100Gi'));
      await until('vm run', () => h!.cocoon.callsOf('vm run').length === 1);
      h.close();
      h = harness();
      await h.provider.createPod(runPod('huge', '2Ti'));
      await until('huge failed', () => states(h!, 'huge').includes('failed'));
      assert.equal(h.cocoon.callsOf('vm run').length, 0);
      h.close();
      h = harness({ env: { VK_MAX_VM_STORAGE: '0' } });
      h.cocoon.on(/^vm run /, () => ({ stdout: '', stderr: '' }));
      await h.provider.createPod(runPod('uncapped', '2Ti'));
      await until('vm run uncapped', () => h!.cocoon.callsOf('vm run').length === 1);
    });
  });
});
