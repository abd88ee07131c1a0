// The control plane around the node, as a real cluster runs it (test-ground.md, "Controllers
// and scheduler"): the node lifecycle controller lifts the admission-added not-ready taint,
// kube-scheduler places a pod that carries only cocoon-operator's nodeSelector and
// tolerations on our node, and the garbage collector removes the pod (and so its VM) when its
// owner is deleted. The world's node gets a pool of its own, so no other test's node matches.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { before, test } from 'node:test';
import type { V1Pod, V1ReplicaSet, V1Toleration } from '@kubernetes/client-node';
import { adminClients, podReady, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { fixture, lifecycle } from './helpers.ts';

const POOL = `sched-${randomBytes(3).toString('hex')}`;
const SNAPSHOT = 'acme/sched';
const POOL_LABEL = 'cocoonstack.io/pool';
const NOT_READY_TAINT = 'node.kubernetes.io/not-ready';

/** What cocoon-operator puts on its main and toolbox pods: the provider taint tolerated for
 * scheduling, not-ready tolerated only for execution (so a node is used once it is Ready). */
const OPERATOR_TOLERATIONS: V1Toleration[] = [
  { key: 'virtual-kubelet.io/provider', operator: 'Exists', effect: 'NoSchedule' },
  { key: NOT_READY_TAINT, operator: 'Exists', effect: 'NoExecute' },
];

const world = useWorld({ env: { VK_NODE_POOL: POOL } });
let w: World;

before(async () => {
  w = await world();
  await fixture(w, SNAPSHOT, 'linux');
});

async function vmNames(): Promise<string[]> {
  const out = (await w.sim(['vm', 'list', '-o', 'json'])).trim();
  return out.startsWith('[')
    ? (JSON.parse(out) as { config: { name: string } }[]).map((v) => v.config.name)
    : [];
}

function managedAnnotations(vmName: string): Record<string, string> {
  return {
    'vm.cocoonstack.io/name': vmName,
    'cocoonset.cocoonstack.io/image': SNAPSHOT,
    'cocoonset.cocoonstack.io/managed': 'true',
  };
}

test('the node lifecycle controller lifts the admission not-ready taint of the Ready node', async () => {
  const node = await w.core.readNode({ name: w.nodeName });
  assert.equal(node.metadata?.labels?.[POOL_LABEL], POOL);
  await waitFor(
    `taint ${NOT_READY_TAINT} to leave node ${w.nodeName}`,
    async () => {
      const n = await w.core.readNode({ name: w.nodeName });
      return !(n.spec?.taints ?? []).some((t) => t.key === NOT_READY_TAINT);
    },
    60_000,
    250,
  );
  const after = await w.core.readNode({ name: w.nodeName });
  assert.deepEqual(
    (after.spec?.taints ?? []).map((t) => `${t.key}=${t.value ?? ''}:${t.effect}`),
    ['virtual-kubelet.io/provider=cocoon:NoSchedule'],
  );
});

test('a pod with only the pool nodeSelector but without the provider toleration is not scheduled', async () => {
  const name = 'no-toleration';
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: {
      metadata: { name, annotations: managedAnnotations('vk-sched-untolerated') },
      spec: { nodeSelector: { [POOL_LABEL]: POOL }, containers: [{ name: 'agent', image: SNAPSHOT }] },
    },
  });
  const p = await waitForPod(w.core, w.namespace, name, 'PodScheduled=False', (x) =>
    (x.status?.conditions ?? []).some((c) => c.type === 'PodScheduled' && c.status === 'False'),
  );
  const cond = p.status?.conditions?.find((c) => c.type === 'PodScheduled');
  assert.equal(cond?.reason, 'Unschedulable');
  assert.match(cond?.message ?? '', /nodes are available: .*untolerated taint/);
  assert.equal(p.spec?.nodeName ?? '', '');
  assert.ok(!(await vmNames()).includes('vk-sched-untolerated'));
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
  await waitForPodGone(w.core, w.namespace, name);
});

test('a ReplicaSet pod with only the pool nodeSelector and the operator tolerations lands on our node, reaches ready, and goes with its VM when the ReplicaSet is deleted', async (t) => {
  const { apps } = adminClients(w.ground.cluster);
  const app = `sched-${randomBytes(3).toString('hex')}`;
  const vmName = `vk-${app}`;
  const rs: V1ReplicaSet = {
    metadata: { name: app },
    spec: {
      replicas: 1,
      selector: { matchLabels: { app } },
      template: {
        metadata: { labels: { app }, annotations: managedAnnotations(vmName) },
        spec: {
          nodeSelector: { [POOL_LABEL]: POOL },
          tolerations: OPERATOR_TOLERATIONS,
          containers: [{ name: 'agent', image: SNAPSHOT }],
        },
      },
    },
  };
  const created = await apps.createNamespacedReplicaSet({ namespace: w.namespace, body: rs });
  let pod: V1Pod | undefined;
  await waitFor(
    `the ReplicaSet ${app} to create its pod`,
    async () => {
      const list = await w.core.listNamespacedPod({ namespace: w.namespace, labelSelector: `app=${app}` });
      pod = list.items[0];
      return pod !== undefined;
    },
    30_000,
    200,
  );
  const name = pod?.metadata?.name ?? '';
  assert.equal(pod?.metadata?.ownerReferences?.[0]?.uid, created.metadata?.uid);
  const scheduled = await waitForPod(
    w.core,
    w.namespace,
    name,
    'bound by the scheduler',
    (p) => !!p.spec?.nodeName,
  );
  assert.equal(scheduled.spec?.nodeName, w.nodeName);
  assert.equal(
    scheduled.status?.conditions?.find((c) => c.type === 'PodScheduled')?.status,
    'True',
    'bound through the scheduler',
  );
  const ready = await waitForPod(
    w.core,
    w.namespace,
    name,
    'lifecycle ready and PodReady',
    (p) => lifecycle(p) === 'ready' && podReady(p),
    60_000,
  );
  assert.equal(ready.status?.phase, 'Running');
  assert.ok((await vmNames()).includes(vmName), 'the simulator holds the VM');
  t.diagnostic(`pod ${name} ready on ${w.nodeName} (pool ${POOL})`);

  await apps.deleteNamespacedReplicaSet({
    namespace: w.namespace,
    name: app,
    body: { propagationPolicy: 'Foreground' },
  });
  await waitForPodGone(w.core, w.namespace, name, 60_000);
  await waitFor(`VM ${vmName} to be removed`, async () => !(await vmNames()).includes(vmName), 30_000, 200);
  await waitFor(
    `ReplicaSet ${app} to be gone after its dependents`,
    async () => {
      try {
        await apps.readNamespacedReplicaSet({ namespace: w.namespace, name: app });
        return false;
      } catch (err) {
        if ((err as { code?: number }).code === 404) return true;
        throw err;
      }
    },
    30_000,
    200,
  );
});
