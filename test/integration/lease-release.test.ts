// DHCP lease release on the production path (docs/contracts/cocoon-cli.md "Lease release"): the
// ground's daemon talks to the simulator's cocoon-net control socket (sim/netctl.ts), so a
// delete, a hibernate and a VM death each send `DELETE /v1/leases/<mac>` for the VM's NIC, the
// lease leaves the lease file at once (not at its expiry), and the daemon counts it released.
// In the realistic timing world (lease 1–8 s, agent 2–20 s, clone 0.3–3 s), the tests at once.
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { annotate, fixture, isReady, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true, timing: 'realistic' });
let w: World;

before(async () => {
  w = await world();
  await fixture(w, 'lr/base', 'linux');
  await w.restart({ OCI_REGISTRY: `${w.ground.registry.hostPort}/${w.namespace}` });
  assert.ok(w.simulator.netControlSocket, "the simulator serves cocoon-net's control socket");
});

async function readyPod(name: string): Promise<{ pod: V1Pod; mac: string }> {
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': 'lr/base',
      'cocoonset.cocoonstack.io/managed': 'true',
    }),
  });
  const pod = await waitForPod(
    w.core,
    w.namespace,
    name,
    'ready',
    (p) => lifecycle(p) === 'ready' && isReady(p),
    90_000,
  );
  const ip = pod.status?.podIP ?? '';
  const lease = w.simulator.leases().find((l) => l.ip === ip);
  assert.ok(lease, `the lease of ${ip}`);
  return { pod, mac: lease.mac.toLowerCase() };
}

async function released(mac: string, from: number): Promise<void> {
  await waitFor(
    `DELETE /v1/leases/${mac} on the control socket`,
    () =>
      w.simulator
        .netControlRequests()
        .slice(from)
        .some((r) => r.method === 'DELETE' && r.mac === mac && r.status === 204),
    30_000,
    50,
  );
  const r = w.simulator
    .netControlRequests()
    .slice(from)
    .find((x) => x.mac === mac);
  assert.equal(r?.released, 1, 'the lease existed and was removed');
  assert.ok(!w.simulator.leases().some((l) => l.mac.toLowerCase() === mac), 'gone from the lease file');
}

describe('each path releases the lease', { concurrency: true }, () => {
  test('delete: the lease is released through the control socket once the VM is removed', async () => {
    const { mac } = await readyPod('lr-del');
    const from = w.simulator.netControlRequests().length;
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'lr-del' });
    await waitForPodGone(w.core, w.namespace, 'lr-del', 60_000);
    await released(mac, from);
    const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
    assert.match(text, /^cocoon_vk_lease_release_total\{result="released"\} [1-9]/m);
  });

  test('hibernate: the lease is released before the VM is saved and removed', async () => {
    const { mac } = await readyPod('lr-hib');
    const from = w.simulator.netControlRequests().length;
    await annotate(w.core, w.namespace, 'lr-hib', { 'vm.cocoonstack.io/hibernate': 'true' });
    await waitForPod(
      w.core,
      w.namespace,
      'lr-hib',
      'hibernated',
      (p) => lifecycle(p) === 'hibernated',
      90_000,
    );
    await released(mac, from);
  });

  test('VM death: a VM crashed twice within 30 s is removed and its lease released', async () => {
    const { mac } = await readyPod('lr-die');
    const from = w.simulator.netControlRequests().length;
    for (let i = 0; i < 2; i++) {
      const r = await w.simulator.run(['__sim', 'crash', 'vk-lr-die']);
      assert.equal(r.code, 0, r.stderr);
      if (i === 0)
        await waitFor(
          'restarted',
          async () => (await w.simulator.run(['vm', 'inspect', 'vk-lr-die'])).stdout.includes('"running"'),
          15_000,
          50,
        );
    }
    await released(mac, from);
  });
});

test('the control socket refuses what cocoon-net refuses', async () => {
  const socket = w.simulator.netControlSocket ?? '';
  const ask = (method: string, path: string) =>
    new Promise<number>((resolve, reject) => {
      const req = process
        .getBuiltinModule('node:http')
        .request({ socketPath: socket, method, path }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        });
      req.on('error', reject);
      req.end();
    });
  assert.equal(await ask('GET', '/v1/leases/02:00:00:00:00:01'), 405);
  assert.equal(await ask('DELETE', '/v1/lease/02:00:00:00:00:01'), 404);
  assert.equal(await ask('DELETE', '/v1/leases/not-a-mac'), 400);
  assert.equal(await ask('DELETE', '/v1/leases/02:00:00:00:00:99'), 204, 'no lease: nothing to release');
});
