// The CPU cost of one simulated `cocoon` call: 100 calls each of `vm inspect <id>`,
// `snapshot inspect <name>` and `vm list -o json` through the installed `cocoon` binary (the
// symlink the provider gets as VK_COCOON_BIN, i.e. bin/cocoon-sim), one at a time, in server
// mode (the root's simulator server runs in-process, the thin Go client talks to it) and in
// fallback mode (COCOON_SIM_SERVER=0: one Node process per call, as before the server).
//
// Usage: npm run bench:sim  (or: node bench/sim-call.ts [calls per verb, default 100])
//
// How CPU is measured, per call:
//  - client: the call's process tree as its parent sees it. Node cannot read a child's rusage,
//    and /proc's utime/stime are clock ticks (10 ms), so each call is spawned (child_process
//    spawn, like the provider) through cocoon-sim-rusage (sim/client-go/rusage), which
//    fork/execs the `cocoon` symlink, waits for it with wait4(2) and reports the child's
//    user+system time in microseconds on fd 3. That rusage includes the descendants the call
//    waited for (bash's fork for readlink, ...) and, across exec(2), the shim, the Go client and
//    (fallback) Node. The wrapper's own start is not counted.
//  - server: the work the server did for the call, as the delta of the server's on-CPU time
//    summed over all its threads (/proc/<pid>/task/*/schedstat, nanoseconds: main thread,
//    libuv pool, GC helpers) between just before the spawn and after the call's exit. Calls run
//    one at a time, so the delta is that call's (plus the server's idle timers: microseconds).
//  - total = client + server; wall = the wrapper's measure of the child, spawn to exit.
// Median and p90 over the calls. The requirement is total ≤ 25 ms (median) in server mode.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { newSimRoot, RUSAGE_BIN, type SimRoot, type VmRecord } from '../sim/client.ts';

const calls = Number(process.argv[2] ?? 100);
if (!Number.isInteger(calls) || calls < 1) {
  console.error('usage: node bench/sim-call.ts [calls per verb]');
  process.exit(2);
}
const say = (line: string) => console.log(`bench:sim: ${line}`);

function serverCpuNs(pid: number | undefined): number {
  if (pid === undefined) return 0;
  let total = 0;
  let tids: string[] = [];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return 0;
  }
  for (const tid of tids) {
    try {
      total += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1').split(' ')[0]);
    } catch {
      // the thread ended meanwhile
    }
  }
  return total;
}

interface Sample {
  clientMs: number;
  serverMs: number;
  wallMs: number;
}

function call(sim: SimRoot, args: string[], env: NodeJS.ProcessEnv): Promise<Sample> {
  const pid = sim.serverPid;
  const before = serverCpuNs(pid);
  return new Promise((resolve, reject) => {
    const child = spawn(RUSAGE_BIN, [sim.cocoonBin, ...args], {
      stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
      env,
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const usage: Buffer[] = [];
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => err.push(d));
    (child.stdio[3] as NodeJS.ReadableStream).on('data', (d: Buffer) => usage.push(d));
    child.on('error', reject);
    child.on('close', (code) => {
      const after = serverCpuNs(pid);
      if (code !== 0) {
        reject(new Error(`cocoon ${args.join(' ')} exited ${code}: ${Buffer.concat(err).toString().trim()}`));
        return;
      }
      const [user, sys, wall] = Buffer.concat(usage).toString().trim().split(' ').map(Number);
      if (user === undefined || sys === undefined || wall === undefined || Number.isNaN(wall)) {
        reject(new Error('no rusage from cocoon-sim-rusage'));
        return;
      }
      resolve({ clientMs: (user + sys) / 1000, serverMs: (after - before) / 1e6, wallMs: wall / 1000 });
    });
  });
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i] as number;
}

function stats(values: number[]): { median: number; p90: number } {
  const s = [...values].sort((a, b) => a - b);
  return { median: quantile(s, 0.5), p90: quantile(s, 0.9) };
}

const fmt = (n: number) => n.toFixed(1).padStart(6);

async function measure(sim: SimRoot, mode: 'server' | 'fallback', verbs: [string, string[]][]) {
  const env = {
    ...process.env,
    ...sim.env(),
    ...(mode === 'fallback' ? { COCOON_SIM_SERVER: '0' } : {}),
  };
  const rows: string[] = [];
  const totals: number[] = [];
  for (const [label, args] of verbs) {
    for (let i = 0; i < 3; i++) await call(sim, args, env); // warm caches (compile cache, page cache)
    const samples: Sample[] = [];
    for (let i = 0; i < calls; i++) samples.push(await call(sim, args, env));
    const c = stats(samples.map((s) => s.clientMs));
    const sv = stats(samples.map((s) => s.serverMs));
    const t = stats(samples.map((s) => s.clientMs + s.serverMs));
    const w = stats(samples.map((s) => s.wallMs));
    totals.push(t.median);
    rows.push(
      `${label.padEnd(24)} ${fmt(c.median)} ${fmt(c.p90)}   ${fmt(sv.median)} ${fmt(sv.p90)}   ${fmt(t.median)} ${fmt(t.p90)}   ${fmt(w.median)} ${fmt(w.p90)}`,
    );
  }
  console.log('');
  console.log(`${mode} mode: ${calls} calls per verb, CPU and wall in ms per call (median, p90)`);
  console.log(
    `${'verb'.padEnd(24)} ${'client CPU'.padStart(13)}   ${'server CPU'.padStart(13)}   ${'total CPU'.padStart(13)}   ${'wall'.padStart(13)}`,
  );
  console.log(
    `${''.padEnd(24)} ${'median'.padStart(6)} ${'p90'.padStart(6)}   ${'median'.padStart(6)} ${'p90'.padStart(6)}   ${'median'.padStart(6)} ${'p90'.padStart(6)}   ${'median'.padStart(6)} ${'p90'.padStart(6)}`,
  );
  for (const r of rows) console.log(r);
  return totals;
}

if (!fs.existsSync(RUSAGE_BIN)) {
  console.error(`bench:sim: ${RUSAGE_BIN} is missing: run bash scripts/setup.sh (needs Go)`);
  process.exit(1);
}
let sim: SimRoot | undefined;
const stop = async (code: number) => {
  await sim?.cleanup().catch(() => {});
  process.exit(code);
};
process.on('SIGINT', () => void stop(130));
process.on('SIGTERM', () => void stop(143));
try {
  sim = await newSimRoot({ parent: fs.mkdtempSync(path.join(os.tmpdir(), 'vk-bench-sim-')), server: true });
  if (sim.serverPid === undefined) throw new Error('the simulator server did not start');
  say(`root ${sim.root}, server pid ${sim.serverPid}, load average ${os.loadavg()[0]?.toFixed(2)}`);
  await sim.fixtureSnapshot('acme/agent', {
    backend: 'cloud-hypervisor',
    os: 'linux',
    image: 'ghcr.io/acme/agent:1',
    pulled: true,
  });
  const vm = await sim.json<VmRecord>([
    'vm',
    'clone',
    '--output',
    'json',
    '--name',
    'vk-bench',
    'acme/agent',
  ]);
  const verbs: [string, string[]][] = [
    ['vm inspect <id>', ['vm', 'inspect', vm.id]],
    ['snapshot inspect <name>', ['snapshot', 'inspect', 'acme/agent']],
    ['vm list -o json', ['vm', 'list', '-o', 'json']],
  ];
  const server = await measure(sim, 'server', verbs);
  await measure(sim, 'fallback', verbs);
  const worst = Math.max(...server);
  console.log('');
  say(
    `server mode: worst median total CPU ${worst.toFixed(1)} ms per call (limit 25 ms): ${worst <= 25 ? 'ok' : 'TOO HIGH'}`,
  );
  const parent = path.dirname(sim.dir);
  await sim.cleanup();
  sim = undefined;
  fs.rmSync(parent, { recursive: true, force: true });
  process.exit(worst <= 25 ? 0 : 1);
} catch (e) {
  console.error(`bench:sim: ${(e as Error).stack ?? e}`);
  await stop(1);
}
