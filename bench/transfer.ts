// Benchmark (a script, not a test): snapshot transfer through the registry. Usage:
//   npm run bench:transfer                 # a 2 GiB sparse disk carrying 1 GiB of random data
//   VK_BENCH_DISK_GIB=4 VK_BENCH_DATA_GIB=2 npm run bench:transfer
// Starts only the ground's docker-registry (CNCF distribution 2.8, filesystem storage on this
// disk) and a simulator root; saves a VM snapshot whose disk (`cow.raw`) is a sparse file of
// VK_BENCH_DISK_GIB with VK_BENCH_DATA_GIB of random data spread through it in 16 MiB extents,
// then measures in one run:
//   - ours, push: pushSnapshot (cocoon snapshot export ⇒ spool + hash ⇒ HEAD/upload, 64 MiB
//     PATCH chunks, 8 parallel layers ⇒ manifest);
//   - ours, pull: pullSnapshot into another local name (registry ⇒ verified stream ⇒ cocoon
//     snapshot import);
//   - crane (go-containerregistry v0.22.1, scripts/cranebin.sh): `crane pull --format oci` of
//     the same artifact to a local OCI layout, then `crane push` of that layout to another
//     repository (a real upload: blobs from a layout are not mounted across repositories).
// MB/s is payload bytes (the layers and config as stored in the registry) over wall time.
// Peak RSS: ours is this process's VmHWM over the phase (reset through /proc/self/clear_refs
// before it), crane's is its own VmHWM sampled from /proc every 20 ms. The simulator's export
// and import run in the simulator's server process and are not counted in ours.
// Everything it starts it stops (bench/lib/harness.ts teardown, the PID registry).
import { spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startRegistry, stopRegistry } from '../ground/registry.ts';
import { newSimRoot } from '../sim/client.ts';
import { CocoonCli } from '../src/cocoon/runner.ts';
import { silentLogger } from '../src/log.ts';
import { RegistryClient } from '../src/registry/client.ts';
import { pullSnapshot } from '../src/registry/pull.ts';
import { pushSnapshot } from '../src/registry/push.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { fmtN, markdownTable } from './lib/stats.ts';

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const EXTENT = 16 * MiB;
const repoRoot = path.resolve(import.meta.dirname, '..');

interface Row {
  what: string;
  bytes: number;
  ms: number;
  peakKiB: number;
  /** RSS when the phase started (ours: this process, which also holds the bench itself). */
  startKiB: number;
  note: string;
}

function hwmKiB(pid: number | 'self'): number {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'latin1');
  return Number(/^VmHWM:\s+(\d+)\s+kB/m.exec(status)?.[1] ?? Number.NaN);
}

/** Runs `fn` with this process's peak RSS reset before and read after. */
async function measureSelf<T>(
  fn: () => Promise<T>,
): Promise<{ value: T; ms: number; peakKiB: number; startKiB: number }> {
  const startKiB = process.memoryUsage().rss / 1024;
  try {
    fs.writeFileSync('/proc/self/clear_refs', '5');
  } catch {
    // older kernels: the peak is then the process's lifetime peak
  }
  const t0 = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - t0, peakKiB: hwmKiB('self'), startKiB };
}

/** Runs a command to completion; its wall time and peak RSS (VmHWM sampled every 20 ms). */
function measureChild(cmd: string, args: string[]): Promise<{ ms: number; peakKiB: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let peak = 0;
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    const timer = setInterval(() => {
      try {
        if (child.pid) peak = Math.max(peak, hwmKiB(child.pid));
      } catch {
        // exited
      }
    }, 20);
    child.on('error', reject);
    child.on('close', (code) => {
      clearInterval(timer);
      if (code !== 0) reject(new Error(`${path.basename(cmd)} ${args[0]} exited ${code}: ${stderr.trim()}`));
      else resolve({ ms: performance.now() - t0, peakKiB: peak });
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

/** A `size`-byte sparse file with `data` bytes of random data in EXTENT pieces spread evenly. */
function writeSparseDisk(file: string, size: number, data: number): void {
  const extents = Math.max(1, Math.round(data / EXTENT));
  const stride = Math.floor(size / extents / EXTENT) * EXTENT;
  if (stride < EXTENT) throw new Error(`cannot spread ${data} bytes of data in ${size} bytes`);
  const fd = fs.openSync(file, 'w');
  try {
    fs.ftruncateSync(fd, size);
    const buf = Buffer.allocUnsafe(EXTENT);
    for (let i = 0; i < extents; i++) {
      randomFillSync(buf);
      fs.writeSync(fd, buf, 0, EXTENT, i * stride);
    }
  } finally {
    fs.closeSync(fd);
  }
}

const bench = new Bench('transfer');
bench.run(async () => {
  const diskBytes = envInt('VK_BENCH_DISK_GIB', 2) * GiB;
  const dataBytes = envInt('VK_BENCH_DATA_GIB', 1) * GiB;
  const crane = await craneBin();
  bench.check();
  bench.log('starting docker-registry');
  const reg = await startRegistry(path.join(bench.dir, 'registry'));
  const sim = await newSimRoot({ parent: bench.dir });
  const lifetime = new AbortController();
  const registry = new RegistryClient({ base: `${reg.hostPort}/bench`, credentials: [] });
  try {
    Object.assign(process.env, sim.env());
    const cli = new CocoonCli(sim.cocoonBin, lifetime.signal, silentLogger);
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
    bench.log('ours: push');
    const push = await measureSelf(() =>
      pushSnapshot({
        registry,
        cli,
        localName: 'bench-vm',
        repo: 'bench-vm',
        tag: 'latest',
        baseImage: image,
        spoolDir: bench.dir,
      }),
    );
    const manifest = await registry.getManifest(registry.repository('bench-vm'), {
      kind: 'tag',
      value: 'latest',
    });
    if (manifest === 'absent') throw new Error('the pushed manifest is absent');
    const layers = manifest.manifest.layers;
    const cow = layers.find((l) => l.annotations['org.opencontainers.image.title'] === 'cow.raw');
    const payload = push.value.bytes;
    rows.push({
      what: 'ours: push (pushSnapshot)',
      bytes: payload,
      ms: push.ms,
      peakKiB: push.peakKiB,
      startKiB: push.startKiB,
      note: `export + spool + upload; ${layers.length} layers, cow.raw layer ${fmtN((cow?.size ?? 0) / MiB, 0)} MiB`,
    });
    bench.check();

    bench.log('ours: pull');
    const pull = await measureSelf(() =>
      pullSnapshot({ registry, cli, repo: 'bench-vm', tag: 'latest', localName: 'bench-copy' }),
    );
    rows.push({
      what: 'ours: pull (pullSnapshot)',
      bytes: payload,
      ms: pull.ms,
      peakKiB: pull.peakKiB,
      startKiB: pull.startKiB,
      note: 'download + verify + import (default 2048 MiB read-ahead budget)',
    });
    bench.check();

    const src = `${reg.hostPort}/bench/bench-vm:latest`;
    const layout = path.join(bench.dir, 'crane-layout');
    bench.log('crane: pull --format oci');
    const cpull = await measureChild(crane, ['pull', '--insecure', '--format', 'oci', src, layout]);
    rows.push({
      what: 'crane pull --format oci',
      bytes: payload,
      ms: cpull.ms,
      peakKiB: cpull.peakKiB,
      startKiB: Number.NaN,
      note: 'registry ⇒ OCI layout on disk',
    });
    bench.check();
    bench.log('crane: push (layout ⇒ another repository)');
    const cpush = await measureChild(crane, [
      'push',
      '--insecure',
      layout,
      `${reg.hostPort}/bench/bench-crane:latest`,
    ]);
    rows.push({
      what: 'crane push (OCI layout)',
      bytes: payload,
      ms: cpush.ms,
      peakKiB: cpush.peakKiB,
      startKiB: Number.NaN,
      note: 'OCI layout ⇒ a new repository',
    });

    console.log('');
    for (const l of machineLines(undefined, bench)) console.log(l);
    console.log(
      `registry: docker-registry (distribution 2.8) on loopback, filesystem storage under ${os.tmpdir()}; ` +
        `snapshot: cow.raw ${diskBytes / GiB} GiB sparse with ${dataBytes / GiB} GiB data, memory 64 MiB; payload ${fmtN(payload / MiB, 0)} MiB`,
    );
    console.log('');
    console.log(
      markdownTable(
        ['transfer', 'payload', 'wall', 'MB/s', 'peak RSS (at start)', 'what'],
        rows.map((r) => [
          r.what,
          `${fmtN(r.bytes / MiB, 0)} MiB`,
          `${fmtN(r.ms / 1000, 1)} s`,
          fmtN(r.bytes / 1e6 / (r.ms / 1000), 0),
          `${fmtN(r.peakKiB / 1024, 0)} MiB` +
            (Number.isFinite(r.startKiB) ? ` (${fmtN(r.startKiB / 1024, 0)})` : ''),
          r.note,
        ]),
      ),
    );
  } finally {
    registry.close();
    lifetime.abort();
    await sim.cleanup({ keepDir: true }).catch(() => {});
    await stopRegistry(reg).catch(() => {});
  }
});
