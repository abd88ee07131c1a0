// Restart writes (issue 9; docs/contracts/lifecycle.md R7, docs/decisions.md "Writes per
// bring-up"), in process with the framework's real status writer: a restarted provider
// re-adopts a ready pod whose API copy is exactly what the previous incarnation published
// and writes nothing (the transition times, the start time and the probe's result are taken
// from the pod; the status writer compares with the API copy); a pod whose status is wrong
// gets exactly one corrective write. Also the status writer's comparison on its own.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { CONTENT_TYPE_MERGE_PATCH } from '../../../src/kube/rest.ts';
import { silentLogger } from '../../../src/log.ts';
import { PodStatusWriter, statusApplied } from '../../../src/pods/status-writer.ts';
import { PUBLISH_GRACE_MS } from '../../../src/provider/cocoon/publication/held.ts';
import type { FakeVm } from '../fakes/cocoon.ts';
import { fakeKube } from '../fakes/kube.ts';
import { clonePod, type Harness, harness, until } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/restart-writes', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const PROBE_PORT = 'vm.cocoonstack.io/probe-port';
  /** The MAC of the fake runner's first VM (see FakeCocoon.addVm). */
  const FIRST_MAC = '02:00:00:00:00:01';
  const HOUR_MS = 3_600_000;

  const open: Harness[] = [];
  afterEach(() => {
    for (const h of open.splice(0)) h.close();
  });
  const track = (h: Harness) => {
    open.push(h);
    return h;
  };
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  /** JSON as the apiserver stores it: times at whole seconds (metav1.Time), shifted `shiftMs`
   * into the past (published a while ago), plus the fields the apiserver adds. */
  function asStored(pod: V1Pod, shiftMs: number): V1Pod {
    const json = JSON.stringify(pod, (_k, v) =>
      typeof v === 'string' && /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/.test(v)
        ? `${new Date(Date.parse(v) - shiftMs).toISOString().slice(0, 19)}Z`
        : v,
    );
    const stored = JSON.parse(json) as V1Pod;
    const status = stored.status as V1PodStatus & Record<string, unknown>;
    status.qosClass = 'BestEffort';
    if (status.hostIP) status.hostIPs = [{ ip: status.hostIP }];
    for (const c of status.conditions ?? []) (c as unknown as Record<string, unknown>).lastProbeTime = null;
    return { ...stored, metadata: { ...stored.metadata, resourceVersion: '5000' } };
  }

  /** Incarnation 1: brings a clone pod up to `ready` and returns the pod as the apiserver
   * holds it afterwards (the tracked annotations and the last status the provider published),
   * with the VM and the lease the next incarnation finds. */
  async function previousIncarnation(name: string, extra: Record<string, string> = {}) {
    const h1 = track(harness());
    h1.cocoon.snapshot('acme/agent');
    h1.lease(FIRST_MAC, '10.0.0.5');
    await h1.provider.createPod(clonePod(name, extra));
    await until('ready', () => h1.provider.getPod('ns', name)?.metadata?.annotations?.[STATE] === 'ready');
    await sleep(PUBLISH_GRACE_MS + 100);
    const tracked = h1.provider.getPod('ns', name)!;
    const published = h1.statuses.filter((p) => p.metadata?.name === name).at(-1)!;
    assert.equal(published.status?.conditions?.find((c) => c.type === 'Ready')?.status, 'True');
    const vm = [...h1.cocoon.vms.values()][0]!;
    h1.close();
    open.splice(open.indexOf(h1), 1);
    return { api: asStored({ ...tracked, status: published.status }, HOUR_MS), vm };
  }

  /** Incarnation 2: a new provider with the real status writer adopts the pod at startup;
   * returns once its probe, reconcile and status queue had time to act. */
  async function restart(api: V1Pod, vm: FakeVm): Promise<Harness> {
    const h2 = track(harness({ realStatusWriter: true }));
    h2.cocoon.vms.set(vm.id, vm);
    h2.lease(FIRST_MAC, '10.0.0.5');
    await h2.provider.startupReconcile([api]);
    h2.statusWriter!.start((key) => (key === `ns/${api.metadata?.name}` ? api : undefined));
    await sleep(400); // the probe's first run, the reconcile, the status queue
    await h2.statusWriter!.idle();
    return h2;
  }

  // Both go to pods/status: a status write is a strategic merge patch, an annotation-only
  // write a JSON merge patch (publication/write.ts).
  const statusPatches = (h: Harness) =>
    h.kube.core
      .callsOf('patchNamespacedPodStatus')
      .filter((c) => c.headers['Content-Type'] !== CONTENT_TYPE_MERGE_PATCH);
  const podPatches = (h: Harness) =>
    h.kube.core
      .callsOf('patchNamespacedPodStatus')
      .filter((c) => c.headers['Content-Type'] === CONTENT_TYPE_MERGE_PATCH);

  describe('restart: a ready pod re-adopted by a new process', () => {
    test('published state already right: no write at all', async () => {
      const { api, vm } = await previousIncarnation('rs-ok');
      const h2 = await restart(api, vm);
      assert.equal(h2.provider.getPod('ns', 'rs-ok')?.metadata?.annotations?.[STATE], 'ready');
      assert.equal(statusPatches(h2).length, 0, JSON.stringify(statusPatches(h2).map((c) => c.params.body)));
      assert.equal(podPatches(h2).length, 0);
      // The provider's own view keeps the published times (no new transition).
      const view = h2.provider.getPodStatus('ns', 'rs-ok')!;
      const ready = view.conditions?.find((c) => c.type === 'Ready');
      assert.equal(ready?.status, 'True');
      assert.equal(
        new Date(ready!.lastTransitionTime!).toISOString(),
        new Date(
          String(api.status?.conditions?.find((c) => c.type === 'Ready')?.lastTransitionTime),
        ).toISOString(),
      );
      assert.equal(
        new Date(view.startTime!).toISOString(),
        new Date(String(api.status?.startTime)).toISOString(),
      );
    });

    test('with a probe port and Ready shown: the probe starts from ready, no write', async () => {
      const { api, vm } = await previousIncarnation('rs-port', { [PROBE_PORT]: '9' });
      // The previous incarnation's probe was green (the pod shows Ready=True).
      const status = api.status!;
      for (const c of status.conditions ?? [])
        if (c.type === 'Ready' || c.type === 'ContainersReady') c.status = 'True';
      status.containerStatuses![0]!.ready = true;
      const h2 = await restart(api, vm);
      assert.equal(statusPatches(h2).length, 0, JSON.stringify(statusPatches(h2).map((c) => c.params.body)));
      assert.equal(
        h2.provider.getPodStatus('ns', 'rs-port')?.conditions?.find((c) => c.type === 'Ready')?.status,
        'True',
      );
    });

    test('a status that is wrong (podIP lost): exactly one corrective write, transition times kept', async () => {
      const { api, vm } = await previousIncarnation('rs-wrong');
      delete api.status!.podIP;
      delete api.status!.podIPs;
      const h2 = await restart(api, vm);
      await sleep(300);
      await h2.statusWriter!.idle();
      const writes = statusPatches(h2);
      assert.equal(writes.length, 1, JSON.stringify(writes.map((c) => c.params.body)));
      assert.equal(podPatches(h2).length, 0);
      const body = writes[0]!.params.body as { metadata: { uid: string }; status: V1PodStatus };
      assert.equal(body.metadata.uid, api.metadata?.uid);
      assert.equal(body.status.podIP, '10.0.0.5');
      for (const type of ['Initialized', 'Ready', 'ContainersReady', 'PodScheduled']) {
        const was = api.status?.conditions?.find((c) => c.type === type)?.lastTransitionTime;
        const now = body.status.conditions?.find((c) => c.type === type)?.lastTransitionTime;
        assert.equal(new Date(now!).toISOString(), new Date(String(was)).toISOString(), type);
      }
    });
  });

  describe('the status writer compares with the API copy', () => {
    const t = new Date('2026-03-01T10:00:00.734Z');
    const want: V1PodStatus = {
      phase: 'Running',
      conditions: [
        { type: 'Initialized', status: 'True', lastTransitionTime: t },
        { type: 'Ready', status: 'True', lastTransitionTime: t },
      ],
      hostIP: '127.0.0.1',
      podIP: '10.0.0.5',
      podIPs: [{ ip: '10.0.0.5' }],
      startTime: t,
      containerStatuses: [
        {
          name: 'agent',
          image: 'acme/agent',
          imageID: '',
          ready: true,
          restartCount: 0,
          started: true,
          state: { running: { startedAt: t } },
        },
      ],
    };
    /** `want` as the apiserver returns it: strings at whole seconds, conditions reordered,
     * extra fields. */
    const stored = (): V1PodStatus =>
      ({
        phase: 'Running',
        qosClass: 'BestEffort',
        conditions: [
          { type: 'Ready', status: 'True', lastProbeTime: null, lastTransitionTime: '2026-03-01T10:00:00Z' },
          {
            type: 'Initialized',
            status: 'True',
            lastProbeTime: null,
            lastTransitionTime: '2026-03-01T10:00:00Z',
          },
        ],
        hostIP: '127.0.0.1',
        hostIPs: [{ ip: '127.0.0.1' }],
        podIP: '10.0.0.5',
        podIPs: [{ ip: '10.0.0.5' }],
        startTime: '2026-03-01T10:00:00Z',
        containerStatuses: [
          {
            name: 'agent',
            image: 'acme/agent',
            imageID: '',
            ready: true,
            restartCount: 0,
            started: true,
            lastState: {},
            state: { running: { startedAt: '2026-03-01T10:00:00Z' } },
          },
        ],
      }) as unknown as V1PodStatus;

    test('statusApplied: equal up to the wire format; any field the patch sets differs ⇒ false', () => {
      assert.equal(statusApplied(stored(), want), true);
      assert.equal(statusApplied(undefined, want), false);
      const moved = stored();
      (moved.conditions![0] as { lastTransitionTime: unknown }).lastTransitionTime = '2026-03-01T10:00:01Z';
      assert.equal(statusApplied(moved, want), false);
      const noIp = stored();
      delete noIp.podIP;
      assert.equal(statusApplied(noIp, want), false);
      // The patch clears a podIP the want lacks.
      const { podIP: _ip, podIPs: _ips, ...wantNoIp } = want;
      assert.equal(statusApplied(stored(), wantNoIp), false);
      const waiting = stored();
      (waiting.containerStatuses![0]!.state as Record<string, unknown>).waiting = {
        reason: 'ContainerCreating',
      };
      assert.equal(statusApplied(waiting, want), false);
      const notReady = stored();
      notReady.containerStatuses![0]!.ready = false;
      assert.equal(statusApplied(notReady, want), false);
    });

    const pod = (status: V1PodStatus, rv = '10'): V1Pod => ({
      metadata: { namespace: 'ns', name: 'p', uid: 'u1', resourceVersion: rv },
      status,
    });

    test('a status the API copy already carries is not written; a different one is', async () => {
      const fake = fakeKube();
      const w = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
      const live = pod(stored());
      w.start(() => live);
      w.notify(pod(want));
      await sleep(20);
      await w.idle();
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 0);
      // A resync re-asserting the same status: the API copy still carries it.
      w.reassert(pod(want));
      await sleep(20);
      await w.idle();
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 0);
      // Not ready any more: the API copy does not show that.
      w.notify(pod({ ...want, conditions: want.conditions!.map((c) => ({ ...c, status: 'False' })) }));
      await sleep(20);
      await w.idle();
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 1);
      w.stop();
    });

    test('a cache copy older than our own last write is not trusted', async () => {
      const fake = fakeKube();
      const w = new PodStatusWriter({ kube: fake.kube, log: silentLogger });
      const live = pod(stored(), '10'); // shows `want`; our write below makes it stale
      w.start(() => live);
      const notReady = { ...want, conditions: want.conditions!.map((c) => ({ ...c, status: 'False' })) };
      await w.writeNow(pod(notReady)); // answered with a resourceVersion above 10
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 1);
      w.notify(pod(want)); // back to Ready: the cache (rv 10) does not show our write yet
      await sleep(20);
      await w.idle();
      assert.equal(fake.core.callsOf('patchNamespacedPodStatus').length, 2);
      w.stop();
    });
  });
});
