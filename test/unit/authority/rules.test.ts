// The authority rules, one block per row (src/authority/rules.ts, docs/security.md).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Owner } from '../../../src/authority/owner.ts';
import { ownerOf } from '../../../src/authority/owner.ts';
import {
  entryOwns,
  isReservedName,
  type LedgerEntry,
  mayAdopt,
  mayAttachUnmanaged,
  mayClaimName,
  mayCloneRegistrySource,
  mayOverwriteTag,
  mayPushDeferred,
  mayRemove,
  mayRestoreState,
  mayUseLocalSource,
  mayWriteSnapshot,
} from '../../../src/authority/rules.ts';

const A: Owner = { namespace: 'a', vmName: 'vk-a', controllerUid: 'set-1' };
const B: Owner = { namespace: 'b', vmName: 'vk-a', controllerUid: '' };
const entry = (owner: Owner, extra: Partial<LedgerEntry> = {}): LedgerEntry => ({
  name: owner.vmName,
  id: 'ID1',
  state: 'confirmed',
  owner,
  pod: `${owner.namespace}/p`,
  podUid: 'u',
  node: 'n',
  at: '2026-12-01T10:00:00.000Z',
  origin: 'created',
  ...extra,
});
const vm = (id: string, createdAt = '2026-12-01T10:00:01Z') => ({ name: 'vk-a', id, createdAt });
const refused = (v: { ok: boolean; rule?: string }, rule: string) => {
  assert.equal(v.ok, false);
  assert.equal((v as { rule: string }).rule, rule);
};

describe('identity', () => {
  it('namespace, VM name and the controller owner reference; not the pod name or UID', () => {
    const pod = (name: string, uid: string, controller?: string) => ({
      metadata: {
        namespace: 'a',
        name,
        uid,
        ownerReferences: controller
          ? [
              { controller: false, uid: 'x' },
              { controller: true, uid: controller },
            ]
          : [],
      },
    });
    assert.deepEqual(ownerOf(pod('p-0', 'u1', 'set-1'), 'vk-a'), A);
    assert.deepEqual(ownerOf(pod('p-1', 'u2', 'set-1'), 'vk-a'), A, 'a rebuild is the same identity');
    assert.notDeepEqual(ownerOf(pod('p-0', 'u1', 'set-2'), 'vk-a'), A, 'another controller is not');
    assert.equal(ownerOf(pod('p-0', 'u1'), 'vk-a').controllerUid, '');
  });
});

describe('row 1: adopt', () => {
  it('the ledger entry of this identity for this very VM', () => {
    assert.ok(mayAdopt(A, vm('ID1'), entry(A)).ok);
  });
  it('another identity`s VM: adopt-foreign', () =>
    refused(mayAdopt(B, vm('ID1'), entry(A)), 'adopt-foreign'));
  it('a VM with no entry (made by hand, by the host): adopt-unowned', () =>
    refused(mayAdopt(A, vm('ID1'), undefined), 'adopt-unowned'));
  it('a confirmed entry for another VM of the name: refused', () =>
    refused(mayAdopt(A, vm('ID2'), entry(A)), 'adopt-unowned'));
  it('an intent: only a VM made at or after it; a VM without a creation time never', () => {
    const intent = entry(A, { id: '', state: 'intent' });
    assert.ok(mayAdopt(A, vm('ID9', '2026-12-01T10:00:00.000001Z'), intent).ok);
    refused(mayAdopt(A, vm('ID9', '2026-12-01T09:59:59.999Z'), intent), 'adopt-unowned');
    refused(mayAdopt(A, vm('ID9', ''), intent), 'adopt-unowned');
  });
  it('a confirmed entry being re-made (intentAt): the old VM or a newer one', () => {
    const e = entry(A, { intentAt: '2026-12-01T11:00:00Z' });
    assert.ok(entryOwns(e, A, vm('ID1')));
    assert.ok(entryOwns(e, A, vm('ID7', '2026-12-01T11:00:01Z')));
    assert.ok(!entryOwns(e, A, vm('ID7', '2026-12-01T10:30:00Z')));
  });
});

describe('row 2: attach (unmanaged)', () => {
  it('a VM the ledger does not list, or this identity`s', () => {
    assert.ok(mayAttachUnmanaged(A, 'ID1', undefined).ok);
    assert.ok(mayAttachUnmanaged(A, 'ID1', entry(A)).ok);
  });
  it('another identity`s: attach-foreign', () =>
    refused(mayAttachUnmanaged(B, 'ID1', entry(A)), 'attach-foreign'));
});

describe('row 3: claim a VM name', () => {
  const none = { vm: undefined, snapshot: undefined, localSnapshotExists: false };
  it('a free name, or one this identity owns', () => {
    assert.ok(mayClaimName(A, none).ok);
    assert.ok(mayClaimName(A, { vm: entry(A), snapshot: entry(A), localSnapshotExists: true }).ok);
  });
  it('reserved shapes', () => {
    refused(mayClaimName({ ...A, vmName: 'fork-vk-x' }, none), 'reserved-name');
    refused(mayClaimName({ ...A, vmName: 'vk-x-hibernate-import' }, none), 'reserved-name');
    assert.ok(isReservedName('fork-a') && !isReservedName('forked'));
  });
  it('a VM or a snapshot of another identity: name-owned', () => {
    refused(mayClaimName(B, { ...none, vm: entry(A) }), 'name-owned');
    refused(mayClaimName(B, { ...none, snapshot: entry(A) }), 'name-owned');
  });
  it('a local snapshot vk-cocoon did not write (a base image): name-unowned', () =>
    refused(mayClaimName(A, { ...none, localSnapshotExists: true }), 'name-unowned'));
});

describe('row 4: write a snapshot', () => {
  it('a new name, or this identity`s', () => {
    assert.ok(mayWriteSnapshot(A, 'vk-a', undefined, false).ok);
    assert.ok(mayWriteSnapshot(A, 'vk-a', entry(A), true).ok);
  });
  it('another identity`s: snapshot-foreign', () =>
    refused(mayWriteSnapshot(B, 'vk-a', entry(A), true), 'snapshot-foreign'));
  it('an existing name with no entry (a base image): snapshot-unowned', () =>
    refused(mayWriteSnapshot(A, 'golden', undefined, true), 'snapshot-unowned'));
});

describe('row 5: remove', () => {
  it('only what the ledger gives this identity, never a pulled base', () => {
    assert.equal(mayRemove(A, entry(A)), true);
    assert.equal(mayRemove(B, entry(A)), false);
    assert.equal(mayRemove(A, undefined), false);
    assert.equal(mayRemove(A, entry(A, { origin: 'pulled' })), false);
  });
});

describe('row 6: a local clone source', () => {
  it('a shared base (no entry, or an unstamped pull) and the namespace`s own', () => {
    assert.ok(mayUseLocalSource('b', 'ubuntu', undefined).ok);
    assert.ok(
      mayUseLocalSource(
        'b',
        'ubuntu',
        entry({ namespace: '', vmName: '', controllerUid: '' }, { origin: 'pulled' }),
      ).ok,
    );
    assert.ok(mayUseLocalSource('a', 'vk-a', entry(A)).ok);
  });
  it('another namespace`s: source-foreign', () =>
    refused(mayUseLocalSource('b', 'vk-a', entry(A)), 'source-foreign'));
  it('a reserved shape without an entry: source-reserved', () =>
    refused(mayUseLocalSource('b', 'fork-vk-a', undefined), 'source-reserved'));
});

describe('row 7: a registry clone source', () => {
  it('unstamped (a base image) or stamped with the pod`s namespace', () => {
    assert.ok(
      mayCloneRegistrySource('b', 'ubuntu:latest', { namespace: '', controllerUid: '', fromNode: '' }).ok,
    );
    assert.ok(
      mayCloneRegistrySource('a', 'vk-a:latest', { namespace: 'a', controllerUid: '', fromNode: 'n' }).ok,
    );
  });
  it('stamped with another namespace: source-foreign', () =>
    refused(
      mayCloneRegistrySource('b', 'vk-a:hibernate', { namespace: 'a', controllerUid: '', fromNode: 'n' }),
      'source-foreign',
    ));
});

describe('row 8: restore hibernated state', () => {
  const stamped = { namespace: 'a', controllerUid: 'set-1', fromNode: 'n' };
  const unstamped = { namespace: '', controllerUid: '', fromNode: 'n' };
  it('the namespace`s own', () => assert.ok(mayRestoreState('a', 'vk-a:hibernate', stamped, false).ok));
  it('another namespace`s: state-foreign', () =>
    refused(mayRestoreState('b', 'vk-a:hibernate', stamped, true), 'state-foreign'));
  it('unstamped: accepted while VK_ACCEPT_UNSTAMPED_STATE is on, else state-unstamped', () => {
    assert.ok(mayRestoreState('b', 'vk-a:hibernate', unstamped, true).ok);
    refused(mayRestoreState('b', 'vk-a:hibernate', unstamped, false), 'state-unstamped');
  });
});

describe('row 9: overwrite a registry tag', () => {
  it('absent, or stamped with this identity (a namespace-only stamp is the namespace`s)', () => {
    assert.ok(mayOverwriteTag(A, 'vk-a', 'hibernate', 'absent', false).ok);
    assert.ok(
      mayOverwriteTag(
        A,
        'vk-a',
        'hibernate',
        { namespace: 'a', controllerUid: 'set-1', fromNode: 'n' },
        false,
      ).ok,
    );
    assert.ok(
      mayOverwriteTag(A, 'vk-a', 'hibernate', { namespace: 'a', controllerUid: '', fromNode: 'n' }, false).ok,
    );
  });
  it('another namespace or another controller: tag-foreign', () => {
    refused(
      mayOverwriteTag(B, 'vk-a', 'latest', { namespace: 'a', controllerUid: '', fromNode: 'n' }, true),
      'tag-foreign',
    );
    refused(
      mayOverwriteTag(A, 'vk-a', 'latest', { namespace: 'a', controllerUid: 'set-2', fromNode: 'n' }, true),
      'tag-foreign',
    );
  });
  it('unstamped: a vk host`s state of this VM name while allowed; a base image never', () => {
    const goState = { namespace: '', controllerUid: '', fromNode: 'go-host' };
    const base = { namespace: '', controllerUid: '', fromNode: '' };
    assert.ok(mayOverwriteTag(A, 'vk-a', 'hibernate', goState, true).ok);
    refused(mayOverwriteTag(A, 'vk-a', 'hibernate', goState, false), 'tag-unstamped');
    refused(mayOverwriteTag({ ...A, vmName: 'golden' }, 'golden', 'latest', base, true), 'tag-unstamped');
  });
});

describe('row 10: a deferred delete-time push', () => {
  const SAVED = '2026-12-01T10:00:00.000Z';
  const push = { name: 'vk-a', repo: 'vk-a', tag: 'latest', snapshotId: 'S1', owner: A, savedAt: SAVED };
  const ours = (created: string) => ({ namespace: 'a', controllerUid: 'set-1', fromNode: 'n1', created });
  const facts = (extra: Partial<Parameters<typeof mayPushDeferred>[1]> = {}) => ({
    snapshot: entry(A, { id: 'S1' }),
    vm: undefined,
    target: 'absent' as const,
    hibernate: 'absent' as const,
    acceptUnstamped: false,
    ...extra,
  });
  it('pushes its own saved state when nothing newer exists', () => {
    assert.equal(mayPushDeferred(push, facts()).ok, true);
    // An older tag of the identity is overwritten; so is an older hibernate beside it.
    const older = ours('2026-12-01T09:00:00Z');
    assert.equal(mayPushDeferred(push, facts({ target: older, hibernate: older })).ok, true);
    // Another identity's hibernate of that repo is no evidence about this one.
    const theirs = { namespace: 'b', controllerUid: '', fromNode: 'n2', created: '2026-12-02T00:00:00Z' };
    assert.equal(mayPushDeferred(push, facts({ hibernate: theirs })).ok, true);
  });
  it('is superseded when the local snapshot is gone, replaced or another identity`s', () => {
    refused(mayPushDeferred(push, facts({ snapshot: undefined })), 'push-superseded');
    refused(mayPushDeferred(push, facts({ snapshot: entry(A, { id: 'S2' }) })), 'push-superseded');
    refused(mayPushDeferred(push, facts({ snapshot: entry(B, { id: 'S1' }) })), 'push-superseded');
  });
  it('is dropped when the identity runs again on this host in a VM made after the save', () => {
    refused(
      mayPushDeferred(push, facts({ vm: entry(A, { at: '2026-12-01T10:05:00.000Z' }) })),
      'push-recreated',
    );
    // The VM the save was made from (older than the save) does not count.
    assert.equal(mayPushDeferred(push, facts({ vm: entry(A, { at: '2026-12-01T09:59:00.000Z' }) })).ok, true);
  });
  it('never overwrites another identity`s tag', () => {
    const theirs = { namespace: 'b', controllerUid: '', fromNode: 'n2', created: '2026-12-01T09:00:00Z' };
    refused(mayPushDeferred(push, facts({ target: theirs })), 'tag-foreign');
  });
  it('is dropped when a tag of the identity was written after the save, or cannot be dated', () => {
    refused(mayPushDeferred(push, facts({ target: ours('2026-12-01T10:00:01Z') })), 'push-newer-state');
    refused(mayPushDeferred(push, facts({ hibernate: ours('2026-12-01T11:00:00Z') })), 'push-newer-state');
    // `created` has whole seconds: a tag of the save's own second cannot be ordered, so it wins.
    const sameSecond = { ...push, savedAt: '2026-12-01T10:00:00.401Z' };
    refused(
      mayPushDeferred(sameSecond, facts({ hibernate: ours('2026-12-01T10:00:00Z') })),
      'push-newer-state',
    );
    assert.equal(mayPushDeferred(sameSecond, facts({ hibernate: ours('2026-12-01T09:59:59Z') })).ok, true);
    const v = mayPushDeferred(push, facts({ target: ours('') }));
    refused(v, 'push-newer-state');
    assert.match((v as { message: string }).message, /undated/);
  });
});
