import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { attemptErrorMessage, joinAttemptErrors } from '../../../src/guest/attempts.ts';

describe('joinAttemptErrors (lifecycle.md §2.2)', () => {
  it('numbers attempts from 1 and joins with \\n', () => {
    assert.equal(
      joinAttemptErrors(['exit status 1 (stderr: agent)', 'timeout']),
      'attempt 1: exit status 1 (stderr: agent)\nattempt 2: timeout',
    );
    assert.equal(joinAttemptErrors([]), '');
    assert.equal(attemptErrorMessage(3, 'boom'), 'attempt 3: boom');
  });

  it('cuts an over-long ASCII chain to exactly 4096 bytes', () => {
    const chain = joinAttemptErrors(Array.from({ length: 100 }, () => 'x'.repeat(100)));
    assert.equal(Buffer.byteLength(chain), 4096);
    assert.ok(chain.startsWith('attempt 1: xxx'));
  });

  it('never splits a code point', () => {
    const chain = joinAttemptErrors(Array.from({ length: 60 }, () => '错误'.repeat(30)));
    assert.ok(Buffer.byteLength(chain) <= 4096);
    assert.ok(Buffer.byteLength(chain) > 4096 - 3);
    assert.ok(chain.isWellFormed());
    assert.ok(!chain.endsWith('\ufffd'));
  });

  it('property: at most the cap, well formed, a prefix of the full chain', () => {
    fc.assert(
      fc.property(
        fc.array(fc.string({ unit: 'binary', maxLength: 300 }), { maxLength: 30 }),
        fc.integer({ min: 1, max: 5000 }),
        (errors, cap) => {
          const chain = joinAttemptErrors(errors, cap);
          assert.ok(Buffer.byteLength(chain) <= cap);
          assert.ok(chain.isWellFormed());
          const full = errors
            .map((e, i) => `attempt ${i + 1}: ${e}`)
            .join('\n')
            .toWellFormed();
          assert.ok(full.startsWith(chain));
        },
      ),
    );
  });
});
