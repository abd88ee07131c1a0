import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  LIFECYCLE_STATES,
  type LifecycleState,
} from '../../../src/contract/annotations.ts';
import {
  buildLifecyclePatch,
  comparisonKey,
  echoGeneration,
  type IntentRecord,
  isUnflushed,
  lifecycleAnnotations,
  markFlushed,
  seedFromAnnotations,
  stage,
} from '../../../src/lifecycle/intent.ts';

const UID = '6f1c8a2e-0d5b-4c47-9a51-3b2f7d0e9c11';

function record(partial: Partial<IntentRecord> = {}): IntentRecord {
  return { uid: UID, state: 'creating', generation: 1n, message: '', flushedKey: '', ...partial };
}

function flushed(r: IntentRecord): IntentRecord {
  return markFlushed(r, comparisonKey(r));
}

describe('comparisonKey', () => {
  it('is state NUL generation NUL message', () => {
    assert.equal(
      comparisonKey({ state: 'failed', generation: 7n, message: 'boom' }),
      'failed\u00007\u0000boom',
    );
  });
});

describe('stage', () => {
  it('creates a record when there is none (R1), unflushed', () => {
    const result = stage(undefined, { uid: UID, state: 'creating', generation: 3n, message: '' }, 0n);
    assert.equal(result.accepted, true);
    assert.equal(result.reason, 'accepted');
    assert.deepEqual(result.record, {
      uid: UID,
      state: 'creating',
      generation: 3n,
      message: '',
      flushedKey: '',
    });
    assert.ok(isUnflushed(result.record!));
  });

  it('R2: drops a request of another UID', () => {
    const current = flushed(record());
    const result = stage(current, { uid: 'other', state: 'ready', generation: 5n, message: '' }, 5n);
    assert.equal(result.accepted, false);
    assert.equal(result.reason, 'uid_mismatch');
    assert.equal(result.record, current);
  });

  it('R3: uses max(request generation, tracked generation)', () => {
    const result = stage(
      record({ generation: 2n }),
      { uid: UID, state: 'ready', generation: 2n, message: '' },
      9n,
    );
    assert.equal(result.record?.generation, 9n);
    const higher = stage(
      record({ generation: 2n }),
      { uid: UID, state: 'ready', generation: 12n, message: '' },
      9n,
    );
    assert.equal(higher.record?.generation, 12n);
  });

  it('R3: drops a lower generation as stale', () => {
    const current = record({ generation: 5n, state: 'ready' });
    const result = stage(current, { uid: UID, state: 'failed', generation: 4n, message: 'x' }, 3n);
    assert.equal(result.accepted, false);
    assert.equal(result.reason, 'stale_generation');
    assert.equal(result.record, current);
  });

  it('R4: a late ready over a same-generation failed is dropped', () => {
    const current = record({ state: 'failed', generation: 4n, message: 'boom' });
    const result = stage(current, { uid: UID, state: 'ready', generation: 4n, message: '' }, 4n);
    assert.equal(result.accepted, false);
    assert.equal(result.reason, 'sticky_failed');
    const hibernated = stage(current, { uid: UID, state: 'hibernated', generation: 4n, message: '' }, 4n);
    assert.equal(hibernated.reason, 'sticky_failed');
  });

  it('R4: failed, creating and hibernating may replace a same-generation failed', () => {
    const current = record({ state: 'failed', generation: 4n, message: 'boom' });
    for (const state of ['failed', 'creating', 'hibernating'] as const) {
      const result = stage(
        current,
        { uid: UID, state, generation: 4n, message: state === 'failed' ? 'b2' : '' },
        4n,
      );
      assert.equal(result.accepted, true, state);
      assert.equal(result.record?.state, state);
    }
  });

  it('R4: a generation bump unsticks failed', () => {
    const current = record({ state: 'failed', generation: 4n, message: 'boom' });
    const viaRequest = stage(current, { uid: UID, state: 'ready', generation: 5n, message: '' }, 4n);
    assert.equal(viaRequest.accepted, true);
    assert.equal(viaRequest.record?.state, 'ready');
    const viaTracked = stage(current, { uid: UID, state: 'ready', generation: 4n, message: '' }, 5n);
    assert.equal(viaTracked.accepted, true);
    assert.equal(viaTracked.record?.generation, 5n);
  });

  it('an identical triple is accepted as unchanged and keeps the flush state', () => {
    const current = flushed(record({ state: 'ready', generation: 3n }));
    const result = stage(current, { uid: UID, state: 'ready', generation: 3n, message: '' }, 0n);
    assert.equal(result.accepted, true);
    assert.equal(result.reason, 'unchanged');
    assert.equal(result.record, current);
    assert.equal(isUnflushed(result.record!), false);
  });

  it('a change keeps the old flushedKey, so the record is unflushed', () => {
    const current = flushed(record({ state: 'creating', generation: 3n }));
    const result = stage(current, { uid: UID, state: 'ready', generation: 3n, message: '' }, 0n);
    assert.equal(result.record?.flushedKey, current.flushedKey);
    assert.ok(isUnflushed(result.record!));
  });

  it('keeps messages only for failed, truncated to 4096 bytes', () => {
    const ready = stage(undefined, { uid: UID, state: 'ready', generation: 1n, message: 'leftover' }, 0n);
    assert.equal(ready.record?.message, '');
    const failed = stage(
      undefined,
      { uid: UID, state: 'failed', generation: 1n, message: 'é'.repeat(3000) },
      0n,
    );
    assert.equal(Buffer.byteLength(failed.record!.message), 4096);
  });

  const states = fc.constantFrom<LifecycleState>(...LIFECYCLE_STATES);
  const request = fc.record({
    uid: fc.constantFrom(UID, UID, UID, 'other-uid'),
    state: states,
    generation: fc.bigInt({ min: 0n, max: 6n }),
    message: fc.constantFrom('', 'boom'),
  });

  it('property: the generation never decreases across any sequence of stages', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(request, fc.bigInt({ min: 0n, max: 6n })), { maxLength: 40 }),
        (steps) => {
          let current: IntentRecord | undefined;
          for (const [req, tracked] of steps) {
            const before = current?.generation;
            const result = stage(current, req, tracked);
            if (result.accepted) current = result.record;
            if (before !== undefined) assert.ok(current!.generation >= before);
          }
        },
      ),
    );
  });

  it('property: a failed is never replaced by ready or hibernated at the same generation', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(request, fc.bigInt({ min: 0n, max: 6n })), { maxLength: 40 }),
        (steps) => {
          let current: IntentRecord | undefined;
          for (const [req, tracked] of steps) {
            const result = stage(current, req, tracked);
            if (
              result.accepted &&
              current?.state === 'failed' &&
              result.record.generation === current.generation
            ) {
              assert.ok(['failed', 'creating', 'hibernating'].includes(result.record.state));
            }
            if (result.accepted) current = result.record;
          }
        },
      ),
    );
  });

  it('property: the UID of a record never changes', () => {
    fc.assert(
      fc.property(fc.array(request, { minLength: 1, maxLength: 30 }), (requests) => {
        let current: IntentRecord | undefined;
        for (const req of requests) {
          const result = stage(current, req, 0n);
          if (result.accepted) current = result.record;
        }
        assert.equal(current?.uid, requests[0]!.uid);
      }),
    );
  });
});

describe('echoGeneration (R5)', () => {
  it('re-stamps state and message with a higher generation, unflushed', () => {
    const current = flushed(record({ state: 'failed', generation: 3n, message: 'boom' }));
    const result = echoGeneration(current, 4n);
    assert.equal(result.changed, true);
    assert.deepEqual(
      { state: result.record.state, generation: result.record.generation, message: result.record.message },
      { state: 'failed', generation: 4n, message: 'boom' },
    );
    assert.ok(isUnflushed(result.record));
  });

  it('does nothing for an unchanged or lower generation', () => {
    const current = flushed(record({ generation: 3n }));
    for (const generation of [3n, 2n]) {
      const result = echoGeneration(current, generation);
      assert.equal(result.changed, false);
      assert.equal(result.record, current);
      assert.equal(isUnflushed(result.record), false);
    }
  });
});

describe('flush bookkeeping (R1)', () => {
  it('markFlushed with the flushed key clears the unflushed flag', () => {
    const r = record({ state: 'ready' });
    assert.ok(isUnflushed(r));
    assert.equal(isUnflushed(markFlushed(r, comparisonKey(r))), false);
  });

  it('a record changed after the patch was built stays unflushed', () => {
    const r = record({ state: 'creating' });
    const keyAtPatch = comparisonKey(r);
    const changed = stage(r, { uid: UID, state: 'ready', generation: 1n, message: '' }, 0n).record!;
    assert.ok(isUnflushed(markFlushed(changed, keyAtPatch)));
  });
});

describe('seedFromAnnotations (R7)', () => {
  it('seeds from the triple and marks it flushed', () => {
    const seeded = seedFromAnnotations(UID, {
      [LIFECYCLE_STATE]: 'failed',
      [LIFECYCLE_OBSERVED_GENERATION]: '9',
      [LIFECYCLE_STATE_MESSAGE]: 'boom',
    });
    assert.deepEqual(seeded && { ...seeded, flushedKey: undefined }, {
      uid: UID,
      state: 'failed',
      generation: 9n,
      message: 'boom',
      flushedKey: undefined,
    });
    assert.equal(isUnflushed(seeded!), false);
  });

  it('reads a missing or unparseable generation as 0', () => {
    assert.equal(seedFromAnnotations(UID, { [LIFECYCLE_STATE]: 'ready' })?.generation, 0n);
    assert.equal(
      seedFromAnnotations(UID, { [LIFECYCLE_STATE]: 'ready', [LIFECYCLE_OBSERVED_GENERATION]: 'x' })
        ?.generation,
      0n,
    );
  });

  it('does not seed pods without lifecycle annotations or with an unknown state', () => {
    assert.equal(seedFromAnnotations(UID, undefined), undefined);
    assert.equal(seedFromAnnotations(UID, {}), undefined);
    assert.equal(seedFromAnnotations(UID, { [LIFECYCLE_OBSERVED_GENERATION]: '3' }), undefined);
    assert.equal(seedFromAnnotations(UID, { [LIFECYCLE_STATE]: 'Ready' }), undefined);
    assert.equal(seedFromAnnotations(UID, { [LIFECYCLE_STATE]: '' }), undefined);
  });

  it('an empty lifecycle (lost creating patch) is not seeded', () => {
    assert.equal(seedFromAnnotations(UID, { [LIFECYCLE_STATE]: '' }), undefined);
  });
});

describe('buildLifecyclePatch (§2.1)', () => {
  it('reproduces the example patch of lifecycle.md §2.1', () => {
    const patch = buildLifecyclePatch(UID, record({ state: 'ready', generation: 7n }));
    assert.equal(
      JSON.stringify(patch),
      '{"metadata":{"uid":"6f1c8a2e-0d5b-4c47-9a51-3b2f7d0e9c11","annotations":{' +
        '"vm.cocoonstack.io/lifecycle-state":"ready",' +
        '"vm.cocoonstack.io/lifecycle-observed-generation":"7",' +
        '"vm.cocoonstack.io/lifecycle-state-message":null}}}',
    );
  });

  it('carries a failure message and the exact int64 generation', () => {
    const patch = buildLifecyclePatch(
      UID,
      record({ state: 'failed', generation: 9223372036854775807n, message: 'clone x: boom' }),
    );
    assert.deepEqual(patch.metadata.annotations, {
      [LIFECYCLE_STATE]: 'failed',
      [LIFECYCLE_OBSERVED_GENERATION]: '9223372036854775807',
      [LIFECYCLE_STATE_MESSAGE]: 'clone x: boom',
    });
  });

  it('lifecycleAnnotations omits an empty message', () => {
    assert.deepEqual(lifecycleAnnotations(record({ state: 'ready', generation: 2n })), {
      [LIFECYCLE_STATE]: 'ready',
      [LIFECYCLE_OBSERVED_GENERATION]: '2',
    });
  });
});
