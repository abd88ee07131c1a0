// A cobra/pflag-compatible argv parser: the simulator must reject exactly what cocoon rejects
// (unknown flags, missing flag values, bad integers, wrong positional counts) with cocoon's
// messages, so that argv drift in the provider shows up as test failures.
//
// Hand-written rather than node:util.parseArgs because that parser has different error texts,
// no integer flags, no repeated string flags and no cobra-style "-ojson" / "--flag=value" rules.
import { CliError } from './errors.ts';

export type FlagType = 'bool' | 'string' | 'int' | 'strings';

export interface FlagSpec {
  name: string;
  short?: string;
  type: FlagType;
  /** Accepted for compatibility and ignored. */
  noop?: boolean;
}

export interface CommandSpec {
  /** Full command path without the binary, e.g. `vm clone`. */
  path: string;
  usage: string;
  flags: FlagSpec[];
  /** Positional argument bounds (max may be Infinity). */
  minArgs: number;
  maxArgs: number;
}

export type FlagValue = boolean | string | number | string[];

export interface Parsed {
  flags: Map<string, FlagValue>;
  args: string[];
  /** Number of positionals before `--`, or -1 when there was no `--` (cobra's ArgsLenAtDash). */
  dashAt: number;
  help: boolean;
}

function parseBool(raw: string, flag: string): boolean {
  if (/^(1|t|T|true|TRUE|True)$/.test(raw)) return true;
  if (/^(0|f|F|false|FALSE|False)$/.test(raw)) return false;
  throw new CliError(
    `invalid argument "${raw}" for "${flag}" flag: strconv.ParseBool: parsing "${raw}": invalid syntax`,
  );
}

function parseInt64(raw: string, flag: string): number {
  if (!/^[+-]?\d+$/.test(raw)) {
    throw new CliError(
      `invalid argument "${raw}" for "${flag}" flag: strconv.ParseInt: parsing "${raw}": invalid syntax`,
    );
  }
  const n = Number(raw);
  if (!Number.isSafeInteger(n)) {
    throw new CliError(
      `invalid argument "${raw}" for "${flag}" flag: strconv.ParseInt: parsing "${raw}": value out of range`,
    );
  }
  return n;
}

function flagLabel(spec: FlagSpec): string {
  return spec.short ? `-${spec.short}, --${spec.name}` : `--${spec.name}`;
}

function store(out: Map<string, FlagValue>, spec: FlagSpec, raw: string, label: string): void {
  switch (spec.type) {
    case 'bool':
      out.set(spec.name, parseBool(raw, label));
      return;
    case 'int':
      out.set(spec.name, parseInt64(raw, label));
      return;
    case 'strings': {
      const prev = out.get(spec.name);
      out.set(spec.name, [...(Array.isArray(prev) ? prev : []), raw]);
      return;
    }
    default:
      out.set(spec.name, raw);
  }
}

/** Parses `argv` (the words after the command path) against `spec`, pflag style. */
export function parseArgs(spec: CommandSpec, argv: readonly string[]): Parsed {
  const byName = new Map(spec.flags.map((f) => [f.name, f]));
  const byShort = new Map(spec.flags.filter((f) => f.short).map((f) => [f.short as string, f]));
  const flags = new Map<string, FlagValue>();
  const args: string[] = [];
  let dashAt = -1;
  let help = false;
  for (let i = 0; i < argv.length; i++) {
    const word = argv[i] as string;
    if (dashAt >= 0 || word === '-' || !word.startsWith('-')) {
      args.push(word);
      continue;
    }
    if (word === '--') {
      dashAt = args.length;
      continue;
    }
    if (word.startsWith('--')) {
      const eq = word.indexOf('=');
      const name = eq >= 0 ? word.slice(2, eq) : word.slice(2);
      if (name === 'help') {
        help = true;
        continue;
      }
      const f = byName.get(name);
      if (!f) throw new CliError(`unknown flag: --${name}`);
      const label = `--${name}`;
      if (eq >= 0) {
        store(flags, f, word.slice(eq + 1), flagLabel(f));
      } else if (f.type === 'bool') {
        flags.set(f.name, true);
      } else {
        if (i + 1 >= argv.length) throw new CliError(`flag needs an argument: ${label}`);
        i += 1;
        store(flags, f, argv[i] as string, flagLabel(f));
      }
      continue;
    }
    // Shorthand cluster: -i, -ojson, -o=json, -o json, -ie FOO=1.
    const cluster = word.slice(1);
    for (let j = 0; j < cluster.length; j++) {
      const c = cluster[j] as string;
      if (c === 'h') {
        help = true;
        continue;
      }
      const f = byShort.get(c);
      if (!f) throw new CliError(`unknown shorthand flag: '${c}' in ${word}`);
      const rest = cluster.slice(j + 1);
      if (f.type === 'bool') {
        if (rest.startsWith('=')) {
          store(flags, f, rest.slice(1), flagLabel(f));
          break;
        }
        flags.set(f.name, true);
        continue;
      }
      if (rest.length > 0) {
        store(flags, f, rest.startsWith('=') ? rest.slice(1) : rest, flagLabel(f));
      } else {
        if (i + 1 >= argv.length) throw new CliError(`flag needs an argument: '${c}' in -${c}`);
        i += 1;
        store(flags, f, argv[i] as string, flagLabel(f));
      }
      break;
    }
  }
  if (!help) checkArgCount(spec, args);
  return { flags, args, dashAt, help };
}

function checkArgCount(spec: CommandSpec, args: string[]): void {
  const n = args.length;
  const { minArgs: min, maxArgs: max } = spec;
  if (max === 0 && n > 0) throw new CliError(`unknown command "${args[0]}" for "cocoon ${spec.path}"`);
  if (min === max && n !== min) throw new CliError(`accepts ${min} arg(s), received ${n}`);
  if (max === Infinity && n < min) throw new CliError(`requires at least ${min} arg(s), only received ${n}`);
  if (n < min || n > max) throw new CliError(`accepts between ${min} and ${max} arg(s), received ${n}`);
}

/** Typed accessors over the parsed flag map. */
export function str(p: Parsed, name: string): string | undefined {
  const v = p.flags.get(name);
  return typeof v === 'string' ? v : undefined;
}
export function int(p: Parsed, name: string): number | undefined {
  const v = p.flags.get(name);
  return typeof v === 'number' ? v : undefined;
}
export function bool(p: Parsed, name: string): boolean {
  return p.flags.get(name) === true;
}
export function strs(p: Parsed, name: string): string[] {
  const v = p.flags.get(name);
  return Array.isArray(v) ? v : [];
}

/** The text printed for `-h/--help`. */
export function usageText(spec: CommandSpec): string {
  const lines = [`Usage:\n  cocoon ${spec.usage}`];
  if (spec.flags.length > 0) {
    lines.push('\nFlags:');
    for (const f of spec.flags.filter((x) => !x.noop)) {
      const arg = f.type === 'bool' ? '' : f.type === 'int' ? ' int' : ' string';
      lines.push(`  ${f.short ? `-${f.short}, ` : '    '}--${f.name}${arg}`);
    }
    lines.push('  -h, --help');
  }
  return `${lines.join('\n')}\n`;
}
