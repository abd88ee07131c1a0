// Issue 18 against the real apiserver and the simulator: DeletePod aborts a bring-up in flight
// (a clone that would take two minutes: the pod is gone in seconds, and neither the VM nor the
// clone's `creating` placeholder is left), and CreatePod admission past VK_NODE_PODS (the
// kubelet's Failed / OutOfpods status, no VM).
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { cliCalls, fixture, lifecycle, podEvents, simVm } from './helpers.ts';

// Two pods fit: the admission test fills the node.
const world = useWorld({ env: { VK_NODE_PODS: '2' } });
let w: World;

before(async () => {
  w = await world();
  await fixture(w, 'acme/agent', 'linux');
});

const managed = (vmName: string) => ({
  'vm.cocoonstack.io/name': vmName,
  'cocoonset.cocoonstack.io/image': 'acme/agent',
  'cocoonset.cocoonstack.io/managed': 'true',
});

describe('DeletePod aborts a bring-up in flight', () => {
  test('a pod deleted mid-clone is deleted promptly; no VM and no placeholder are left', async () => {
    // Every clone now sleeps 2 minutes after reserving its name (a `creating` placeholder).
    await w.simulator.mergeKnobs({ latency: { 'vm clone': 120_000 } });
    try {
      await w.core.createNamespacedPod({
        namespace: w.namespace,
        body: vmPod('slow', w.nodeName, managed('vk-ad-slow')),
      });
      await waitFor(
        'the clone started',
        async () => (await simVm(w, 'vk-ad-slow')) !== undefined,
        60_000,
        100,
      );
      const placeholder = JSON.parse(await w.sim(['vm', 'inspect', 'vk-ad-slow'])) as { state: string };
      assert.equal(placeholder.state, 'creating');
      const t0 = performance.now();
      await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'slow' });
      // Far less than the clone's 2 minutes: the delete did not wait behind it.
      await waitForPodGone(w.core, w.namespace, 'slow', 60_000);
      const seconds = (performance.now() - t0) / 1000;
      assert.ok(seconds < 60, `deleted after ${seconds.toFixed(1)} s`);
      assert.equal(await simVm(w, 'vk-ad-slow'), undefined, 'no VM and no placeholder of that name');
      assert.ok(
        cliCalls(w).some((c) => c.argv[0] === 'vm' && c.argv[1] === 'reconcile-stale-create'),
        'the placeholder was collected by cocoon',
      );
    } finally {
      await w.simulator.mergeKnobs({ latency: { 'vm clone': null } } as never);
    }
  });
});

describe('admission', () => {
  test('past VK_NODE_PODS a pod is rejected like the kubelet does: Failed, OutOfpods, no VM', async () => {
    for (const name of ['fit-0', 'fit-1'])
      await w.core.createNamespacedPod({
        namespace: w.namespace,
        body: vmPod(name, w.nodeName, managed(`vk-ad-${name}`)),
      });
    for (const name of ['fit-0', 'fit-1'])
      await waitForPod(w.core, w.namespace, name, 'ready', (p) => lifecycle(p) === 'ready', 60_000);
    await w.core.createNamespacedPod({
      namespace: w.namespace,
      body: vmPod('over', w.nodeName, managed('vk-ad-over')),
    });
    const p = await waitForPod(
      w.core,
      w.namespace,
      'over',
      'Failed',
      (x) => x.status?.phase === 'Failed',
      60_000,
    );
    assert.equal(p.status?.reason, 'OutOfpods');
    assert.equal(
      p.status?.message,
      "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
    );
    assert.equal(lifecycle(p), '', 'never claimed');
    assert.equal(await simVm(w, 'vk-ad-over'), undefined, 'no VM');
    const events = await podEvents(w.core, w.namespace, 'over');
    assert.ok(
      events.some((e) => e.reason === 'OutOfpods' && e.type === 'Warning'),
      JSON.stringify(events),
    );
    // The rejected pod deletes like any terminal pod.
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'over' });
    await waitForPodGone(w.core, w.namespace, 'over', 60_000);
  });
});
