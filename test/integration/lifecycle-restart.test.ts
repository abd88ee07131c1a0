// Never stranded (lifecycle.md §10.9): the provider SIGKILLed during the fixup, during the IP
// wait, and between the `post-clone-state=failed` write and the lifecycle `failed` write; the
// apiserver unreachable around the decision. Every pod still reaches `ready` or `failed`.
// The outage stops the apiserver, so the file runs on a control plane of its own.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { startApiserver, stopApiserver } from '../../ground/cluster.ts';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import {
  annotate,
  fixture,
  guestCalls,
  leaseFor,
  lifecycle,
  postClone,
  simVm,
  staticSeed,
} from './helpers.ts';

const world = useWorld({ deferDaemon: true, privateGround: true });
let w: World;

function pod(name: string, vmName: string, image: string, extra: Record<string, string> = {}): V1Pod {
  return vmPod(name, w.nodeName, {
    'vm.cocoonstack.io/name': vmName,
    'cocoonset.cocoonstack.io/image': image,
    'cocoonset.cocoonstack.io/managed': 'true',
    ...extra,
  });
}

before(async () => {
  w = await world();
  await fixture(w, 'win/base', 'windows');
  await fixture(w, 'lin/static-oci', 'linux', [staticSeed(w, 0, 17, 22).seed]);
  await fixture(w, 'lin/dhcp', 'linux');
  await w.simulator.setKnobs({
    dhcp: {
      windowsApipaWedge: false,
      vms: [
        { match: '^vk-kill-ipwait', leaseDelayMs: 25_000 },
        { match: '^vk-outage', leaseDelayMs: 15_000 },
      ],
    },
    // The first fixup attempt of vk-kill-fixup takes 20 s, so the kill lands inside it.
    exec: [{ match: '^vk-kill-fixup', argvRegex: 'systemd-networkd', delayMs: 20_000, times: 1 }],
  });
  await w.restart();
});

test('SIGKILL during the IP wait: after the restart the pod reaches ready', async () => {
  const ns = w.namespace;
  await w.core.createNamespacedPod({
    namespace: ns,
    body: pod('kill-ipwait', 'vk-kill-ipwait', 'win/base', { 'cocoonset.cocoonstack.io/os': 'windows' }),
  });
  await waitForPod(w.core, ns, 'kill-ipwait', 'IP wait running', (p) => postClone(p) === 'done', 60_000);
  await w.daemon.kill();
  await w.restart();
  const p = await waitForPod(w.core, ns, 'kill-ipwait', 'ready', (x) => lifecycle(x) === 'ready', 90_000);
  const vm = await simVm(w, 'vk-kill-ipwait');
  assert.equal(p.status?.podIP, leaseFor(w, vm?.network_configs[0]?.mac ?? '')?.ip);
});

test('SIGKILL during the fixup: the fixup runs again after the restart and the pod reaches ready', async () => {
  const ns = w.namespace;
  await w.core.createNamespacedPod({
    namespace: ns,
    body: pod('kill-fixup', 'vk-kill-fixup', 'lin/static-oci'),
  });
  await waitForPod(w.core, ns, 'kill-fixup', 'fixup running', (p) => postClone(p) === 'running', 60_000);
  await w.daemon.kill();
  const restartedAt = Date.now();
  await w.restart();
  const p = await waitForPod(w.core, ns, 'kill-fixup', 'ready', (x) => lifecycle(x) === 'ready', 90_000);
  assert.equal(postClone(p), 'done');
  // The killed process's exec is still sleeping in the guest; the new process ran its own.
  const after = guestCalls(w, 'vk-kill-fixup').filter((c) => Date.parse(c.ts) >= restartedAt);
  assert.ok(after.length >= 1, 'the fixup ran again after the restart');
});

test('killed between post-clone-state=failed and lifecycle failed: the restart publishes failed, no new exec', async () => {
  const ns = w.namespace;
  await w.core.createNamespacedPod({ namespace: ns, body: pod('lost-failed', 'vk-lost-failed', 'lin/dhcp') });
  await waitForPod(w.core, ns, 'lost-failed', 'ready', (x) => lifecycle(x) === 'ready', 60_000);
  await w.daemon.kill();
  // What the apiserver holds when the process died right after the marker write.
  await annotate(w.core, ns, 'lost-failed', {
    'vm.cocoonstack.io/lifecycle-state': 'creating',
    'vm.cocoonstack.io/post-clone-state': 'failed',
    'vm.cocoonstack.io/post-clone-errors': 'attempt 1: exit status 1 (output: Error: boom)',
  });
  const before = guestCalls(w, 'vk-lost-failed').length;
  await w.restart();
  const p = await waitForPod(w.core, ns, 'lost-failed', 'failed', (x) => lifecycle(x) === 'failed', 30_000);
  assert.equal(
    p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'],
    'attempt 1: exit status 1 (output: Error: boom)',
  );
  assert.equal(guestCalls(w, 'vk-lost-failed').length, before);
});

test('apiserver unreachable around the decision: published within 15 s of recovery, no duplicate events', async (t) => {
  const ns = w.namespace;
  const cluster = w.ground.cluster;
  await w.core.createNamespacedPod({ namespace: ns, body: pod('outage', 'vk-outage', 'lin/dhcp') });
  await waitForPod(
    w.core,
    ns,
    'outage',
    'VM bound',
    (p) => !!p.metadata?.annotations?.['vm.cocoonstack.io/id'],
    60_000,
  );
  const vm = await simVm(w, 'vk-outage');
  const mac = vm?.network_configs[0]?.mac ?? '';
  await stopApiserver(cluster);
  try {
    // The lease (and so the ready decision) arrives while the apiserver is down.
    await waitFor('lease during the outage', () => leaseFor(w, mac) !== undefined, 60_000, 200);
    await new Promise((r) => setTimeout(r, 20_000));
  } finally {
    await startApiserver(cluster);
    // Keep the shared ground's record of the apiserver PID current for its teardown.
    writeFileSync(join(cluster.dir, 'cluster.json'), JSON.stringify(cluster, null, 2));
    writeFileSync(join(w.ground.dir, 'ground.json'), JSON.stringify(w.ground, null, 2));
  }
  const recovered = Date.now();
  await waitForPod(w.core, ns, 'outage', 'ready', (x) => lifecycle(x) === 'ready', 30_000);
  const took = Date.now() - recovered;
  t.diagnostic(`ready published ${took} ms after the apiserver came back`);
  assert.ok(took <= 15_000 + 2000, `published ${took} ms after recovery`);
  const ev = await w.core.listNamespacedEvent({ namespace: ns, fieldSelector: 'involvedObject.name=outage' });
  const keys = ev.items.map((e) => `${e.reason}|${e.message}`);
  assert.equal(new Set(keys).size, keys.length, `duplicate events: ${keys.join(', ')}`);
});
