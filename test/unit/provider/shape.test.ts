// The provider's shape rules (docs/architecture.md, "Inside src/provider/cocoon/"): every
// file is under 300 lines, and a PodRecord is changed by one module only (state.ts): its
// fields are readonly and only state.ts holds the writable view.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const provider = join(root, 'src', 'provider');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

test('every file of the provider is under 300 lines', () => {
  const long = files(provider)
    .map((f) => ({ f: relative(root, f), lines: readFileSync(f, 'utf8').split('\n').length - 1 }))
    .filter(({ lines }) => lines >= 300);
  assert.deepEqual(long, []);
});

test('only state.ts has a writable view of a PodRecord', () => {
  const writers = files(provider)
    .filter((f) => /Mutable<|-readonly/.test(readFileSync(f, 'utf8')))
    .map((f) => relative(root, f));
  assert.deepEqual(writers, ['src/provider/cocoon/state.ts']);
});
