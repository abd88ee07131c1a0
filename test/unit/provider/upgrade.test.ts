// The provenance ledger's one-time upgrade rule (src/provider/cocoon/ops/upgrade.ts), pure.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { upgradeEntries } from '../../../src/provider/cocoon/ops/upgrade.ts';

const pod = (name: string, ns: string, ann: Record<string, string>, phase = 'Running'): V1Pod => ({
  metadata: {
    name,
    namespace: ns,
    uid: `uid-${name}`,
    annotations: { 'cocoonset.cocoonstack.io/managed': 'true', ...ann },
    ownerReferences: [{ apiVersion: 'v1', kind: 'X', name: 'set', uid: 'set-1', controller: true }],
  },
  status: { phase },
});
const vms = [
  { id: 'ID1', name: 'vk-a' },
  { id: 'ID2', name: 'vk-b' },
  { id: 'ID3', name: 'vk-c' },
];

test('a VM named by ID on exactly one live managed pod, under its VM name, goes to that pod`s identity', () => {
  const e = upgradeEntries(
    [pod('a', 'ns-a', { 'vm.cocoonstack.io/name': 'vk-a', 'vm.cocoonstack.io/id': 'ID1' })],
    vms,
    [],
  );
  assert.deepEqual(e, [
    {
      kind: 'vm',
      name: 'vk-a',
      id: 'ID1',
      owner: { namespace: 'ns-a', vmName: 'vk-a', controllerUid: 'set-1' },
      pod: { key: 'ns-a/a', uid: 'uid-a' },
    },
  ]);
});

test('nothing for a VM two pods name, a name that does not match, a terminal pod or an unmanaged one', () => {
  const e = upgradeEntries(
    [
      pod('b1', 'ns-a', { 'vm.cocoonstack.io/name': 'vk-b', 'vm.cocoonstack.io/id': 'ID2' }),
      pod('b2', 'ns-b', { 'vm.cocoonstack.io/name': 'vk-b', 'vm.cocoonstack.io/id': 'ID2' }),
      pod('x', 'ns-b', { 'vm.cocoonstack.io/name': 'vk-x', 'vm.cocoonstack.io/id': 'ID3' }),
      pod('a', 'ns-a', { 'vm.cocoonstack.io/name': 'vk-a', 'vm.cocoonstack.io/id': 'ID1' }, 'Failed'),
      {
        ...pod('c', 'ns-a', { 'vm.cocoonstack.io/name': 'vk-c', 'vm.cocoonstack.io/id': 'ID3' }),
        metadata: {
          name: 'c',
          namespace: 'ns-a',
          annotations: { 'vm.cocoonstack.io/id': 'ID3', 'vm.cocoonstack.io/name': 'vk-c' },
        },
      },
    ],
    vms,
    [],
  );
  assert.deepEqual(e, []);
});

test('the local snapshot of a pod published hibernated that no other pod names; not of a running one', () => {
  const snaps = [
    { name: 'vk-h', id: 'S1' },
    { name: 'vk-r', id: 'S2' },
  ];
  const e = upgradeEntries(
    [
      pod('h', 'ns-a', {
        'vm.cocoonstack.io/name': 'vk-h',
        'vm.cocoonstack.io/lifecycle-state': 'hibernated',
      }),
      pod('r', 'ns-a', { 'vm.cocoonstack.io/name': 'vk-r', 'vm.cocoonstack.io/lifecycle-state': 'ready' }),
    ],
    vms,
    snaps,
  );
  assert.deepEqual(
    e.map((x) => [x.kind, x.name, x.id]),
    [['snapshot', 'vk-h', 'S1']],
  );
});
