// The shape of one row of the settings table (src/config/settings.ts): the variable, where its
// value lands in Config, its default, its parser, its documentation line and its group. The
// table is the one source of loadConfig, `--help`, the README table (scripts/config-table.ts)
// and the environment file example (packaging/env-example.ts).
import type { NetworkPolicy } from '../vmspec/network-policy.ts';
import type { Parse } from './parsers.ts';
import type { PeerConfig } from './peer.ts';
import type { Config } from './types.ts';

/** The groups, in the order the documentation lists them. */
export const GROUPS = {
  api: 'Kubernetes API',
  node: 'The node',
  kubelet: 'Kubelet API',
  observe: 'Logs and metrics',
  host: 'Cocoon on this host',
  pods: 'Pods and VMs',
  registry: 'Snapshot registry',
  peer: 'Peer restore (docs/peer-restore.md)',
} as const;
export type Group = keyof typeof GROUPS;

/** Config fields that hold other settings' values (`peer.listen`) or no setting's. */
type Nested = 'peer' | 'networkPolicy';
type Derived = 'ignoredLaterTier';

/** Where a setting's value lands in Config: a field, or a field of `peer` / `networkPolicy`. */
export type FieldPath =
  | Exclude<keyof Config, Nested | Derived>
  | `peer.${keyof PeerConfig & string}`
  | `networkPolicy.${keyof NetworkPolicy & string}`;

/** The type of the Config field at `P`. */
export type ValueAt<P extends FieldPath> = P extends `peer.${infer K extends keyof PeerConfig}`
  ? PeerConfig[K]
  : P extends `networkPolicy.${infer K extends keyof NetworkPolicy}`
    ? NetworkPolicy[K]
    : P extends keyof Config
      ? Config[P]
      : never;

/** A default computed from the settings parsed before it (table order). */
export type Derive<T> = (earlier: Readonly<Partial<Config>>) => T;

interface Row {
  /** The environment variable. */
  readonly name: string;
  readonly group: Group;
  /** One line for `--help`, the README and the env example. */
  readonly doc: string;
  /** The default as documented, when it is not the default value itself: a computed one in
   * parentheses (`(host cores)`), or the value a derived default has with the other defaults. */
  readonly shown?: string;
  /** An empty value is parsed (it disables something) instead of meaning the default. */
  readonly emptyIsValue?: true;
}

/** A setting the daemon reads through Config. */
export interface FieldSetting<P extends FieldPath = FieldPath> extends Row {
  readonly field: P;
  readonly default: ValueAt<P> | Derive<ValueAt<P>>;
  readonly parse: Parse<ValueAt<P>>;
}

/** A setting validated here and read from the environment by other code (a library, say):
 * `readFromEnv` names the reader. */
export interface EnvSetting extends Row {
  readonly readFromEnv: string;
  readonly parse: Parse<unknown>;
}

/** A setting in the table only for compatibility with the Go daemon's configurations:
 * `compat` says why it is accepted (and ignored) or what refusing it tells the operator. */
export interface CompatSetting extends Row {
  readonly compat: string;
  readonly parse: Parse<unknown>;
}

export type Setting = FieldSetting | EnvSetting | CompatSetting;

/** A row with its field's type checked against its default and parser. */
export function setting<P extends FieldPath>(row: FieldSetting<P>): FieldSetting<P> {
  return row;
}

export function isFieldSetting(s: Setting): s is FieldSetting {
  return 'field' in s;
}

/** The default as the documentation shows it. */
export function shownDefault(s: Setting): string {
  if (s.shown !== undefined) return s.shown;
  if (!isFieldSetting(s) || s.default === undefined) return '(unset)';
  const d = s.default;
  if (typeof d === 'string' || typeof d === 'number' || typeof d === 'boolean') return String(d);
  throw new Error(`${s.name}: a derived, list or object default needs \`shown\``);
}
