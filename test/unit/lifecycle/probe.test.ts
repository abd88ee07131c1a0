import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  initialProbeState,
  nextProbeStep,
  type ProbeResult,
  type ProbeState,
  podReady,
} from '../../../src/lifecycle/probe.ts';

function run(results: ProbeResult[], from: ProbeState = initialProbeState()) {
  let state = from;
  const delays: number[] = [];
  const transitions: (string | undefined)[] = [];
  for (const result of results) {
    const step = nextProbeStep(state, result);
    state = step.state;
    delays.push(step.delayMs);
    transitions.push(step.transition);
  }
  return { state, delays, transitions };
}

describe('probe cadence (pod-to-vm.md §8)', () => {
  it('before ready: 100 ms ×1.5 per failure, capped at 1 s', () => {
    const { delays, transitions, state } = run(Array(9).fill('failure'));
    assert.deepEqual(delays, [100, 150, 225, 337.5, 506.25, 759.375, 1000, 1000, 1000]);
    assert.deepEqual(transitions, Array(9).fill(undefined));
    assert.equal(state.ready, false);
  });

  it('one success flips to ready and switches to 5 s', () => {
    const { delays, transitions, state } = run(['failure', 'failure', 'success']);
    assert.deepEqual(delays, [100, 150, 5000]);
    assert.deepEqual(transitions, [undefined, undefined, 'ready']);
    assert.equal(state.ready, true);
  });

  it('once ready: successes stay at 5 s without transitions', () => {
    const { delays, transitions } = run(['success', 'success', 'success']);
    assert.deepEqual(delays, [5000, 5000, 5000]);
    assert.deepEqual(transitions, ['ready', undefined, undefined]);
  });

  it('3 consecutive failures flip to not-ready and fall back to the fast cadence', () => {
    const { delays, transitions, state } = run([
      'success',
      'failure',
      'failure',
      'failure',
      'failure',
      'failure',
    ]);
    assert.deepEqual(delays, [5000, 5000, 5000, 100, 150, 225]);
    assert.deepEqual(transitions, ['ready', undefined, undefined, 'notReady', undefined, undefined]);
    assert.equal(state.ready, false);
  });

  it('a success between failures resets the count', () => {
    const { transitions, state } = run(['success', 'failure', 'failure', 'success', 'failure', 'failure']);
    assert.deepEqual(transitions, ['ready', undefined, undefined, undefined, undefined, undefined]);
    assert.equal(state.ready, true);
  });

  it('a recovered probe restarts the backoff at 100 ms', () => {
    const { delays } = run([
      'failure',
      'failure',
      'failure',
      'success',
      'failure',
      'failure',
      'failure',
      'failure',
    ]);
    assert.deepEqual(delays, [100, 150, 225, 5000, 5000, 5000, 100, 150]);
  });

  it('property: transitions fire only on readiness changes; delays stay within bounds', () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom<ProbeResult>('success', 'failure'), { maxLength: 60 }),
        (results) => {
          let state = initialProbeState();
          for (const result of results) {
            const step = nextProbeStep(state, result);
            const changed = step.state.ready !== state.ready;
            assert.equal(step.transition !== undefined, changed);
            if (step.transition === 'ready') assert.equal(result, 'success');
            if (step.transition === 'notReady') assert.equal(result, 'failure');
            assert.ok(step.delayMs >= 100 && step.delayMs <= 5000);
            if (step.state.ready) assert.equal(step.delayMs, 5000);
            else assert.ok(step.delayMs <= 1000);
            state = step.state;
          }
        },
      ),
    );
  });
});

describe('podReady (lifecycle.md §5)', () => {
  it('is probe ready ∧ lifecycle ready', () => {
    assert.equal(podReady(true, 'ready'), true);
    assert.equal(podReady(false, 'ready'), false);
    for (const lifecycle of ['creating', 'failed', 'hibernating', 'hibernated', ''] as const) {
      assert.equal(podReady(true, lifecycle), false, lifecycle);
    }
  });
});
