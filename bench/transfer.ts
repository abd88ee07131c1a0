// Benchmark (a script, not a test): snapshot transfer through the registry. Usage:
//   npm run bench:transfer                 # a 2 GiB sparse disk carrying 1 GiB of random data
//   VK_BENCH_DISK_GIB=4 VK_BENCH_DATA_GIB=2 npm run bench:transfer
//   VK_BENCH_RUNS=3 npm run bench:transfer # every row three times, in turn
// Starts only the ground's docker-registry (CNCF distribution 2.8, filesystem storage on this
// disk) and a simulator root; saves a VM snapshot whose disk (`cow.raw`) is a sparse file of
// VK_BENCH_DISK_GIB with VK_BENCH_DATA_GIB of random data spread through it in 16 MiB extents,
// then measures in one run:
//   - ours, push: pushSnapshot (cocoon snapshot export ⇒ large files streamed to the registry,
//     small ones spooled + HEAD/upload ⇒ manifest);
//   - ours, pull: pullSnapshot into another local name (registry ⇒ verified stream ⇒ cocoon
//     snapshot import);
//   - crane (go-containerregistry v0.22.1, scripts/cranebin.sh): `crane pull --format oci` of
//     the same artifact to a local OCI layout, then `crane push` of that layout to another
//     repository (a real upload: blobs from a layout are not mounted across repositories);
//   - the simulator alone: `snapshot export -o -` into /dev/null and `snapshot import` of the
//     same tar from a file, what any push or pull through it costs at least.
// MB/s is payload bytes (the layers and config as stored in the registry) over wall time.
// Ours runs in a process of its own (bench/transfer-child.ts, with the daemon's V8 flags
// --max-semi-space-size=2 --no-opt --no-maglev --optimize-for-size): its peak RSS is that
// process's VmHWM, shown with its RSS before the transfer (Node.js and the modules); crane's is its VmHWM sampled from /proc every 20 ms. CPU:
// the transfer process's own, then what the registry and the simulator (its server, where
// export and import run, and the `cocoon` client processes) spent during the phase.
// VK_BENCH_CHILD_FLAGS adds Node flags to the transfer process (e.g. --cpu-prof); with
// VK_BENCH_CHILD_LOG=info it logs its progress every second on stderr.
// Everything it starts it stops (bench/lib/harness.ts teardown, the PID registry).
import { spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startRegistry, stopRegistry } from '../ground/registry.ts';
import { newSimRoot } from '../sim/client.ts';
import { RegistryClient } from '../src/registry/client.ts';
import { runBenchChild } from './lib/child.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes, memOf } from './lib/procfs.ts';
import { writeSparseDisk } from './lib/sparse.ts';
import { fmtN, markdownTable } from './lib/stats.ts';

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const repoRoot = path.resolve(import.meta.dirname, '..');

interface Row {
  what: string;
  bytes: number;
  ms: number;
  peakKiB: number;
  /** Ours: the transfer process's RSS before the transfer (Node.js and its modules). */
  startKiB: number;
  /** CPU time (user + system) of the transfer process. */
  cpuMs: number;
  /** CPU the registry spent during the phase. */
  registryMs: number;
  /** CPU the simulator spent during the phase (its server and the `cocoon` client processes). */
  simMs: number;
  note: string;
}

interface ChildResult {
  ms: number;
  bytes: number;
  uploadedBytes?: number;
  /** The child's RSS before the transfer (Node.js and the modules it loaded). */
  idleKiB: number;
  /** The child's VmHWM at the end: its peak over its whole life. */
  hwmKiB: number;
  /** The child's CPU time (user + system), ms. */
  cpuMs: number;
  /** CPU time of the child's own children (the `cocoon` client processes it ran), ms. */
  childrenCpuMs: number;
}

/**
 * Runs a command to completion; its wall time, peak RSS (VmHWM sampled every 20 ms) and CPU
 * time (utime + stime, the last sample before it exited).
 */
function measureChild(cmd: string, args: string[]): Promise<{ ms: number; peakKiB: number; cpuMs: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let peak = 0;
    let cpuMs = 0;
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    const timer = setInterval(() => {
      try {
        if (child.pid) {
          // A process that is exiting (a zombie) has no VmHWM: keep the last real samples.
          const hwm = memOf(child.pid).hwmKiB;
          const cpu = cpuTimes(child.pid).selfMs;
          if (Number.isFinite(hwm)) peak = Math.max(peak, hwm);
          if (Number.isFinite(cpu)) cpuMs = cpu;
        }
      } catch {
        // exited
      }
    }, 20);
    child.on('error', reject);
    child.on('close', (code) => {
      clearInterval(timer);
      if (code !== 0) reject(new Error(`${path.basename(cmd)} ${args[0]} exited ${code}: ${stderr.trim()}`));
      else resolve({ ms: performance.now() - t0, peakKiB: peak, cpuMs });
    });
  });
}

async function craneBin(): Promise<string> {
  if (process.env.VK_CRANE_BIN) return process.env.VK_CRANE_BIN;
  const out = await new Promise<string>((resolve, reject) => {
    const child = spawn('bash', [path.join(repoRoot, 'scripts', 'cranebin.sh')], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let text = '';
    child.stdout.on('data', (d: Buffer) => {
      text += d.toString();
    });
    child.on('close', (code) =>
      code === 0 ? resolve(text) : reject(new Error(`cranebin.sh exited ${code}`)),
    );
  });
  return path.join(out.trim().split('\n').pop() ?? '', 'crane');
}

const bench = new Bench('transfer');
bench.run(async () => {
  const diskBytes = envInt('VK_BENCH_DISK_GIB', 2) * GiB;
  const dataBytes = envInt('VK_BENCH_DATA_GIB', 1) * GiB;
  const crane = await craneBin();
  bench.check();
  bench.log('starting docker-registry');
  // The published figures (docs/benchmarks.md) are 2.8's: the bench keeps it, whatever the
  // ground's default registry is.
  const reg = await startRegistry(path.join(bench.dir, 'registry'), { kind: 'docker-registry' });
  const sim = await newSimRoot({ parent: bench.dir });
  const registry = new RegistryClient({ base: `${reg.hostPort}/bench`, credentials: [] });
  try {
    Object.assign(process.env, sim.env());
    const image = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';
    await sim.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image, pulled: true });
    const vm = await sim.json<{ id: string }>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'bench-vm',
      'base',
    ]);
    const saved = await sim.run(['snapshot', 'save', '--name', 'bench-vm', vm.id]);
    if (saved.code !== 0) throw new Error(`snapshot save: ${saved.stderr.trim()}`);
    const dataDir = path.join(sim.root, 'snapshot', 'localfile', saved.stdout.trim());
    bench.log(
      `writing the disk: ${diskBytes / GiB} GiB sparse, ${dataBytes / GiB} GiB random data in 16 MiB extents`,
    );
    writeSparseDisk(path.join(dataDir, 'cow.raw'), diskBytes, dataBytes);
    fs.writeFileSync(path.join(dataDir, 'memory-range-0'), randomFillSync(Buffer.alloc(64 * MiB)));
    bench.check();

    const rows: Row[] = [];
    const runs = envInt('VK_BENCH_RUNS', 1);
    const simEnv = sim.env();
    const serverPid = sim.serverPid;
    /** CPU ms so far of the registry and of the simulator's server (export and import run there). */
    const others = () => ({
      registryMs: cpuTimes(reg.pid).selfMs,
      simMs: serverPid === undefined ? 0 : cpuTimes(serverPid).selfMs,
    });
    /** Runs a phase; the CPU the registry and the simulator server spent meanwhile. */
    const phase = async <T>(fn: () => Promise<T>): Promise<T & { registryMs: number; simMs: number }> => {
      const before = others();
      const value = await fn();
      const after = others();
      return {
        ...value,
        registryMs: after.registryMs - before.registryMs,
        simMs: after.simMs - before.simMs,
      };
    };
    let payload = 0;
    for (let run = 1; run <= runs; run++) {
      const suffix = runs > 1 ? ` #${run}` : '';
      const repo = run === 1 ? 'bench-vm' : `bench-vm-${run}`;
      bench.log(`ours: push${suffix}`);
      const push = await phase(() =>
        runBenchChild<ChildResult>(
          'transfer-child.ts',
          {
            op: 'push',
            registry: `${reg.hostPort}/bench`,
            cocoonBin: sim.cocoonBin,
            localName: 'bench-vm',
            repo,
            tag: 'latest',
            baseImage: image,
            spoolDir: bench.dir,
          },
          simEnv,
        ),
      );
      const manifest = await registry.getManifest(registry.repository(repo), {
        kind: 'tag',
        value: 'latest',
      });
      if (manifest === 'absent') throw new Error('the pushed manifest is absent');
      const layers = manifest.manifest.layers;
      const cow = layers.find((l) => l.annotations['org.opencontainers.image.title'] === 'cow.raw');
      payload = push.bytes;
      rows.push({
        what: `ours: push (pushSnapshot)${suffix}`,
        bytes: payload,
        ms: push.ms,
        peakKiB: push.hwmKiB,
        startKiB: push.idleKiB,
        cpuMs: push.cpuMs,
        registryMs: push.registryMs,
        simMs: push.simMs + push.childrenCpuMs,
        note: `export ⇒ upload; ${layers.length} layers, cow.raw ${fmtN((cow?.size ?? 0) / MiB, 0)} MiB`,
      });
      bench.check();

      bench.log(`ours: pull${suffix}`);
      const pull = await phase(() =>
        runBenchChild<ChildResult>(
          'transfer-child.ts',
          {
            op: 'pull',
            registry: `${reg.hostPort}/bench`,
            cocoonBin: sim.cocoonBin,
            repo,
            tag: 'latest',
            localName: `bench-copy-${run}`,
            spillDir: bench.dir,
          },
          simEnv,
        ),
      );
      rows.push({
        what: `ours: pull (pullSnapshot)${suffix}`,
        bytes: payload,
        ms: pull.ms,
        peakKiB: pull.hwmKiB,
        startKiB: pull.idleKiB,
        cpuMs: pull.cpuMs,
        registryMs: pull.registryMs,
        simMs: pull.simMs + pull.childrenCpuMs,
        note: 'download + verify + import',
      });
      const removed = await sim.run(['snapshot', 'rm', `bench-copy-${run}`]);
      if (removed.code !== 0) throw new Error(`snapshot rm: ${removed.stderr.trim()}`);
      bench.check();

      const src = `${reg.hostPort}/bench/${repo}:latest`;
      const layout = path.join(bench.dir, `crane-layout-${run}`);
      bench.log(`crane: pull --format oci${suffix}`);
      const cpull = await phase(() =>
        measureChild(crane, ['pull', '--insecure', '--format', 'oci', src, layout]),
      );
      rows.push({
        what: `crane pull --format oci${suffix}`,
        bytes: payload,
        ms: cpull.ms,
        peakKiB: cpull.peakKiB,
        startKiB: Number.NaN,
        cpuMs: cpull.cpuMs,
        registryMs: cpull.registryMs,
        simMs: 0,
        note: 'registry ⇒ OCI layout on disk',
      });
      bench.check();
      bench.log(`crane: push (layout ⇒ another repository)${suffix}`);
      const cpush = await phase(() =>
        measureChild(crane, [
          'push',
          '--insecure',
          layout,
          `${reg.hostPort}/bench/bench-crane-${run}:latest`,
        ]),
      );
      rows.push({
        what: `crane push (OCI layout)${suffix}`,
        bytes: payload,
        ms: cpush.ms,
        peakKiB: cpush.peakKiB,
        startKiB: Number.NaN,
        cpuMs: cpush.cpuMs,
        registryMs: cpush.registryMs,
        simMs: 0,
        note: 'OCI layout ⇒ a new repository',
      });
      fs.rmSync(layout, { recursive: true, force: true });
      bench.check();
    }

    // The simulator alone, no registry: what any push (export) or pull (import) through it costs.
    bench.log('simulator alone: snapshot export, snapshot import');
    const exportOnly = await phase(() =>
      measureChild('bash', ['-c', 'exec "$0" snapshot export bench-vm -o - > /dev/null', sim.cocoonBin]),
    );
    const tarFile = path.join(bench.dir, 'bench-vm.tar');
    const exported = await sim.run(['snapshot', 'export', 'bench-vm', '-o', tarFile]);
    if (exported.code !== 0) throw new Error(`snapshot export: ${exported.stderr.trim()}`);
    const importOnly = await phase(() =>
      measureChild('bash', [
        '-c',
        'exec "$0" snapshot import --name bench-floor < "$1"',
        sim.cocoonBin,
        tarFile,
      ]),
    );
    fs.rmSync(tarFile, { force: true });
    for (const [what, m, note] of [
      [
        'simulator: snapshot export',
        exportOnly,
        '`cocoon snapshot export -o -` into /dev/null: the push floor',
      ],
      [
        'simulator: snapshot import',
        importOnly,
        '`cocoon snapshot import` of the tar from a file: the pull floor',
      ],
    ] as const) {
      rows.push({
        what,
        bytes: payload,
        ms: m.ms,
        peakKiB: Number.NaN,
        startKiB: Number.NaN,
        cpuMs: Number.NaN,
        registryMs: 0,
        simMs: m.simMs + m.cpuMs,
        note,
      });
    }

    console.log('');
    for (const l of machineLines(undefined, bench)) console.log(l);
    console.log(
      `registry: docker-registry (distribution 2.8) on loopback, filesystem storage under ${os.tmpdir()}; ` +
        `snapshot: cow.raw ${diskBytes / GiB} GiB sparse with ${dataBytes / GiB} GiB data, memory 64 MiB; payload ${fmtN(payload / MiB, 0)} MiB`,
    );
    console.log('');
    const sec = (ms: number) => (Number.isFinite(ms) ? `${fmtN(ms / 1000, 1)} s` : '–');
    console.log(
      markdownTable(
        ['transfer', 'payload', 'wall', 'MB/s', 'peak RSS (idle)', 'CPU', 'CPU registry / simulator', 'what'],
        rows.map((r) => [
          r.what,
          `${fmtN(r.bytes / MiB, 0)} MiB`,
          `${fmtN(r.ms / 1000, 1)} s`,
          fmtN(r.bytes / 1e6 / (r.ms / 1000), 0),
          Number.isFinite(r.peakKiB)
            ? `${fmtN(r.peakKiB / 1024, 0)} MiB` +
              (Number.isFinite(r.startKiB) ? ` (${fmtN(r.startKiB / 1024, 0)})` : '')
            : '–',
          sec(r.cpuMs),
          `${sec(r.registryMs)} / ${sec(r.simMs)}`,
          r.note,
        ]),
      ),
    );
  } finally {
    registry.close();
    await sim.cleanup({ keepDir: true }).catch(() => {});
    await stopRegistry(reg).catch(() => {});
  }
});
