// Hibernate and wake end to end (issue 10; docs/decisions.md "Hibernate and wake"): the real
// apiserver, the ground's real registry, the cocoon simulator with disk content, and crane
// reading what we pushed. Each world pushes under its own registry path. In the realistic
// timing world (lease 1–8 s, agent 2–20 s, clone 0.3–3 s), the three round trips at once.
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { readSnapshotIdentity } from '../../src/registry/identity.ts';
import { parseReference } from '../../src/registry/reference.ts';
import { annotate, type FixtureKind, fixture, isReady, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true, timing: 'realistic' });
let w: World;
let registry: RegistryClient;
let base: string;

before(async () => {
  w = await world();
  base = `${w.ground.registry.hostPort}/${w.namespace}`;
  registry = new RegistryClient({ base, credentials: [] });
  await w.restart({ OCI_REGISTRY: base });
});

const vmId = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';

async function head(vmName: string): Promise<number> {
  const r = await registry.headManifest(registry.repository(vmName), parseReference('hibernate'));
  return r === 'absent' ? 404 : 200;
}

async function readyPod(name: string, kind: FixtureKind): Promise<V1Pod> {
  await fixture(w, `hb/${name}`, kind);
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': `hb/${name}`,
      'cocoonset.cocoonstack.io/managed': 'true',
      ...(kind === 'firecracker' ? { 'vm.cocoonstack.io/backend': 'firecracker' } : {}),
      ...(kind === 'windows' ? { 'cocoonset.cocoonstack.io/os': 'windows' } : {}),
    }),
  });
  return await waitForPod(
    w.core,
    w.namespace,
    name,
    'ready',
    (p) => lifecycle(p) === 'ready' && isReady(p),
    90_000,
  );
}

describe('round trip: clone → ready → hibernate → hibernated → wake → ready', { concurrency: true }, () => {
  for (const kind of ['linux', 'firecracker', 'windows'] as const) {
    test(kind, async () => {
      const name = `rt-${kind.slice(0, 3)}`;
      const vmName = `vk-${name}`;
      const ready = await readyPod(name, kind);
      const firstId = vmId(ready);
      await w.simulator.diskWrite(vmName, `marker-${kind}`);
      await annotate(w.core, w.namespace, name, { 'vm.cocoonstack.io/hibernate': 'true' });
      const hib = await waitForPod(
        w.core,
        w.namespace,
        name,
        'hibernated',
        (p) => lifecycle(p) === 'hibernated',
        90_000,
      );
      assert.equal(vmId(hib), '');
      assert.equal(await head(vmName), 200);
      assert.equal(hib.status?.phase, 'Pending');
      // The manifest says whose state it is (a pod of another namespace never restores it).
      const id = await readSnapshotIdentity(registry, vmName, 'hibernate');
      assert.equal(id === 'absent' ? '' : id.namespace, w.namespace);
      await annotate(w.core, w.namespace, name, { 'vm.cocoonstack.io/hibernate': null });
      const woken = await waitForPod(
        w.core,
        w.namespace,
        name,
        'ready again',
        (p) => lifecycle(p) === 'ready' && isReady(p),
        90_000,
      );
      assert.notEqual(vmId(woken), '');
      assert.notEqual(vmId(woken), firstId);
      assert.equal(await w.simulator.diskRead(vmName), `marker-${kind}`);
      assert.equal(await head(vmName), 200, 'the :hibernate tag is never deleted on wake');
    });
  }
});
