import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { localSnapshotName, splitCloneImage } from '../../../src/vmspec/snapshot-name.ts';

describe('splitCloneImage (pod-to-vm.md §2.3 step 1)', () => {
  it('splits at the first colon; an empty tag is latest', () => {
    assert.deepEqual(splitCloneImage('acme/agent:v3'), { repo: 'acme/agent', tag: 'v3' });
    assert.deepEqual(splitCloneImage('acme/agent'), { repo: 'acme/agent', tag: 'latest' });
    assert.deepEqual(splitCloneImage('acme/agent:'), { repo: 'acme/agent', tag: 'latest' });
    assert.deepEqual(splitCloneImage('a:b:c'), { repo: 'a', tag: 'b:c' });
  });
});

describe('localSnapshotName (pod-to-vm.md §2.3 step 2)', () => {
  it('is the repo for latest or no tag, else repo:tag', () => {
    assert.equal(localSnapshotName('acme/agent'), 'acme/agent');
    assert.equal(localSnapshotName('acme/agent:latest'), 'acme/agent');
    assert.equal(localSnapshotName('acme/agent:'), 'acme/agent');
    assert.equal(localSnapshotName('acme/agent:v3'), 'acme/agent:v3');
  });

  it('keeps a name of exactly 63 characters', () => {
    const name = `${'r'.repeat(60)}:v1`;
    assert.equal(name.length, 63);
    assert.equal(localSnapshotName(name), name);
  });

  it('63-char rule: first 50 characters + "-" + 12 hex of sha256(full name)', () => {
    const image = 'cocoonstack/windows-11-enterprise-ltsc-with-office-preinstalled:2026.05.01-r7';
    const full = image; // tag is not latest, so the full name is repo:tag
    const hash = createHash('sha256').update(full).digest('hex').slice(0, 12);
    const expected = `${full.slice(0, 50)}-${hash}`;
    assert.equal(localSnapshotName(image), expected);
    assert.equal(expected.length, 63);
    // computed independently (Python hashlib)
    assert.equal(expected, 'cocoonstack/windows-11-enterprise-ltsc-with-office-ccb3ccfdac9f');
  });

  it('hashes the tag-aware name (latest dropped) for a long repo', () => {
    const repo = 'x'.repeat(64);
    const hash = createHash('sha256').update(repo).digest('hex').slice(0, 12);
    assert.equal(localSnapshotName(`${repo}:latest`), `${'x'.repeat(50)}-${hash}`);
  });

  it('a pinned literal (guards against accidental hash changes)', () => {
    assert.equal(
      localSnapshotName('a'.repeat(70)),
      `${'a'.repeat(50)}-${createHash('sha256').update('a'.repeat(70)).digest('hex').slice(0, 12)}`,
    );
    assert.equal(localSnapshotName('a'.repeat(70)), `${'a'.repeat(50)}-6bd5e5034855`);
  });

  it('property: the result is at most 63 characters and deterministic', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[a-z0-9./-]{1,90}(:[a-z0-9.-]{0,30})?$/), (image) => {
        const name = localSnapshotName(image);
        assert.ok(name.length <= 63);
        assert.equal(localSnapshotName(image), name);
        if (name.length === 63 && name !== image) assert.match(name, /-[0-9a-f]{12}$/);
      }),
    );
  });
});
