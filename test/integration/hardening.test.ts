// Hardening of the bring-up half (docs/decisions.md: "Create failures", "VM ownership",
// "Decisions that must always be possible"): a failed create never loops and never flips
// `failed` back to `creating`; no pod destroys, shares or takes over a VM another pod holds;
// a generation that goes down, a clone that did not settle, a replaced VM and a hibernate
// request that arrived while the daemon was down all still reach a decision.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { newNamespace, vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { annotate, cliCalls, fixture, guestCalls, lifecycle, staticSeed } from './helpers.ts';

const world = useWorld();
let w: World;
const seen = new Map<string, string[]>();
const versions = new Map<string, number>();
let stopWatch: (() => void) | undefined;

const MANAGED = (vm: string, image = 'acme/agent', extra: Record<string, string> = {}) => ({
  'vm.cocoonstack.io/name': vm,
  'cocoonset.cocoonstack.io/image': image,
  'cocoonset.cocoonstack.io/managed': 'true',
  ...extra,
});

before(async () => {
  w = await world();
  await fixture(w, 'acme/agent', 'linux');
  await fixture(w, 'acme/static', 'linux', [staticSeed(w, 0, 20).seed]);
  await w.simulator.mergeKnobs({ dhcp: { vms: [{ match: '^vk-h-slow', leaseDelayMs: 6000 }] } });
  // Every version of every pod of this namespace: lifecycle sequence and write count.
  const watch = new Watch(w.kc);
  const req = await watch.watch(
    `/api/v1/pods`,
    {},
    (type: string, p: V1Pod) => {
      const key = `${p.metadata?.namespace}/${p.metadata?.name}`;
      if (type === 'DELETED') return;
      versions.set(key, (versions.get(key) ?? 0) + 1);
      const list = seen.get(key) ?? [];
      const state = lifecycle(p);
      if (list.at(-1) !== state) list.push(state);
      seen.set(key, list);
    },
    () => {},
  );
  stopWatch = () => req.abort();
});

after(() => stopWatch?.());

const create = (name: string, annotations: Record<string, string>, ns = w.namespace) =>
  w.core.createNamespacedPod({ namespace: ns, body: vmPod(name, w.nodeName, annotations) });
const read = (name: string, ns = w.namespace) => w.core.readNamespacedPod({ namespace: ns, name });
const message = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
const waitState = (name: string, state: string, ns = w.namespace, timeoutMs = 60_000) =>
  waitForPod(w.core, ns, name, `lifecycle ${state}`, (p) => lifecycle(p) === state, timeoutMs);

async function simVms(): Promise<{ id: string; name: string }[]> {
  const out = (await w.sim(['vm', 'list', '-o', 'json'])).trim();
  if (!out.startsWith('[')) return [];
  return (JSON.parse(out) as { id: string; config: { name: string } }[]).map((v) => ({
    id: v.id,
    name: v.config.name,
  }));
}

async function cloneByHand(name: string): Promise<string> {
  const out = await w.sim(['vm', 'clone', '--output', 'json', '--name', name, '--pull', 'acme/agent']);
  return (JSON.parse(out) as { id: string }).id;
}

async function events(name: string, ns = w.namespace) {
  const list = await w.core.listNamespacedEvent({
    namespace: ns,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => ({
    reason: e.reason ?? '',
    type: e.type ?? '',
    message: e.message ?? '',
    count: e.count ?? 1,
  }));
}

async function waitEvent(name: string, reason: string, ns = w.namespace) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const ev = await events(name, ns);
    const hit = ev.find((e) => e.reason === reason);
    if (hit) return hit;
    if (Date.now() > deadline) throw new Error(`no ${reason} event for ${name}: ${JSON.stringify(ev)}`);
    await sleep(200);
  }
}

/** `failed` followed later by `creating` in a watched lifecycle sequence. */
const flipsBack = (states: string[]) => {
  const i = states.indexOf('failed');
  return i >= 0 && states.slice(i + 1).includes('creating');
};

describe('a failed create does not loop', () => {
  test('a pod whose snapshot is missing, left alone 60 s: a handful of cocoon calls and writes, never failed → creating', async () => {
    await create('missing-0', MANAGED('vk-h-missing', 'acme/nothing-here'));
    await waitState('missing-0', 'failed');
    const key = `${w.namespace}/missing-0`;
    const calls = () => cliCalls(w).filter((c) => c.argv.join(' ').includes('nothing-here')).length;
    const callsAtFail = calls();
    const versionsAtFail = versions.get(key) ?? 0;
    // Edits that are not create inputs (a label) must not re-run the create either.
    await w.core.patchNamespacedPod(
      { namespace: w.namespace, name: 'missing-0', body: { metadata: { labels: { touched: 'yes' } } } },
      (await import('./helpers.ts')).mergePatch,
    );
    await sleep(60_000);
    const callsAfter = calls() - callsAtFail;
    const writesAfter = (versions.get(key) ?? 0) - versionsAtFail;
    const ev = await events('missing-0');
    const eventWrites = ev.reduce((n, e) => n + e.count, 0);
    console.log(
      `bad pod left alone 60 s: ${callsAfter} cocoon calls, ${writesAfter} pod versions (1 is our label), ${eventWrites} event writes in total`,
    );
    assert.equal(callsAfter, 0, 'no create re-run for our own writes or a label edit');
    assert.ok(writesAfter <= 2, `pod versions after the failure: ${writesAfter}`);
    assert.ok(eventWrites <= 4, `event writes: ${eventWrites}`);
    assert.ok(!flipsBack(seen.get(key) ?? []), `lifecycle sequence ${JSON.stringify(seen.get(key))}`);
    assert.match(message(await read('missing-0')), /snapshot acme\/nothing-here not found locally/);
  });

  test('an annotation fix re-runs the create; a generation bump re-runs it too', async () => {
    await create('fixme-0', MANAGED('vk-h-fixme', 'acme/absent'));
    await waitState('fixme-0', 'failed');
    await annotate(w.core, w.namespace, 'fixme-0', { 'cocoonset.cocoonstack.io/image': 'acme/agent' });
    await waitState('fixme-0', 'ready');

    await create(
      'bump-0',
      MANAGED('vk-h-bump', 'acme/later', { 'cocoonset.cocoonstack.io/generation': '1' }),
    );
    await waitState('bump-0', 'failed');
    const inspects = () =>
      cliCalls(w).filter((c) => c.argv.join(' ') === 'snapshot inspect acme/later').length;
    const before = inspects();
    await fixture(w, 'acme/later', 'linux');
    await sleep(1000);
    assert.equal(inspects(), before, 'same generation, same inputs: no re-run');
    await annotate(w.core, w.namespace, 'bump-0', { 'cocoonset.cocoonstack.io/generation': '2' });
    const p = await waitState('bump-0', 'ready');
    assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-observed-generation'], '2');
  });
});

describe('VM ownership', () => {
  test('two pods with one VM name never share it, across a restart; deleting the second keeps the first VM', async () => {
    const nsA = await newNamespace(w.core, 'team-a');
    const nsB = await newNamespace(w.core, 'team');
    await create('web-0', MANAGED('vk-team-a-web-0'), nsA);
    const first = await waitState('web-0', 'ready', nsA);
    const firstId = first.metadata?.annotations?.['vm.cocoonstack.io/id'];
    await create('a-web-0', MANAGED('vk-team-a-web-0'), nsB);
    const second = await waitState('a-web-0', 'failed', nsB);
    assert.match(message(second), new RegExp(`VM name vk-team-a-web-0 is already used by pod ${nsA}/web-0`));
    assert.equal(second.metadata?.annotations?.['vm.cocoonstack.io/id'], undefined);

    await w.daemon.kill();
    await w.restart();
    await sleep(2000);
    const again = await read('a-web-0', nsB);
    assert.equal(
      again.metadata?.annotations?.['vm.cocoonstack.io/id'],
      undefined,
      'not bound after the restart',
    );
    assert.notEqual(lifecycle(again), 'ready');
    await w.core.deleteNamespacedPod({ namespace: nsB, name: 'a-web-0' });
    await waitForPodGone(w.core, nsB, 'a-web-0');
    assert.ok(
      (await simVms()).some((v) => v.id === firstId),
      "the first pod's VM survives",
    );
    assert.equal(lifecycle(await read('web-0', nsA)), 'ready');
    assert.ok(!cliCalls(w).some((c) => c.argv.join(' ') === `vm rm --force ${firstId}`));
  });

  test('the orphan sweep keeps VMs referenced by an unmanaged pod and by a managed pod whose annotations stopped decoding', async () => {
    const handId = await cloneByHand('vk-h-handmade');
    await create('static-ref', {
      'vm.cocoonstack.io/name': 'vk-h-static-ref',
      'vm.cocoonstack.io/id': handId,
      'vm.cocoonstack.io/ip': '10.9.9.9',
    });
    await waitState('static-ref', 'ready');
    await create('edited-0', MANAGED('vk-h-edited'));
    const edited = await waitState('edited-0', 'ready');
    const editedId = edited.metadata?.annotations?.['vm.cocoonstack.io/id'];
    await annotate(w.core, w.namespace, 'edited-0', { 'vm.cocoonstack.io/backend': 'qemu' });
    await waitEvent('edited-0', 'UpdateInvalidAnnotations');
    await w.daemon.kill();
    await w.restart({ VK_ORPHAN_POLICY: 'destroy' });
    await sleep(2000);
    const ids = (await simVms()).map((v) => v.id);
    assert.ok(ids.includes(handId), "the unmanaged pod's VM is not an orphan");
    assert.ok(ids.includes(editedId ?? ''), 'an annotation edit never destroys a VM');
    assert.equal(lifecycle(await read('edited-0')), 'ready', 'its state is kept');
    const ev = await events('edited-0');
    assert.ok(
      ev.some((e) => e.reason === 'UpdateInvalidAnnotations' && e.message.includes('qemu')),
      JSON.stringify(ev),
    );
  });

  test('managed turned off on a live pod: Warning, and deleting the pod still removes its VM', async () => {
    await create('unmanage-0', MANAGED('vk-h-unmanage'));
    const p = await waitState('unmanage-0', 'ready');
    const id = p.metadata?.annotations?.['vm.cocoonstack.io/id'];
    await annotate(w.core, w.namespace, 'unmanage-0', { 'cocoonset.cocoonstack.io/managed': 'false' });
    await waitEvent('unmanage-0', 'ManagedFlagRemoved');
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'unmanage-0' });
    await waitForPodGone(w.core, w.namespace, 'unmanage-0');
    assert.ok(!(await simVms()).some((v) => v.id === id), 'the VM is removed with the pod, not leaked');
  });

  test("an unmanaged pod cannot take another tenant's VM by name, ID prefix or full ID", async () => {
    await create('owner-0', MANAGED('vk-h-owner'));
    const owner = await waitState('owner-0', 'ready');
    const ownerId = owner.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
    const attempts: [string, string, RegExp][] = [
      ['thief-name', 'vk-h-owner', /must be a full 26-character cocoon VM ID/],
      ['thief-prefix', ownerId.slice(0, 8), /must be a full 26-character cocoon VM ID/],
      ['thief-full', ownerId, new RegExp(`VM ${ownerId} is already bound to pod ${w.namespace}/owner-0`)],
      ['thief-ghost', 'A'.repeat(26), /no VM with id A{26} exists on this node/],
    ];
    for (const [name, id] of attempts) {
      await create(name, {
        'vm.cocoonstack.io/name': `vk-h-${name}`,
        'vm.cocoonstack.io/id': id,
        'vm.cocoonstack.io/ip': '10.1.1.1',
      });
    }
    for (const [name, , re] of attempts) {
      const p = await waitState(name, 'failed');
      assert.match(message(p), re, name);
      assert.notEqual(p.status?.podIP, '10.1.1.1');
    }
    for (const [name] of attempts) {
      await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
      await waitForPodGone(w.core, w.namespace, name);
    }
    assert.ok(
      (await simVms()).some((v) => v.id === ownerId),
      'the victim VM is untouched',
    );
  });

  test("deleting a pod that asked for another pod's VM name never removes that VM's snapshots", async () => {
    await create('snapowner-0', MANAGED('vk-h-snapowner'));
    await waitState('snapowner-0', 'ready');
    await fixture(w, 'vk-h-snapowner', 'linux'); // a local snapshot named after the VM
    await create('snapthief-0', MANAGED('vk-h-snapowner'));
    await waitState('snapthief-0', 'failed');
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'snapthief-0' });
    await waitForPodGone(w.core, w.namespace, 'snapthief-0');
    assert.ok(
      !cliCalls(w).some(
        (c) => c.argv.join(' ').startsWith('snapshot rm') && c.argv.includes('vk-h-snapowner'),
      ),
    );
    await w.sim(['snapshot', 'inspect', 'vk-h-snapowner']);
  });
});

describe('decisions that must always be possible', () => {
  test('generation 5 → 1, and 3 → garbage, while waiting for the lease: ready is still published', async () => {
    await create(
      'gen-0',
      MANAGED('vk-h-slow-gen', 'acme/agent', { 'cocoonset.cocoonstack.io/generation': '5' }),
    );
    await waitForPod(
      w.core,
      w.namespace,
      'gen-0',
      'bound',
      (p) => !!p.metadata?.annotations?.['vm.cocoonstack.io/id'],
    );
    await annotate(w.core, w.namespace, 'gen-0', { 'cocoonset.cocoonstack.io/generation': '1' });
    const p = await waitState('gen-0', 'ready', w.namespace, 30_000);
    assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-observed-generation'], '5');

    await create(
      'gen-1',
      MANAGED('vk-h-slow-gen1', 'acme/agent', { 'cocoonset.cocoonstack.io/generation': '3' }),
    );
    await waitForPod(
      w.core,
      w.namespace,
      'gen-1',
      'bound',
      (x) => !!x.metadata?.annotations?.['vm.cocoonstack.io/id'],
    );
    await annotate(w.core, w.namespace, 'gen-1', { 'cocoonset.cocoonstack.io/generation': 'garbage' });
    const q = await waitState('gen-1', 'ready', w.namespace, 30_000);
    assert.equal(q.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-observed-generation'], '3');
  });

  test('a clone whose follow-up inspect failed is adopted; a name taken by a VM vk-cocoon did not make is refused and the VM kept', async () => {
    await w.simulator.mergeKnobs({
      quirks: { clonePidZero: true },
      faults: [
        { argvRegex: '^vm inspect ', match: '^vk-h-unsettled$', error: 'database is locked', times: 1 },
      ],
    });
    try {
      await create('unsettled-0', MANAGED('vk-h-unsettled'));
      const p = await waitState('unsettled-0', 'ready');
      const vm = (await simVms()).find((v) => v.name === 'vk-h-unsettled');
      assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'], vm?.id);
    } finally {
      await w.simulator.mergeKnobs({ quirks: { clonePidZero: false }, faults: null });
    }
    // A VM made on the host outside Kubernetes is never bound to a managed pod that names it
    // (docs/security.md, rule adopt-unowned), and deleting that pod leaves it alone.
    const takenId = await cloneByHand('vk-h-taken');
    await create('taken-0', MANAGED('vk-h-taken'));
    const t = await waitState('taken-0', 'failed');
    assert.match(message(t), /rule adopt-unowned/);
    assert.equal(t.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '', '');
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'taken-0' });
    await waitForPodGone(w.core, w.namespace, 'taken-0');
    assert.deepEqual(
      (await simVms()).filter((v) => v.name === 'vk-h-taken').map((v) => v.id),
      [takenId],
      'the host VM survives',
    );
  });

  test('a replacement VM gets its own fixup: the previous VM`s done marker does not skip it', async () => {
    await create('marker-0', MANAGED('vk-h-marker', 'acme/static'));
    const first = await waitState('marker-0', 'ready');
    assert.equal(first.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'], 'done');
    const execsBefore = guestCalls(w, 'vk-h-marker').length;
    await w.daemon.kill();
    await w.sim(['__sim', 'delete-behind-back', 'vk-h-marker']);
    await w.restart();
    const second = await waitForPod(
      w.core,
      w.namespace,
      'marker-0',
      'a new VM, ready',
      (p) =>
        lifecycle(p) === 'ready' &&
        p.metadata?.annotations?.['vm.cocoonstack.io/id'] !==
          first.metadata?.annotations?.['vm.cocoonstack.io/id'],
      60_000,
    );
    assert.equal(second.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'], 'done');
    assert.ok(guestCalls(w, 'vk-h-marker').length > execsBefore, 'the fixup ran again for the new VM');
  });

  test('a hibernate request that arrived while the daemon was down is resumed at startup', async () => {
    await create('hib-down-0', MANAGED('vk-h-hibdown'));
    await waitState('hib-down-0', 'ready');
    await w.daemon.kill();
    await annotate(w.core, w.namespace, 'hib-down-0', { 'vm.cocoonstack.io/hibernate': 'true' });
    await w.restart();
    // Without a registry the state is saved locally; the VM and its id are gone.
    const p = await waitState('hib-down-0', 'hibernated', w.namespace, 20_000);
    assert.equal(message(p), '');
    assert.equal(p.metadata?.annotations?.['vm.cocoonstack.io/id'], undefined);
  });
});
