// Running as the node identity (docs/contracts/virtual-node.md "RBAC and the node identity"):
// recognising one the way the apiserver does, refusing a node name the identity does not own,
// leaving the labels NodeRestriction refuses to an administrator and never re-adding the
// taint, which a node may not change on itself.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { V1Node } from '@kubernetes/client-node';
import { loadConfig } from '../../../src/config/env.ts';
import { identityMismatch, nodeNameOf, whoAmI } from '../../../src/kube/identity.ts';
import { silentLogger } from '../../../src/log.ts';
import { NodeAgent } from '../../../src/node/heartbeat.ts';
import {
  labelsLeftToAdmin,
  type NodeFacts,
  nodeLabels,
  nodeRestrictedLabel,
  PROVIDER_TAINT_KEY,
} from '../../../src/node/node-object.ts';
import { apiError, fakeKube } from '../fakes/kube.ts';

const NODE = 'cocoon-a';

function facts(nodeIdentity: boolean): NodeFacts {
  return {
    config: loadConfig({ VK_NODE_NAME: NODE }),
    host: {
      cpus: 4,
      memoryBytes: 8n << 30n,
      storageTotalBytes: 100n << 30n,
      storageAvailableBytes: 50n << 30n,
      hugepages: undefined,
      firstIPv4: '10.0.0.9',
    },
    nodeIP: '10.0.0.9',
    version: 'v0.0.0-test',
    declareWebSockets: true,
    nodeIdentity,
  };
}

test('a node identity is system:node:<name> in group system:nodes, as the apiserver decides', () => {
  assert.equal(nodeNameOf({ username: 'system:node:cocoon-a', groups: ['system:nodes'] }), 'cocoon-a');
  assert.equal(nodeNameOf({ username: 'system:node:cocoon-a', groups: ['system:authenticated'] }), undefined);
  assert.equal(nodeNameOf({ username: 'vk-cocoon', groups: ['system:nodes'] }), undefined);
  assert.equal(
    identityMismatch({ username: 'system:node:cocoon-a', groups: ['system:nodes'] }, NODE),
    undefined,
  );
  assert.equal(identityMismatch({ username: 'vk-cocoon', groups: [] }, NODE), undefined);
  assert.match(
    identityMismatch({ username: 'system:node:other', groups: ['system:nodes'] }, NODE) ?? '',
    /system:node:other is the node "other", but VK_NODE_NAME is "cocoon-a"/,
  );
});

test('whoAmI reads the SelfSubjectReview, and reports an error instead of guessing', async () => {
  const f = fakeKube();
  const bodies: unknown[] = [];
  (f.kube as { authn: unknown }).authn = {
    createSelfSubjectReview: async (p: { body: unknown }) => {
      bodies.push(p.body);
      return { status: { userInfo: { username: 'system:node:cocoon-a', groups: ['system:nodes'] } } };
    },
  };
  assert.deepEqual(await whoAmI(f.kube), { username: 'system:node:cocoon-a', groups: ['system:nodes'] });
  assert.deepEqual(bodies, [{ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' }]);
  (f.kube as { authn: unknown }).authn = {
    createSelfSubjectReview: async () =>
      Promise.reject(apiError(404, 'the server could not find the resource')),
  };
  assert.match(((await whoAmI(f.kube)) as { error: string }).error, /could not find/);
});

test('NodeRestriction label rule: kubelet labels and foreign domains pass, roles and other kubernetes.io keys do not', () => {
  const allowed = [
    'type',
    'kubernetes.io/hostname',
    'kubernetes.io/os',
    'kubernetes.io/arch',
    'topology.kubernetes.io/zone',
    'node.kubernetes.io/instance-type',
    'node.kubernetes.io/anything',
    'kubelet.kubernetes.io/anything',
    'cocoonstack.io/pool',
    'example.com/role',
  ];
  const refused = [
    'kubernetes.io/role',
    'node-role.kubernetes.io/cocoon-vm',
    'node-restriction.kubernetes.io/x',
    'sub.node-restriction.kubernetes.io/x',
    'k8s.io/x',
    'foo.k8s.io/x',
  ];
  for (const k of allowed) assert.equal(nodeRestrictedLabel(k), false, k);
  for (const k of refused) assert.equal(nodeRestrictedLabel(k), true, k);
});

test('as a node identity the node labels leave out the role labels, which are left to an administrator', () => {
  const full = nodeLabels(facts(false));
  assert.equal(full['node-role.kubernetes.io/cocoon-vm'], '');
  assert.equal(full['kubernetes.io/role'], 'agent');
  const own = nodeLabels(facts(true));
  assert.deepEqual(Object.keys(own).sort(), [
    'cocoonstack.io/pool',
    'kubernetes.io/arch',
    'kubernetes.io/hostname',
    'kubernetes.io/os',
    'type',
  ]);
  assert.deepEqual(labelsLeftToAdmin(facts(true)).sort(), [
    'kubernetes.io/role',
    'node-role.kubernetes.io/cocoon-vm',
  ]);
  assert.deepEqual(labelsLeftToAdmin(facts(false)), []);
});

/** NodeAgent.register against an existing node without the provider taint: what it patches. */
async function registerOverUntaintedNode(nodeIdentity: boolean) {
  const f = fakeKube();
  const live: V1Node = {
    metadata: { name: NODE, uid: 'uid-node', labels: { 'kubernetes.io/role': 'agent' } },
    spec: { taints: [{ key: 'example.com/maintenance', effect: 'NoSchedule' }] },
  };
  f.core.on('createNode', () => Promise.reject(apiError(409, 'nodes "cocoon-a" already exists')));
  f.core.on('readNode', () => live);
  const agent = new NodeAgent({
    kube: f.kube,
    facts: facts(nodeIdentity),
    health: { ping: async () => {} },
    log: silentLogger,
  });
  await agent.register();
  agent.stop();
  const [create] = f.core.callsOf('createNode');
  const patches = f.core.callsOf('patchNode');
  assert.equal(patches.length, 1);
  return { create: create?.params.body as V1Node, patch: patches[0]?.params.body };
}

test('as a node identity the taint is created with the node but never re-added; otherwise it is', async () => {
  const asNode = await registerOverUntaintedNode(true);
  assert.ok(
    asNode.create.spec?.taints?.some((t) => t.key === PROVIDER_TAINT_KEY),
    'created with the taint (NodeRestriction admits taints on create)',
  );
  assert.equal(asNode.create.metadata?.labels?.['node-role.kubernetes.io/cocoon-vm'], undefined);
  assert.equal(asNode.patch.spec, undefined, 'no taint change: NodeRestriction would refuse the whole patch');
  assert.equal(
    asNode.patch.metadata.labels['kubernetes.io/role'],
    undefined,
    'the admin label is left alone',
  );
  const asProvider = await registerOverUntaintedNode(false);
  assert.deepEqual(
    asProvider.patch.spec?.taints?.map((t: { key: string }) => t.key),
    ['example.com/maintenance', PROVIDER_TAINT_KEY],
  );
  assert.equal(asProvider.patch.metadata.labels['node-role.kubernetes.io/cocoon-vm'], '');
});
