// The per-invocation context handed to every verb: root, knobs, output helpers, and the
// latency / fault injection of cocoon-cli.md §8.5.
import type { CommandSpec, Parsed } from './cli.ts';
import { findSnapshotIn, findVm, readSnapDb } from './db.ts';
import { ScriptedExit } from './errors.ts';
import { checkpoint, type Io, io } from './io.ts';
import { consumeTimes, type Knobs, latencyMs, matchesAny, re, ruleKey } from './knobs.ts';

export interface Verb {
  spec: CommandSpec;
  /** Reserving verbs sleep their latency themselves, after reserving a placeholder. */
  reserving?: boolean;
  run(ctx: Ctx, p: Parsed): Promise<number | undefined>;
}

export type VerbModule = { verbs: Record<string, Verb> };

export type FaultPhase = 'pre' | 'start';

/**
 * Never resolves (a hung cocoon). A process keeps its event loop alive until it is killed; a
 * server request stays open until its client goes away.
 */
export function hangForever(cur: Io = io()): Promise<never> {
  return new Promise<never>(() => {
    if (!cur.server) setInterval(() => {}, 1 << 30);
  });
}

export class Ctx {
  readonly root: string;
  readonly env: NodeJS.ProcessEnv;
  /** Words after the binary name. */
  readonly argv: readonly string[];
  /** Command path, e.g. `vm clone`. */
  readonly verb: string;
  readonly knobs: Knobs;
  readonly leasesPath: string;
  /** stdout, stderr, stdin, signals and the caller's identity (sim/io.ts). */
  readonly io: Io;
  stdinBytes = 0;
  private readonly onFinish: (exit: number) => void;

  constructor(opts: {
    root: string;
    env: NodeJS.ProcessEnv;
    argv: readonly string[];
    verb: string;
    knobs: Knobs;
    leasesPath: string;
    io: Io;
    onFinish: (exit: number) => void;
  }) {
    this.root = opts.root;
    this.env = opts.env;
    this.argv = opts.argv;
    this.verb = opts.verb;
    this.knobs = opts.knobs;
    this.leasesPath = opts.leasesPath;
    this.io = opts.io;
    this.onFinish = opts.onFinish;
  }

  out(text: string): void {
    this.io.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
  }

  /** Pretty JSON (inspect, list, clone/run output). */
  json(value: unknown): void {
    this.io.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
  }

  err(text: string): void {
    this.io.stderr.write(text.endsWith('\n') ? text : `${text}\n`);
  }

  /** Records the invocation in calls.jsonl now (long-running verbs that exit on a signal). */
  finish(exit: number): void {
    this.onFinish(exit);
  }

  /** The verb's latency knob (or, for a clone of `vmName`, the timing world's delay). */
  async latency(vmName?: string): Promise<void> {
    const ms = latencyMs(this.knobs, this.verb, vmName);
    if (ms > 0) await this.io.sleep(ms);
    else await checkpoint(this.io);
  }

  /**
   * Evaluates the fault knobs for `phase`. A firing fault throws ScriptedExit (or hangs).
   * `names` are the VM/snapshot names the invocation concerns (matched by `match`); when
   * omitted they are derived from --name and the positionals (resolved to names if they are
   * VM or snapshot references).
   */
  async faults(phase: FaultPhase, p: Parsed, names?: string[]): Promise<void> {
    await checkpoint(this.io);
    const faults = this.knobs.faults ?? [];
    if (faults.length === 0) return;
    const argvText = this.argv.join(' ');
    let targetNames = names;
    for (const [i, f] of faults.entries()) {
      if ((f.phase ?? 'pre') !== phase) continue;
      if (f.argvRegex !== undefined && !re(f.argvRegex).test(argvText)) continue;
      if (f.match !== undefined) {
        targetNames ??= this.namesOf(p);
        if (!matchesAny(f.match, targetNames)) continue;
      }
      if (f.probability !== undefined && Math.random() >= f.probability) continue;
      if (f.times !== undefined && !consumeTimes(this.root, ruleKey('fault', i, f), f.times)) continue;
      if (f.delayMs) await this.io.sleep(f.delayMs);
      if (f.hang) await hangForever(this.io);
      const exit = f.exit ?? 1;
      const stderr =
        f.stderr ??
        (f.error !== undefined ? `Error: ${f.error}\n` : exit !== 0 ? 'Error: injected fault\n' : '');
      throw new ScriptedExit(exit, f.stdout ?? '', stderr);
    }
  }

  private namesOf(p: Parsed): string[] {
    const out: string[] = [];
    const name = p.flags.get('name');
    if (typeof name === 'string') out.push(name);
    const snaps = readSnapDb(this.root);
    for (const a of p.args.slice(0, p.dashAt >= 0 ? p.dashAt : undefined)) {
      out.push(a);
      try {
        const vm = findVm(this.root, a);
        if (vm) out.push(vm.vm.config.name);
        const s = findSnapshotIn(snaps, a, true);
        if (s) out.push(s.name);
      } catch {
        // ambiguous reference: match on the raw word only
      }
    }
    return out;
  }
}
