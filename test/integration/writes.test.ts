// Writes per bring-up (issue 9; docs/decisions.md "Writes per bring-up", docs/contracts/
// lifecycle.md R8): against the real apiserver and the simulator, one pod at a time, a watch
// on the pod records every version the apiserver stored, the daemon's
// `cocoon_vk_api_writes_total` counts its writes (its own node heartbeats subtracted) and the
// simulator's calls record counts the `cocoon` invocations of the bring-up.
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import { PatchStrategy, setHeaderOptions, type V1Pod, Watch } from '@kubernetes/client-node';
import { adminClients, newNamespace, vmPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { fixture, isReady, lifecycle, staticSeed } from './helpers.ts';

const world = useWorld();
let w: World;

before(async () => {
  w = await world();
  const started = Date.now();
  await fixture(w, 'wr/dhcp', 'linux');
  await fixture(w, 'wr/static', 'linux', [staticSeed(w, 0, 17, 22).seed]);
  // The node's first heartbeats (node, Lease, status) are behind us before anything is counted.
  const { coordination } = adminClients(w.ground.cluster);
  await waitFor(
    'the node Lease',
    async () =>
      !!(await coordination
        .readNamespacedLease({ name: w.nodeName, namespace: 'kube-node-lease' })
        .catch(() => undefined)),
    30_000,
    100,
  );
  // The node agent re-asserts the node's labels 5 s after start (a node patch that may
  // change nothing, so no heartbeat mark shows it): that too is behind us.
  await new Promise((r) => setTimeout(r, Math.max(500, 7000 - (Date.now() - started))));
});

async function apiWrites(): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('cocoon_vk_api_writes_total '));
  return Number(line?.split(' ').pop() ?? Number.NaN);
}

/** The daemon's heartbeat marks (Lease renewTime, the node's status heartbeat): a change
 * between two reads is one heartbeat write (the windows here are far below 10 s). */
async function heartbeatMarks(): Promise<[string, string]> {
  const { coordination, core } = adminClients(w.ground.cluster);
  const lease = await coordination.readNamespacedLease({ name: w.nodeName, namespace: 'kube-node-lease' });
  const node = await core.readNode({ name: w.nodeName });
  const hb = node.status?.conditions?.find((c) => c.type === 'Ready')?.lastHeartbeatTime;
  return [String(lease.spec?.renewTime ?? ''), String(hb ?? '')];
}

interface Version {
  type: string;
  rv: string;
  lifecycle: string;
  podIP: string;
  ready: boolean;
  phase: string;
  vmId: string;
  postClone: string;
}

interface Measured {
  versions: Version[];
  /** Daemon API writes in the window, heartbeats subtracted (pod writes and events). */
  writes: number;
  events: { reason: string; count: number }[];
  /** cocoon calls of the bring-up (the health check's `vm list` left out). */
  calls: string[][];
}

/** Creates one pod, waits for `ready` and a quiet period, and measures what it cost. */
async function bringUp(name: string, annotations: Record<string, string>): Promise<Measured> {
  const versions: Version[] = [];
  const watch = new Watch(w.kc);
  const req = await watch.watch(
    `/api/v1/namespaces/${w.namespace}/pods`,
    { fieldSelector: `metadata.name=${name}` },
    (type: string, p: V1Pod) =>
      versions.push({
        type,
        rv: p.metadata?.resourceVersion ?? '',
        lifecycle: lifecycle(p),
        podIP: p.status?.podIP ?? '',
        ready: isReady(p),
        phase: p.status?.phase ?? '',
        vmId: p.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '',
        postClone: p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'] ?? '',
      }),
    () => {},
  );
  try {
    // Start right after a Lease renewal (every 10 s), so no heartbeat falls into the window;
    // the marks below still subtract one that does.
    const renewed = async () => Date.parse((await heartbeatMarks())[0]);
    const last = await renewed();
    if (Date.now() - last > 4000)
      await waitFor('a Lease renewal', async () => (await renewed()) !== last, 15_000, 50);
    const hb0 = await heartbeatMarks();
    const writes0 = await apiWrites();
    const t0 = Date.now();
    await w.core.createNamespacedPod({ namespace: w.namespace, body: vmPod(name, w.nodeName, annotations) });
    await waitFor(`${name} ready`, () => versions.some((v) => v.lifecycle === 'ready'), 60_000, 50);
    // Quiet period: past the publish grace (1.5 s), so a held or follow-up write would show.
    await new Promise((r) => setTimeout(r, 2500));
    const writes1 = await apiWrites();
    await new Promise((r) => setTimeout(r, 300)); // a heartbeat counted just now is visible
    const hb1 = await heartbeatMarks();
    const heartbeats = (hb0[0] !== hb1[0] ? 1 : 0) + (hb0[1] !== hb1[1] ? 1 : 0);
    const list = await w.core.listNamespacedEvent({
      namespace: w.namespace,
      fieldSelector: `involvedObject.name=${name}`,
    });
    const calls = w.simulator
      .calls()
      .filter((c) => Date.parse(c.startedAt) >= t0 - 50)
      .map((c) => c.argv)
      .filter((a) => !(a[0] === 'vm' && a[1] === 'list'));
    return {
      versions,
      writes: writes1 - writes0 - heartbeats,
      events: list.items.map((e) => ({ reason: e.reason ?? '', count: e.count ?? 1 })),
      calls,
    };
  } finally {
    req.abort();
  }
}

/** No version is ready without its IP, and none is Ready without `ready`. */
function assertReadyOnlyWithIp(versions: Version[]): void {
  for (const v of versions) {
    if (v.lifecycle === 'ready')
      assert.ok(v.podIP !== '' && v.ready, `ready without IP/Ready: ${JSON.stringify(v)}`);
    if (v.ready) assert.equal(v.lifecycle, 'ready', `Ready without the annotation: ${JSON.stringify(v)}`);
  }
}

test('the apiserver takes metadata.annotations in a UID-fenced pods/status patch', async () => {
  const core = w.core;
  const ns = await newNamespace(core, 'wr');
  const pod = await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: 'p', annotations: { gone: '1' } },
      spec: { nodeName: 'nowhere', containers: [{ name: 'c', image: 'x' }] },
    },
  });
  const smp = setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch);
  const res = await core.patchNamespacedPodStatus(
    {
      namespace: ns,
      name: 'p',
      body: {
        metadata: {
          uid: pod.metadata?.uid,
          annotations: { 'vm.cocoonstack.io/lifecycle-state': 'ready', gone: null },
        },
        status: { phase: 'Running', podIP: '10.0.0.9', podIPs: [{ ip: '10.0.0.9' }] },
      },
    },
    smp,
  );
  assert.deepEqual(res.metadata?.annotations, { 'vm.cocoonstack.io/lifecycle-state': 'ready' });
  assert.equal(res.status?.podIP, '10.0.0.9');
  const read = await core.readNamespacedPod({ namespace: ns, name: 'p' });
  assert.equal(read.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state'], 'ready');
  assert.equal(read.metadata?.resourceVersion, res.metadata?.resourceVersion, 'one version for both');
  // The UID fence holds on the status subresource too.
  await assert.rejects(
    core.patchNamespacedPodStatus(
      { namespace: ns, name: 'p', body: { metadata: { uid: 'another', annotations: { x: '1' } } } },
      smp,
    ),
    (err: { code?: number }) => err.code === 422 || err.code === 409,
  );
});

test('a DHCP clone: created, creating, then ONE version with podIP, Ready and ready; ≤ 3 writes, ≤ 2 cocoon calls', async (t) => {
  const m = await bringUp('wr-dhcp', {
    'vm.cocoonstack.io/name': 'vk-wr-dhcp',
    'cocoonset.cocoonstack.io/image': 'wr/dhcp',
    'cocoonset.cocoonstack.io/managed': 'true',
  });
  const summary = JSON.stringify(m, null, 1);
  t.diagnostic(
    `API writes ${m.writes}, pod versions ${m.versions.length - 1}, cocoon calls ${m.calls.length}`,
  );
  assert.deepEqual(
    m.versions.map((v) => [v.type, v.lifecycle, v.podIP !== '', v.ready]),
    [
      ['ADDED', '', false, false],
      ['MODIFIED', 'creating', false, false],
      ['MODIFIED', 'ready', true, true],
    ],
    summary,
  );
  const ready = m.versions[2]!;
  assert.equal(ready.phase, 'Running');
  assert.notEqual(ready.vmId, '', 'the VM id lands with ready');
  assert.equal(m.versions[1]!.phase, 'Pending', 'the claim writes the Pending status with creating');
  assertReadyOnlyWithIp(m.versions);
  assert.deepEqual(
    m.events.map((e) => e.reason),
    ['ProviderCreateSuccess'],
    summary,
  );
  assert.ok(m.writes <= 3, `${m.writes} API writes (2 pod writes and one event expected): ${summary}`);
  assert.deepEqual(
    m.calls.map((a) => a.slice(0, 2).join(' ')),
    ['snapshot inspect', 'vm clone'],
    summary,
  );
});

test('a clone with a post-clone fixup: ≤ 4 pod writes, ready only with its IP, ≤ 2 cocoon calls besides the fixup exec', async (t) => {
  const m = await bringUp('wr-fix', {
    'vm.cocoonstack.io/name': 'vk-wr-fix',
    'cocoonset.cocoonstack.io/image': 'wr/static',
    'cocoonset.cocoonstack.io/managed': 'true',
  });
  const summary = JSON.stringify(m, null, 1);
  const podWrites = m.versions.filter((v) => v.type === 'MODIFIED').length;
  t.diagnostic(
    `API writes ${m.writes} (${m.events.length} events), pod versions ${podWrites}, cocoon calls ${m.calls.length}`,
  );
  assert.ok(podWrites <= 4, `${podWrites} pod versions: ${summary}`);
  assert.equal(m.versions.at(-1)?.lifecycle, 'ready', summary);
  assert.equal(m.versions.filter((v) => v.lifecycle === 'ready').length, 1, summary);
  assert.equal(m.versions.at(-1)?.postClone, 'done');
  assertReadyOnlyWithIp(m.versions);
  assert.deepEqual(
    m.events.map((e) => e.reason).sort(),
    ['PostCloneSucceeded', 'ProviderCreateSuccess'],
    summary,
  );
  assert.ok(
    m.writes - m.events.length <= 4,
    `${m.writes} API writes with ${m.events.length} events: ${summary}`,
  );
  const execs = m.calls.filter((a) => a[0] === 'vm' && a[1] === 'exec');
  assert.equal(execs.length, 1, summary);
  assert.deepEqual(
    m.calls.filter((a) => !(a[0] === 'vm' && a[1] === 'exec')).map((a) => a.slice(0, 2).join(' ')),
    ['snapshot inspect', 'vm clone'],
    summary,
  );
});
