// The test runner's job scheduler (ground/schedule.ts): `base` jobs always, more while their
// expected CPU fits.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pickNext, type Schedulable, scheduleLimits } from '../../../ground/schedule.ts';

const job = (estimate: number, cpu: number): Schedulable => ({ estimate, cpu });
const limits = { base: 3, max: 5, cpuBudget: 1.5 };

describe('pickNext', () => {
  test('below base the longest waiting job starts, whatever its CPU', () => {
    assert.equal(pickNext([job(100, 1), job(50, 0.1)], [job(90, 0.9), job(80, 0.9)], limits), 0);
  });

  test('at base a job starts only if its CPU fits: the longest that fits, not the head', () => {
    const running = [job(130, 0.64), job(120, 0.19), job(110, 0.29)]; // 1.12 cores
    const queue = [job(100, 0.69), job(90, 0.92), job(80, 0.19), job(70, 0.17)];
    assert.equal(pickNext(queue, running, limits), 2);
  });

  test('at base nothing starts when no waiting job fits', () => {
    const running = [job(100, 0.6), job(90, 0.5), job(80, 0.3)]; // 1.4 cores
    assert.equal(pickNext([job(70, 0.2), job(60, 0.5)], running, limits), undefined);
  });

  test('a job that exactly fills the budget starts', () => {
    const running = [job(100, 0.5), job(90, 0.5), job(80, 0.25)];
    assert.equal(pickNext([job(70, 0.25)], running, limits), 0);
  });

  test('never more than max, however little CPU', () => {
    const running = [job(1, 0.1), job(1, 0.1), job(1, 0.1), job(1, 0.1), job(1, 0.1)];
    assert.equal(pickNext([job(1, 0.01)], running, limits), undefined);
  });

  test('an empty queue starts nothing', () => {
    assert.equal(pickNext([], [], limits), undefined);
  });
});

describe('scheduleLimits', () => {
  test('two jobs above base at most; the cores less half a core, at least one', () => {
    assert.deepEqual(scheduleLimits(3, 2), { base: 3, max: 5, cpuBudget: 1.5 });
    assert.deepEqual(scheduleLimits(2, 1), { base: 2, max: 4, cpuBudget: 1 });
  });

  test('a serial run (base 1) stays serial', () => {
    assert.equal(scheduleLimits(1, 8).max, 1);
  });
});
