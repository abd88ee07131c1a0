// Which settings of the table (src/config/settings.ts) the daemon never reads: a syntactic scan
// of src/ outside src/config for property reads (`config.nodeName`, `{ stagingDir } = peer`,
// `env.GOOGLE_APPLICATION_CREDENTIALS`). It is a scan of names, not of types: a field whose
// name another object also has (nodeName) counts as read by either; a nested field
// (`peer.listen`) needs both of its names read.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import ts from 'typescript';

export const ROOT = join(import.meta.dirname, '..', '..', '..');

/** What the check needs of a row (src/config/setting.ts's Setting). */
export interface ReadCheckRow {
  readonly name: string;
  readonly field?: string;
  readonly readFromEnv?: string;
  readonly compat?: string;
}

/** The property names `text` reads: `x.name`, `x?.name`, `x['name']` and destructured
 * `{ name }` / `{ name: y }`. Comments, type members and object literal keys are not reads. */
export function propertyReads(fileName: string, text: string): Set<string> {
  const reads = new Set<string>();
  const visit = (node: ts.Node): void => {
    if (ts.isPropertyAccessExpression(node)) reads.add(node.name.text);
    else if (ts.isElementAccessExpression(node) && ts.isStringLiteralLike(node.argumentExpression))
      reads.add(node.argumentExpression.text);
    else if (ts.isBindingElement(node) && ts.isObjectBindingPattern(node.parent)) {
      const key = node.propertyName ?? node.name;
      if (ts.isIdentifier(key) || ts.isStringLiteralLike(key)) reads.add(key.text);
    }
    ts.forEachChild(node, visit);
  };
  visit(ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS));
  return reads;
}

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? tsFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

const scanned = new Map<string, ReadonlySet<string>>();

/** Every property read in the daemon's sources outside src/config (scanned once per root). */
export function daemonReads(root = ROOT): ReadonlySet<string> {
  const known = scanned.get(root);
  if (known) return known;
  const reads = new Set<string>();
  for (const file of tsFiles(join(root, 'src'))) {
    if (relative(root, file).startsWith(`${join('src', 'config')}${sep}`)) continue;
    for (const r of propertyReads(file, readFileSync(file, 'utf8'))) reads.add(r);
  }
  scanned.set(root, reads);
  return reads;
}

/** One line per row that nothing reads (and per `compat` without a reason); empty when the
 * table is sound. A row is read when every name of its Config field path is read, or, for a
 * row the daemon reads from the environment itself, when its variable is read as a property
 * (`env.NAME`). A `compat` row is exempt: it says why it is kept. */
export function unreadSettings(rows: readonly ReadCheckRow[], reads: ReadonlySet<string>): string[] {
  const out: string[] = [];
  for (const row of rows) {
    if (row.compat !== undefined) {
      if (row.compat.trim() === '') out.push(`${row.name}: marked compat without a reason`);
    } else if (row.field !== undefined) {
      if (!row.field.split('.').every((part) => reads.has(part)))
        out.push(
          `${row.name}: Config field ${row.field} is never read outside src/config (read it, drop the row, or mark it compat with the reason)`,
        );
    } else if (row.readFromEnv !== undefined) {
      if (!reads.has(row.name))
        out.push(
          `${row.name}: said to be read from the environment by ${row.readFromEnv}, but nothing outside src/config reads env.${row.name}`,
        );
    } else {
      out.push(`${row.name}: no Config field, not read from the environment and not marked compat`);
    }
  }
  return out;
}
