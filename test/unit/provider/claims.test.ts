// VM ownership rules (docs/decisions.md, "VM ownership") and the create-input key that
// decides when a failed create is re-run (docs/decisions.md, "Create failures").

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../../src/cocoon/records.ts';
import {
  byAge,
  holderOfName,
  holderOfVm,
  isVmId,
  referencedVms,
} from '../../../src/provider/cocoon/claims.ts';
import { createInputsKey } from '../../../src/provider/cocoon/inputs.ts';
import {
  bindVm,
  newRecord,
  type PodRecord,
  setBringingUp,
  setSpec,
} from '../../../src/provider/cocoon/state.ts';

const pod = (name: string, annotations: Record<string, string>, created = '2026-01-01T00:00:00Z'): V1Pod => ({
  metadata: { namespace: 'ns', name, uid: `uid-${name}`, annotations, creationTimestamp: new Date(created) },
  spec: { containers: [{ name: 'agent', image: 'x' }] },
});

function tracked(name: string, vm?: { id: string; name: string }): PodRecord {
  const rec = newRecord(`ns/${name}`, pod(name, {}), undefined);
  if (vm) bindVm(rec, { ...vm, nics: [] } as unknown as VmRecord, { owns: true });
  return rec;
}

describe('isVmId', () => {
  test('only a full 26-character base32 ID', () => {
    assert.equal(isVmId('ABCDEFGHIJKLMNOPQRSTUVWXYZ'), true);
    assert.equal(isVmId('ABCDEFGHIJKLMNOPQRSTUVWXY2'), true);
    assert.equal(isVmId('ABCDEFGH'), false, 'a prefix');
    assert.equal(isVmId('vk-team-a-web-0'), false, 'a VM name');
    assert.equal(isVmId('ABCDEFGHIJKLMNOPQRSTUVWXY1'), false, '1 is not base32');
    assert.equal(isVmId('abcdefghijklmnopqrstuvwxyz'), false, 'lower case');
    assert.equal(isVmId('ABCDEFGHIJKLMNOPQRSTUVWXYZ\n'), false);
  });
});

describe('holders', () => {
  const pods = new Map<string, PodRecord>();
  const a = tracked('a', { id: 'AAAAAAAAAAAAAAAAAAAAAAAAAA', name: 'vk-x' });
  const b = tracked('b');
  setBringingUp(b, true);
  setSpec(b, { vmName: 'vk-y' } as PodRecord['spec']);
  pods.set(a.key, a);
  pods.set(b.key, b);

  test('a VM is held by the pod it is bound to, by ID or name, never by the asker itself', () => {
    assert.equal(holderOfVm(pods, 'ns/c', { id: 'AAAAAAAAAAAAAAAAAAAAAAAAAA' }), a);
    assert.equal(holderOfVm(pods, 'ns/c', { id: 'OTHER', name: 'vk-x' }), a);
    assert.equal(holderOfVm(pods, 'ns/a', { id: 'AAAAAAAAAAAAAAAAAAAAAAAAAA' }), undefined);
    assert.equal(holderOfVm(pods, 'ns/c', { id: 'OTHER' }), undefined);
  });

  test('a name is held by a bound VM or by a bring-up in flight', () => {
    assert.equal(holderOfName(pods, 'ns/c', 'vk-x'), a);
    assert.equal(holderOfName(pods, 'ns/c', 'vk-y'), b);
    assert.equal(holderOfName(pods, 'ns/b', 'vk-y'), undefined);
    assert.equal(holderOfName(pods, 'ns/c', ''), undefined);
    setBringingUp(b, false);
    assert.equal(holderOfName(pods, 'ns/c', 'vk-y'), undefined, 'a failed bring-up holds nothing');
  });

  test('raw references count whether or not the rest decodes', () => {
    const refs = referencedVms([
      pod('u', { 'vm.cocoonstack.io/id': 'BBBBBBBBBBBBBBBBBBBBBBBBBB' }),
      pod('m', { 'vm.cocoonstack.io/name': 'vk-m', 'vm.cocoonstack.io/backend': 'qemu' }),
    ]);
    assert.deepEqual([...refs.ids], ['BBBBBBBBBBBBBBBBBBBBBBBBBB']);
    assert.deepEqual([...refs.names], ['vk-m']);
  });

  test('the oldest claimant comes first, then by key', () => {
    const old = pod('z', {}, '2026-01-01T00:00:00Z');
    const young = pod('a', {}, '2026-01-02T00:00:00Z');
    const twin = pod('b', {}, '2026-01-01T00:00:00Z');
    assert.deepEqual(
      [young, twin, old].sort(byAge).map((p) => p.metadata?.name),
      ['b', 'z', 'a'],
    );
  });
});

describe('createInputsKey', () => {
  const base = {
    'vm.cocoonstack.io/name': 'vk-a',
    'cocoonset.cocoonstack.io/image': 'acme/agent',
    'cocoonset.cocoonstack.io/managed': 'true',
  };
  const key = (ann: Record<string, string>, labels?: Record<string, string>) => {
    const p = pod('a', ann);
    if (labels) p.metadata = { ...p.metadata, labels };
    return createInputsKey(p);
  };

  test('our own writes, labels and the generation do not change it', () => {
    const k = key(base);
    assert.equal(
      key({
        ...base,
        'vm.cocoonstack.io/lifecycle-state': 'failed',
        'vm.cocoonstack.io/lifecycle-state-message': 'x',
        'vm.cocoonstack.io/lifecycle-observed-generation': '3',
        'vm.cocoonstack.io/id': 'AAAAAAAAAAAAAAAAAAAAAAAAAA',
        'vm.cocoonstack.io/ip': '1.2.3.4',
        'vm.cocoonstack.io/post-clone-state': 'done',
      }),
      k,
    );
    assert.equal(key(base, { touched: 'yes' }), k);
    assert.equal(key({ ...base, 'cocoonset.cocoonstack.io/generation': '9' }), k);
    assert.equal(key({ ...base, 'cocoonset.cocoonstack.io/image': 'acme/agent' }), k, 'order free');
  });

  test('an annotation fix changes it', () => {
    assert.notEqual(key({ ...base, 'cocoonset.cocoonstack.io/image': 'acme/other' }), key(base));
    assert.notEqual(key({ ...base, 'vm.cocoonstack.io/backend': 'firecracker' }), key(base));
  });

  test("an unmanaged pod's id and ip are its operator's input", () => {
    const u = { 'vm.cocoonstack.io/name': 'vk-u' };
    assert.notEqual(
      key({ ...u, 'vm.cocoonstack.io/id': 'A'.repeat(26) }),
      key({ ...u, 'vm.cocoonstack.io/id': 'B'.repeat(26) }),
    );
  });
});
