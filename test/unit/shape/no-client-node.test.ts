// The daemon never loads @kubernetes/client-node at runtime (docs/decisions.md "Kubernetes
// client": importing it alone costs ~85 MB of RSS). Under src/ it may only appear in
// `import type` / `export type` statements, which are erased; ground/, bench/ and the tests
// may use it as an admin client.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const SPEC = '@kubernetes/client-node';

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** The source without comments (good enough for finding module specifiers). */
function code(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:'"`])\/\/.*$/gm, '$1');
}

/** Every mention of the package in `file` that is not a type-only import or export. */
export function runtimeUses(text: string): string[] {
  const src = code(text);
  const typeOnly = new RegExp(
    String.raw`\b(?:import|export)\s+type\s*\{[^}]*\}\s*from\s*['"]${SPEC}(?:/[^'"]*)?['"]`,
    'g',
  );
  const rest = src.replace(typeOnly, '');
  const mention = new RegExp(String.raw`['"\`]${SPEC}(?:/[^'"\`]*)?['"\`]`, 'g');
  return [...rest.matchAll(mention)].map((m) => {
    const start = rest.lastIndexOf('\n', m.index) + 1;
    const end = rest.indexOf('\n', m.index);
    return rest.slice(start, end < 0 ? undefined : end).trim();
  });
}

test('the check itself: type-only imports pass, anything else is found', () => {
  assert.deepEqual(runtimeUses(`import type { V1Pod } from '${SPEC}';\n// import { X } from '${SPEC}'`), []);
  assert.deepEqual(runtimeUses(`export type {\n  V1Pod,\n  V1Node,\n} from "${SPEC}";`), []);
  assert.equal(runtimeUses(`import { type V1Pod } from '${SPEC}';`).length, 1, 'keeps a side-effect import');
  assert.equal(runtimeUses(`import { KubeConfig } from '${SPEC}';`).length, 1);
  assert.equal(runtimeUses(`const m = await import('${SPEC}');`).length, 1);
  assert.equal(runtimeUses(`import '${SPEC}/dist/watch.js';`).length, 1);
  assert.equal(runtimeUses(`export { V1Pod } from '${SPEC}';`).length, 1);
});

test(`no runtime import of ${SPEC} under src/`, () => {
  const found: string[] = [];
  for (const f of files(join(root, 'src')))
    for (const use of runtimeUses(readFileSync(f, 'utf8'))) found.push(`${relative(root, f)}: ${use}`);
  assert.deepEqual(found, []);
});

test(`loading the daemon's whole module graph (src/main.ts) never resolves ${SPEC}`, () => {
  // A resolve hook records every specifier; `--version` exits after the static imports ran.
  const hook = `
    import { registerHooks } from 'node:module';
    registerHooks({
      resolve(specifier, context, next) {
        if (specifier === '${SPEC}' || specifier.startsWith('${SPEC}/'))
          process.stderr.write('RESOLVED ' + specifier + ' from ' + context.parentURL + '\\n');
        return next(specifier, context);
      },
    });`;
  const res = spawnSync(
    process.execPath,
    [
      '--import',
      `data:text/javascript,${encodeURIComponent(hook)}`,
      join(root, 'src', 'main.ts'),
      '--version',
    ],
    { encoding: 'utf8', timeout: 60_000 },
  );
  assert.equal(res.status, 0, res.stderr);
  assert.match(res.stdout, /^v\d/);
  assert.doesNotMatch(res.stderr, /RESOLVED/);
});
