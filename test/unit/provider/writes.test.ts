// Writes per bring-up (issue 9; docs/decisions.md "Writes per bring-up", docs/contracts/
// lifecycle.md R8), in process: the claim writes `creating` with the Pending status; the bind
// (id, ip, Running) is held for the next write; `ready` goes out with the status (podIP,
// PodReady, the probe's result when it has no port of its own) in ONE pods/status patch;
// a held state is written on its own once the grace is over; a failed write holds its part
// again. Also the merged write of the status writer itself, and the aggregation of a
// bring-up's per-attempt Warnings into one Event.
import assert from 'node:assert/strict';
import { afterEach, describe, mock, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { PodStatusWriter } from '../../../src/pods/status-writer.ts';
import { PUBLISH_GRACE_MS } from '../../../src/provider/cocoon/publication/held.ts';
import { apiError, fakeKube } from '../fakes/kube.ts';
import { clonePod, type Harness, harness, type PodWrite, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/writes', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const OBSERVED = 'vm.cocoonstack.io/lifecycle-observed-generation';
  const VM_ID = 'vm.cocoonstack.io/id';
  const VM_IP = 'vm.cocoonstack.io/ip';
  const POST_CLONE = 'vm.cocoonstack.io/post-clone-state';
  const READINESS = 'vm.cocoonstack.io/Readiness';
  /** The MAC of the fake runner's first VM (see FakeCocoon.addVm). */
  const FIRST_MAC = '02:00:00:00:00:01';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    mock.timers.reset();
  });

  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));
  const cond = (w: PodWrite | undefined, type: string) => w?.status?.conditions?.find((c) => c.type === type);
  const bound = (hh: Harness, name: string) =>
    !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID];

  describe('a DHCP clone', () => {
    test('two writes: creating with the Pending status, then ONE status write carrying podIP, Ready and the ready annotations; two cocoon calls', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent', { image: 'ghcr.io/acme/agent:1' });
      h.lease(FIRST_MAC, '10.0.0.5'); // the lease is there when the VM is bound
      await h.provider.createPod(clonePod('w-dhcp'));
      await until('ready', () => states(h!, 'w-dhcp').includes('ready'));
      await sleep(PUBLISH_GRACE_MS + 200); // nothing held is left for the timer
      const writes = h.writes('w-dhcp');
      assert.equal(writes.length, 2, JSON.stringify(writes, null, 1));
      const [claim, ready] = writes;
      assert.equal(claim!.kind, 'status');
      assert.equal(claim!.annotations?.[STATE], 'creating');
      assert.equal(claim!.status?.phase, 'Pending');
      assert.equal(claim!.status?.podIP, undefined);
      assert.equal(ready!.kind, 'status');
      const vm = [...h.cocoon.vms.values()][0]!;
      assert.equal(ready!.annotations?.[STATE], 'ready');
      assert.equal(ready!.annotations?.[OBSERVED], '0');
      assert.equal(ready!.annotations?.[VM_ID], vm.id);
      assert.equal(ready!.annotations?.[VM_IP], '10.0.0.5');
      assert.equal(ready!.status?.phase, 'Running');
      assert.equal(ready!.status?.podIP, '10.0.0.5');
      // No probe port: "an IP resolved" is the probe's success, in the same write.
      assert.equal(cond(ready, 'Ready')?.status, 'True');
      assert.equal(cond(ready, 'ContainersReady')?.status, 'True');
      assert.equal(cond(ready, READINESS)?.reason, 'Ready');
      // Every status handed to the status writer afterwards is that same Ready one.
      for (const s of h.statuses.slice(h.statuses.findIndex((p) => p.status === ready!.status)))
        assert.equal(s.status?.conditions?.find((c) => c.type === 'Ready')?.status, 'True');
      // `snapshot inspect` and `vm clone --pull`: no `image inspect` for the base image.
      assert.deepEqual(
        h.cocoon.calls.map((c) => c.argv.slice(0, 2).join(' ')),
        ['snapshot inspect', 'vm clone'],
      );
      assert.ok(h.cocoon.callsOf('vm clone')[0]!.argv.includes('--pull'));
    });

    test('an IP wait longer than the grace: the id and the Running status go out in one write, then ready', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('w-slow'));
      await until('bound', () => bound(h!, 'w-slow'));
      await sleep(PUBLISH_GRACE_MS - 500);
      assert.equal(h.writes('w-slow').length, 1, 'within the grace only the claim is written');
      await until('the held write', () => h!.writes('w-slow').length === 2, PUBLISH_GRACE_MS + 1500);
      const held = h.writes('w-slow')[1]!;
      assert.equal(held.kind, 'status');
      assert.equal(held.annotations?.[STATE], undefined, 'no lifecycle change');
      assert.equal(held.annotations?.[VM_ID], [...h.cocoon.vms.values()][0]!.id);
      assert.equal(held.status?.phase, 'Running');
      assert.equal(held.status?.podIP, undefined);
      assert.equal(cond(held, 'Ready')?.status, 'False');
      assert.equal(cond(held, READINESS)?.reason, 'WaitingForLease');
      h.lease(FIRST_MAC, '10.0.0.6');
      await until('ready', () => states(h!, 'w-slow').includes('ready'));
      const writes = h.writes('w-slow');
      assert.equal(writes.length, 3);
      assert.equal(writes[2]!.status?.podIP, '10.0.0.6');
      assert.equal(cond(writes[2], 'Ready')?.status, 'True');
    });

    test('with a probe port the ready write carries Ready=False until the probe answers (a follow-up write)', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      h.lease(FIRST_MAC, '127.0.0.1');
      // Port 1 on loopback refuses connections: the TCP probe never turns green.
      await h.provider.createPod(clonePod('w-port', { 'vm.cocoonstack.io/probe-port': '1' }));
      await until('ready', () => states(h!, 'w-port').includes('ready'));
      const ready = h.writes('w-port').at(-1)!;
      assert.equal(ready.annotations?.[STATE], 'ready');
      assert.equal(ready.status?.podIP, '127.0.0.1');
      assert.equal(cond(ready, 'Ready')?.status, 'False');
    });

    test('a held write that failed is held again: the next write carries it', async () => {
      let failHeld = true;
      h = harness({
        statusWriter: async (_pod, o) => {
          if (failHeld && o.annotations?.[VM_ID] && !o.annotations[STATE]) {
            failHeld = false;
            throw apiError(500, 'etcdserver: request timed out');
          }
        },
      });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('w-retry'));
      await until('bound', () => bound(h!, 'w-retry'));
      await until('the held write was tried', () => !failHeld, PUBLISH_GRACE_MS + 1500);
      assert.equal(h.writes('w-retry').length, 1, 'the failed write did not land');
      h.lease(FIRST_MAC, '10.0.0.8');
      await until('ready', () => states(h!, 'w-retry').includes('ready'));
      const ready = h.writes('w-retry').at(-1)!;
      // The bind's clearing of the post-clone keys was held again and rides along.
      assert.ok(ready.annotations && POST_CLONE in ready.annotations, JSON.stringify(ready.annotations));
      assert.equal(ready.annotations[VM_ID], [...h.cocoon.vms.values()][0]!.id);
    });
  });

  describe('a ready pod', () => {
    test('an IP change (cocoon-net rebound the MAC) moves the ip annotation and podIP in one write', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      h.lease(FIRST_MAC, '10.0.0.5');
      const pod = clonePod('w-move');
      await h.provider.createPod(pod);
      await until('ready', () => states(h!, 'w-move').includes('ready'));
      const before = h.writes('w-move').length;
      h.lease(FIRST_MAC, '10.0.0.55');
      // The API copy (with every annotation written so far) comes back: only the IP is news.
      await h.provider.updatePod(withAnnotations(pod, Object.assign({}, ...h.patches('w-move')), '900000'));
      await until('moved', () => h!.writes('w-move').length > before);
      await sleep(50);
      const added = h.writes('w-move').slice(before);
      assert.equal(added.length, 1, JSON.stringify(added));
      assert.equal(added[0]!.kind, 'status');
      assert.equal(added[0]!.annotations?.[VM_IP], '10.0.0.55');
      assert.equal(added[0]!.status?.podIP, '10.0.0.55');
      assert.equal(cond(added[0], 'Ready')?.status, 'True');
    });
  });

  describe('a clone with a post-clone fixup', () => {
    test('four writes: creating, running (with the id and Running), done, ready with podIP and Ready', async () => {
      h = harness();
      h.cocoon.snapshot('acme/static', { staticIp: '10.0.0.9' });
      await h.provider.createPod(clonePod('w-fix', { 'cocoonset.cocoonstack.io/image': 'acme/static' }));
      await until('ready', () => states(h!, 'w-fix').includes('ready'));
      await sleep(50);
      const writes = h.writes('w-fix');
      assert.deepEqual(
        writes.map((w) => [w.kind, w.annotations?.[STATE] ?? w.annotations?.[POST_CLONE] ?? '']),
        [
          ['status', 'creating'],
          ['status', 'running'],
          ['annotations', 'done'],
          ['status', 'ready'],
        ],
      );
      assert.equal(writes[1]!.annotations?.[VM_ID], [...h.cocoon.vms.values()][0]!.id);
      assert.equal(writes[1]!.status?.phase, 'Running');
      assert.equal(writes[3]!.status?.podIP, '10.0.0.9');
      assert.equal(cond(writes[3], 'Ready')?.status, 'True');
      assert.deepEqual(
        h.cocoon.calls.map((c) => c.argv.slice(0, 2).join(' ')),
        ['snapshot inspect', 'vm clone', 'vm exec'],
      );
    });
  });

  describe('the status writer', () => {
    test('writeNow carries annotations in the same UID-fenced pods/status patch and supersedes an older pending status', async () => {
      const fake = fakeKube();
      const writer = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
      const pod: V1Pod = { metadata: { namespace: 'ns', name: 'p', uid: 'uid-p' } };
      // An older status waits for the pod to reach the cache.
      writer.notify({ ...pod, status: { phase: 'Pending' } });
      const rv = await writer.writeNow(
        { ...pod, status: { phase: 'Running', podIP: '10.0.0.3' } },
        { annotations: { [STATE]: 'ready', [VM_IP]: '10.0.0.3', gone: null }, priority: 'normal' },
      );
      const calls = fake.core.callsOf('patchNamespacedPodStatus');
      assert.equal(calls.length, 1);
      assert.equal(calls[0]!.headers['Content-Type'], 'application/strategic-merge-patch+json');
      const body = calls[0]!.params.body;
      assert.deepEqual(body.metadata, {
        uid: 'uid-p',
        annotations: { [STATE]: 'ready', [VM_IP]: '10.0.0.3', gone: null },
      });
      assert.equal(body.status.podIP, '10.0.0.3');
      assert.equal(typeof rv, 'string');
      assert.equal(fake.core.callsOf('patchNamespacedPod').length, 0, 'no patch of the pod itself');
      // The pod reaches the cache: the superseded Pending status is not written after it.
      writer.start(() => ({ ...pod, status: { phase: 'Pending' } }));
      writer.podChanged('ns/p');
      await writer.idle();
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 1);
      writer.stop();
    });

    test('a pod whose API phase is terminal gets its annotations but never a status', async () => {
      const fake = fakeKube();
      const writer = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
      const pod: V1Pod = { metadata: { namespace: 'ns', name: 't', uid: 'uid-t' } };
      writer.start(() => ({ ...pod, status: { phase: 'Succeeded' } }));
      await writer.writeNow({ ...pod, status: { phase: 'Running' } }, { annotations: { [STATE]: 'failed' } });
      await writer.writeNow({ ...pod, status: { phase: 'Running' } });
      const calls = fake.core.callsOf('patchNamespacedPodStatus');
      assert.equal(calls.length, 1);
      assert.deepEqual(calls[0]!.params.body, {
        metadata: { uid: 'uid-t', annotations: { [STATE]: 'failed' } },
      });
      writer.stop();
    });

    test('writeNow without annotations sends no metadata.annotations', async () => {
      const fake = fakeKube();
      const writer = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
      await writer.writeNow({
        metadata: { namespace: 'ns', name: 'q', uid: 'uid-q' },
        status: { phase: 'Running' },
      });
      assert.deepEqual(fake.core.callsOf('patchNamespacedPodStatus')[0]!.params.body.metadata, {
        uid: 'uid-q',
      });
      writer.stop();
    });
  });

  describe('events of a bring-up', () => {
    test("per-attempt Warnings are one Event whose count is patched, as the kubelet's recorder aggregates", async () => {
      mock.timers.enable({ apis: ['setTimeout'] });
      h = harness({ recorder: true });
      h.cocoon.snapshot('acme/agent');
      let locked = 3;
      h.cocoon.on(/^snapshot inspect /, (argv) => {
        if (locked-- > 0) throw new CocoonCommandError(argv, 'database is locked', 'database is locked', 1);
        return {
          stdout: JSON.stringify({ id: 's', name: 'acme/agent', image: '', hypervisor: 'cloud-hypervisor' }),
          stderr: '',
        };
      });
      await h.provider.createPod(clonePod('w-flaky'));
      const attempts = () => h!.cocoon.callsOf('snapshot inspect').length;
      await until('attempt 1', () => attempts() === 1);
      await until('event 1', () => h!.kube.core.callsOf('createNamespacedEvent').length === 1);
      for (const [n, ms] of [
        [2, 10_000],
        [3, 20_000],
        [4, 40_000],
      ] as const) {
        mock.timers.tick(ms);
        await until(`attempt ${n}`, () => attempts() === n);
        await h.recorder!.idle();
      }
      await until('cloned', () => h!.cocoon.callsOf('vm clone').length === 1);
      await h.recorder!.idle();
      const warnings = h.events.filter((e) => e.reason === 'CreateBringUpFailed');
      assert.equal(warnings.length, 3, 'the provider reported every attempt');
      const creates = h.kube.core.callsOf('createNamespacedEvent');
      assert.equal(creates.length, 1, 'one Event object');
      assert.equal(creates[0]!.params.body.reason, 'CreateBringUpFailed');
      assert.equal(creates[0]!.params.body.involvedObject.name, 'w-flaky');
      const patches = h.kube.core.callsOf('patchNamespacedEvent');
      assert.ok(patches.length >= 1 && patches.length <= 2, `${patches.length} count patches`);
      assert.equal(patches.at(-1)!.params.body.count, 3);
      assert.match(patches.at(-1)!.params.body.message, /^create: .*database is locked; retrying$/);
    });
  });
});
