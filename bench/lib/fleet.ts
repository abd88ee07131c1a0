// What the fleet benchmark (bench/fleet.ts) and its soak share: a fleet of vk-cocoon hosts
// (ground/fleet.ts) on the bench's ground, each with the bench's clone-source snapshot in its
// own simulator, one namespace for every pod of the fleet, pods bound to their host by
// spec.nodeName, per-host meters (CPU from /proc, RSS samples) and the hosts' VM lists.
// The fleet is stopped however the bench ends: by the caller's `finally` (done, an error) and
// on a signal here; the run's PID registry (ground/proc.ts) catches whatever is left.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { type Fleet, type FleetHost, startFleet, stopFleet } from '../../ground/fleet.ts';
import type { Ground } from '../../ground/ground.ts';
import { adminClients, newNamespace, vmPod } from '../../ground/kube.ts';
import type { Knobs } from '../../sim/client.ts';
import { createEach } from './bringup.ts';
import { type Bench, PASS_THROUGH } from './harness.ts';
import { cpuTimes, memOf, RssSampler } from './procfs.ts';
import type { PodTracker, PodView } from './watchers.ts';

/** The clone source of every fleet pod: a fixture snapshot in each host's simulator. */
export const FLEET_IMAGE = 'bench/base';

export interface BenchFleet {
  fleet: Fleet;
  hosts: FleetHost[];
  ns: string;
  core: CoreV1Api;
  kc: KubeConfig;
  /** Stops every host (idempotent). */
  stop(): Promise<void>;
}

/**
 * Starts `hosts` daemons on the bench's ground, each with room for `capacity` pods (pods, cpu
 * and memory: admission counts every VM at its size, 2 vCPUs and 2 GiB for the snapshot), at
 * log level info unless VK_LOG_LEVEL says otherwise, and the clone-source snapshot in each
 * simulator; one namespace for the fleet's pods.
 */
export async function startBenchFleet(
  bench: Bench,
  g: Ground,
  o: { hosts: number; capacity: number; knobs?: Knobs },
): Promise<BenchFleet> {
  const env: Record<string, string> = {
    VK_LOG_LEVEL: process.env.VK_LOG_LEVEL ?? 'info',
    VK_NODE_PODS: String(Math.max(256, o.capacity)),
    VK_NODE_CPU: String(Math.max(1024, 4 * o.capacity)),
    VK_NODE_MEM: `${Math.max(2048, 4 * o.capacity)}Gi`,
  };
  for (const k of PASS_THROUGH) if (process.env[k]) env[k] = process.env[k] as string;
  if (process.env.VK_BENCH_DAEMON_NODE_OPTIONS) env.NODE_OPTIONS = process.env.VK_BENCH_DAEMON_NODE_OPTIONS;
  for (const pair of (process.env.VK_BENCH_DAEMON_ENV ?? '').split(/\s+/)) {
    const eq = pair.indexOf('=');
    if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  const fleet = await startFleet({
    ground: g,
    hosts: o.hosts,
    dir: join(bench.dir, 'fleet'),
    env,
    log: bench.log,
    namePrefix: 'fleet-h',
    ...(o.knobs ? { knobs: o.knobs } : {}),
  });
  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= stopFleet(fleet).catch((e: unknown) => bench.log(`stopping the fleet: ${String(e)}`));
    return stopping;
  };
  // Bench's teardown stops the ground and the PID registry on a signal; the fleet's daemons
  // get their SIGTERM at the same time, from here.
  for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.once(s, () => void stop());
  try {
    bench.check();
    await Promise.all(
      fleet.hosts.map((h) =>
        h.simulator.fixtureSnapshot(FLEET_IMAGE, {
          backend: 'cloud-hypervisor',
          os: 'linux',
          image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
        }),
      ),
    );
    const { core, kc } = adminClients(g.cluster);
    const ns = await newNamespace(core, 'fleet');
    return { fleet, hosts: fleet.hosts, ns, core, kc, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** A pod to create: its name, the node it is bound to, its VM name (the identity). */
export interface PodSpec {
  name: string;
  node: string;
  vmName: string;
}

/** Pods of `perHost` per host, interleaved across hosts (h1-0, h2-0, ..., h1-1, ...) so that
 * every host's burst arrives at once. */
export function fleetPods(hosts: readonly FleetHost[], perHost: number): PodSpec[] {
  const out: PodSpec[] = [];
  for (let i = 0; i < perHost; i++)
    for (const h of hosts)
      out.push({ name: `h${h.index + 1}-${i}`, node: h.name, vmName: `vk-fl-h${h.index + 1}-${i}` });
  return out;
}

/** Creates the pods (bench/lib/bringup.ts createEach); records each create's answer in the tracker. */
export async function createFleetPods(
  bf: BenchFleet,
  tracker: PodTracker,
  pods: readonly PodSpec[],
  concurrency = 50,
): Promise<void> {
  await createEach(
    pods,
    (p) =>
      bf.core.createNamespacedPod({
        namespace: bf.ns,
        body: vmPod(p.name, p.node, {
          'vm.cocoonstack.io/name': p.vmName,
          'cocoonset.cocoonstack.io/image': FLEET_IMAGE,
          'cocoonset.cocoonstack.io/managed': 'true',
        }),
      }),
    (p) => {
      tracker.view(p.name).createdAt = Date.now();
    },
    concurrency,
  );
}

/** When the pod was bound: the earlier of its create's answer and the watch's first sight. */
export function boundAt(v: PodView): number | undefined {
  const t = Math.min(v.createdAt ?? Number.POSITIVE_INFINITY, v.firstSeenAt ?? Number.POSITIVE_INFINITY);
  return Number.isFinite(t) ? t : undefined;
}

/** One host's daemon cost over a window: CPU from /proc, RSS sampled every 100 ms. */
export class HostMeter {
  readonly host: FleetHost;
  readonly pid: number;
  readonly rss: RssSampler;
  readonly idleRssKiB: number;
  readonly #cpu0: number;
  readonly #child0: number;
  readonly #sim0: number;
  #lastCpu: number;
  #lastAt = Date.now();
  /** Set by finish(). */
  cpuMs = 0;
  childCpuMs = 0;
  simServerCpuMs = 0;
  hwmKiB = 0;

  constructor(host: FleetHost) {
    this.host = host;
    this.pid = host.daemon.pid;
    this.rss = new RssSampler(this.pid);
    this.idleRssKiB = this.rss.lastKiB;
    const c = cpuTimes(this.pid);
    this.#cpu0 = c.selfMs;
    this.#child0 = c.childrenMs;
    this.#sim0 = this.#simCpu();
    this.#lastCpu = c.selfMs;
  }

  #simCpu(): number {
    const pid = this.host.simulator.serverPid;
    if (pid === undefined) return 0;
    try {
      return cpuTimes(pid).selfMs;
    } catch {
      return 0;
    }
  }

  /** CPU % of one core since the previous call (progress lines); NaN once the daemon is gone. */
  cpuPctSinceLast(): number {
    try {
      const now = Date.now();
      const cpu = cpuTimes(this.pid).selfMs;
      const pct = ((cpu - this.#lastCpu) / Math.max(1, now - this.#lastAt)) * 100;
      this.#lastCpu = cpu;
      this.#lastAt = now;
      return pct;
    } catch {
      return Number.NaN;
    }
  }

  /** Ends the window: CPU deltas, VmHWM; stops the sampler. */
  finish(): void {
    const c = cpuTimes(this.pid);
    this.cpuMs = c.selfMs - this.#cpu0;
    this.childCpuMs = c.childrenMs - this.#child0;
    this.simServerCpuMs = this.#simCpu() - this.#sim0;
    this.hwmKiB = memOf(this.pid).hwmKiB;
    this.rss.stop();
  }
}

/** The node identity a fleet host writes as (ground/node-identity.ts). */
export function hostUser(h: FleetHost): string {
  return `system:node:${h.name}`;
}

export interface VmEntry {
  id: string;
  name: string;
  state: string;
}

/** `cocoon vm list -o json` of a host's simulator ("No VMs found." is none). */
export async function listVms(h: FleetHost): Promise<VmEntry[]> {
  const r = await h.simulator.run(['vm', 'list', '-o', 'json'], { timeoutMs: 60_000 });
  if (r.code !== 0) throw new Error(`${h.name}: cocoon vm list exited ${r.code}: ${r.stderr.trim()}`);
  const out = r.stdout.trim();
  if (out === '' || out.startsWith('No VMs found')) return [];
  const vms = JSON.parse(out) as { id: string; state: string; config?: { name?: string } }[] | null;
  return (vms ?? []).map((v) => ({ id: v.id, name: v.config?.name ?? '', state: v.state }));
}

/** Warn/error/fatal lines of a daemon log by level and message, most frequent first. */
export function logDigest(file: string, from = 0): { level: string; msg: string; n: number }[] {
  let text = '';
  try {
    text = readFileSync(file, 'utf8').slice(from);
  } catch {
    return [];
  }
  const counts = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (
      !line.includes('"level":"warn"') &&
      !line.includes('"level":"error"') &&
      !line.includes('"level":"fatal"')
    )
      continue;
    try {
      const rec = JSON.parse(line) as { level?: string; msg?: string };
      const key = `${rec.level ?? '?'}\t${rec.msg ?? ''}`;
      counts.set(key, (counts.get(key) ?? 0) + 1);
    } catch {
      // a line cut by a kill
    }
  }
  return [...counts.entries()]
    .map(([k, n]) => {
      const [level = '', msg = ''] = k.split('\t');
      return { level, msg, n };
    })
    .sort((a, b) => b.n - a.n || a.msg.localeCompare(b.msg));
}

/** Prints each host's log digest (at most `top` messages per host). */
export function printLogDigests(bench: Bench, hosts: readonly FleetHost[], top = 8): void {
  for (const h of hosts) {
    const d = logDigest(h.logFile);
    if (d.length === 0) {
      bench.log(`[${h.name}] log: no warn/error lines`);
      continue;
    }
    bench.log(`[${h.name}] log warn/error lines (${h.logFile}):`);
    for (const e of d.slice(0, top)) bench.log(`  ${e.n} × ${e.level} ${e.msg}`);
  }
}

/** One pod's writes as the apiserver's audit log times them (stageTimestamp: answered). */
export interface ApiPodTimes {
  /** When the create of the pod was answered (2xx), epoch ms. */
  createdAt?: number;
  /** When each successful pods/status write of a node identity was answered, epoch ms. */
  statusWrites: number[];
}

/**
 * The pods of namespace `ns` by name, from the audit log: when their create was answered and
 * when each status write of a daemon was. The bench's own watch can lag the apiserver by
 * seconds on a loaded machine (a starved bench process, watches the apiserver closes for
 * unresponsiveness), the audit log does not: its times are the apiserver's.
 */
export function auditPodTimes(path: string, ns: string): Map<string, ApiPodTimes> {
  const out = new Map<string, ApiPodTimes>();
  let text = '';
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return out;
  }
  for (const line of text.split('\n')) {
    if (!line.includes(`"namespace":"${ns}"`) || !line.includes('"resource":"pods"')) continue;
    let e: {
      stage?: string;
      verb?: string;
      user?: { username?: string };
      objectRef?: { name?: string; subresource?: string };
      responseStatus?: { code?: number };
      stageTimestamp?: string;
    };
    try {
      e = JSON.parse(line);
    } catch {
      continue;
    }
    const name = e.objectRef?.name;
    const code = e.responseStatus?.code ?? 0;
    if (e.stage !== 'ResponseComplete' || !name || code >= 400) continue;
    const at = Date.parse(e.stageTimestamp ?? '');
    let t = out.get(name);
    if (!t) {
      t = { statusWrites: [] };
      out.set(name, t);
    }
    if (e.verb === 'create' && e.objectRef?.subresource === undefined) t.createdAt = at;
    else if (e.objectRef?.subresource === 'status' && (e.user?.username ?? '').startsWith('system:node:'))
      t.statusWrites.push(at);
  }
  return out;
}

/**
 * created → ready on the apiserver's clock: the create answered → the daemon's last status
 * write answered before the bench saw the pod ready (lifecycle and PodReady), i.e. the write
 * that made it ready; and the bench watch's lag behind that write. Undefined when unknown.
 */
export function apiReadyTimes(
  v: PodView,
  t: ApiPodTimes | undefined,
): { latency: number; lag: number; readyAt: number } | undefined {
  if (!t || t.createdAt === undefined || v.readyAt === undefined || v.podReadyAt === undefined)
    return undefined;
  const seen = Math.max(v.readyAt, v.podReadyAt);
  let ready: number | undefined;
  for (const w of t.statusWrites) if (w <= seen && (ready === undefined || w > ready)) ready = w;
  return ready === undefined
    ? undefined
    : { latency: ready - t.createdAt, lag: seen - ready, readyAt: ready };
}
