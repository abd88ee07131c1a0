// The simulator's dispatcher (loaded by main.ts): argv → verb module (imported on demand),
// knobs, latency and faults, `Error:` printing, exit status and the calls.jsonl record.
import fs from 'node:fs';
import { parseArgs, usageText } from './cli.ts';
import { Ctx, type VerbModule } from './ctx.ts';
import { CliError, ScriptedExit } from './errors.ts';
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

async function flushStdout(): Promise<void> {
  if (process.stdout.writableLength > 0) {
    await new Promise<void>((resolve) => process.stdout.once('drain', () => resolve()));
  }
}

export async function main(): Promise<void> {
  const startedMs = Date.now();
  const startedAt = new Date(startedMs).toISOString();
  const env = process.env;
  const helper = env.COCOON_SIM_ARGV0 === 'cocoon-sim';
  const argv = process.argv.slice(2);
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
  process.stdout.on('error', () => {}); // a reader that went away (EPIPE) is not our failure
  let exit = 0;
  let ctx: Ctx | undefined;
  try {
    exit = await dispatch();
  } catch (e) {
    if (ctx) stdinBytes = ctx.stdinBytes;
    if (e instanceof ScriptedExit) {
      if (e.stdout) process.stdout.write(e.stdout);
      if (e.stderr) process.stderr.write(e.stderr);
      exit = e.exit;
    } else if (e instanceof CliError) {
      process.stderr.write(`Error: ${e.message}\n`);
      exit = e.exit;
    } else {
      process.stderr.write(`Error: internal simulator error: ${(e as Error)?.stack ?? String(e)}\n`);
      exit = 1;
    }
  }
  if (ctx) stdinBytes = ctx.stdinBytes;
  logCall(exit);
  await flushStdout();
  process.exit(exit);

  async function dispatch(): Promise<number> {
    if (group === undefined || group === 'help' || group === '--help' || group === '-h') {
      process.stdout.write(rootUsage(helper));
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
      process.stdout.write(groupUsage(group));
      return 0;
    }
    const loader = verbs[verbName];
    if (!loader) throw new CliError(`unknown command "${verbName}" for "cocoon ${group}"`);
    const verb = (await loader()).verbs[verbName];
    if (!verb) throw new CliError(`unknown command "${verbName}" for "cocoon ${group}"`);
    const parsed = parseArgs(verb.spec, argv.slice(2));
    if (parsed.help) {
      process.stdout.write(usageText(verb.spec));
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
