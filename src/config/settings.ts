// The settings table: one row per environment variable (src/config/setting.ts says what a row
// holds), in three parts by group. loadConfig reads it (src/config/env.ts); `--help`, the
// README table (scripts/config-table.ts) and the env example (packaging/env-example.ts) are
// rendered from the documentation view below. test/unit/config/settings-read.test.ts fails on
// a row that nothing outside src/config reads, unless the row is `compat` with its reason.
import { PEER_SETTINGS } from './peer.ts';
import { type FieldPath, GROUPS, type Group, type Setting, shownDefault } from './setting.ts';
import { HOST_SETTINGS } from './settings-host.ts';
import { NODE_SETTINGS } from './settings-node.ts';

const ROWS = [...NODE_SETTINGS, ...HOST_SETTINGS, ...PEER_SETTINGS];

/** The Config fields no row fills: this must stay empty (the assignment below fails to
 * compile, naming the field, when a Config field has no row). */
type Missing = Exclude<FieldPath, Extract<(typeof ROWS)[number], { field: FieldPath }>['field']>;
const _everyFieldHasARow: [Missing] extends [never] ? true : Missing = true;

const GROUP_ORDER = Object.keys(GROUPS) as Group[];

/** Every setting, grouped in GROUPS order (the order of the rows within a group kept: a
 * derived default comes after what it is derived from). */
export const SETTINGS: readonly Setting[] = [...(ROWS as readonly Setting[])].sort(
  (a, b) => GROUP_ORDER.indexOf(a.group) - GROUP_ORDER.indexOf(b.group),
);

/** One documented variable: what `--help`, the README and the env example show. */
export interface EnvVarDoc {
  name: string;
  /** The default as shown: a value, or a computed one in parentheses. */
  default: string;
  meaning: string;
  /** The group's title. */
  group: string;
  /** An empty value is a value (it disables something), not the default. */
  emptyIsValue: boolean;
}

export const ENV_DOCS: readonly EnvVarDoc[] = SETTINGS.map((s) => ({
  name: s.name,
  default: shownDefault(s),
  meaning: 'compat' in s ? `${s.doc}. Compatibility only: ${s.compat}` : s.doc,
  group: GROUPS[s.group],
  emptyIsValue: s.emptyIsValue === true,
}));

/** ENV_DOCS by group, in order. */
export function docGroups(): { title: string; docs: EnvVarDoc[] }[] {
  return GROUP_ORDER.map((g) => ({
    title: GROUPS[g],
    docs: ENV_DOCS.filter((d) => d.group === GROUPS[g]),
  })).filter((g) => g.docs.length > 0);
}

/** `vk-cocoon --help` text, generated from the same table as the parser. */
export function helpText(): string {
  const width = Math.max(...ENV_DOCS.map((d) => d.name.length));
  const groups = docGroups().flatMap((g) => [
    '',
    `${g.title}:`,
    ...g.docs.map((d) => `  ${d.name.padEnd(width)}  ${d.meaning} [default: ${d.default}]`),
  ]);
  return [
    'vk-cocoon: a Virtual Kubelet that turns pods into Cocoon microVMs.',
    '',
    'Usage: vk-cocoon [run]       start the daemon (configured by the environment below)',
    '       vk-cocoon --help      this text',
    '       vk-cocoon --version   print the version',
    '',
    'Environment:',
    ...groups,
    '',
  ].join('\n');
}
