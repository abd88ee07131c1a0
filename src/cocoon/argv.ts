/**
 * Pure argv builders for every `cocoon` verb the provider uses (docs/contracts/cocoon-cli.md "Verbs and argv"). The result
 * is the argv after the binary path, in exactly the emitted order the spec fixes (tests and the
 * simulator assert it). No global flags are ever added (docs/contracts/cocoon-cli.md "Invocation").
 *
 * Defence in depth against flag injection: a positional argument that is empty or starts with
 * `-` would be parsed by cocoon as a flag (or shift the positionals), so the builders throw an
 * {@link ArgvError} for it. Callers validate pod-author input before it gets here (VMSpec);
 * reaching the throw is a bug, not a user error.
 */
import type { Backend } from '../contract/vm.ts';

/** A positional argument that cocoon would misread as a flag, or an empty one. */
export class ArgvError extends Error {
  override readonly name = 'ArgvError';
}

type Numeric = number | bigint;

function positional(what: string, value: string): string {
  if (value === '' || value.startsWith('-')) {
    throw new ArgvError(`cocoon argv: invalid ${what} ${JSON.stringify(value)}`);
  }
  return value;
}

function numeric(flag: string, value: Numeric | undefined): string[] {
  return value === undefined ? [] : [flag, String(value)];
}

function text(flag: string, value: string | undefined): string[] {
  return value === undefined || value === '' ? [] : [flag, value];
}

function bool(flag: string, on: boolean | undefined): string[] {
  return on === true ? [flag] : [];
}

/** Options of `vm clone` (docs/contracts/cocoon-cli.md "vm clone" step 6, docs/contracts/cocoon-cli.md "vm clone"). */
export interface CloneArgs {
  readonly vmName: string;
  /** The snapshot's backend: `--restore-mode` and `--nics` are never sent for Firecracker. */
  readonly backend: Backend;
  readonly network?: string;
  /** CH only; dropped for Firecracker. */
  readonly noDirectIO?: boolean;
  /** `--pull` (the snapshot has a base image); forced for `fromDir`. */
  readonly pull?: boolean;
  readonly restoreMode?: 'copy' | 'ondemand' | 'mmap';
  /** `--nics 1` for a CH+Windows wake. */
  readonly nics?: number;
  readonly cpuWeight?: number;
  readonly cpuQuotaUs?: Numeric;
  readonly cpuPeriodUs?: Numeric;
  /** Exactly one source: a local snapshot name, or an absolute directory. */
  readonly source: { readonly snapshot: string } | { readonly fromDir: string };
}

/**
 * `vm clone --output json --name <vm> [--network <net>] [--no-direct-io] [--pull]
 * [--restore-mode <m>] [--nics <n>] [--cpu-weight <w>] [--cpu-quota-us <q>]
 * [--cpu-period-us <p>] <snapshot>` — or `--from-dir <dir>` in place of `<snapshot>`, which
 * forces `--pull`.
 */
export function cloneArgv(args: CloneArgs): string[] {
  const firecracker = args.backend === 'firecracker';
  const fromDir = 'fromDir' in args.source ? args.source.fromDir : undefined;
  const argv = [
    'vm',
    'clone',
    '--output',
    'json',
    '--name',
    positional('VM name', args.vmName),
    ...text('--network', args.network),
    ...bool('--no-direct-io', args.noDirectIO === true && !firecracker),
    ...bool('--pull', args.pull === true || fromDir !== undefined),
    ...(firecracker ? [] : text('--restore-mode', args.restoreMode)),
    ...(firecracker ? [] : numeric('--nics', args.nics)),
    ...numeric('--cpu-weight', args.cpuWeight),
    ...numeric('--cpu-quota-us', args.cpuQuotaUs),
    ...numeric('--cpu-period-us', args.cpuPeriodUs),
  ];
  if (fromDir !== undefined) argv.push('--from-dir', positional('clone dir', fromDir));
  else if ('snapshot' in args.source) argv.push(positional('snapshot name', args.source.snapshot));
  return argv;
}

/** Options of `vm run` (docs/contracts/cocoon-cli.md "vm run" step 2). */
export interface RunArgs {
  readonly vmName: string;
  readonly cpus?: Numeric;
  readonly cpuWeight?: number;
  readonly cpuQuotaUs?: Numeric;
  readonly cpuPeriodUs?: Numeric;
  readonly memoryBytes?: Numeric;
  readonly storageBytes?: Numeric;
  readonly network?: string;
  readonly windows?: boolean;
  /** `--fc` (backend firecracker). */
  readonly firecracker?: boolean;
  /** CH only; dropped with `firecracker`. */
  readonly noDirectIO?: boolean;
  readonly image: string;
}

/**
 * `vm run --output json --name <vm> [--cpu <n>] [--cpu-weight <w>] [--cpu-quota-us <q>]
 * [--cpu-period-us <p>] [--memory <bytes>] [--storage <bytes>] [--network <net>] [--windows]
 * [--fc] [--no-direct-io] <image>`.
 */
export function runArgv(args: RunArgs): string[] {
  return [
    'vm',
    'run',
    '--output',
    'json',
    '--name',
    positional('VM name', args.vmName),
    ...numeric('--cpu', args.cpus),
    ...numeric('--cpu-weight', args.cpuWeight),
    ...numeric('--cpu-quota-us', args.cpuQuotaUs),
    ...numeric('--cpu-period-us', args.cpuPeriodUs),
    ...numeric('--memory', args.memoryBytes),
    ...numeric('--storage', args.storageBytes),
    ...text('--network', args.network),
    ...bool('--windows', args.windows),
    ...bool('--fc', args.firecracker),
    ...bool('--no-direct-io', args.noDirectIO === true && args.firecracker !== true),
    positional('image', args.image),
  ];
}

/** `vm inspect <id|name>` (always JSON; no `-o` flag). */
export function inspectArgv(ref: string): string[] {
  return ['vm', 'inspect', positional('VM reference', ref)];
}

/** `vm list -o json`. */
export function listArgv(): string[] {
  return ['vm', 'list', '-o', 'json'];
}

/** `vm rm --force <id>` (the provider always forces; not found counts as success). */
export function removeArgv(vmId: string): string[] {
  return ['vm', 'rm', '--force', positional('VM id', vmId)];
}

/** `vm start <id>`. */
export function startArgv(vmId: string): string[] {
  return ['vm', 'start', positional('VM id', vmId)];
}

/** Options of `vm exec` (docs/contracts/cocoon-cli.md "vm exec", docs/contracts/post-clone.md "Windows"/docs/contracts/post-clone.md "Linux script"). */
export interface ExecArgs {
  readonly vmId: string;
  /** `-i` only when the caller supplies stdin. */
  readonly stdin?: boolean;
  /** Guest environment; emitted as `-e KEY=VAL` sorted by key. */
  readonly env?: Readonly<Record<string, string>>;
  /** Guest command; at least `argv0`. Passed after the mandatory `--` unchanged. */
  readonly command: readonly string[];
}

/** Orders strings by Unicode code point, i.e. by UTF-8 bytes like Go's `sort.Strings`. */
function compareCodePoints(a: string, b: string): number {
  const left = [...a];
  const right = [...b];
  const length = Math.min(left.length, right.length);
  for (let i = 0; i < length; i++) {
    const difference = left[i]!.codePointAt(0)! - right[i]!.codePointAt(0)!;
    if (difference !== 0) return difference;
  }
  return left.length - right.length;
}

/** `vm exec [-i] [-e KEY=VAL]... <id> -- <argv0> [argv...]` with `-e` sorted by key. */
export function execArgv(args: ExecArgs): string[] {
  if (args.command.length === 0) throw new ArgvError('cocoon argv: exec needs a command');
  const env = Object.entries(args.env ?? {}).sort(([a], [b]) => compareCodePoints(a, b));
  const argv = ['vm', 'exec', ...bool('-i', args.stdin)];
  for (const [key, value] of env) {
    if (key === '' || key.includes('='))
      throw new ArgvError(`cocoon argv: invalid env key ${JSON.stringify(key)}`);
    argv.push('-e', `${key}=${value}`);
  }
  argv.push(positional('VM id', args.vmId), '--', ...args.command);
  return argv;
}

/** Default `--tail` of `kubectl logs` (docs/contracts/cocoon-cli.md "vm exec"). */
export const DEFAULT_LOG_TAIL = 200;

/** `vm logs --tail <n> <id>`. */
export function logsArgv(vmId: string, tail: number = DEFAULT_LOG_TAIL): string[] {
  return ['vm', 'logs', '--tail', String(tail), positional('VM id', vmId)];
}

/** `vm net --nics <n> <id>` (CH only). */
export function netArgv(vmId: string, nics: number): string[] {
  return ['vm', 'net', '--nics', String(nics), positional('VM id', vmId)];
}

/** `vm status --event --format json` (the event stream, docs/contracts/cocoon-cli.md "Event line"). */
export function statusEventsArgv(): string[] {
  return ['vm', 'status', '--event', '--format', 'json'];
}

/** `vm reconcile-stale-create <id> -o json` (later tier). */
export function reconcileStaleCreateArgv(vmId: string): string[] {
  return ['vm', 'reconcile-stale-create', positional('VM id', vmId), '-o', 'json'];
}

/** `snapshot save --name <name> <vmID>`. */
export function snapshotSaveArgv(name: string, vmId: string): string[] {
  return ['snapshot', 'save', '--name', positional('snapshot name', name), positional('VM id', vmId)];
}

/** `snapshot inspect <name>`. */
export function snapshotInspectArgv(name: string): string[] {
  return ['snapshot', 'inspect', positional('snapshot name', name)];
}

/** `snapshot rm <name|id>` (`snapshot not found` counts as success). */
export function snapshotRemoveArgv(ref: string): string[] {
  return ['snapshot', 'rm', positional('snapshot reference', ref)];
}

/** `snapshot import --name <name> [--description <d>]` (tar on stdin). */
export function snapshotImportArgv(name: string, description?: string): string[] {
  return [
    'snapshot',
    'import',
    '--name',
    positional('snapshot name', name),
    ...text('--description', description),
  ];
}

/** `snapshot export <name> -o -` (tar on stdout). */
export function snapshotExportArgv(name: string): string[] {
  return ['snapshot', 'export', positional('snapshot name', name), '-o', '-'];
}

/** `snapshot list -o json` (later tier). */
export function snapshotListArgv(): string[] {
  return ['snapshot', 'list', '-o', 'json'];
}

/** `image pull [--force] <image>`. */
export function imagePullArgv(image: string, force = false): string[] {
  return ['image', 'pull', ...bool('--force', force), positional('image', image)];
}

/** `image inspect <name|digest>`. */
export function imageInspectArgv(ref: string): string[] {
  return ['image', 'inspect', positional('image reference', ref)];
}

/** `image import <name>` (disk stream on stdin). */
export function imageImportArgv(name: string): string[] {
  return ['image', 'import', positional('image name', name)];
}
