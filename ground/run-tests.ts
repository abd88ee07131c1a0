// Runs the whole suite (or the given files, globs or directories) with one shared test ground:
// starts the control plane and the registry, runs the test files several at a time, then
// stops everything the run started. The ground's logs are kept when a test fails.
//
// Scheduling. The unit tests are one job (`node --test`, all files in one process), the simulator
// tests another; every other file (the integration tests) is a job of its own. VK_TEST_CONCURRENCY
// jobs (default 3) always run while any wait, longest first (the estimates below, measured warm
// on 2 cores), so the long files start at once and the short ones fill the gaps; up to two more
// start while the CPU the running jobs are expected to use leaves room (ground/schedule.ts:
// most integration time is spent waiting on leases, deadlines and tickers, at a fifth of a core
// for some files; docs/test-ground.md "Suite scheduling").
// Integration files share the ground and keep apart by namespace and node name
// (ground/world.ts); a file that stops or restarts the apiserver starts a ground of its own
// (useWorld({ privateGround: true })). Each job's output is printed in one block when it ends
// (a run of one job streams it); the last line is the summary
// `suite: <N> passed, <M> failed in <mm:ss>` (the wall time since `npm test` started).
//
// A job that runs past its limit (four times its estimate, at least 5 min; VK_TEST_JOB_TIMEOUT
// seconds for all) is interrupted, killed 15 s later, and counts as failed, so a hang is a red
// run naming the file, never a suite that does not end. The line names the processes holding
// the job's test output open: node --test waits for a file's stdout and stderr to close, so a
// process the file started with its output inherited hangs the job however the tests went.
//
// Every process of the run is in its PID registry (<ground dir>/pids, exported to the tests as
// VK_GROUND_PIDS; see ground/proc.ts): the shared ground, an apiserver a test restarted
// in its own process, private grounds, daemons, simulator stand-ins, the test processes
// themselves. However the run ends (tests pass or fail, SIGINT/SIGTERM/SIGHUP, an uncaught
// exception or rejection here, the ground failing half-way) they are all stopped: SIGTERM,
// then SIGKILL after a grace.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, globSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { availableParallelism, homedir, tmpdir } from 'node:os';
import { isAbsolute, join, relative } from 'node:path';
import { sweepDeadOwners } from '../sim/guestnet.ts';
import { repoRoot } from './cluster.ts';
import { type Ground, startGround, stopGround } from './ground.ts';
import { installTeardown, openPidRegistry } from './proc.ts';
import { pickNext, type Schedulable, scheduleLimits } from './schedule.ts';

/** Per job: its wall time in seconds and the cores it keeps busy (its CPU time over its wall
 * time), both measured in a clean-clone CI run on 2 cores (2026-12-06, `cdeb79b`, three jobs at
 * once; CPU from a cpuacct cgroup per job, as `node scripts/suite-cpu.ts npm test` measures it,
 * as root). The estimate orders the jobs (longest first); the CPU share decides how many run at
 * once (ground/schedule.ts). Unknown files: 30 s, 0.6 cores.
 * The realistic timing world (ground/world.ts) runs in hibernate.test.ts and
 * lease-release.test.ts, their tests at once. */
const PROFILE: Record<string, Schedulable> = {
  'test/integration/sac.test.ts': { estimate: 136, cpu: 0.19 },
  'test/integration/soak.test.ts': { estimate: 132, cpu: 0.64 },
  'test/integration/hibernate-faults.test.ts': { estimate: 117, cpu: 0.29 },
  'test/integration/gc-gate.test.ts': { estimate: 107, cpu: 0.17 },
  'test/integration/hardening.test.ts': { estimate: 107, cpu: 0.19 },
  'test/integration/fleet-peer.test.ts': { estimate: 105, cpu: 0.38 },
  'test/integration/teardown.test.ts': { estimate: 97, cpu: 0.92 },
  'test/integration/lifecycle-restart.test.ts': { estimate: 93, cpu: 0.36 },
  'test/integration/lifecycle.test.ts': { estimate: 89, cpu: 0.23 },
  unit: { estimate: 80, cpu: 0.58 },
  'test/integration/explain.test.ts': { estimate: 80, cpu: 0.32 },
  sim: { estimate: 73, cpu: 0.76 },
  'test/integration/virtual-node.test.ts': { estimate: 69, cpu: 0.69 },
  'test/integration/release.test.ts': { estimate: 64, cpu: 0.67 },
  'test/integration/fleet-death.test.ts': { estimate: 64, cpu: 0.61 },
  'test/integration/registry-push.test.ts': { estimate: 57, cpu: 0.6 },
  'test/integration/top.test.ts': { estimate: 56, cpu: 0.69 },
  'test/integration/hibernate.test.ts': { estimate: 51, cpu: 0.31 },
  'test/integration/authority.test.ts': { estimate: 43, cpu: 0.39 },
  'test/integration/probes.test.ts': { estimate: 36, cpu: 0.22 },
  'test/integration/registry-v2.test.ts': { estimate: 36, cpu: 0.6 },
  'test/integration/vm-events.test.ts': { estimate: 33, cpu: 0.28 },
  'test/integration/hibernate-operator.test.ts': { estimate: 28, cpu: 0.56 },
  'test/integration/registry-pull.test.ts': { estimate: 28, cpu: 0.36 },
  'test/integration/demo.test.ts': { estimate: 24, cpu: 0.99 },
  'test/integration/deferred-push.test.ts': { estimate: 24, cpu: 0.63 },
  'test/integration/writes.test.ts': { estimate: 22, cpu: 0.28 },
  'test/integration/least-privilege.test.ts': { estimate: 21, cpu: 0.4 },
  'test/integration/authority-registry.test.ts': { estimate: 19, cpu: 0.53 },
  'test/integration/stale-creates.test.ts': { estimate: 18, cpu: 0.71 },
  'test/integration/fleet.test.ts': { estimate: 18, cpu: 0.69 },
  'test/integration/lease-release.test.ts': { estimate: 17, cpu: 0.49 },
  'test/integration/run-artifacts.test.ts': { estimate: 16, cpu: 0.4 },
  'test/integration/startup.test.ts': { estimate: 15, cpu: 0.59 },
  'test/integration/bringup.test.ts': { estimate: 14, cpu: 0.54 },
  'test/integration/kubelet-authz.test.ts': { estimate: 13, cpu: 0.6 },
  'test/integration/ground.test.ts': { estimate: 13, cpu: 0.57 },
  'test/integration/admission-delete.test.ts': { estimate: 9, cpu: 0.6 },
  'test/integration/tenant-claims.test.ts': { estimate: 8, cpu: 0.61 },
  'test/integration/scheduling.test.ts': { estimate: 6, cpu: 0.72 },
};
const UNKNOWN: Schedulable = { estimate: 30, cpu: 0.6 };
const DEFAULT_PATTERNS = ['test/unit/**/*.test.ts', 'test/sim/**/*.test.ts', 'test/integration/**/*.test.ts'];

// scripts/test.sh sets VK_SUITE_T0 (epoch ms) before setup, typecheck and lint: the summary's
// wall time is the whole `npm test`. Not inherited by nested runs (tests of this runner).
const t0 = Date.now();
const suiteStart = Number(process.env.VK_SUITE_T0) || t0;
delete process.env.VK_SUITE_T0;
const log = (line: string) => console.log(`ground: [${((Date.now() - t0) / 1000).toFixed(1)}s] ${line}`);
const mmss = (ms: number) => {
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
};
const say = (line: string) => console.log(`suite: [${mmss(Date.now() - t0)}] ${line}`);

// Node's compile cache for every process of the run (test files, simulator servers and
// stand-ins, demos; bin/vk-cocoon and bin/cocoon-sim keep theirs when it is set): a warm run
// loads its TypeScript without stripping it again, a third less CPU for the unit tests on 2
// cores (92 s → 64 s). Node keys entries by file content, binary and flags, so a stale
// entry is never used. The same directory as bin/vk-cocoon's default.
process.env.NODE_COMPILE_CACHE ??= join(
  process.env.XDG_CACHE_HOME || join(homedir(), '.cache'),
  'vk-cocoon',
  'node-compile-cache',
);

interface Job {
  name: string;
  files: string[];
  /**
   * How `node --test` runs the job's files: `'one process'` imports them all into one
   * (`--test-isolation=none`: the unit tests, where a process per file was most of their CPU),
   * a number is the files at a time, each in a process of its own.
   */
  filesAtOnce: number | 'one process';
  estimate: number;
  cpu: number;
  needsGround: boolean;
}

interface JobResult {
  job: Job;
  passed: number;
  failed: number;
  /** Skipped and todo tests (neither passed nor failed). */
  other: number;
  ms: number;
  code: number | null;
}

function expand(args: string[]): string[] {
  const out: string[] = [];
  for (const a of args) {
    const abs = isAbsolute(a) ? a : join(repoRoot, a);
    if (/[*?[{]/.test(a)) out.push(...globSync(a, { cwd: repoRoot }).map((f) => join(repoRoot, f)));
    else if (existsSync(abs) && statSync(abs).isDirectory())
      out.push(...globSync('**/*.test.{ts,mts}', { cwd: abs }).map((f) => join(abs, f)));
    else out.push(abs);
  }
  return [...new Set(out)].sort();
}

function plan(files: string[]): Job[] {
  const jobs: Job[] = [];
  const groups = new Map<string, string[]>();
  for (const f of files) {
    const rel = relative(repoRoot, f);
    const group = rel.startsWith('test/unit/') ? 'unit' : rel.startsWith('test/sim/') ? 'sim' : undefined;
    if (group) groups.set(group, [...(groups.get(group) ?? []), f]);
    else {
      const p = PROFILE[rel];
      const name = rel.startsWith('..') ? f : rel;
      jobs.push({
        name,
        files: [f],
        filesAtOnce: 1,
        estimate: p?.estimate ?? UNKNOWN.estimate,
        cpu: p?.cpu ?? UNKNOWN.cpu,
        needsGround: true,
      });
    }
  }
  for (const [group, fs] of groups) {
    const name =
      fs.length === 1 ? relative(repoRoot, fs[0] as string) : `test/${group}/ (${fs.length} files)`;
    const { estimate, cpu } = PROFILE[group] ?? UNKNOWN;
    const filesAtOnce = group === 'unit' ? 'one process' : 2;
    jobs.push({ name, files: fs, filesAtOnce, estimate, cpu, needsGround: false });
  }
  // Longest first; the order of equal estimates is the file order.
  return jobs.sort((a, b) => b.estimate - a.estimate);
}

/**
 * The processes holding the other end of `pid`'s stdio sockets (node --test reads each test
 * file's output through a socket pair): `<pid> <command line>` each, `pid` itself and this
 * process left out. From `ss -xpn` (iproute2): each line names a socket's inode, its peer's
 * inode and the processes holding it. Empty when ss is missing.
 */
function outputHolders(pid: number): string[] {
  const r = spawnSync('ss', ['-xpn'], { encoding: 'utf8', timeout: 10_000 });
  if (r.status !== 0) return [];
  const rows = r.stdout.split('\n').flatMap((line) => {
    const m = /\s(\d+)\s+\S+\s+(\d+)\s+users:\((.*)\)\s*$/.exec(line);
    if (!m) return [];
    const pids = [...(m[3] as string).matchAll(/pid=(\d+)/g)].map((x) => Number(x[1]));
    return [{ inode: m[1] as string, peer: m[2] as string, pids }];
  });
  const peers = new Set(rows.filter((row) => row.pids.includes(pid)).map((row) => row.peer));
  const holders = new Set(
    rows
      .filter((row) => peers.has(row.inode))
      .flatMap((row) => row.pids.filter((p) => p !== pid && p !== process.pid)),
  );
  return [...holders].map((p) => {
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
    } catch {
      // gone since
    }
    return `${p} ${cmd.length > 120 ? `${cmd.slice(0, 117)}...` : cmd}`;
  });
}

function count(out: string, key: string): number | undefined {
  const all = [...out.matchAll(new RegExp(`^ℹ ${key} (\\d+)$`, 'gm'))];
  const last = all[all.length - 1];
  return last ? Number(last[1]) : undefined;
}

const files = expand(process.argv.slice(2).length > 0 ? process.argv.slice(2) : DEFAULT_PATTERNS);
const jobs = plan(files);
const concurrency = Math.max(1, Number(process.env.VK_TEST_CONCURRENCY ?? 3) || 3);
const limits = scheduleLimits(concurrency, availableParallelism());
/** A job that runs past this is interrupted (SIGINT: node --test prints what it was running and
 * its output so far), killed 15 s later if still there, and counted failed. */
const jobLimitMs = (job: Job) =>
  (Number(process.env.VK_TEST_JOB_TIMEOUT) || Math.max(job.estimate * 4, 300)) * 1000;
const dir = mkdtempSync(join(tmpdir(), 'vk-ground-'));
const registry = openPidRegistry(join(dir, 'pids'));
log(`dir ${dir}`);

let ground: Ground | undefined;
/** Set once the teardown began: no job starts, no result is reported (the process is exiting). */
let stopping = false;
const running = new Map<Job, { child: ChildProcess; out: () => string; started: number }>();
const end = installTeardown(
  async (why) => {
    if (why.kind === 'signal') log(`${why.signal}: stopping the tests and the ground`);
    stopping = true;
    // The test processes first (they may be restarting things), then the ground in order
    // (apiserver before etcd), then whatever else is left in the registry.
    for (const [job, r] of running) {
      if (r.child.exitCode === null && r.child.signalCode === null) r.child.kill('SIGTERM');
      // A single job's output was streamed already.
      if (why.kind !== 'done')
        say(
          `interrupted ${job.name} after ${mmss(Date.now() - r.started)}${jobs.length > 1 ? `:\n${r.out()}` : ''}`,
        );
    }
    if (ground) await stopGround(ground).catch(() => {});
    // Guest network namespaces of test processes that were killed (sim/guestnet.ts).
    sweepDeadOwners();
    const keepLogs = !(why.kind === 'done' && why.code === 0);
    if (keepLogs) {
      log(`logs kept in ${dir}`);
      return undefined;
    }
    // Remove the directory only after the registry's processes are gone (installTeardown
    // stops them after this function returns).
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    return undefined;
  },
  { registry, log },
);

if (files.length === 0) {
  console.error(`suite: no test files match ${process.argv.slice(2).join(' ')}`);
  await end({ kind: 'done', code: 2 });
}
if (jobs.some((j) => j.needsGround)) {
  try {
    ground = await startGround(dir, { log });
  } catch (err) {
    await end({ kind: 'error', error: err });
  }
  const g = ground as Ground;
  console.log(
    `ground: kube-apiserver ${g.cluster.version} at ${g.cluster.url}; registry ${g.registry.url} (${g.registry.kind}, ${g.registry.version})`,
  );
}
say(
  `${files.length} files in ${jobs.length} jobs, ${concurrency} at a time` +
    (limits.max > concurrency
      ? ` (up to ${limits.max} while their CPU fits in ${limits.cpuBudget} cores)`
      : '') +
    ` on ${availableParallelism()} cores: ` +
    jobs.map((j) => j.name.replace(/^test\/integration\//, '')).join(', '),
);

function runJob(job: Job): Promise<JobResult> {
  const started = Date.now();
  const child = spawn(
    process.execPath,
    [
      '--test',
      '--test-reporter=spec',
      job.filesAtOnce === 'one process' ? '--test-isolation=none' : `--test-concurrency=${job.filesAtOnce}`,
      ...job.files,
    ],
    {
      cwd: repoRoot,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        ...(ground ? { VK_TEST_GROUND_DIR: dir } : {}),
        PATH: `${join(repoRoot, 'node_modules', '.bin')}:${process.env.PATH}`,
      },
    },
  );
  const chunks: Buffer[] = [];
  // A run of one job (`npm test -- <file>`, a large soak) shows its progress as it comes.
  const stream = jobs.length === 1;
  const onData = (b: Buffer) => {
    chunks.push(b);
    if (stream) process.stdout.write(b);
  };
  child.stdout?.on('data', onData);
  child.stderr?.on('data', onData);
  const out = () => Buffer.concat(chunks).toString();
  running.set(job, { child, out, started });
  say(`start ${job.name}`);
  let timedOut = false;
  let kill: NodeJS.Timeout | undefined;
  const limit = setTimeout(() => {
    timedOut = true;
    // node --test waits for a test file's output to close, so a process the file started that
    // inherited its stdout or stderr keeps the job from ever ending: name what holds it.
    const holders = child.pid === undefined ? [] : outputHolders(child.pid);
    say(
      `TIMED OUT ${job.name} after ${mmss(Date.now() - started)}: interrupting it` +
        (holders.length > 0 ? `; its test output is held open by ${holders.join(', ')}` : ''),
    );
    child.kill('SIGINT');
    kill = setTimeout(() => child.kill('SIGKILL'), 15_000);
  }, jobLimitMs(job));
  return new Promise((resolve) => {
    child.on('close', (code) => {
      clearTimeout(limit);
      clearTimeout(kill);
      running.delete(job);
      if (stopping) return;
      const text = out();
      const ms = Date.now() - started;
      const passed = count(text, 'pass') ?? 0;
      let failed = (count(text, 'fail') ?? 0) + (count(text, 'cancelled') ?? 0);
      // A file that crashed (or whose hooks failed) without a failing test still fails the suite.
      if ((code !== 0 || timedOut) && failed === 0) failed = 1;
      const other = (count(text, 'skipped') ?? 0) + (count(text, 'todo') ?? 0);
      if (!stream)
        process.stdout.write(
          `\n──── ${job.name}\n${text.endsWith('\n') || text === '' ? text : `${text}\n`}`,
        );
      say(
        `${failed === 0 ? 'ok' : 'FAILED'} ${job.name}: ${passed + failed} tests, ` +
          `${failed === 0 ? 'all passed' : `${failed} failing`}, ${mmss(ms)}` +
          (timedOut ? ` (timed out at ${mmss(jobLimitMs(job))})` : ''),
      );
      resolve({ job, passed, failed, other, ms, code });
    });
  });
}

const results: JobResult[] = [];
await new Promise<void>((resolve) => {
  const queue = [...jobs];
  const pump = () => {
    if (stopping) return;
    for (;;) {
      const i = pickNext(queue, [...running.keys()], limits);
      if (i === undefined) break;
      const [job] = queue.splice(i, 1) as [Job];
      void runJob(job).then((r) => {
        results.push(r);
        pump();
      });
    }
    if (queue.length === 0 && running.size === 0) resolve();
  };
  pump();
});

const passed = results.reduce((n, r) => n + r.passed, 0);
const failed = results.reduce((n, r) => n + r.failed, 0);
const other = results.reduce((n, r) => n + r.other, 0);
console.log('');
say(
  `job times: ${results
    .sort((a, b) => b.ms - a.ms)
    .map((r) => `${r.job.name.replace(/^test\/integration\//, '')} ${mmss(r.ms)}`)
    .join(', ')}`,
);
for (const r of results) if (r.failed > 0) say(`FAILED ${r.job.name} (exit ${r.code})`);
console.log(
  `suite: ${passed} passed, ${failed} failed in ${mmss(Date.now() - suiteStart)}` +
    (suiteStart !== t0 ? ` (npm test wall time; the tests ${mmss(Date.now() - t0)})` : '') +
    (other > 0 ? `; ${other} skipped or todo` : ''),
);
await end({ kind: 'done', code: failed > 0 ? 1 : 0 });
