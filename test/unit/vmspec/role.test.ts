import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { deriveRole } from '../../../src/vmspec/role.ts';

const owner = [{ kind: 'CocoonSet', name: 'agents' }];

describe('deriveRole (pod-to-vm.md §1)', () => {
  it('slot 0 ⇒ main, slot > 0 ⇒ sub-agent', () => {
    assert.equal(deriveRole('vk-team-a-agents-0', 'team-a', owner), 'main');
    assert.equal(deriveRole('vk-team-a-agents-00', 'team-a', owner), 'main');
    assert.equal(deriveRole('vk-team-a-agents-3', 'team-a', owner), 'sub-agent');
    assert.equal(deriveRole('vk-team-a-agents-12', 'team-a', owner), 'sub-agent');
  });

  it('anything else ⇒ toolbox', () => {
    assert.equal(deriveRole('vk-team-a-agents-toolbox-1', 'team-a', owner), 'toolbox');
    assert.equal(deriveRole('vk-team-a-agents-', 'team-a', owner), 'toolbox');
    assert.equal(deriveRole('vk-team-a-agents-+1', 'team-a', owner), 'toolbox');
    assert.equal(deriveRole('vk-team-a-agents-1a', 'team-a', owner), 'toolbox');
    assert.equal(deriveRole('vk-team-a-agents-99999999999999999999', 'team-a', owner), 'toolbox');
  });

  it('uses the CocoonSet ownerReference only', () => {
    const refs = [
      { kind: 'ReplicaSet', name: 'other' },
      { kind: 'CocoonSet', name: 'agents' },
    ];
    assert.equal(deriveRole('vk-team-a-agents-0', 'team-a', refs), 'main');
    assert.equal(deriveRole('vk-team-a-other-0', 'team-a', refs), 'toolbox');
  });

  it('without a CocoonSet owner the prefix is vk-<ns>--; never inferred from a suffix', () => {
    assert.equal(deriveRole('vk-team-a-agents-0', 'team-a', undefined), 'toolbox');
    assert.equal(deriveRole('vk-team-a--0', 'team-a', []), 'main');
  });

  it('a name without the prefix is taken whole (TrimPrefix semantics)', () => {
    assert.equal(deriveRole('7', 'team-a', owner), 'sub-agent');
    assert.equal(deriveRole('agent-0', 'team-a', owner), 'toolbox');
  });

  it('the namespace is part of the prefix', () => {
    assert.equal(deriveRole('vk-team-b-agents-0', 'team-a', owner), 'toolbox');
  });
});
