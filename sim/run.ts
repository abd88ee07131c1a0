// The simulator's dispatcher (loaded by main.ts and server.ts): argv → verb module (imported
// on demand), knobs, latency and faults, `Error:` printing, exit status and the calls.jsonl
// record. All process I/O goes through the invocation's Io (sim/io.ts).
import fs from 'node:fs';
import { parseArgs, usageText } from './cli.ts';
import { Ctx, type VerbModule } from './ctx.ts';
import { CliError, ScriptedExit } from './errors.ts';
import { type Io, io } from './io.ts';
import { type Knobs, loadKnobs } from './knobs.ts';
import { callsFile, leasesFile, resolveRoot, simDir } from './paths.ts';

type Loader = () => Promise<VerbModule>;

const vmBasic: Loader = () => import('./verbs/vm-basic.ts');
const vmRead: Loader = () => import('./verbs/vm-read.ts');
const vmCreate: Loader = () => import('./verbs/vm-create.ts');
const snapshot: Loader = () => import('./verbs/snapshot.ts');
const image: Loader = () => import('./verbs/image.ts');

const GROUPS: Record<string, Record<string, Loader>> = {
  vm: {
    clone: vmCreate,
    run: vmCreate,
    inspect: vmRead,
    list: vmRead,
    rm: vmBasic,
    start: vmBasic,
    net: vmBasic,
    logs: vmBasic,
    'reconcile-stale-create': vmBasic,
    exec: () => import('./verbs/exec.ts'),
    status: () => import('./verbs/events.ts'),
  },
  snapshot: {
    save: snapshot,
    inspect: snapshot,
    rm: snapshot,
    list: snapshot,
    import: snapshot,
    export: snapshot,
  },
  image: { pull: image, inspect: image, import: image },
};

const HELPER_GROUPS = ['knobs', 'fixture'];

function rootUsage(helper: boolean): string {
  const groups = [...Object.keys(GROUPS), ...(helper ? HELPER_GROUPS : [])];
  return `cocoon (simulator) manages microVMs.\n\nUsage:\n  cocoon [command]\n\nAvailable Commands:\n${groups
    .map((g) => `  ${g}`)
    .join('\n')}\n`;
}

function groupUsage(group: string): string {
  return `Usage:\n  cocoon ${group} [command]\n\nAvailable Commands:\n${Object.keys(GROUPS[group] ?? {})
    .map((v) => `  ${v}`)
    .join('\n')}\n`;
}

/**
 * Runs one `cocoon` invocation (`argv`: the words after the binary name) against `cur` and
 * resolves with its exit status, after the calls.jsonl record. Never rejects: errors become
 * `Error: ...` on stderr. The caller ends the invocation (io.exit). An aborted server request
 * never resolves (see sim/io.ts).
 */
export async function invoke(cur: Io, argv: string[]): Promise<number> {
  const startedMs = Date.now();
  const startedAt = new Date(startedMs).toISOString();
  const env = cur.env;
  const helper = env.COCOON_SIM_ARGV0 === 'cocoon-sim';
  const root = resolveRoot(env);
  const group = argv[0];
  const internal = group === '__sim' || (helper && HELPER_GROUPS.includes(group ?? ''));
  let stdinBytes = 0;
  let logged = false;
  const logCall = (exit: number) => {
    if (logged || internal) return;
    logged = true;
    const line = `${JSON.stringify({ argv, exit, startedAt, durationMs: Date.now() - startedMs, stdinBytes })}\n`;
    try {
      fs.appendFileSync(callsFile(root), line);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') return;
      try {
        fs.mkdirSync(simDir(root), { recursive: true });
        fs.appendFileSync(callsFile(root), line);
      } catch {
        // an unwritable root: nothing to log to
      }
    }
  };
  cur.stdout.on('error', () => {}); // a reader that went away (EPIPE) is not our failure
  let exit = 0;
  let ctx: Ctx | undefined;
  try {
    exit = await dispatch();
  } catch (e) {
    if (ctx) stdinBytes = ctx.stdinBytes;
    if (e instanceof ScriptedExit) {
      if (e.stdout) cur.stdout.write(e.stdout);
      if (e.stderr) cur.stderr.write(e.stderr);
      exit = e.exit;
    } else if (e instanceof CliError) {
      cur.stderr.write(`Error: ${e.message}\n`);
      exit = e.exit;
    } else {
      cur.stderr.write(`Error: internal simulator error: ${(e as Error)?.stack ?? String(e)}\n`);
      exit = 1;
    }
  }
  if (ctx) stdinBytes = ctx.stdinBytes;
  logCall(exit);
  return exit;

  async function dispatch(): Promise<number> {
    if (group === undefined || group === 'help' || group === '--help' || group === '-h') {
      cur.stdout.write(rootUsage(helper));
      return 0;
    }
    if (group === '__sim') {
      const { runSimAction } = await import('./verbs/sim.ts');
      return runSimAction(root, argv.slice(1), env);
    }
    if (helper && HELPER_GROUPS.includes(group)) {
      const { runHelper } = await import('./verbs/helper.ts');
      return runHelper(root, argv, env);
    }
    const verbs = GROUPS[group];
    if (!verbs) throw new CliError(`unknown command "${group}" for "cocoon"`);
    const verbName = argv[1];
    if (verbName === undefined || verbName === '--help' || verbName === '-h' || verbName === 'help') {
      cur.stdout.write(groupUsage(group));
      return 0;
    }
    const loader = verbs[verbName];
    if (!loader) throw new CliError(`unknown command "${verbName}" for "cocoon ${group}"`);
    const verb = (await loader()).verbs[verbName];
    if (!verb) throw new CliError(`unknown command "${verbName}" for "cocoon ${group}"`);
    const parsed = parseArgs(verb.spec, argv.slice(2));
    if (parsed.help) {
      cur.stdout.write(usageText(verb.spec));
      return 0;
    }
    const knobs: Knobs = await loadKnobs(root);
    ctx = new Ctx({
      root,
      env,
      argv,
      verb: `${group} ${verbName}`,
      knobs,
      leasesPath: leasesFile(root, env),
      io: cur,
      onFinish: (code) => {
        stdinBytes = ctx?.stdinBytes ?? 0;
        logCall(code);
      },
    });
    if (!verb.reserving) await ctx.latency();
    await ctx.faults('pre', parsed);
    return (await verb.run(ctx, parsed)) ?? 0;
  }
}

/** Imports every verb module (the server does this once at start, off the request path). */
export async function preloadVerbs(): Promise<void> {
  const loaders = new Set<Loader>(Object.values(GROUPS).flatMap((g) => Object.values(g)));
  await Promise.all([
    ...[...loaders].map((l) => l()),
    import('./verbs/sim.ts'),
    import('./verbs/helper.ts'),
    import('./knob-schema.ts'),
  ]);
}

/** Process mode: one invocation per process (sim/main.ts). */
export async function main(): Promise<void> {
  const cur = io();
  const exit = await invoke(cur, process.argv.slice(2));
  if (process.stdout.writableLength > 0) {
    await new Promise<void>((resolve) => process.stdout.once('drain', () => resolve()));
  }
  cur.exit(exit);
}
