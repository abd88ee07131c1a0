// The layer check of docs/architecture.md: every module under src/ imports only modules of
// its own layer or a lower one, and the framework (src/pods, src/kubelet, src/node) never
// imports the provider; a part listed in ONLY (src/peer) imports nothing but what it lists.
// Run: `node scripts/layers.ts` (exit 1 and a line per violation).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** The layer of each top-level part of src/ (docs/architecture.md, "Where everything lives"). */
export const LAYERS: Readonly<Record<string, number>> = {
  util: 1,
  contract: 1,
  'log.ts': 1,
  'version.ts': 1,
  net: 1,
  cocoon: 2,
  kube: 2,
  guest: 2,
  vmspec: 2,
  metrics: 2,
  config: 3,
  authority: 3,
  lifecycle: 3,
  registry: 3,
  peer: 3,
  stats: 3,
  pods: 3,
  kubelet: 4,
  node: 4,
  provider: 5,
  'main.ts': 6,
  cli: 6,
};

const FRAMEWORK = ['pods', 'kubelet', 'node'];

/** Parts that may import only these (paths under src/, a file or a whole folder). */
const ONLY: Readonly<Record<string, readonly string[]>> = {
  // docs/peer-restore.md: the peer library never runs cocoon or talks to Kubernetes itself.
  peer: ['peer', 'util', 'log.ts', 'registry/artifact-config.ts'],
};

function part(file: string): string {
  return relative(join(root, 'src'), file).split('/')[0] ?? '';
}

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

const IMPORT =
  /(?:import|export)[^'"]*?from\s*['"](\.{1,2}\/[^'"]+)['"]|import\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g;

/** Every violation as `<file> (layer a) imports <file> (layer b)`. */
export function violations(): string[] {
  const out: string[] = [];
  for (const file of files(join(root, 'src'))) {
    const from = part(file);
    const lf = LAYERS[from];
    if (lf === undefined) {
      out.push(`${relative(root, file)}: src/${from} has no layer in scripts/layers.ts`);
      continue;
    }
    for (const m of readFileSync(file, 'utf8').matchAll(IMPORT)) {
      const target = normalize(join(dirname(file), m[1] ?? m[2] ?? ''));
      if (!target.startsWith(join(root, 'src'))) continue;
      const to = part(target);
      const lt = LAYERS[to] ?? Number.POSITIVE_INFINITY;
      const where = `${relative(root, file)} (${from}, layer ${lf}) imports ${relative(root, target)} (${to}, layer ${lt})`;
      if (lt > lf) out.push(`${where}: a higher layer`);
      if (FRAMEWORK.includes(from) && to === 'provider')
        out.push(`${where}: the framework never imports the provider`);
      const only = ONLY[from];
      const rel = relative(join(root, 'src'), target);
      if (only && !only.some((p) => rel === p || rel.startsWith(`${p}/`)))
        out.push(`${where}: src/${from} may import only ${only.join(', ')}`);
    }
  }
  return out;
}

if (process.argv[1] && normalize(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const found = violations();
  for (const v of found) console.log(v);
  console.log(
    found.length === 0
      ? 'layers: every import points down or sideways'
      : `layers: ${found.length} violations`,
  );
  process.exit(found.length === 0 ? 0 : 1);
}
