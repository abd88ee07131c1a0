// Benchmark (a script, not a test): a fleet of vk-cocoon hosts (ground/fleet.ts) on one control
// plane with the audit log, each host bound its own burst of clone pods, all created at once.
// Usage:
//   node bench/fleet.ts              # 3 hosts × 200 pods (VK_BENCH_HOSTS, VK_BENCH_PODS_PER_HOST)
//   node bench/fleet.ts 3 200        # hosts, pods per host
//   node bench/fleet.ts soak [3 200] # faults, a host killed for good mid-run (bench/lib/fleet-soak.ts)
// Per host and overall: created → ready p50/p99, the daemon's CPU (total and per bring-up),
// its peak RSS, and its apiserver writes per bring-up (the audit log's lines whose user is the
// host's node identity system:node:<name>). Machine lines first, then one markdown table.
// However it ends (done, an error, SIGINT/SIGTERM, a crash) every process it started is stopped:
// the fleet here (stopFleet), the ground by Bench's teardown, the rest by the PID registry.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_KUBE_BURST, DEFAULT_KUBE_QPS } from '../src/kube/client.ts';
import {
  countWrites,
  isDaemonUser,
  MAIN_KINDS,
  otherWrites,
  selectWrites,
  type WriteCount,
} from './lib/audit.ts';
import { waitQuiet } from './lib/bringup.ts';
import { countCalls, sumCounts } from './lib/calls.ts';
import {
  type ApiPodTimes,
  apiReadyTimes,
  auditPodTimes,
  type BenchFleet,
  boundAt,
  createFleetPods,
  fleetPods,
  HostMeter,
  hostUser,
  printLogDigests,
  startBenchFleet,
} from './lib/fleet.ts';
import { Bench, benchArgs, envInt, machineLines, releaseWanted } from './lib/harness.ts';
import { fmtMiB, fmtN, fmtS, markdownTable, max, pct } from './lib/stats.ts';
import { PodTracker, type PodView, settledReady } from './lib/watchers.ts';

const USAGE = 'usage: node bench/fleet.ts [soak] [hosts [pods-per-host]]';

function sizes(args: string[]): { hosts: number; perHost: number } {
  const nums = args.map(Number);
  if (args.length > 2 || nums.some((n) => !Number.isInteger(n) || n <= 0))
    throw new Error(`${USAGE} (got ${args.join(' ')})`);
  return {
    hosts: nums[0] ?? envInt('VK_BENCH_HOSTS', 3),
    perHost: nums[1] ?? envInt('VK_BENCH_PODS_PER_HOST', 200),
  };
}

const args = benchArgs();
// ground/fleet.ts starts the checkout's bin/vk-cocoon (FleetOptions has no daemon `bin`).
if (releaseWanted())
  throw new Error('bench/fleet.ts runs the checkout only (startFleet takes no release build)');
if (args[0] === 'soak') {
  const { soak } = await import('./lib/fleet-soak.ts');
  soak(sizes(args.slice(1)));
} else {
  burst(sizes(args));
}

interface HostResult {
  label: string;
  pods: number;
  /** t0 → the host's last ready write answered (the apiserver's clock), ms. */
  wallMs: number;
  /** Create answered → the ready write answered, by the audit log (the apiserver's clock). */
  apiCreatedToReady: number[];
  /** The bench watch's lag: ready seen − the ready write answered. */
  watchLag: number[];
  createdToReady: number[];
  createdToLifecycle: number[];
  createdToPodReady: number[];
  cpuMs: number;
  simCpuMs: number;
  idleRssKiB: number;
  peakRssKiB: number;
  hwmKiB: number;
  writes: WriteCount;
  calls: Record<string, number>;
}

function burst({ hosts, perHost }: { hosts: number; perHost: number }): void {
  const total = hosts * perHost;
  const bench = new Bench('fleet');
  bench.run(async () => {
    bench.log(`load average (1 min) at the start: ${bench.loadAtStart.toFixed(1)}`);
    const g = await bench.startGround();
    const audit = bench.audit;
    if (!audit) throw new Error('the bench has no audit log');
    bench.log(`starting ${hosts} hosts for ${perHost} pods each`);
    const bf = await startBenchFleet(bench, g, { hosts, capacity: perHost });
    let tracker: PodTracker | undefined;
    try {
      tracker = new PodTracker(bf.kc, bf.core, bf.ns);
      await tracker.start();
      const pods = fleetPods(bf.hosts, perHost);
      const byHost = new Map(
        bf.hosts.map((h) => [h.name, pods.filter((p) => p.node === h.name).map((p) => p.name)]),
      );
      const meters = bf.hosts.map((h) => new HostMeter(h));
      const t0 = Date.now();
      audit.poll();
      const progress = setInterval(() => {
        const t = tracker as PodTracker;
        const per = bf.hosts.map((h, i) => {
          const names = byHost.get(h.name) ?? [];
          const m = meters[i] as HostMeter;
          return (
            `${h.name} ${countReady(t, names)}/${names.length} ready, ` +
            `${Math.round(m.rss.lastKiB / 1024)} MiB, CPU ${fmtN(m.cpuPctSinceLast(), 0)}%`
          );
        });
        bench.log(
          `${Math.round((Date.now() - t0) / 1000)} s: created ${t.count((v) => v.createdAt !== undefined)}/${total}; ` +
            per.join('; '),
        );
      }, 10_000);
      try {
        bench.log(`creating ${total} pods (${perHost} bound to each of ${hosts} hosts)`);
        await createFleetPods(bf, tracker, pods);
        bench.log(`created ${total} pods in ${fmtS(Date.now() - t0)}; waiting for ready`);
        await waitAllReady(bench, bf, tracker, byHost, t0);
      } finally {
        clearInterval(progress);
      }
      const wallMs = Date.now() - t0;
      bench.log(`all ${total} ready after ${fmtS(wallMs)}; waiting for the daemons' pod writes to stop`);
      await waitQuiet(audit, t0);
      const t1 = Date.now();
      for (const m of meters) m.finish();
      await new Promise((r) => setTimeout(r, 300));
      audit.poll();
      const apiTimes = auditPodTimes(audit.path, bf.ns);
      const results = bf.hosts.map((h, i): HostResult => {
        const m = meters[i] as HostMeter;
        const names = byHost.get(h.name) ?? [];
        return {
          label: h.name,
          pods: names.length,
          ...latencies(tracker as PodTracker, names, apiTimes, t0),
          cpuMs: m.cpuMs,
          simCpuMs: m.childCpuMs + m.simServerCpuMs,
          idleRssKiB: m.idleRssKiB,
          peakRssKiB: m.rss.maxKiB,
          hwmKiB: m.hwmKiB,
          writes: countWrites(selectWrites(audit.writes, { user: hostUser(h), from: t0, to: t1 })),
          calls: countCalls(h.simulator.calls(), t0, t1),
        };
      });
      const allWrites = countWrites(selectWrites(audit.writes, { user: isDaemonUser, from: t0, to: t1 }));
      // Each pod's times, for a look at a run kept with VK_BENCH_KEEP=1.
      writeFileSync(
        join(bench.dir, 'fleet-pods.json'),
        JSON.stringify({
          t0,
          t1,
          watchRestarts: tracker.restarts,
          pods: pods.map((p) => ({ ...p, ...tracker?.view(p.name) })),
        }),
      );
      for (const r of results)
        bench.log(
          `[${r.label}] ${r.pods} ready in ${fmtS(r.wallMs)}, created → ready p50 ${pct(r.apiCreatedToReady, 50)} ms, ` +
            `p99 ${pct(r.apiCreatedToReady, 99)} ms (apiserver clock); CPU ${fmtN(r.cpuMs / r.pods, 1)} ms per bring-up; ` +
            `peak RSS ${fmtMiB(r.peakRssKiB)}; writes ${fmtN(r.writes.total / r.pods, 2)} per bring-up`,
        );
      printLogDigests(bench, bf.hosts);
      console.log('');
      for (const l of machineLines(g, bench)) console.log(l);
      console.log(
        `settings: ${hosts} hosts × ${perHost} clone pods, all created at once (≤ 50 creates in flight); ` +
          `zero simulated VM latency, VK_KUBE_QPS=${process.env.VK_KUBE_QPS ?? `${DEFAULT_KUBE_QPS} (default)`}, ` +
          `VK_KUBE_BURST=${process.env.VK_KUBE_BURST ?? `${DEFAULT_KUBE_BURST} (default)`} per host`,
      );
      console.log(`wall time to all ${total} ready: ${fmtS(wallMs)}; measured window ${fmtS(t1 - t0)}`);
      console.log('');
      console.log(table(results, wallMs, allWrites));
    } finally {
      tracker?.stop();
      await bf.stop();
    }
  });
}

function countReady(t: PodTracker, names: readonly string[]): number {
  let n = 0;
  for (const nm of names) {
    const v = t.pods.get(nm);
    if (v && settledReady(v)) n++;
  }
  return n;
}

/** Waits until every pod is ready (lifecycle and PodReady); throws on a failed pod, a daemon
 * that exited or the timeout. */
async function waitAllReady(
  bench: Bench,
  bf: BenchFleet,
  tracker: PodTracker,
  byHost: Map<string, string[]>,
  t0: number,
): Promise<void> {
  const total = [...byHost.values()].reduce((a, n) => a + n.length, 0);
  const timeoutMs = (Number(process.env.VK_BENCH_TIMEOUT_S) || 600 + 2 * total) * 1000;
  let lastList = Date.now();
  for (;;) {
    bench.check();
    let ready = 0;
    for (const h of bf.hosts) {
      const d = h.daemon.child;
      if (d.exitCode !== null || d.signalCode !== null)
        throw new Error(`vk-cocoon of ${h.name} exited; see ${h.logFile}`);
      const names = byHost.get(h.name) ?? [];
      const n = countReady(tracker, names);
      ready += n;
      const failed = names.filter((nm) => {
        const v = tracker.pods.get(nm);
        return v?.lifecycle === 'failed' || v?.phase === 'Failed';
      });
      if (failed.length > 0) {
        const v = tracker.pods.get(failed[0] as string);
        throw new Error(
          `${failed.length} pod(s) of ${h.name} failed, e.g. ${failed[0]}: ${v?.message || v?.reason || ''}`,
        );
      }
    }
    if (ready === total) return;
    if (Date.now() - t0 > timeoutMs)
      throw new Error(`timed out after ${timeoutMs / 1000} s: ${ready}/${total} ready`);
    if (Date.now() - lastList > 5000) {
      await tracker.relist().catch(() => {});
      lastList = Date.now();
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

function latencies(
  t: PodTracker,
  names: readonly string[],
  api: Map<string, ApiPodTimes>,
  t0: number,
): Pick<
  HostResult,
  'wallMs' | 'apiCreatedToReady' | 'watchLag' | 'createdToReady' | 'createdToLifecycle' | 'createdToPodReady'
> {
  let last = Number.NaN;
  const apiCreatedToReady: number[] = [];
  const watchLag: number[] = [];
  const createdToReady: number[] = [];
  const createdToLifecycle: number[] = [];
  const createdToPodReady: number[] = [];
  for (const nm of names) {
    const v: PodView = t.view(nm);
    const a = apiReadyTimes(v, api.get(nm));
    if (a) {
      apiCreatedToReady.push(a.latency);
      watchLag.push(a.lag);
      if (!(a.readyAt <= last)) last = a.readyAt;
    }
    const b = boundAt(v);
    if (b === undefined) continue;
    if (v.readyAt !== undefined) createdToLifecycle.push(v.readyAt - b);
    if (v.podReadyAt !== undefined) createdToPodReady.push(v.podReadyAt - b);
    if (v.readyAt !== undefined && v.podReadyAt !== undefined)
      createdToReady.push(Math.max(v.readyAt, v.podReadyAt) - b);
  }
  return {
    wallMs: last - t0,
    apiCreatedToReady,
    watchLag,
    createdToReady,
    createdToLifecycle,
    createdToPodReady,
  };
}

function table(rs: HostResult[], wallMs: number, allWrites: WriteCount): string {
  const ms = (v: number) => (Number.isFinite(v) ? `${Math.round(v)} ms` : '–');
  const all = (f: (r: HostResult) => number[]) => rs.flatMap(f);
  const sum = (f: (r: HostResult) => number) => rs.reduce((a, r) => a + f(r), 0);
  const pods = sum((r) => r.pods);
  const p5099 = (v: number[]) => `${ms(pct(v, 50))} / ${ms(pct(v, 99))}`;
  const writesPer = (w: WriteCount, n: number, kind?: string) =>
    fmtN((kind === undefined ? w.total : kind === 'other' ? otherWrites(w) : (w.byKind[kind] ?? 0)) / n, 2);
  const verbs = [...new Set(rs.flatMap((r) => Object.keys(r.calls)))].sort();
  const allCalls: Record<string, number> = {};
  for (const r of rs) for (const [k, v] of Object.entries(r.calls)) allCalls[k] = (allCalls[k] ?? 0) + v;
  const row = (label: string, cell: (r: HostResult) => string, overall: string) => [
    label,
    ...rs.map(cell),
    overall,
  ];
  const rows = [
    row('pods', (r) => String(r.pods), String(pods)),
    row(
      't0 → last ready write answered (bench: all seen ready)',
      (r) => fmtS(r.wallMs),
      `${fmtS(Math.max(...rs.map((r) => r.wallMs)))} (${fmtS(wallMs)})`,
    ),
    row(
      '**created → ready p50 / p99** (apiserver clock: create answered → ready write answered)',
      (r) => `**${p5099(r.apiCreatedToReady)}**`,
      `**${p5099(all((r) => r.apiCreatedToReady))}**`,
    ),
    row(
      'created → ready max (apiserver clock)',
      (r) => ms(max(r.apiCreatedToReady)),
      ms(max(all((r) => r.apiCreatedToReady))),
    ),
    row(
      'created → ready p50 / p99, bench watch (lifecycle ready and PodReady seen)',
      (r) => p5099(r.createdToReady),
      p5099(all((r) => r.createdToReady)),
    ),
    row(
      '· created → lifecycle ready p50 / p99',
      (r) => p5099(r.createdToLifecycle),
      p5099(all((r) => r.createdToLifecycle)),
    ),
    row(
      '· created → PodReady p50 / p99',
      (r) => p5099(r.createdToPodReady),
      p5099(all((r) => r.createdToPodReady)),
    ),
    row(
      'bench watch lag behind the ready write p50 / p99',
      (r) => p5099(r.watchLag),
      p5099(all((r) => r.watchLag)),
    ),
    row(
      'daemon CPU ms, window total',
      (r) => fmtN(r.cpuMs, 0),
      fmtN(
        sum((r) => r.cpuMs),
        0,
      ),
    ),
    row(
      '**daemon CPU ms per bring-up**',
      (r) => `**${fmtN(r.cpuMs / r.pods, 1)}**`,
      `**${fmtN(sum((r) => r.cpuMs) / pods, 1)}**`,
    ),
    row(
      'simulator CPU ms per bring-up (cocoon clients + sim server)',
      (r) => fmtN(r.simCpuMs / r.pods, 1),
      fmtN(sum((r) => r.simCpuMs) / pods, 1),
    ),
    row(
      'daemon RSS before the burst',
      (r) => fmtMiB(r.idleRssKiB),
      `max ${fmtMiB(Math.max(...rs.map((r) => r.idleRssKiB)))}`,
    ),
    row(
      '**daemon peak RSS** (100 ms samples) / VmHWM',
      (r) => `**${fmtMiB(r.peakRssKiB)}** / ${fmtMiB(r.hwmKiB)}`,
      `max **${fmtMiB(Math.max(...rs.map((r) => r.peakRssKiB)))}** / ${fmtMiB(Math.max(...rs.map((r) => r.hwmKiB)))}`,
    ),
    row(
      '**API writes per bring-up** (system:node:<host>)',
      (r) => `**${writesPer(r.writes, r.pods)}**`,
      `**${writesPer(allWrites, pods)}**`,
    ),
    ...[...MAIN_KINDS, 'other'].map((k) =>
      row(`· ${k}`, (r) => writesPer(r.writes, r.pods, k), writesPer(allWrites, pods, k)),
    ),
    row('· failed (≥ 400)', (r) => fmtN(r.writes.failed / r.pods, 2), fmtN(allWrites.failed / pods, 2)),
    row(
      'cocoon calls per bring-up',
      (r) => fmtN(sumCounts(r.calls) / r.pods, 2),
      fmtN(sumCounts(allCalls) / pods, 2),
    ),
    ...verbs.map((v) =>
      row(`· ${v}`, (r) => fmtN((r.calls[v] ?? 0) / r.pods, 2), fmtN((allCalls[v] ?? 0) / pods, 2)),
    ),
  ];
  return markdownTable(['fleet burst', ...rs.map((r) => r.label), 'all hosts'], rows);
}
