// Benchmark: restart at scale. Brings up N ready pods (VK_BENCH_PODS, default 256), SIGKILLs
// the daemon, starts it again on the same node, simulator root and lease file, and measures
// the time until every pod is re-adopted and consistent, and the writes the recovery made.
//   npm run bench:restart        (or npm run bench -- restart)
//   VK_BENCH_PODS=30 VK_BENCH_SETTLE_S=5 node bench/restart.ts
// Consistent: the new daemon serves /healthz (it does so only after its startup reconcile,
// which adopts every VM, its pod controller's start and the node registration) AND every pod
// still has lifecycle-state=ready, the Ready condition True and the same VM id as before the
// kill. The consistent time is the later of /healthz and the last change of any pod after the
// kill (a pod the daemon rewrote is consistent from its last write on); the observation goes on
// for VK_BENCH_SETTLE_S (default 10) after that, so a late write still counts.
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { countWrites, isDaemonUser, MAIN_KINDS, otherWrites, selectWrites } from './lib/audit.ts';
import { bringUp, bringUpLine, POD_WRITE_KINDS, waitQuiet } from './lib/bringup.ts';
import { countCalls, sumCounts } from './lib/calls.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes, memOf, RssSampler } from './lib/procfs.ts';
import { fmtCounts, fmtMiB, markdownTable } from './lib/stats.ts';
import { settledReady } from './lib/watchers.ts';

const N = envInt('VK_BENCH_PODS', 256);
const SETTLE_MS = envInt('VK_BENCH_SETTLE_S', 10) * 1000;
const TIMEOUT_MS = envInt('VK_BENCH_RESTART_TIMEOUT_S', 300) * 1000;
const TARGET_MS = 5000;

/** `time` (epoch ms) of the first daemon log line with message `msg` at or after `since`. */
function logTime(file: string, msg: string, since: number): number | undefined {
  let text = '';
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    if (!line.includes(msg)) continue;
    try {
      const rec = JSON.parse(line) as { msg?: string; time?: string | number };
      const t = typeof rec.time === 'number' ? rec.time : Date.parse(rec.time ?? '');
      if (rec.msg === msg && t >= since) return t;
    } catch {
      // not a JSON line
    }
  }
  return undefined;
}

const bench = new Bench('bench-restart');
bench.run(async () => {
  const g = await bench.startGround();
  const audit = bench.audit as NonNullable<typeof bench.audit>;
  const env = await bench.newEnv('restart', { pods: N });
  const { result, tracker, windowEnd } = await bringUp(bench, env, N, { prefix: 'r' });
  bench.log(bringUpLine(result));
  await waitQuiet(audit, windowEnd, { quietMs: 3000, capMs: 60_000 });
  await tracker.relist();
  const before = new Map(
    [...tracker.pods.values()].map((v) => [v.name, { vmId: v.vmId, rv: v.resourceVersion }]),
  );
  const notReady = [...tracker.pods.values()].filter((v) => !settledReady(v)).map((v) => v.name);
  if (notReady.length > 0) throw new Error(`before the kill, not ready: ${notReady.slice(0, 5).join(', ')}`);

  bench.log(`SIGKILL vk-cocoon (pid ${env.daemon.pid}) with ${N} ready pods`);
  const tKill = Date.now();
  await bench.killDaemon(env);
  const tSpawn = Date.now();
  const daemon = await bench.startDaemonAgain(env);
  const tHealthz = Date.now();
  bench.log(`new vk-cocoon (pid ${daemon.pid}) serves /healthz after ${tHealthz - tSpawn} ms`);
  const rss = new RssSampler(daemon.pid);

  const consistent = (v: { name: string; vmId: string; lifecycle: string; podReady: boolean }) =>
    settledReady(v as Parameters<typeof settledReady>[0]) && v.vmId === before.get(v.name)?.vmId;
  const allConsistent = () => [...before.keys()].every((name) => consistent(tracker.view(name)));
  const deadline = tSpawn + TIMEOUT_MS;
  let settleUntil: number | undefined;
  let lastList = 0;
  let lastProgress = Date.now();
  for (;;) {
    bench.check();
    if (daemon.child.exitCode !== null || daemon.child.signalCode !== null)
      throw new Error(`vk-cocoon exited; see ${env.daemonOpts.logFile}`);
    if (Date.now() - lastList > 2000) {
      await tracker.relist().catch(() => {});
      lastList = Date.now();
    }
    const ok = allConsistent();
    if (ok) settleUntil ??= Date.now() + SETTLE_MS;
    else settleUntil = undefined;
    if (ok && settleUntil !== undefined && Date.now() >= settleUntil) break;
    if (Date.now() > deadline)
      throw new Error(
        `timed out after ${TIMEOUT_MS / 1000} s: ${[...before.keys()].filter((n) => consistent(tracker.view(n))).length}/${N} consistent`,
      );
    if (Date.now() - lastProgress >= 10_000) {
      lastProgress = Date.now();
      bench.log(
        `${Math.round((Date.now() - tSpawn) / 1000)} s after the restart: ` +
          `${[...before.keys()].filter((n) => consistent(tracker.view(n))).length}/${N} consistent`,
      );
    }
    await sleep(100);
  }
  const tEnd = Date.now();
  const cpu = cpuTimes(daemon.pid);
  const { hwmKiB } = memOf(daemon.pid);
  rss.stop();
  tracker.stop();
  await sleep(300);
  audit.poll();

  const lastChange = Math.max(
    0,
    ...[...tracker.pods.values()].map((v) =>
      v.modifiedAt !== undefined && v.modifiedAt > tKill ? v.modifiedAt : 0,
    ),
  );
  const consistentAt = Math.max(tHealthz, lastChange);
  const changed = [...before]
    .filter(([name, b]) => tracker.view(name).resourceVersion !== b.rv)
    .map(([n]) => n);
  const writes = selectWrites(audit.writes, { user: isDaemonUser, from: tKill, to: tEnd });
  const wc = countWrites(writes);
  const podWrites = countWrites(writes.filter((w) => POD_WRITE_KINDS.includes(w.kind)));
  const calls = countCalls(env.sim.calls(), tKill, tEnd);
  const started = logTime(env.daemonOpts.logFile, 'starting vk-cocoon', tSpawn);
  const listening = logTime(env.daemonOpts.logFile, 'kubelet API listening; node ready', tSpawn);

  console.log('');
  for (const l of machineLines(g, bench)) console.log(l);
  console.log(`bring-up before the kill: ${bringUpLine(result)}`);
  console.log('');
  const s = (ms: number | undefined) => (ms === undefined ? '–' : `${(ms / 1000).toFixed(2)} s`);
  const rows: string[][] = [
    ['pods (ready before the kill)', String(N)],
    [
      '**restart → consistent** (target ≤ 5 s)',
      `**${s(consistentAt - tSpawn)}**${consistentAt - tSpawn > TARGET_MS ? ' (over)' : ''}`,
    ],
    ['restart → /healthz (startup done)', s(tHealthz - tSpawn)],
    [
      '· restart → "starting vk-cocoon" (process start)',
      s(started === undefined ? undefined : started - tSpawn),
    ],
    [
      '· "starting" → "node ready" (reconcile, pod list, node)',
      s(started && listening ? listening - started : undefined),
    ],
    ['SIGKILL → process gone', s(tSpawn - tKill)],
    [
      'pods changed (resourceVersion) / VM id changed',
      `${changed.length} / ${[...before].filter(([n, b]) => tracker.view(n).vmId !== b.vmId).length}`,
    ],
    ['**daemon writes during recovery** (target: 0 to pods)', `**${wc.total}**`],
    ...MAIN_KINDS.map((k) => [`· ${k}`, String(wc.byKind[k] ?? 0)]),
    ['· other', String(otherWrites(wc))],
    ['· pods written', String(wc.podsWritten)],
    ['cocoon calls during recovery', `${sumCounts(calls)} (${fmtCounts(calls)})`],
    ['new daemon CPU (whole life, to the end of the window)', `${Math.round(cpu.selfMs)} ms`],
    ['new daemon VmHWM / peak RSS (100 ms samples)', `${fmtMiB(hwmKiB)} / ${fmtMiB(rss.maxKiB)}`],
    ['observed window after the kill', s(tEnd - tKill)],
  ];
  console.log(markdownTable(['restart at scale', 'value'], rows));
  if (podWrites.total > 0) {
    console.log('');
    console.log(
      `writes to pods and events during recovery, by kind and verb: ${fmtCounts(podWrites.byKindVerb)}`,
    );
  }
});
