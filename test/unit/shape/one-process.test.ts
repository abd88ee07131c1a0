// The unit job runs every unit test file in one process (`node --test --test-isolation=none`,
// ground/run-tests.ts; docs/test-ground.md "Suite CPU"). There a hook registered at a file's
// top level belongs to the run's root and runs around every other file's tests (a
// `mock.timers.reset()` of one file once froze another file's real timers), so a file's hooks
// live inside a `describe`.
import assert from 'node:assert/strict';
import { globSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

const root = join(import.meta.dirname, '..', '..', '..');

test('no unit test file registers a hook at its top level', () => {
  const files = globSync('test/unit/**/*.test.ts', { cwd: root });
  assert.ok(files.length > 100, `the unit test files are found (${files.length})`);
  const offenders = files.flatMap((f) =>
    readFileSync(join(root, f), 'utf8')
      .split('\n')
      .flatMap((line, i) =>
        /^(before|after|beforeEach|afterEach)\(/.test(line) ? [`${f}:${i + 1}: ${line}`] : [],
      ),
  );
  assert.deepEqual(offenders, []);
});
