// Where a test run's CPU goes: runs a command (default `npm test`), puts every job it starts
// (each `node --test` of ground/run-tests.ts, and any test-file process seen before its job)
// into a cpuacct cgroup named after the job, so everything the job starts is counted with it,
// and at the end prints per job its CPU, its wall time and its share of a core (CPU over wall),
// then how busy the machine was (/proc/stat). The `cpu` values of ground/run-tests.ts's
// PROFILE come from it (docs/test-ground.md "Suite scheduling").
//   node scripts/suite-cpu.ts [command args...]
// Root and the cgroup v1 cpuacct hierarchy (/sys/fs/cgroup/cpuacct); a one-off measurement
// tool, not part of the suite. Processes seen later than 150 ms after they start may have
// started children outside their job's cgroup (counted as "outside the jobs").
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

const ROOT = '/sys/fs/cgroup/cpuacct';
if (!existsSync(join(ROOT, 'cpuacct.usage'))) {
  console.error(`suite-cpu: no cgroup v1 cpuacct hierarchy at ${ROOT}`);
  process.exit(2);
}
const base = join(ROOT, `vk-suite-cpu-${process.pid}`);
mkdirSync(base);

const busy = () => {
  const f = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').split(/\s+/).slice(1).map(Number);
  const all = f.slice(0, 8).reduce((a, b) => a + b, 0);
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  return { all, busy: all - idle };
};
const usage = (dir: string) => Number(readFileSync(join(dir, 'cpuacct.usage'), 'utf8')) / 1e9;

/** The job a process belongs to, from its argv, or undefined for any other process. */
function jobOf(args: string[]): string | undefined {
  if (args.some((a) => a.endsWith('run-tests.ts'))) return undefined;
  const files = args.filter((a) => /\.test\.m?ts$/.test(a));
  if (files.length === 0) return undefined;
  if (files.length === 1) return basename(files[0] as string);
  if (files.some((f) => f.includes('test/unit/'))) return 'test/unit/';
  if (files.some((f) => f.includes('test/sim/'))) return 'test/sim/';
  return files.map((f) => basename(f)).join(' ');
}

interface Job {
  dir: string;
  first: number;
  last: number;
}
const jobs = new Map<string, Job>();
const seen = new Set<string>();

function sweep(now: number): void {
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid) || seen.has(pid)) continue;
    seen.add(pid);
    let args: string[];
    try {
      args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    } catch {
      continue;
    }
    const name = jobOf(args);
    if (name === undefined) continue;
    let job = jobs.get(name);
    if (!job) {
      job = { dir: join(base, `job-${jobs.size}`), first: now, last: now };
      mkdirSync(job.dir);
      jobs.set(name, job);
    }
    try {
      writeFileSync(join(job.dir, 'cgroup.procs'), pid);
    } catch {
      // Gone already.
    }
  }
  for (const job of jobs.values())
    if (readFileSync(join(job.dir, 'cgroup.procs'), 'utf8').trim() !== '') job.last = now;
}

const [cmd, ...cmdArgs] = process.argv.length > 2 ? process.argv.slice(2) : ['npm', 'test'];
const t0 = Date.now();
const total0 = usage(ROOT);
const stat0 = busy();
const child = spawn(cmd as string, cmdArgs, { stdio: 'inherit' });
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig));
const timer = setInterval(() => sweep(Date.now()), 150);
const code = await new Promise<number>((resolve) => child.on('exit', (c, s) => resolve(c ?? (s ? 1 : 0))));
clearInterval(timer);

const wall = (Date.now() - t0) / 1000;
const total = usage(ROOT) - total0;
const stat1 = busy();
const rows = [...jobs].map(([name, j]) => {
  const cpu = usage(j.dir);
  const w = Math.max(1, (j.last - j.first) / 1000);
  return { name, cpu, w, share: cpu / w };
});
rows.sort((a, b) => b.cpu - a.cpu);
console.log('');
console.log('| job | CPU | wall | share of a core |');
console.log('|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.name} | ${r.cpu.toFixed(1)} s | ${r.w.toFixed(0)} s | ${r.share.toFixed(2)} |`);
const inJobs = rows.reduce((a, r) => a + r.cpu, 0);
console.log(
  `suite-cpu: ${wall.toFixed(0)} s wall, ${total.toFixed(0)} s of CPU (${inJobs.toFixed(0)} s in the jobs, ` +
    `${(total - inJobs).toFixed(0)} s outside them: the shared ground, the runner); the machine ` +
    `${((100 * (stat1.busy - stat0.busy)) / (stat1.all - stat0.all)).toFixed(0)} % busy`,
);
for (const j of jobs.values()) {
  try {
    rmdirSync(j.dir);
  } catch {
    // A process still in it (a leftover of the run): the directory stays, named in the error.
    console.error(`suite-cpu: ${j.dir} still has processes`);
  }
}
try {
  rmdirSync(base);
} catch {}
process.exit(code);
