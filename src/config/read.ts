// Reads the rows of the settings table from the environment: each value parsed by its row's
// parser, or its row's default when unset; every bad value is reported naming the variable.
import { INVALID, type ParseContext } from './parsers.ts';
import { type FieldPath, isFieldSetting, type Setting } from './setting.ts';
import type { Config } from './types.ts';

/** An environment variable's value, trimmed; `undefined` when unset. */
export type Getter = (name: string) => string | undefined;

export interface ReadSettings {
  /** The value of every field setting, by its field path (`nodeName`, `peer.listen`). */
  readonly values: Readonly<Partial<Record<FieldPath, unknown>>>;
  /** The variables whose value was bad (reported): checks across settings skip them. */
  readonly bad: ReadonlySet<string>;
  /** The compatibility settings that were set and accepted: ignored. */
  readonly ignored: readonly string[];
}

/** Reads `rows` in order (a derived default sees the fields read before it); pushes one
 * problem per bad value (or bad part of a list) to `problems`. */
export function readSettings(rows: readonly Setting[], get: Getter, problems: string[]): ReadSettings {
  const values: Partial<Record<FieldPath, unknown>> = {};
  const bad = new Set<string>();
  const ignored: string[] = [];
  for (const s of rows) {
    const raw = get(s.name);
    const set = raw !== undefined && (raw !== '' || s.emptyIsValue === true);
    let failed = false;
    const ctx: ParseContext = {
      bad: (what) => {
        failed = true;
        problems.push(`${s.name}=${JSON.stringify(raw)}: ${what}`);
        return INVALID;
      },
      badPart: (what) => {
        failed = true;
        problems.push(what.startsWith(`${s.name}:`) ? what : `${s.name}: ${what}`);
      },
    };
    const parsed = set ? s.parse(raw, ctx) : INVALID;
    if (failed) bad.add(s.name);
    if ('compat' in s && set && !failed) ignored.push(s.name);
    if (!isFieldSetting(s)) continue;
    values[s.field] =
      parsed !== INVALID && !failed
        ? parsed
        : typeof s.default === 'function'
          ? s.default(values as Partial<Config>)
          : s.default;
  }
  return { values, bad, ignored };
}

/** Sets each value at its field path: `peer.listen` is `listen` of the `peer` object. */
export function assemble(values: ReadSettings['values']): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [path, value] of Object.entries(values)) {
    const [top = '', inner] = path.split('.');
    if (inner === undefined) {
      out[top] = value;
      continue;
    }
    const nested = (out[top] ?? {}) as Record<string, unknown>;
    nested[inner] = value;
    out[top] = nested;
  }
  return out;
}
