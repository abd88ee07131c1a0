// Prints the README configuration table from the parser's own documentation rows;
// `--write` replaces the block between the config-table markers in README.md.
import { readFileSync, writeFileSync } from 'node:fs';
import { ENV_DOCS } from '../src/config/env.ts';

export function configTable(): string {
  const fmt = (d: string) => (d.startsWith('(') ? d : `\`${d}\``);
  return [
    '| Variable | Default | Meaning |',
    '|---|---|---|',
    // A `|` in a meaning (VK_NAMESPACE_NETWORKS' syntax) would end the Markdown cell.
    ...ENV_DOCS.map((d) => `| \`${d.name}\` | ${fmt(d.default)} | ${d.meaning.replaceAll('|', '\\|')} |`),
  ].join('\n');
}

export function readmeTable(readme: string): string | undefined {
  const m = /<!-- config-table:start -->\n([\s\S]*?)\n<!-- config-table:end -->/.exec(readme);
  return m?.[1];
}

if (import.meta.main) {
  const path = new URL('../README.md', import.meta.url);
  if (process.argv.includes('--write')) {
    const readme = readFileSync(path, 'utf8');
    writeFileSync(
      path,
      readme.replace(
        /(<!-- config-table:start -->\n)[\s\S]*?(\n<!-- config-table:end -->)/,
        `$1${configTable()}$2`,
      ),
    );
  } else {
    process.stdout.write(`${configTable()}\n`);
  }
}
