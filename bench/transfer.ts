// Benchmark (a script, not a test): snapshot transfer through the registry. Usage:
//   npm run bench:transfer                 # a 1 GiB and a 4 GiB sparse disk, half of each data, v1 and v2
//   VK_BENCH_DISK_GIB=2 VK_BENCH_DATA_GIB=1 npm run bench:transfer   # one size (a list: several)
//   VK_BENCH_FORMATS=v1 npm run bench:transfer                       # v1 only
//   VK_BENCH_RUNS=3 npm run bench:transfer # every row three times, in turn
// Starts only the ground's docker-registry (CNCF distribution 2.8, filesystem storage on this
// disk; a fresh one per size) and a simulator root; per size, saves a VM snapshot whose disk
// (`cow.raw`) is a sparse file of VK_BENCH_DISK_GIB (default 1, then 4) with VK_BENCH_DATA_GIB
// (default half the disk) of random data spread through it in 16 MiB extents
// (VK_BENCH_COMPRESSIBLE=<percent>: that share of the extents half zeros, so that zstd has
// something to compress), writes its `cocoon snapshot export` to a tar file (untimed), then,
// for v1 and for v2 (the v2 writer at zstd level VK_BENCH_ZSTD_LEVEL, default 3, and chunks of
// VK_BENCH_CHUNK_MIB, default 64; pulls read ahead VK_BENCH_PULL_CONCURRENCY blobs at once, default
// the daemon's SNAPSHOT_TRANSFER_CONCURRENCY default), measures:
//   - ours, push: pushSnapshot (live `cocoon snapshot export` ⇒ upload ⇒ manifest);
//   - ours, pull: pullSnapshot into another local name (registry ⇒ verified stream ⇒ cocoon
//     snapshot import);
//   - ours, fetch: the registry part of a pull as the issue defines it and as crane does it —
//     the manifest, then the config and every layer fetched and verified, as the pull reads
//     them (RegistryClient.getBlob, the same concurrency), nothing decoded, no tar;
//   - ours, registry pull: the same pullSnapshot, its import's tar read and discarded
//     (bench/lib/bench-cli.ts): fetch and verify every blob, v2 decompression, the tar;
//   - crane (go-containerregistry v0.22.1, scripts/cranebin.sh): `crane pull --format oci` of
//     the same artifact to a local OCI layout;
//   - ours, upload: the registry part of a push — the blobs of crane's layout uploaded by the
//     daemon's client (uploadBlob, the push's concurrency), then the manifest, into a new
//     repository: the same bytes crane push sends;
//   - ours, registry push: pushSnapshot with the export read from the tar file (`cat`):
//     hashing, v2 compression, upload, into a new repository;
//   - crane: `crane push` of the layout to another new repository (a real upload: blobs from
//     a layout are not mounted across repositories);
// Every phase starts after a `sync`, and ours and crane take turns at going first (in even runs
// crane pulls before ours and pushes before ours); with VK_BENCH_RUNS > 1 the summary adds the
// ratio of each side's summed walls. And, once per size, the simulator alone: `snapshot export
// -o -` into /dev/null and `snapshot import` of the tar from the file, what any push or pull
// through it costs at least.
// MB/s is payload bytes (the layers and config as stored in the registry: compressed under v2)
// over wall time. Ours runs in a process of its own (bench/transfer-child.ts, with the daemon's
// V8 flags --max-semi-space-size=2 --no-opt --no-maglev --optimize-for-size): its peak RSS is
// that process's VmHWM, shown with its RSS before the transfer (Node.js and the modules);
// crane's is its VmHWM sampled from /proc every 20 ms. CPU: the transfer process's own, then
// what the registry and the simulator (its server, where export and import run, and the
// `cocoon` client processes; `cat` for the registry push) spent during the phase.
// VK_BENCH_CHILD_FLAGS adds Node flags to the transfer process (e.g. --cpu-prof); with
// VK_BENCH_CHILD_LOG=info it logs its progress every second on stderr.
// Everything it starts it stops, and its gigabytes (disks, tar files, registry storage, crane
// layouts) are removed however it ends (bench/lib/harness.ts teardown, the PID registry).
import { execFileSync } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { type RegistryState, startRegistry, stopRegistry } from '../ground/registry.ts';
import { newSimRoot, type SimRoot } from '../sim/client.ts';
import { RegistryClient } from '../src/registry/client.ts';
import { DEFAULT_TRANSFER_CONCURRENCY } from '../src/registry/pull.ts';
import type { V2Format } from '../src/registry/v2-write.ts';
import { runBenchChild } from './lib/child.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes } from './lib/procfs.ts';
import { writeSparseDisk } from './lib/sparse.ts';
import { fmtN } from './lib/stats.ts';
import {
  type ChildResult,
  cocoonTable,
  craneBin,
  type Format,
  measureChild,
  type Row,
  rowsTable,
  summaryTable,
} from './lib/transfer-report.ts';

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const repoRoot = path.resolve(import.meta.dirname, '..');
const IMAGE = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';

/** GiB as a short number ("0.5", "4"). */
const gib = (n: number) => String(Number(n.toFixed(2)));

/** Positive numbers from a comma-separated variable, or undefined when it is unset. */
function envList(name: string): number[] | undefined {
  const raw = process.env[name] ?? '';
  if (raw === '') return undefined;
  return raw.split(',').map((s) => {
    const n = Number(s.trim());
    if (!Number.isFinite(n) || n <= 0) throw new Error(`${name}=${raw}: expected positive numbers`);
    return n;
  });
}

interface Size {
  diskGiB: number;
  dataGiB: number;
  label: string;
}

/** The sizes: a 1 GiB and a 4 GiB disk with half their size in data, or the variables'. */
function sizes(): Size[] {
  const disks = envList('VK_BENCH_DISK_GIB');
  const data = envList('VK_BENCH_DATA_GIB');
  const list = (disks ?? (data ? data.map((d) => d * 2) : [1, 4])).map((diskGiB, i) => {
    const dataGiB = data ? (data[i] ?? (data.at(-1) as number)) : diskGiB / 2;
    if (dataGiB > diskGiB) throw new Error(`${dataGiB} GiB of data do not fit a ${diskGiB} GiB disk`);
    return { diskGiB, dataGiB, label: `${gib(diskGiB)} GiB disk, ${gib(dataGiB)} GiB data` };
  });
  return list;
}

function formats(): Format[] {
  const raw = (process.env.VK_BENCH_FORMATS ?? 'v1,v2').split(',').map((s) => s.trim());
  for (const f of raw) if (f !== 'v1' && f !== 'v2') throw new Error(`VK_BENCH_FORMATS: ${f}? (v1, v2)`);
  return raw as Format[];
}

/** Free bytes of the file system that holds `dir`. */
function freeBytes(dir: string): number {
  const st = fs.statfsSync(dir);
  return st.bavail * st.bsize;
}

const bench = new Bench('transfer');
/** Blob downloads at once in the pulls (the daemon's `SNAPSHOT_TRANSFER_CONCURRENCY`). */
const pullConcurrency = envInt('VK_BENCH_PULL_CONCURRENCY', DEFAULT_TRANSFER_CONCURRENCY);
bench.run(async () => {
  const crane = await craneBin(repoRoot);
  const sizeList = sizes();
  const formatList = formats();
  const runs = envInt('VK_BENCH_RUNS', 1);
  const compressible = Number(process.env.VK_BENCH_COMPRESSIBLE ?? '0') / 100;
  if (!(compressible >= 0 && compressible <= 1))
    throw new Error('VK_BENCH_COMPRESSIBLE: a percentage, 0–100');
  const v2: V2Format = {
    zstdLevel: envInt('VK_BENCH_ZSTD_LEVEL', 3),
    chunkBytes: envInt('VK_BENCH_CHUNK_MIB', 64) * MiB,
  };
  bench.check();
  const sim = await newSimRoot({ parent: bench.dir });
  bench.removeAtEnd(path.join(sim.root, 'snapshot'));
  const rows: Row[] = [];
  const lines: string[] = [];
  let reg: RegistryState | undefined;
  try {
    Object.assign(process.env, sim.env());
    await sim.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
    const vm = await sim.json<{ id: string }>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'bench-vm',
      'base',
    ]);
    for (const [i, size] of sizeList.entries()) {
      // The source snapshot and its tar, the registry's v1 and v2 blobs, a crane layout, an
      // imported copy: about six times the data at once, plus v2's spool.
      const need = 7 * size.dataGiB * GiB + 2 * GiB;
      if (freeBytes(bench.dir) < need)
        throw new Error(
          `${size.label}: ${fmtN(freeBytes(bench.dir) / GiB, 1)} GiB free under ${bench.dir}, ${fmtN(need / GiB, 1)} GiB needed`,
        );
      const regDir = path.join(bench.dir, `registry-${i + 1}`);
      bench.removeAtEnd(path.join(regDir, 'storage'));
      bench.log(`${size.label}: starting docker-registry`);
      // The published figures (docs/benchmarks.md) are 2.8's: the bench keeps it, whatever the
      // ground's default registry is.
      reg = await startRegistry(regDir, { kind: 'docker-registry' });
      lines.push(
        ...(await runSize(sim, reg, vm.id, size, i + 1, { crane, formatList, runs, v2, compressible }, rows)),
      );
      await stopRegistry(reg);
      reg = undefined;
      fs.rmSync(path.join(regDir, 'storage'), { recursive: true, force: true });
    }

    console.log('');
    for (const l of machineLines(undefined, bench)) console.log(l);
    console.log(
      `registry: docker-registry (distribution 2.8) on loopback, filesystem storage under ${os.tmpdir()}, a fresh one per size; ` +
        `v2: zstd level ${v2.zstdLevel}, chunks of ${v2.chunkBytes / MiB} MiB; pulls: ${pullConcurrency} blob downloads at once; data ${
          compressible > 0
            ? `${fmtN(compressible * 100, 0)}% of the extents half zeros, the rest random`
            : 'random'
        }`,
    );
    for (const l of lines) console.log(l);
    for (const size of sizeList) {
      console.log('');
      console.log(`${size.label}:`);
      console.log('');
      console.log(rowsTable(rows.filter((r) => r.size === size.label)));
    }
    console.log('');
    console.log(
      'Ours against crane: the registry part first (fetch + verify; upload: what crane does, ours ÷ crane ≤ 1.00 is the goal), then with the tar and v2 coding crane does not do:',
    );
    console.log('');
    console.log(summaryTable(rows, runs));
    console.log('');
    console.log('With cocoon, and cocoon alone (wall):');
    console.log('');
    console.log(cocoonTable(rows, runs));
  } finally {
    await sim.cleanup({ keepDir: true }).catch(() => {});
    if (reg) await stopRegistry(reg).catch(() => {});
  }
});

interface SizeOptions {
  crane: string;
  formatList: Format[];
  runs: number;
  v2: V2Format;
  compressible: number;
}

/** One snapshot size: every row of every format (and run), then the simulator alone. Returns
 * the lines that describe the snapshot and its payloads. */
async function runSize(
  sim: SimRoot,
  reg: RegistryState,
  vmId: string,
  size: Size,
  n: number,
  o: SizeOptions,
  rows: Row[],
): Promise<string[]> {
  const snapshot = `bench-s${n}`;
  const saved = await sim.run(['snapshot', 'save', '--name', snapshot, vmId]);
  if (saved.code !== 0) throw new Error(`snapshot save: ${saved.stderr.trim()}`);
  const dataDir = path.join(sim.root, 'snapshot', 'localfile', saved.stdout.trim());
  bench.log(`${size.label}: writing the disk (16 MiB extents)`);
  writeSparseDisk(path.join(dataDir, 'cow.raw'), size.diskGiB * GiB, size.dataGiB * GiB, o.compressible);
  fs.writeFileSync(path.join(dataDir, 'memory-range-0'), randomFillSync(Buffer.alloc(64 * MiB)));
  bench.check();
  const tarFile = bench.removeAtEnd(path.join(bench.dir, `${snapshot}.tar`));
  bench.log(`${size.label}: snapshot export into ${tarFile} (untimed: the registry push reads it)`);
  const exported = await sim.run(['snapshot', 'export', snapshot, '-o', tarFile]);
  if (exported.code !== 0) throw new Error(`snapshot export: ${exported.stderr.trim()}`);

  const registry = new RegistryClient({ base: `${reg.hostPort}/bench`, credentials: [] });
  const simEnv = sim.env();
  const serverPid = sim.serverPid;
  /** Runs a phase; the CPU the registry and the simulator server spent meanwhile. */
  const phase = async <T>(fn: () => Promise<T>): Promise<T & { registryMs: number; simMs: number }> => {
    const others = () => ({
      registryMs: cpuTimes(reg.pid).selfMs,
      simMs: serverPid === undefined ? 0 : cpuTimes(serverPid).selfMs,
    });
    // Every phase starts with no dirty pages: the previous phase's files (crane's layout, the
    // registry's new blobs, a tar) would otherwise be written back during this one, on the
    // same disk, and charge it for the last phase's writes.
    execFileSync('sync');
    const before = others();
    const value = await fn();
    const after = others();
    return { ...value, registryMs: after.registryMs - before.registryMs, simMs: after.simMs - before.simMs };
  };
  const child = (job: Record<string, unknown>) =>
    phase(() =>
      runBenchChild<ChildResult>(
        'transfer-child.ts',
        { registry: `${reg.hostPort}/bench`, cocoonBin: sim.cocoonBin, tag: 'latest', ...job },
        simEnv,
      ),
    );
  const payloads = new Map<Format, number>();
  const lines: string[] = [];
  try {
    for (let run = 1; run <= o.runs; run++) {
      const suffix = o.runs > 1 ? ` #${run}` : '';
      for (const format of o.formatList) {
        const v2 = format === 'v2' ? o.v2 : undefined;
        const repo = `s${n}-${format}${run > 1 ? `-r${run}` : ''}`;
        const log = (what: string) => bench.log(`${size.label}, ${format}: ${what}${suffix}`);
        const base = { size: size.label, format, run };
        const ours = (
          kind: Row['kind'],
          what: string,
          r: ChildResult & { registryMs: number; simMs: number },
          bytes: number,
          note: string,
        ): Row => ({
          ...base,
          kind,
          what: `${what} ${format}${suffix}`,
          bytes,
          ms: r.ms,
          peakKiB: r.hwmKiB,
          startKiB: r.idleKiB,
          cpuMs: r.cpuMs,
          registryMs: r.registryMs,
          simMs: r.simMs + r.childrenCpuMs,
          note,
        });

        log('ours: push');
        const push = await child({
          op: 'push',
          localName: snapshot,
          repo,
          baseImage: IMAGE,
          spoolDir: bench.dir,
          v2,
        });
        const manifest = await registry.getManifest(registry.repository(repo), {
          kind: 'tag',
          value: 'latest',
        });
        if (manifest === 'absent') throw new Error('the pushed manifest is absent');
        const layers = manifest.manifest.layers;
        const cow = layers.filter((l) => l.annotations['org.opencontainers.image.title'] === 'cow.raw');
        const cowBytes = cow.reduce((a, l) => a + l.size, 0);
        const payload = push.bytes;
        payloads.set(format, payload);
        rows.push(
          ours(
            'push',
            'ours: push (pushSnapshot)',
            push,
            payload,
            `live export ⇒ upload; ${layers.length} layers, cow.raw ${fmtN(cowBytes / MiB, 0)} MiB in ${cow.length}`,
          ),
        );
        bench.check();

        const src = `${reg.hostPort}/bench/${repo}:latest`;
        const layout = bench.removeAtEnd(path.join(bench.dir, `crane-layout-${repo}`));
        // Ours and crane take turns at going first (crane in even runs), so that neither always
        // runs in the same spot: the registry's CPU for the same upload varies widely between
        // runs on the bench's VM (mostly system time), and with ours always first our upload was
        // the dearer in every 4 GiB comparison and the cheaper in every 1 GiB one
        // (docs/benchmarks.md "Order").
        const pullSide = async () => {
          log('ours: pull');
          const copy = `bench-copy-${n}`;
          const pull = await child({
            op: 'pull',
            repo,
            localName: copy,
            spillDir: bench.dir,
            concurrency: pullConcurrency,
          });
          rows.push(ours('pull', 'ours: pull (pullSnapshot)', pull, payload, 'download + verify + import'));
          const removed = await sim.run(['snapshot', 'rm', copy]);
          if (removed.code !== 0) throw new Error(`snapshot rm: ${removed.stderr.trim()}`);
          bench.check();

          log('ours: fetch');
          const fetch = await child({ op: 'fetch', repo, concurrency: pullConcurrency });
          rows.push(
            ours(
              'fetch',
              'ours: fetch',
              fetch,
              payload,
              `fetch + verify every blob as the pull reads it (${pullConcurrency} at once); no ${v2 ? 'unzstd, no ' : ''}tar`,
            ),
          );
          bench.check();

          log('ours: registry pull');
          const rpull = await child({
            op: 'pull',
            repo,
            localName: `bench-discard-${n}`,
            spillDir: bench.dir,
            concurrency: pullConcurrency,
            discardImport: true,
          });
          rows.push(
            ours(
              'registry-pull',
              'ours: registry pull',
              rpull,
              payload,
              `download + verify${v2 ? ' + unzstd' : ''} + tar, ${fmtN((rpull.discardedBytes ?? 0) / MiB, 0)} MiB of tar discarded`,
            ),
          );
          bench.check();
        };
        const cranePull = async () => {
          log('crane: pull --format oci');
          const cpull = await phase(() =>
            measureChild(o.crane, ['pull', '--insecure', '--format', 'oci', src, layout]),
          );
          rows.push({
            ...base,
            kind: 'crane-pull',
            what: `crane pull --format oci ${format}${suffix}`,
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
        };
        const pushSide = async () => {
          log('ours: upload (the layout crane pulled)');
          const upload = await child({ op: 'upload', repo: `${repo}-up`, layoutDir: layout });
          rows.push(
            ours(
              'upload',
              'ours: upload',
              upload,
              upload.bytes,
              'OCI layout ⇒ a new repository (uploadBlob, putManifest)',
            ),
          );
          bench.check();

          log('ours: registry push (export from the tar file)');
          const rpush = await child({
            op: 'push',
            localName: snapshot,
            repo: `${repo}-ours`,
            baseImage: IMAGE,
            spoolDir: bench.dir,
            v2,
            exportFrom: tarFile,
          });
          rows.push(
            ours(
              'registry-push',
              'ours: registry push',
              rpush,
              rpush.bytes,
              `tar file ⇒ ${v2 ? 'zstd + ' : ''}hash ⇒ a new repository, ${fmtN((rpush.uploadedBytes ?? 0) / MiB, 0)} MiB uploaded`,
            ),
          );
          bench.check();
        };
        const cranePush = async () => {
          log('crane: push (layout ⇒ another repository)');
          const cpush = await phase(() =>
            measureChild(o.crane, [
              'push',
              '--insecure',
              layout,
              `${reg.hostPort}/bench/${repo}-crane:latest`,
            ]),
          );
          rows.push({
            ...base,
            kind: 'crane-push',
            what: `crane push (OCI layout) ${format}${suffix}`,
            bytes: payload,
            ms: cpush.ms,
            peakKiB: cpush.peakKiB,
            startKiB: Number.NaN,
            cpuMs: cpush.cpuMs,
            registryMs: cpush.registryMs,
            simMs: 0,
            note: 'OCI layout ⇒ a new repository',
          });
        };
        const order =
          run % 2 === 0
            ? [cranePull, pullSide, cranePush, pushSide]
            : [pullSide, cranePull, pushSide, cranePush];
        for (const step of order) await step();
        fs.rmSync(layout, { recursive: true, force: true });
        bench.check();
      }
    }

    // The simulator alone, no registry: what any push (export) or pull (import) through it costs.
    bench.log(`${size.label}: simulator alone: snapshot export, snapshot import`);
    const exportOnly = await phase(() =>
      measureChild('bash', [
        '-c',
        'exec "$0" snapshot export "$1" -o - > /dev/null',
        sim.cocoonBin,
        snapshot,
      ]),
    );
    const importOnly = await phase(() =>
      measureChild('bash', [
        '-c',
        'exec "$0" snapshot import --name "$1" < "$2"',
        sim.cocoonBin,
        `bench-floor-${n}`,
        tarFile,
      ]),
    );
    const floorRemoved = await sim.run(['snapshot', 'rm', `bench-floor-${n}`]);
    if (floorRemoved.code !== 0) throw new Error(`snapshot rm: ${floorRemoved.stderr.trim()}`);
    const tarBytes = fs.statSync(tarFile).size;
    for (const [kind, what, m, note] of [
      [
        'export',
        'simulator: snapshot export',
        exportOnly,
        '`cocoon snapshot export -o -` into /dev/null: the push floor',
      ],
      [
        'import',
        'simulator: snapshot import',
        importOnly,
        '`cocoon snapshot import` of the tar from a file: the pull floor',
      ],
    ] as const) {
      rows.push({
        size: size.label,
        format: undefined,
        kind,
        run: 1,
        what,
        bytes: tarBytes,
        ms: m.ms,
        peakKiB: Number.NaN,
        startKiB: Number.NaN,
        cpuMs: Number.NaN,
        registryMs: 0,
        simMs: m.simMs + m.cpuMs,
        note,
      });
    }
    const v1 = payloads.get('v1');
    lines.push(
      `${size.label}: cow.raw ${gib(size.diskGiB)} GiB sparse with ${gib(size.dataGiB)} GiB data, memory 64 MiB; export tar ${fmtN(tarBytes / MiB, 0)} MiB; payload ` +
        [...payloads]
          .map(
            ([f, b]) =>
              `${f} ${fmtN(b / MiB, 0)} MiB${f === 'v2' && v1 ? ` (${fmtN((b / v1) * 100, 1)}% of v1)` : ''}`,
          )
          .join(', '),
    );
  } finally {
    registry.close();
    fs.rmSync(tarFile, { force: true });
    await sim.run(['snapshot', 'rm', snapshot]).catch(() => undefined);
  }
  return lines;
}
