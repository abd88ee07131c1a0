// Runtime dependencies are exactly what the daemon imports at run time (docs/decisions.md,
// "Release artifact"): package.json's `dependencies` against the packages src/ imports once its
// types are stripped (type-only imports erased), scanned the way the release build scans them
// (packaging/build.ts, which refuses to build on a mismatch). Types-only and test packages are
// devDependencies; `node`, the runtime, is a dependency no module imports.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { test } from 'node:test';
import { dependencyMismatch, RUNTIME_PACKAGE, stripModule } from '../../../packaging/build.ts';

const root = join(import.meta.dirname, '..', '..', '..');
const ts = createRequire(import.meta.url)('typescript') as {
  preProcessFile: Parameters<typeof stripModule>[1];
};

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

test('package.json dependencies are exactly the packages src/ imports at run time, plus the runtime', () => {
  const imported = new Set<string>();
  for (const f of files(join(root, 'src')))
    for (const p of stripModule(readFileSync(f, 'utf8'), ts.preProcessFile).packages) imported.add(p);
  assert.equal(dependencyMismatch(Object.keys(pkg.dependencies), imported), undefined);
  assert.ok(RUNTIME_PACKAGE in pkg.dependencies, 'Node.js 24 itself is a runtime dependency');
  // What the tests and the type checker need only.
  for (const dev of ['@kubernetes/client-node', '@peculiar/x509', 'reflect-metadata', 'pino', 'typescript'])
    assert.ok(dev in pkg.devDependencies && !(dev in pkg.dependencies), dev);
});

test('the check names what is missing and what is extra', () => {
  assert.equal(dependencyMismatch(['a', 'node'], ['a/lib/x']), undefined);
  assert.match(
    dependencyMismatch(['a', 'extra'], ['a', '@s/b/sub']) ?? '',
    /imported but not dependencies: @s\/b; dependencies nothing imports: extra$/,
  );
});
