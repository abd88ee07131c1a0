import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  BACKEND,
  GENERATION,
  isLifecycleState,
  isTrue,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  MANAGED,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  parseGeneration,
  parseInt64,
  parsePostCloneState,
  VM_ID,
  VM_IP,
  VM_NAME,
  VMSPEC_KEYS,
} from '../../../src/contract/annotations.ts';
import { truncateUtf8 } from '../../../src/util/text.ts';

describe('annotation keys', () => {
  it('reproduces the contract keys byte for byte', () => {
    assert.equal(LIFECYCLE_STATE, 'vm.cocoonstack.io/lifecycle-state');
    assert.equal(LIFECYCLE_OBSERVED_GENERATION, 'vm.cocoonstack.io/lifecycle-observed-generation');
    assert.equal(LIFECYCLE_STATE_MESSAGE, 'vm.cocoonstack.io/lifecycle-state-message');
    assert.equal(POST_CLONE_STATE, 'vm.cocoonstack.io/post-clone-state');
    assert.equal(POST_CLONE_HINT, 'vm.cocoonstack.io/post-clone-hint');
    assert.equal(POST_CLONE_ERRORS, 'vm.cocoonstack.io/post-clone-errors');
    assert.equal(VM_ID, 'vm.cocoonstack.io/id');
    assert.equal(VM_IP, 'vm.cocoonstack.io/ip');
    assert.equal(VM_NAME, 'vm.cocoonstack.io/name');
    assert.equal(GENERATION, 'cocoonset.cocoonstack.io/generation');
    assert.equal(MANAGED, 'cocoonset.cocoonstack.io/managed');
    assert.equal(BACKEND, 'vm.cocoonstack.io/backend');
  });

  it('lists 19 distinct VMSpec keys, none of them provider-written', () => {
    assert.equal(VMSPEC_KEYS.length, 19);
    assert.equal(new Set(VMSPEC_KEYS).size, 19);
    for (const written of [LIFECYCLE_STATE, POST_CLONE_STATE, VM_ID, VM_IP]) {
      assert.ok(!VMSPEC_KEYS.includes(written));
    }
  });
});

describe('value encodings', () => {
  it('isTrue accepts only the exact string "true"', () => {
    assert.equal(isTrue('true'), true);
    for (const value of ['True', 'TRUE', '1', 'yes', 'false', '', ' true', undefined]) {
      assert.equal(isTrue(value), false, String(value));
    }
  });

  it('isLifecycleState accepts only the five lower-case states', () => {
    for (const s of ['creating', 'ready', 'hibernating', 'hibernated', 'failed'])
      assert.ok(isLifecycleState(s));
    for (const s of ['Ready', 'waking', '', 'READY']) assert.ok(!isLifecycleState(s));
  });

  it('parsePostCloneState maps unknown values to absent', () => {
    assert.equal(parsePostCloneState('running'), 'running');
    assert.equal(parsePostCloneState('done'), 'done');
    assert.equal(parsePostCloneState('failed'), 'failed');
    assert.equal(parsePostCloneState(undefined), '');
    assert.equal(parsePostCloneState('Failed'), '');
  });

  it('parseInt64 follows strconv.ParseInt(s, 10, 64)', () => {
    assert.equal(parseInt64('7'), 7n);
    assert.equal(parseInt64('+7'), 7n);
    assert.equal(parseInt64('-7'), -7n);
    assert.equal(parseInt64('0007'), 7n);
    assert.equal(parseInt64('9223372036854775807'), 9223372036854775807n);
    assert.equal(parseInt64('-9223372036854775808'), -9223372036854775808n);
    for (const bad of ['9223372036854775808', '', ' 7', '7 ', '1e3', '0x10', '7.0', '٣', undefined]) {
      assert.equal(parseInt64(bad), undefined, String(bad));
    }
  });

  it('parseGeneration reads missing or unparseable as 0', () => {
    assert.equal(parseGeneration(undefined), 0n);
    assert.equal(parseGeneration('abc'), 0n);
    assert.equal(parseGeneration('12345678901234567'), 12345678901234567n);
  });
});

describe('truncateUtf8', () => {
  it('keeps short texts unchanged', () => {
    assert.equal(truncateUtf8('hello', 5), 'hello');
    assert.equal(truncateUtf8('', 10), '');
  });

  it('cuts ASCII to exactly the cap', () => {
    const out = truncateUtf8('x'.repeat(5000), 4096);
    assert.equal(Buffer.byteLength(out), 4096);
  });

  it('never splits a multi-byte code point', () => {
    assert.equal(truncateUtf8('aé', 2), 'a'); // é is 2 bytes
    assert.equal(truncateUtf8('aé', 3), 'aé');
    assert.equal(truncateUtf8('€€', 5), '€'); // € is 3 bytes
    assert.equal(truncateUtf8('a😀', 4), 'a'); // 😀 is 4 bytes (a surrogate pair)
    assert.equal(truncateUtf8('a😀', 5), 'a😀');
  });

  it('replaces lone surrogates with U+FFFD', () => {
    assert.equal(truncateUtf8('a\ud800b', 10), 'a\ufffdb');
    assert.equal(truncateUtf8('a\ud800b', 3), 'a');
  });

  it('returns empty for a non-positive cap', () => {
    assert.equal(truncateUtf8('abc', 0), '');
    assert.equal(truncateUtf8('abc', -1), '');
  });

  it('property: never exceeds the cap, is well formed, is a maximal prefix', () => {
    fc.assert(
      fc.property(
        fc.string({ unit: 'binary', maxLength: 200 }),
        fc.integer({ min: 0, max: 300 }),
        (text, cap) => {
          const out = truncateUtf8(text, cap);
          const encoded = Buffer.from(out, 'utf8');
          assert.ok(encoded.length <= cap);
          assert.ok(out.isWellFormed());
          assert.equal(encoded.toString('utf8'), out);
          const full = text.toWellFormed();
          assert.ok(full.startsWith(out));
          const rest = [...full.slice(out.length)];
          if (rest.length > 0) assert.ok(encoded.length + Buffer.byteLength(rest[0]!) > cap);
        },
      ),
    );
  });
});
