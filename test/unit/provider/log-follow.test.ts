import assert from 'node:assert/strict';
import { test } from 'node:test';
import { newLogLines } from '../../../src/provider/cocoon/provider.ts';

test('new log lines after the previous tail', () => {
  assert.deepEqual(newLogLines(['a', 'b', 'c'], ['a', 'b', 'c', 'd', 'e']), ['d', 'e']);
  assert.deepEqual(newLogLines(['b', 'c'], ['x', 'a', 'b', 'c', 'd']), ['d']);
  assert.deepEqual(newLogLines(['a', 'b'], ['a', 'b']), []);
});

test('repeated lines anchor on the latest occurrence', () => {
  assert.deepEqual(newLogLines(['x', 'tick'], ['x', 'tick', 'y', 'x', 'tick', 'z']), ['z']);
});

test('no anchor (rotation) emits everything; no previous emits everything', () => {
  assert.deepEqual(newLogLines(['old'], ['n1', 'n2']), ['n1', 'n2']);
  assert.deepEqual(newLogLines([], ['n1']), ['n1']);
});
