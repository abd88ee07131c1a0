// Benchmark (a script, not a test): N concurrent clones with zero simulated VM latency.
// Prints pod bound → lifecycle ready p50/p99, lease written → ready p50/p99, and apiserver
// write requests per bring-up. Usage: npm run bench -- [pods=200]
// However it ends (done, an error, SIGINT/SIGTERM, a crash) every process it started is stopped
// through its PID registry (ground/proc.ts), the simulator's stand-ins included.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { type Daemon, startDaemon } from '../ground/daemon.ts';
import { type Ground, startGround, stopGround } from '../ground/ground.ts';
import { adminClients, newNamespace, vmPod } from '../ground/kube.ts';
import { installTeardown, openPidRegistry, waitFor } from '../ground/proc.ts';
import { newSimRoot, type SimRoot } from '../sim/client.ts';

const N = Number(process.argv[2] ?? process.env.VK_BENCH_PODS ?? 200);
const dir = mkdtempSync(join(tmpdir(), 'vk-bench-'));
const registry = openPidRegistry(join(dir, 'pids'));
const log = (s: string) => console.log(`bench: ${s}`);
log(`work dir ${dir}`);

let ground: Ground | undefined;
let sim: SimRoot | undefined;
let daemon: Daemon | undefined;
let stopping = false;
const end = installTeardown(
  async (why) => {
    stopping = true;
    if (why.kind === 'signal') log(`${why.signal}: stopping`);
    if (daemon) await Promise.race([daemon.stop().catch(() => null), sleep(15_000)]);
    await sim?.cleanup({ keepDir: true }).catch(() => {});
    if (ground) await stopGround(ground).catch(() => {});
    if (why.kind === 'done' && why.code === 0) {
      // After installTeardown has stopped whatever is left in the registry.
      process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    } else {
      log(`logs kept in ${dir}`);
    }
    return undefined;
  },
  { registry, log },
);

function pct(values: number[], p: number): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] ?? Number.NaN;
}

async function metricValue(port: number, name: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name)) sum += Number(line.split(' ').pop());
  return sum;
}

async function main(): Promise<void> {
  const g = await startGround(join(dir, 'ground'), { log: (l) => log(l) });
  ground = g;
  if (stopping) return;
  sim = await newSimRoot({ parent: dir });
  const leasesPath = sim.leasesPath;
  await sim.fixtureSnapshot('bench/base', {
    backend: 'cloud-hypervisor',
    os: 'linux',
    image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
  });
  daemon = await startDaemon({
    cluster: g.cluster,
    nodeName: 'bench-node',
    cocoonBin: sim.cocoonBin,
    rootDir: sim.root,
    leasesPath,
    logFile: join(dir, 'vk-cocoon.log'),
    env: {
      ...sim.env(),
      VK_LOG_LEVEL: 'info',
      ...(process.env.VK_KUBE_QPS ? { VK_KUBE_QPS: process.env.VK_KUBE_QPS } : {}),
      ...(process.env.VK_KUBE_BURST ? { VK_KUBE_BURST: process.env.VK_KUBE_BURST } : {}),
    },
  });
  if (stopping) return;
  const { core, kc } = adminClients(g.cluster);
  const ns = await newNamespace(core, 'bench');

  const created = new Map<string, number>();
  const readyAt = new Map<string, number>();
  const vmIdOf = new Map<string, string>();
  const onPod = (p: V1Pod) => {
    const name = p.metadata?.name ?? '';
    const id = p.metadata?.annotations?.['vm.cocoonstack.io/id'];
    if (id) vmIdOf.set(name, id);
    if (p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state'] === 'ready' && !readyAt.has(name)) {
      readyAt.set(name, Date.now());
    }
  };
  // A watch for precise timings, re-established if the apiserver ends it; a 1 s list poll
  // below catches anything a re-established watch missed.
  const watch = new Watch(kc);
  let req: { abort(): void } | undefined;
  let watching = true;
  const startWatch = async () => {
    req = await watch.watch(
      `/api/v1/namespaces/${ns}/pods`,
      {},
      (_t: string, p: V1Pod) => onPod(p),
      () => {
        if (watching) setTimeout(() => void startWatch(), 100);
      },
    );
  };
  await startWatch();
  // Lease first-seen times, polled every 20 ms.
  const leaseSeen = new Map<string, number>();
  const poll = setInterval(() => {
    if (!existsSync(leasesPath)) return;
    try {
      const rows = JSON.parse(readFileSync(leasesPath, 'utf8')) as { mac: string }[] | null;
      const now = Date.now();
      for (const r of rows ?? []) if (!leaseSeen.has(r.mac)) leaseSeen.set(r.mac, now);
    } catch {
      // mid-rename; next tick
    }
  }, 20);

  const writesBefore = await metricValue(daemon.metricsPort, 'cocoon_vk_api_writes_total');
  log(`creating ${N} pods`);
  const t0 = Date.now();
  await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const name = `b-${i}`;
      created.set(name, Date.now());
      await core.createNamespacedPod({
        namespace: ns,
        body: vmPod(name, 'bench-node', {
          'vm.cocoonstack.io/name': `vk-bench-${i}`,
          'cocoonset.cocoonstack.io/image': 'bench/base',
          'cocoonset.cocoonstack.io/managed': 'true',
        }),
      });
    }),
  );
  await waitFor(
    `${N} pods ready`,
    async () => {
      for (const p of (await core.listNamespacedPod({ namespace: ns })).items) onPod(p);
      return readyAt.size === N;
    },
    900_000,
    1000,
  );
  watching = false;
  const wall = (Date.now() - t0) / 1000;
  clearInterval(poll);
  req?.abort();
  const writesAfter = await metricValue(daemon.metricsPort, 'cocoon_vk_api_writes_total');

  const vms = await sim.json<{ id: string; network_configs: { mac: string }[] }[]>([
    'vm',
    'list',
    '-o',
    'json',
  ]);
  const macOf = new Map(vms.map((v) => [v.id, v.network_configs[0]?.mac ?? '']));
  const boundToReady: number[] = [];
  const leaseToReady: number[] = [];
  for (const [name, at] of readyAt) {
    boundToReady.push(at - (created.get(name) ?? at));
    const seen = leaseSeen.get(macOf.get(vmIdOf.get(name) ?? '') ?? '');
    if (seen !== undefined) leaseToReady.push(at - seen);
  }
  console.log(
    `\nresults (${N} concurrent clones, zero simulated VM latency, VK_KUBE_QPS=${process.env.VK_KUBE_QPS ?? 20}, wall ${wall.toFixed(1)} s)`,
  );
  console.log(
    `  pod bound -> lifecycle ready: p50 ${pct(boundToReady, 50)} ms, p99 ${pct(boundToReady, 99)} ms`,
  );
  console.log(
    `  lease written -> ready:       p50 ${pct(leaseToReady, 50)} ms, p99 ${pct(leaseToReady, 99)} ms (${leaseToReady.length} leases observed)`,
  );
  console.log(
    `  apiserver writes per bring-up (reads: one shared pod watch): ${((writesAfter - writesBefore) / N).toFixed(1)}`,
  );
}

main().then(
  () => end({ kind: 'done', code: 0 }),
  (error: unknown) => end({ kind: 'error', error }),
);
