// Benchmark: steady state. Brings up N ready pods (VK_BENCH_PODS, default 256), waits until the
// daemon's pod writes have stopped, then samples the daemon over a window in which nothing
// happens (VK_BENCH_STEADY_S, default 300): mean CPU % of one core (utime+stime delta), max RSS
// (VmRSS every 100 ms, VmHWM), its API writes by kind (audit log) and its `cocoon` calls by
// verb (the simulator's record).
//   npm run bench:steady         (or npm run bench -- steady)
//   VK_BENCH_PODS=30 VK_BENCH_STEADY_S=20 node bench/steady.ts
import { setTimeout as sleep } from 'node:timers/promises';
import { countWrites, isDaemonUser, MAIN_KINDS, otherWrites, selectWrites } from './lib/audit.ts';
import { bringUp, bringUpLine, waitQuiet } from './lib/bringup.ts';
import { countCalls, sumCounts } from './lib/calls.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes, memOf, RssSampler } from './lib/procfs.ts';
import { fmtCounts, fmtMiB, markdownTable } from './lib/stats.ts';
import { settledReady } from './lib/watchers.ts';

const N = envInt('VK_BENCH_PODS', 256);
const WINDOW_MS = envInt('VK_BENCH_STEADY_S', 300) * 1000;

const bench = new Bench('bench-steady');
bench.run(async () => {
  const g = await bench.startGround();
  const audit = bench.audit as NonNullable<typeof bench.audit>;
  const env = await bench.newEnv('steady', { pods: N });
  const { result, tracker, windowEnd } = await bringUp(bench, env, N, { prefix: 's' });
  bench.log(bringUpLine(result));
  await waitQuiet(audit, windowEnd, { quietMs: 5000, capMs: 120_000 });

  const pid = env.daemon.pid;
  const rss = new RssSampler(pid);
  const cpu0 = cpuTimes(pid);
  const t0 = Date.now();
  bench.log(`sampling the idle daemon for ${WINDOW_MS / 1000} s`);
  let lastCpu = cpu0.selfMs;
  let lastAt = t0;
  while (Date.now() - t0 < WINDOW_MS) {
    bench.check();
    if (env.daemon.child.exitCode !== null || env.daemon.child.signalCode !== null)
      throw new Error(`vk-cocoon exited; see ${env.daemonOpts.logFile}`);
    await sleep(Math.min(10_000, Math.max(0, WINDOW_MS - (Date.now() - t0))));
    const now = Date.now();
    const cpu = cpuTimes(pid).selfMs;
    const w = audit.count({ user: isDaemonUser, from: t0, to: now });
    bench.log(
      `${Math.round((now - t0) / 1000)} s: CPU ${(((cpu - lastCpu) / (now - lastAt)) * 100).toFixed(1)}% of a core, ` +
        `RSS ${Math.round(rss.lastKiB / 1024)} MiB, writes so far ${w.total}`,
    );
    lastCpu = cpu;
    lastAt = now;
  }
  const t1 = Date.now();
  const cpu1 = cpuTimes(pid);
  const { hwmKiB } = memOf(pid);
  rss.stop();
  await tracker.relist();
  tracker.stop();
  await sleep(300);
  audit.poll();
  const wc = countWrites(selectWrites(audit.writes, { user: isDaemonUser, from: t0, to: t1 }));
  const calls = countCalls(env.sim.calls(), t0, t1);
  const windowS = (t1 - t0) / 1000;
  const stillReady = [...tracker.pods.values()].filter(settledReady).length;
  const perMin = (n: number) => `${n} (${((n / windowS) * 60).toFixed(1)}/min)`;

  console.log('');
  for (const l of machineLines(g, bench)) console.log(l);
  console.log(`bring-up before the window: ${bringUpLine(result)}`);
  console.log('');
  const rows: string[][] = [
    ['pods (ready, idle)', `${N} (${stillReady} still ready at the end)`],
    ['window', `${windowS.toFixed(0)} s`],
    [
      '**daemon CPU, mean % of one core**',
      `**${(((cpu1.selfMs - cpu0.selfMs) / (t1 - t0)) * 100).toFixed(2)}%**`,
    ],
    [
      'cocoon calls CPU, mean % of one core (children)',
      `${(((cpu1.childrenMs - cpu0.childrenMs) / (t1 - t0)) * 100).toFixed(2)}%`,
    ],
    [
      '**daemon max RSS** (100 ms samples) / VmHWM (since start)',
      `**${fmtMiB(rss.maxKiB)}** / ${fmtMiB(hwmKiB)}`,
    ],
    ['**daemon writes in the window**', `**${perMin(wc.total)}**`],
    ...MAIN_KINDS.map((k) => [`· ${k}`, perMin(wc.byKind[k] ?? 0)]),
    ['· other', perMin(otherWrites(wc))],
    ['cocoon calls in the window', `${perMin(sumCounts(calls))}: ${fmtCounts(calls)}`],
  ];
  console.log(markdownTable(['steady state', 'value'], rows));
  if (wc.total > 0) console.log(`\nwrites by kind and verb: ${fmtCounts(wc.byKindVerb)}`);
});
