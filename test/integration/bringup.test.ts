// Pod → VM bring-up (pod-to-vm.md §2–§3): exact cocoon argv for clone and run modes, CPU
// policy and restore-mode flags, unmanaged pods, and bad input (invalid annotations, a
// missing snapshot, a backend mismatch, a hibernate request) ending in a visible `failed`
// with an event — never a crash, never a VM.
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { cliCalls, fixture, lifecycle } from './helpers.ts';

const world = useWorld();
let w: World;

before(async () => {
  w = await world();
  await fixture(w, 'acme/agent', 'linux');
  await fixture(w, 'acme/agent:v3', 'linux');
  await fixture(w, 'acme/win', 'windows');
  await fixture(w, 'acme/fc', 'firecracker');
});

function create(
  name: string,
  annotations: Record<string, string>,
  resources?: V1Pod['spec'],
): Promise<unknown> {
  const body = vmPod(name, w.nodeName, annotations);
  if (resources?.containers?.[0]?.resources)
    body.spec!.containers[0]!.resources = resources.containers[0].resources;
  return w.core.createNamespacedPod({ namespace: w.namespace, body });
}

const argvOf = (verb: string, vmName: string) =>
  cliCalls(w).find((c) => c.argv[0] === 'vm' && c.argv[1] === verb && c.argv.includes(vmName))?.argv;

async function events(name: string): Promise<{ reason: string; type: string; message: string }[]> {
  const list = await w.core.listNamespacedEvent({
    namespace: w.namespace,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => ({ reason: e.reason ?? '', type: e.type ?? '', message: e.message ?? '' }));
}

describe('clone', () => {
  test('tag-aware snapshot name, --pull for a base image, restore mode and CPU policy flags', async () => {
    await create(
      'clone-tagged',
      {
        'vm.cocoonstack.io/name': 'vk-b-clone',
        'cocoonset.cocoonstack.io/image': 'acme/agent:v3',
        'cocoonset.cocoonstack.io/managed': 'true',
        'cocoonset.cocoonstack.io/network': 'cocoon-dhcp',
      },
      { containers: [{ name: 'agent', resources: { requests: { cpu: '2' }, limits: { cpu: '4' } } }] },
    );
    await waitForPod(w.core, w.namespace, 'clone-tagged', 'ready', (p) => lifecycle(p) === 'ready');
    assert.deepEqual(argvOf('clone', 'vk-b-clone'), [
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-b-clone',
      '--network',
      'cocoon-dhcp',
      '--pull',
      '--restore-mode',
      'ondemand',
      '--cpu-weight',
      '79',
      '--cpu-quota-us',
      '400000',
      '--cpu-period-us',
      '100000',
      'acme/agent:v3',
    ]);
  });

  test('Windows clones always restore with copy; Firecracker never gets --restore-mode', async () => {
    await create('clone-win', {
      'vm.cocoonstack.io/name': 'vk-b-win',
      'cocoonset.cocoonstack.io/image': 'acme/win',
      'cocoonset.cocoonstack.io/os': 'windows',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    await create('clone-fc', {
      'vm.cocoonstack.io/name': 'vk-b-fc',
      'cocoonset.cocoonstack.io/image': 'acme/fc',
      'vm.cocoonstack.io/backend': 'firecracker',
      'vm.cocoonstack.io/no-direct-io': 'true',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    await waitFor(
      'both clones',
      () => argvOf('clone', 'vk-b-win') !== undefined && argvOf('clone', 'vk-b-fc') !== undefined,
      60_000,
      200,
    );
    assert.deepEqual(argvOf('clone', 'vk-b-win'), [
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-b-win',
      '--pull',
      '--restore-mode',
      'copy',
      '--cpu-weight',
      '1',
      'acme/win',
    ]);
    assert.deepEqual(argvOf('clone', 'vk-b-fc'), [
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-b-fc',
      '--pull',
      '--cpu-weight',
      '1',
      'acme/fc',
    ]);
  });

  test('a snapshot of another backend is refused with the exact message', async () => {
    await create('clone-mismatch', {
      'vm.cocoonstack.io/name': 'vk-b-mismatch',
      'cocoonset.cocoonstack.io/image': 'acme/fc',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    const p = await waitForPod(
      w.core,
      w.namespace,
      'clone-mismatch',
      'failed',
      (x) => lifecycle(x) === 'failed',
    );
    assert.equal(
      p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'],
      'snapshot acme/fc was taken with firecracker but CocoonSet requests cloud-hypervisor',
    );
    assert.ok(
      (await events('clone-mismatch')).some(
        (e) => e.reason === 'CreateBringUpFailed' && e.type === 'Warning',
      ),
    );
    assert.equal(argvOf('clone', 'vk-b-mismatch'), undefined, 'no clone was attempted');
  });

  test('a missing snapshot without a registry fails with the exact message', async () => {
    await create('clone-missing', {
      'vm.cocoonstack.io/name': 'vk-b-missing',
      'cocoonset.cocoonstack.io/image': 'acme/nope',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    const p = await waitForPod(
      w.core,
      w.namespace,
      'clone-missing',
      'failed',
      (x) => lifecycle(x) === 'failed',
    );
    assert.equal(
      p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'],
      'snapshot acme/nope not found locally and no registry configured',
    );
  });
});

describe('a guest that cannot run the fixup', () => {
  test('the guest`s own stderr reaches the attempt errors (a Windows pod on a Linux snapshot: no powershell)', async () => {
    await create('fixup-no-sh', {
      'vm.cocoonstack.io/name': 'vk-b-no-sh',
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/os': 'windows',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    // Each failed attempt is a Warning with the guest's own output (post-clone.md, attempts).
    let message = '';
    await waitFor(
      'a PostCloneExecAttemptFailed event',
      async () => {
        message =
          (await events('fixup-no-sh')).find((e) => e.reason === 'PostCloneExecAttemptFailed')?.message ?? '';
        return message !== '';
      },
      30_000,
      200,
    );
    assert.match(message, /^attempt 1: exit status 127 \(output: sh: 1: powershell: not found\)/);
    const p = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'fixup-no-sh' });
    assert.equal(lifecycle(p), 'creating', 'never ready on a fixup the guest could not run');
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'fixup-no-sh' });
    await waitForPodGone(w.core, w.namespace, 'fixup-no-sh', 60_000);
  });
});

describe('run mode', () => {
  test('image pull then vm run with CPU, memory, storage and --windows flags', async () => {
    await create(
      'run-0',
      {
        'vm.cocoonstack.io/name': 'vk-b-run',
        'cocoonset.cocoonstack.io/image': 'https://cloud-images.example/win2022.qcow2',
        'cocoonset.cocoonstack.io/mode': 'Run',
        'cocoonset.cocoonstack.io/os': 'windows',
        'cocoonset.cocoonstack.io/storage': '40Gi',
        'cocoonset.cocoonstack.io/managed': 'true',
      },
      {
        containers: [
          { name: 'agent', resources: { requests: { cpu: '500m', memory: '4Gi' }, limits: { cpu: '2' } } },
        ],
      },
    );
    const p = await waitForPod(w.core, w.namespace, 'run-0', 'ready', (x) => lifecycle(x) === 'ready');
    const pull = cliCalls(w).find(
      (c) => c.argv[0] === 'image' && c.argv.includes('https://cloud-images.example/win2022.qcow2'),
    );
    assert.deepEqual(pull?.argv, ['image', 'pull', 'https://cloud-images.example/win2022.qcow2']);
    assert.deepEqual(argvOf('run', 'vk-b-run'), [
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-b-run',
      '--cpu',
      '2',
      '--cpu-weight',
      '20',
      '--cpu-quota-us',
      '200000',
      '--cpu-period-us',
      '100000',
      '--memory',
      '4294967296',
      '--storage',
      '42949672960',
      '--windows',
      'https://cloud-images.example/win2022.qcow2',
    ]);
    // Run mode is not a cloned boot: no fixup, no IP wait (Go parity).
    assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'], undefined);
  });
});

describe('unmanaged and bad input', () => {
  test('an unmanaged pod adopts its pre-written id/ip after one read-only inspect, and delete leaves the VM alone', async () => {
    const out = await w.sim([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-b-static-vm',
      '--pull',
      'acme/agent',
    ]);
    const id = (JSON.parse(out) as { id: string }).id;
    const before = cliCalls(w).length;
    await create('static-0', {
      'vm.cocoonstack.io/name': 'vk-b-static',
      'vm.cocoonstack.io/id': id,
      'vm.cocoonstack.io/ip': '10.1.2.3',
    });
    const p = await waitForPod(w.core, w.namespace, 'static-0', 'ready', (x) => lifecycle(x) === 'ready');
    assert.equal(p.status?.podIP, '10.1.2.3');
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'static-0' });
    await waitForPodGone(w.core, w.namespace, 'static-0');
    const mine = cliCalls(w)
      .slice(before)
      .filter(
        (c) => c.argv.includes(id) || c.argv.includes('vk-b-static') || c.argv.includes('vk-b-static-vm'),
      )
      .map((c) => c.argv.join(' '));
    assert.deepEqual(mine, [`vm inspect ${id}`], 'only the validating inspect: the VM is never touched');
    const vms = JSON.parse(await w.sim(['vm', 'list', '-o', 'json'])) as { id: string }[];
    assert.ok(
      vms.some((v) => v.id === id),
      'the VM is still there after the delete',
    );
  });

  test('invalid annotations: Warning naming the key, lifecycle failed, no VM', async () => {
    await create('bad-0', {
      'vm.cocoonstack.io/name': 'vk-b-bad',
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/managed': 'true',
      'cocoonset.cocoonstack.io/mode': 'teleport',
      'vm.cocoonstack.io/backend': 'qemu',
    });
    const p = await waitForPod(w.core, w.namespace, 'bad-0', 'failed', (x) => lifecycle(x) === 'failed');
    const msg = p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
    assert.match(msg, /cocoonset\.cocoonstack\.io\/mode/);
    assert.match(msg, /unsupported backend "qemu"/);
    const ev = await events('bad-0');
    assert.ok(ev.some((e) => e.type === 'Warning' && e.message.includes('cocoonset.cocoonstack.io/mode')));
    assert.equal(argvOf('clone', 'vk-b-bad'), undefined);
  });

  test('hibernate without a registry saves locally: hibernated, no VM, no id; withdrawn, it wakes from the local copy', async () => {
    await create('hib-0', {
      'vm.cocoonstack.io/name': 'vk-b-hib',
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/managed': 'true',
    });
    const first = await waitForPod(w.core, w.namespace, 'hib-0', 'ready', (x) => lifecycle(x) === 'ready');
    const { annotate } = await import('./helpers.ts');
    await annotate(w.core, w.namespace, 'hib-0', { 'vm.cocoonstack.io/hibernate': 'true' });
    const p = await waitForPod(
      w.core,
      w.namespace,
      'hib-0',
      'hibernated',
      (x) => lifecycle(x) === 'hibernated',
    );
    assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'], undefined);
    // The event follows the lifecycle write (the recorder posts it on its own queue): waited
    // for, not read at once.
    await waitFor(
      'the Hibernated event saying "saved locally"',
      async () =>
        (await events('hib-0')).some(
          (e) => e.reason === 'Hibernated' && e.type === 'Normal' && /saved locally/.test(e.message ?? ''),
        ),
      30_000,
      200,
    );
    await annotate(w.core, w.namespace, 'hib-0', { 'vm.cocoonstack.io/hibernate': null });
    const woken = await waitForPod(
      w.core,
      w.namespace,
      'hib-0',
      'ready again',
      (x) => lifecycle(x) === 'ready',
    );
    const id = woken.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
    assert.ok(id && id !== first.metadata?.annotations?.['vm.cocoonstack.io/id']);
  });

  test('generation echo: a bumped generation is re-stamped on the current state', async () => {
    const { annotate } = await import('./helpers.ts');
    await annotate(w.core, w.namespace, 'clone-tagged', { 'cocoonset.cocoonstack.io/generation': '7' });
    await waitForPod(
      w.core,
      w.namespace,
      'clone-tagged',
      'observed generation 7',
      (p) =>
        p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-observed-generation'] === '7' &&
        lifecycle(p) === 'ready',
    );
  });
});
