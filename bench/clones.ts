// Benchmark (a script, not a test): N concurrent clone bring-ups with zero simulated VM latency,
// measured as the daemon's own cost. Usage:
//   npm run bench                 # 50, 200 and 500 pods, one table at the end
//   npm run bench -- 200          # one size (several: `-- 50 200`)
//   npm run bench -- restart      # bench/restart.ts (also `npm run bench:restart`)
//   npm run bench -- steady       # bench/steady.ts (also `npm run bench:steady`)
//   npm run bench -- --release 100 300 1000   # the release build (also VK_BENCH_RELEASE=1)
//   npm run bench -- --figures docs/figures   # also SVG figures of each size (also VK_BENCH_FIGURES=DIR)
// One control plane (with its audit log) serves every size; each size gets a fresh simulator
// root, a fresh daemon on its own node name and a fresh namespace, so the daemon's CPU, peak
// memory and writes belong to that size alone (docs/benchmarks.md).
// However it ends (done, an error, SIGINT/SIGTERM, a crash) every process it started is stopped
// through its PID registry (ground/proc.ts), the simulator's stand-ins included.
import { join } from 'node:path';
import { DEFAULT_KUBE_BURST, DEFAULT_KUBE_QPS } from '../src/kube/client.ts';
import { MAIN_KINDS, otherWrites } from './lib/audit.ts';
import { type BringUpResult, bringUp, bringUpLine } from './lib/bringup.ts';
import { sumCounts } from './lib/calls.ts';
import { burstSvg, figuresOption, readyLatencySvg, writeFigure } from './lib/charts.ts';
import { Bench, benchArgs, machineLines } from './lib/harness.ts';
import { fmtMiB, fmtN, fmtS, markdownTable, max, pct } from './lib/stats.ts';
import type { PodTracker } from './lib/watchers.ts';

// `--figures DIR` is taken out here, as the harness takes out `--release`.
const { dir: figuresDir, rest: args } = figuresOption(benchArgs(), process.env);
const sub = args[0];
if (sub === 'restart' || sub === 'steady') {
  await import(sub === 'restart' ? './restart.ts' : './steady.ts');
} else {
  clones();
}

function sizes(): number[] {
  const fromArgs = args.map(Number);
  if (args.length > 0) {
    if (fromArgs.some((n) => !Number.isInteger(n) || n <= 0))
      throw new Error(
        `usage: npm run bench -- [--release] [--figures DIR] [pods...] | restart | steady (got ${args.join(' ')})`,
      );
    return fromArgs;
  }
  if (process.env.VK_BENCH_PODS) return [Number(process.env.VK_BENCH_PODS)];
  return [50, 200, 500];
}

function clones(): void {
  const list = sizes();
  const bench = new Bench('bench');
  bench.run(async () => {
    const g = await bench.startGround();
    const results: BringUpResult[] = [];
    for (const n of list) {
      bench.check();
      const env = await bench.newEnv(`bench-${n}`, { pods: n });
      const { result, tracker, windowEnd } = await bringUp(bench, env, n);
      tracker.stop();
      results.push(result);
      if (figuresDir !== undefined) figures(bench, figuresDir, result, tracker, windowEnd);
      // The table comes at the end; a size's own figures are in the log as soon as it is done.
      bench.log(
        `[bench-${n}] ${bringUpLine(result)}; daemon RSS idle ${fmtMiB(result.idleRssKiB)}, ` +
          `peak ${fmtMiB(result.peakRssKiB)}, ` +
          `VmHWM ${fmtMiB(result.hwmKiB)}, CPU ${fmtN(result.cpuMs / n, 1)} ms per bring-up`,
      );
      bench.log(`[bench-${n}] done; removing its pods, namespace and node`);
      await bench.dropEnv(env);
    }
    console.log('');
    for (const l of machineLines(g, bench)) console.log(l);
    console.log(
      `settings: zero simulated VM latency, VK_KUBE_QPS=${process.env.VK_KUBE_QPS ?? `${DEFAULT_KUBE_QPS} (default)`}, ` +
        `VK_KUBE_BURST=${process.env.VK_KUBE_BURST ?? `${DEFAULT_KUBE_BURST} (default)`}`,
    );
    console.log('');
    console.log(table(results));
  });
}

/**
 * The two figures of a size (bench/lib/charts.ts) in `dir`: created → PodReady of its pods, and
 * the daemon's RSS and CPU over the window with the count of pods Ready (PodReady).
 */
function figures(bench: Bench, dir: string, r: BringUpResult, tracker: PodTracker, windowEnd: number): void {
  const t0 = windowEnd - r.windowMs;
  // The tracker watched only this size's namespace: its pods are the burst's.
  const readyAt = [...tracker.pods.values()].flatMap((v) =>
    v.podReadyAt === undefined ? [] : [v.podReadyAt - t0],
  );
  const ready = join(dir, `clones-${r.pods}-ready.svg`);
  const burst = join(dir, `clones-${r.pods}-burst.svg`);
  try {
    writeFigure(
      ready,
      readyLatencySvg(r.createdToPodReady, { title: `${r.pods} clone pods at once: created → Ready` }),
    );
    writeFigure(burst, burstSvg(r.series, { title: `${r.pods} clone pods at once: the daemon`, readyAt }));
    bench.log(`[bench-${r.pods}] figures: ${ready}, ${burst}`);
  } catch (err) {
    // The measurement stands without its figures: the table still comes at the end.
    bench.log(`[bench-${r.pods}] no figures: ${(err as Error).message}`);
  }
}

/**
 * The Go daemon's peak RSS (MB) in the same bench (clone pods at once, same simulator and
 * apiserver, each daemon at its defaults), as published by the Go daemon's maintainers with the
 * memory goal (docs/benchmark-history.md "Memory against the Go daemon"); the sizes it was
 * measured at.
 */
export const GO_PEAK_RSS_MB: Readonly<Record<number, number>> = { 100: 76, 300: 91, 1000: 150 };

function table(rs: BringUpResult[]): string {
  const ms = (v: number) => (Number.isFinite(v) ? `${Math.round(v)} ms` : '–');
  const per = (r: BringUpResult, v: number) => fmtN(v / r.pods, 2);
  const row = (label: string, cell: (r: BringUpResult) => string) => [label, ...rs.map(cell)];
  const verbs = [...new Set(rs.flatMap((r) => Object.keys(r.calls)))].sort();
  const other = [...new Set(rs.flatMap((r) => Object.keys(r.writes.byKind)))]
    .filter((k) => !(MAIN_KINDS as readonly string[]).includes(k))
    .sort();
  const rows = [
    row('wall time to all ready', (r) => fmtS(r.wallMs)),
    row('pod bound → lifecycle ready p50 / p99 / max', (r) =>
      [pct(r.boundToReady, 50), pct(r.boundToReady, 99), max(r.boundToReady)].map(ms).join(' / '),
    ),
    row(
      'lease written → ready p50 / p99',
      (r) =>
        `${ms(pct(r.leaseToReady, 50))} / ${ms(pct(r.leaseToReady, 99))}` +
        (r.leasesSeen < r.pods ? ` (${r.leasesSeen} leases seen)` : ''),
    ),
    row(
      'pod created → PodReady p50 / p99',
      (r) => `${ms(pct(r.createdToPodReady, 50))} / ${ms(pct(r.createdToPodReady, 99))}`,
    ),
    row('p50 (bound → ready) / wall', (r) => fmtN(pct(r.boundToReady, 50) / r.wallMs, 2)),
    row('**daemon CPU ms per bring-up**', (r) => `**${fmtN(r.cpuMs / r.pods, 1)}**`),
    row('simulator CPU ms per bring-up (cocoon clients + sim server)', (r) =>
      fmtN((r.childCpuMs + r.simServerCpuMs) / r.pods, 1),
    ),
    row('**API writes per bring-up**', (r) => `**${per(r, r.writes.total)}**`),
    ...MAIN_KINDS.map((k) => row(`· ${k}`, (r) => per(r, r.writes.byKind[k] ?? 0))),
    row(`· other${other.length ? ` (${other.join(', ')})` : ''}`, (r) => per(r, otherWrites(r.writes))),
    row('· failed (≥ 400)', (r) => per(r, r.writes.failed)),
    row('**cocoon calls per bring-up**', (r) => `**${per(r, sumCounts(r.calls))}**`),
    ...verbs.map((v) => row(`· ${v}`, (r) => per(r, r.calls[v] ?? 0))),
    row('daemon RSS before the burst (started, node idle)', (r) => fmtMiB(r.idleRssKiB)),
    row('daemon peak RSS (100 ms samples) / VmHWM', (r) => `${fmtMiB(r.peakRssKiB)} / ${fmtMiB(r.hwmKiB)}`),
    row(
      'daemon RSS anonymous / file-backed, before the burst → at the peak',
      (r) =>
        `${fmtMiB(r.idleAnonKiB)} / ${fmtMiB(r.idleFileKiB)} → ${fmtMiB(r.peakAnonKiB)} / ${fmtMiB(r.peakFileKiB)}`,
    ),
    row('**Go daemon peak RSS, published** (same bench)', (r) => {
      const go = GO_PEAK_RSS_MB[r.pods];
      return go === undefined
        ? '– (measured at 100, 300, 1000)'
        : `**${go} MB** (ours ÷ Go ${fmtN(r.peakRssKiB / 1024 / go, 2)})`;
    }),
    row('measured window (to writes quiet)', (r) => fmtS(r.windowMs)),
  ];
  return markdownTable(['per run', ...rs.map((r) => `${r.pods} pods`)], rows);
}
