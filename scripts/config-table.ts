// Prints the README configuration tables, one per group, from the settings table that also
// drives the parser (src/config/settings.ts); `--write` replaces the block between the
// config-table markers in README.md.
import { readFileSync, writeFileSync } from 'node:fs';
import { docGroups } from '../src/config/settings.ts';

export function configTable(): string {
  const fmt = (d: string) => (d.startsWith('(') ? d : `\`${d}\``);
  return docGroups()
    .map((g) =>
      [
        `**${g.title}**`,
        '',
        '| Variable | Default | Meaning |',
        '|---|---|---|',
        // A `|` in a meaning (VK_NAMESPACE_NETWORKS' syntax) would end the Markdown cell.
        ...g.docs.map((d) => `| \`${d.name}\` | ${fmt(d.default)} | ${d.meaning.replaceAll('|', '\\|')} |`),
      ].join('\n'),
    )
    .join('\n\n');
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
