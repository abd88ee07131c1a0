// One burst of N concurrent clone bring-ups on a daemon environment, measured from outside the
// daemon: its CPU time and memory from /proc, its API writes from the apiserver's audit log,
// its `cocoon` calls from the simulator's record, and the times from a pod watch and the
// lease file.
import { setTimeout as sleep } from 'node:timers/promises';
import { vmPod } from '../../ground/kube.ts';
import {
  type AuditTail,
  type AuditWrite,
  countWrites,
  isDaemonUser,
  selectWrites,
  type WriteCount,
} from './audit.ts';
import { countCalls } from './calls.ts';
import type { BurstSample } from './charts.ts';
import type { Bench, DaemonEnv } from './harness.ts';
import { cpuTimes, memOf, RssSampler } from './procfs.ts';
import { max, pct } from './stats.ts';
import { LeaseWatcher, PodTracker, settledReady } from './watchers.ts';

export interface BringUpResult {
  pods: number;
  /** t0 (first create sent) → every pod ready (lifecycle and Ready condition), ms. */
  wallMs: number;
  /** The measured window: t0 → all ready and the daemon's pod writes quiet, ms. */
  windowMs: number;
  boundToReady: number[];
  leaseToReady: number[];
  createdToPodReady: number[];
  /** Daemon utime+stime over the window, ms. */
  cpuMs: number;
  /** cutime+cstime over the window (the `cocoon` invocations it waited for), ms. */
  childCpuMs: number;
  /** The simulator server's own CPU over the window (the work of the `cocoon` calls runs
   * there; the thin clients are the children above), ms; 0 without a server. */
  simServerCpuMs: number;
  writes: WriteCount;
  calls: Record<string, number>;
  /** Max of the 100 ms VmRSS samples over the window, KiB. */
  peakRssKiB: number;
  /** VmHWM at the end of the window (the process's peak since it started), KiB. */
  hwmKiB: number;
  /** VmRSS just before the first create (the started daemon with its node idle), KiB. */
  idleRssKiB: number;
  /** Anonymous and file-backed RSS (KiB) before the first create and at the peak sample. */
  idleAnonKiB: number;
  idleFileKiB: number;
  peakAnonKiB: number;
  peakFileKiB: number;
  /** Pods of the burst whose lease was seen (lease → ready is over these). */
  leasesSeen: number;
  watchRestarts: number;
  /** The daemon every 500 ms from t0 to the end of the window (the burst figure of
   * bench/lib/charts.ts): ms since t0, VmRSS (KiB) and its CPU over the interval before the
   * sample, % of one core. */
  series: BurstSample[];
}

/** Daemon writes to pods and events: what a bring-up or a recovery makes (not the node's
 * periodic Lease and status). */
export const POD_WRITE_KINDS = ['pods', 'pods/status', 'events'];

/**
 * Resolves once the daemon made no pod or event write for `quietMs` (by the audit log), or
 * after `capMs`. Returns when the last such write was received (or `since` if none).
 */
export async function waitQuiet(
  audit: AuditTail,
  since: number,
  opts: { quietMs?: number; capMs?: number } = {},
): Promise<number> {
  const quietMs = opts.quietMs ?? 2000;
  const until = Date.now() + (opts.capMs ?? 30_000);
  for (;;) {
    const last = audit.lastAt({ user: isDaemonUser, from: since }, POD_WRITE_KINDS) ?? since;
    if (Date.now() - last >= quietMs || Date.now() >= until) return last;
    await sleep(250);
  }
}

function ready(tracker: PodTracker, names: readonly string[]): number {
  let n = 0;
  for (const name of names) {
    const v = tracker.pods.get(name);
    if (v && settledReady(v)) n++;
  }
  return n;
}

/**
 * Runs `create` for every item, at most `concurrency` at once, retrying an answer of 429 or 5xx
 * up to 5 attempts (200 ms × attempt apart); `created(item)` after each success.
 */
export async function createEach<T>(
  items: readonly T[],
  create: (item: T) => Promise<unknown>,
  created: (item: T) => void,
  concurrency = 50,
): Promise<void> {
  let next = 0;
  const one = async (item: T) => {
    for (let attempt = 1; ; attempt++) {
      try {
        await create(item);
        created(item);
        return;
      } catch (err) {
        const code = (err as { code?: number }).code ?? 0;
        if (attempt >= 5 || !(code === 429 || code >= 500)) throw err;
        await sleep(200 * attempt);
      }
    }
  };
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async () => {
      while (next < items.length) await one(items[next++] as T);
    }),
  );
}

/** Creates the bench's clone pods on the env's node (createEach). */
async function createPods(env: DaemonEnv, tracker: PodTracker, names: string[], prefix: string) {
  await createEach(
    names.map((name, i) => ({ name, i })),
    ({ name, i }) =>
      env.core.createNamespacedPod({
        namespace: env.ns,
        body: vmPod(name, env.nodeName, {
          'vm.cocoonstack.io/name': `vk-${prefix}-${i}`,
          'cocoonset.cocoonstack.io/image': env.image,
          'cocoonset.cocoonstack.io/managed': 'true',
        }),
      }),
    ({ name }) => {
      tracker.view(name).createdAt = Date.now();
    },
  );
}

export interface BringUpOptions {
  /** Pod name prefix (default `b`). */
  prefix?: string;
  timeoutMs?: number;
}

/**
 * Creates N clone pods at once on `env` and waits until all are ready. The tracker keeps
 * watching (the caller stops it); the daemon keeps running.
 */
export async function bringUp(
  bench: Bench,
  env: DaemonEnv,
  n: number,
  opts: BringUpOptions = {},
): Promise<{ result: BringUpResult; tracker: PodTracker; windowEnd: number }> {
  const audit = bench.audit;
  if (!audit) throw new Error('the bench has no audit log');
  const prefix = opts.prefix ?? 'b';
  const names = Array.from({ length: n }, (_, i) => `${prefix}-${i}`);
  const tracker = new PodTracker(env.kc, env.core, env.ns);
  await tracker.start();
  const leases = new LeaseWatcher(env.sim.leasesPath);
  const pid = env.daemon.pid;
  const rss = new RssSampler(pid);
  const idleRssKiB = rss.lastKiB;
  const log = (s: string) => bench.log(`[${env.label}] ${s}`);
  const timeoutMs = opts.timeoutMs ?? (Number(process.env.VK_BENCH_TIMEOUT_S) || 600 + 2 * n) * 1000;

  const cpu0 = cpuTimes(pid);
  const simCpu = () => (env.sim.serverPid === undefined ? 0 : cpuTimes(env.sim.serverPid).selfMs);
  const simCpu0 = simCpu();
  audit.poll();
  const t0 = Date.now();
  let lastCpu = cpu0.selfMs;
  let lastTick = t0;
  const progress = setInterval(() => {
    let cpuNow = lastCpu;
    try {
      cpuNow = cpuTimes(pid).selfMs;
    } catch {
      // gone: noticed below
    }
    const now = Date.now();
    const cpuPct = ((cpuNow - lastCpu) / (now - lastTick)) * 100;
    lastCpu = cpuNow;
    lastTick = now;
    log(
      `${Math.round((now - t0) / 1000)} s: created ${tracker.count((v) => v.createdAt !== undefined)}/${n}, ` +
        `leases ${leases.firstSeen.size}, lifecycle ready ${tracker.count((v) => v.lifecycle === 'ready')}, ` +
        `PodReady ${tracker.count((v) => v.podReady)}, daemon RSS ${Math.round(rss.lastKiB / 1024)} MiB, ` +
        `CPU ${cpuPct.toFixed(0)}% of a core`,
    );
  }, 10_000);
  // The figure's finer grain, apart from the log line's 10 s: a burst of 50 pods is over in a
  // few seconds. A sample is skipped when /proc cannot be read (the daemon gone: the loop below
  // says so).
  const series: BurstSample[] = [];
  let sampledCpu = cpu0.selfMs;
  let sampledAt = t0;
  const sample = () => {
    let cpuNow: number;
    let rssKiB: number;
    try {
      cpuNow = cpuTimes(pid).selfMs;
      rssKiB = memOf(pid).rssKiB;
    } catch {
      return;
    }
    const now = Date.now();
    if (now <= sampledAt) return;
    series.push({ tMs: now - t0, rssKiB, cpuPct: ((cpuNow - sampledCpu) / (now - sampledAt)) * 100 });
    sampledCpu = cpuNow;
    sampledAt = now;
  };
  const sampler = setInterval(sample, 500);
  sampler.unref();
  try {
    log(`creating ${n} pods`);
    await createPods(env, tracker, names, `${env.label}-${prefix}`);
    log(`created ${n} pods in ${((Date.now() - t0) / 1000).toFixed(1)} s; waiting for ready`);
    const until = t0 + timeoutMs;
    let lastList = Date.now();
    for (;;) {
      bench.check();
      if (env.daemon.child.exitCode !== null || env.daemon.child.signalCode !== null)
        throw new Error(`vk-cocoon exited; see ${env.daemonOpts.logFile}`);
      // Failed bring-ups, and pods admission rejected (phase Failed, e.g. OutOfcpu).
      const failed = names.filter((nm) => {
        const v = tracker.pods.get(nm);
        return v?.lifecycle === 'failed' || v?.phase === 'Failed';
      });
      if (failed.length > 0) {
        const v = tracker.pods.get(failed[0] as string);
        throw new Error(
          `${failed.length} pod(s) failed, e.g. ${failed[0]}: ${v?.message || v?.reason || ''}`,
        );
      }
      if (ready(tracker, names) === n) break;
      if (Date.now() > until)
        throw new Error(`timed out after ${timeoutMs / 1000} s: ${ready(tracker, names)}/${n} ready`);
      if (Date.now() - lastList > 5000) {
        // Catches what the watch missed (re-established watches, a dropped event).
        await tracker.relist().catch(() => {});
        lastList = Date.now();
      }
      await sleep(100);
    }
  } catch (err) {
    clearInterval(sampler);
    throw err;
  } finally {
    clearInterval(progress);
  }
  const allReady = Date.now();
  const wallMs = allReady - t0;
  log(`all ${n} ready after ${(wallMs / 1000).toFixed(1)} s; waiting for the daemon's pod writes to stop`);
  // The series covers the whole measured window: the writes after the last Ready cost too.
  try {
    await waitQuiet(audit, t0);
  } finally {
    clearInterval(sampler);
  }
  const t1 = Date.now();
  sample(); // the window's end
  const cpu1 = cpuTimes(pid);
  const simCpu1 = simCpu();
  const { hwmKiB } = memOf(pid);
  rss.stop();
  leases.stop();
  // calls.jsonl and the audit log are written before the request/invocation returns; the
  // margin covers a line still being appended.
  await sleep(300);
  audit.poll();
  const writes: AuditWrite[] = selectWrites(audit.writes, { user: isDaemonUser, from: t0, to: t1 });
  const calls = countCalls(env.sim.calls(), t0, t1);

  const vms = await env.sim.json<{ id: string; network_configs: { mac: string }[] }[]>([
    'vm',
    'list',
    '-o',
    'json',
  ]);
  const macOf = new Map(vms.map((v) => [v.id, v.network_configs[0]?.mac ?? '']));
  const boundToReady: number[] = [];
  const leaseToReady: number[] = [];
  const createdToPodReady: number[] = [];
  for (const name of names) {
    const v = tracker.view(name);
    const bound = Math.min(
      v.createdAt ?? Number.POSITIVE_INFINITY,
      v.firstSeenAt ?? Number.POSITIVE_INFINITY,
    );
    if (v.readyAt !== undefined && Number.isFinite(bound)) boundToReady.push(v.readyAt - bound);
    if (v.podReadyAt !== undefined && Number.isFinite(bound)) createdToPodReady.push(v.podReadyAt - bound);
    const seen = leases.firstSeen.get(macOf.get(v.vmId) ?? '');
    if (seen !== undefined && v.readyAt !== undefined) leaseToReady.push(v.readyAt - seen);
  }
  return {
    tracker,
    windowEnd: t1,
    result: {
      pods: n,
      wallMs,
      windowMs: t1 - t0,
      boundToReady,
      leaseToReady,
      createdToPodReady,
      cpuMs: cpu1.selfMs - cpu0.selfMs,
      childCpuMs: cpu1.childrenMs - cpu0.childrenMs,
      simServerCpuMs: simCpu1 - simCpu0,
      writes: countWrites(writes),
      calls,
      peakRssKiB: Math.max(rss.maxKiB, 0),
      hwmKiB,
      idleRssKiB,
      idleAnonKiB: rss.first?.anonKiB ?? Number.NaN,
      idleFileKiB: rss.first?.fileKiB ?? Number.NaN,
      peakAnonKiB: rss.atMax?.anonKiB ?? Number.NaN,
      peakFileKiB: rss.atMax?.fileKiB ?? Number.NaN,
      leasesSeen: leaseToReady.length,
      watchRestarts: tracker.restarts,
      series,
    },
  };
}

/** The one-line summary of a bring-up (restart and steady print it before their own figures). */
export function bringUpLine(r: BringUpResult): string {
  return (
    `${r.pods} pods ready in ${(r.wallMs / 1000).toFixed(1)} s ` +
    `(bound → ready p50 ${pct(r.boundToReady, 50)} ms, p99 ${pct(r.boundToReady, 99)} ms, max ${max(r.boundToReady)} ms)`
  );
}
