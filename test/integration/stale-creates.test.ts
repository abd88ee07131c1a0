// A daemon SIGKILLed during 20 concurrent clones (issue 11; docs/contracts/pod-to-vm.md
// "Stale creates"): after the restart every placeholder is collected or adopted, every pod
// ends ready or failed with a reason, no VM name stays blocked and no VM is left without a
// pod. The killed daemon's `cocoon` children run on in their own process group (as with the
// real cocoon), so some clones finish after the kill: those VMs are adopted, never cloned twice.
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { fixture, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
const N = 20;

before(async () => {
  w = await world();
  await fixture(w, 'st/base', 'linux');
  // Each clone holds its `creating` placeholder for 2–4 s: the kill lands among them.
  await w.simulator.mergeKnobs({ latency: { 'vm clone': { ms: 2000, jitterMs: 2000 } } });
  await w.restart();
});

type Listed = { id: string; state: string; config?: { name?: string } };
async function vms(): Promise<Listed[]> {
  const r = await w.simulator.run(['vm', 'list', '-o', 'json']);
  const text = r.stdout.trim();
  return text.startsWith('[') ? (JSON.parse(text) as Listed[]) : [];
}

test('SIGKILL during 20 concurrent clones: every pod decided, placeholders collected or adopted, nothing leaked', async () => {
  const names = Array.from({ length: N }, (_, i) => `st-${i}`);
  await Promise.all(
    names.map((name) =>
      w.core.createNamespacedPod({
        namespace: w.namespace,
        body: vmPod(name, w.nodeName, {
          'vm.cocoonstack.io/name': `vk-${name}`,
          'cocoonset.cocoonstack.io/image': 'st/base',
          'cocoonset.cocoonstack.io/managed': 'true',
        }),
      }),
    ),
  );
  await waitFor(
    'placeholders in creating',
    async () => (await vms()).filter((v) => v.state === 'creating').length >= 5,
    60_000,
    50,
  );
  await w.daemon.kill();
  const atKill = await vms();
  const creatingAtKill = atKill.filter((v) => v.state === 'creating').length;
  assert.ok(creatingAtKill >= 1, 'the kill landed among the clones');
  await w.restart();

  const decided = (p: V1Pod) =>
    lifecycle(p) === 'ready' ||
    (lifecycle(p) === 'failed' &&
      (p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '') !== '');
  const pods = await Promise.all(
    names.map((name) =>
      waitForPod(w.core, w.namespace, name, 'ready or failed with a reason', decided, 120_000),
    ),
  );
  const failed = pods.filter((p) => lifecycle(p) === 'failed');
  assert.deepEqual(
    failed.map(
      (p) => `${p.metadata?.name}: ${p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message']}`,
    ),
    [],
    'every pod reaches ready (a stale create never blocks its name)',
  );
  // Nothing left creating, one VM per pod, each the one its pod names.
  await waitFor(
    'no placeholder left',
    async () => (await vms()).every((v) => v.state !== 'creating'),
    60_000,
    200,
  );
  const after = await vms();
  const ids = new Set(pods.map((p) => p.metadata?.annotations?.['vm.cocoonstack.io/id']));
  assert.equal(
    after.length,
    N,
    `one VM per pod (found ${after.map((v) => `${v.config?.name}:${v.state}`).join(', ')})`,
  );
  for (const vm of after) assert.ok(ids.has(vm.id), `VM ${vm.config?.name} (${vm.id}) is held by its pod`);
  console.log(`# ${creatingAtKill} placeholders creating at the kill; ${N} pods ready after the restart`);
});
