// Benchmark (a script, not a test): fairness between namespaces. One daemon, two
// namespaces. Namespace A holds 64 slow pulls: run-mode pods, each with its own image, whose
// `image pull` the simulator makes last 10 minutes (a transfer: VK_TRANSFER_SLOTS at a time,
// at most 3/4 of them for one namespace, the rest queued). Meanwhile namespace B creates 20
// clone pods (local snapshot) and deletes them; one of A's pods is deleted mid-pull. Printed:
// B's created→ready (p50, p99, max) under that load against the same burst on the idle node
// (goal: p99 within 1.5x), and the delete times (the aborted pull must not hold the delete).
//   npm run bench:fairness
// However it ends every process it started is stopped (ground/proc.ts PID registry).
import { setTimeout as sleep } from 'node:timers/promises';
import { newNamespace, vmPod } from '../ground/kube.ts';
import { Bench, type DaemonEnv, envInt, machineLines } from './lib/harness.ts';
import { fmtN, fmtS, markdownTable, max, pct } from './lib/stats.ts';
import { PodTracker, settledReady } from './lib/watchers.ts';

const A_PODS = 64;
const B_PODS = 20;
// VK_BENCH_PULL_MS: how long each of A's pulls takes (default 10 min).
const PULL_MS = envInt('VK_BENCH_PULL_MS', 10 * 60_000);

const bench = new Bench('fairness');

/** Creates pods (all at once) and records when each create was answered. */
async function create(
  env: DaemonEnv,
  ns: string,
  tracker: PodTracker,
  pods: Record<string, Record<string, string>>,
) {
  await Promise.all(
    Object.entries(pods).map(async ([name, annotations]) => {
      await env.core.createNamespacedPod({ namespace: ns, body: vmPod(name, env.nodeName, annotations) });
      tracker.view(name).createdAt = Date.now();
    }),
  );
}

async function waitUntil(what: string, check: () => boolean, capMs: number): Promise<void> {
  const end = Date.now() + capMs;
  while (!check()) {
    bench.check();
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** B's burst: 20 clones created at once; created→ready of each (ms), then all deleted. */
async function burstB(
  env: DaemonEnv,
  tracker: PodTracker,
  label: string,
): Promise<{ ready: number[]; deleteMs: number[] }> {
  const names = Array.from({ length: B_PODS }, (_, i) => `b-${label}-${i}`);
  const pods = Object.fromEntries(
    names.map((n) => [
      n,
      {
        'vm.cocoonstack.io/name': `vk-${n}`,
        'cocoonset.cocoonstack.io/image': env.image,
        'cocoonset.cocoonstack.io/managed': 'true',
      },
    ]),
  );
  await create(env, env.ns, tracker, pods);
  await waitUntil(`${label}: B ready`, () => names.every((n) => settledReady(tracker.view(n))), 10 * 60_000);
  const ready = names.map((n) => {
    const v = tracker.view(n);
    return Math.max(v.readyAt ?? 0, v.podReadyAt ?? 0) - (v.createdAt ?? 0);
  });
  const deleteMs = await Promise.all(names.map((n) => deleteAndWait(env, env.ns, tracker, n)));
  return { ready, deleteMs };
}

/** Deletes a pod (default grace) and resolves with the ms until the API no longer has it. */
async function deleteAndWait(env: DaemonEnv, ns: string, tracker: PodTracker, name: string): Promise<number> {
  const t0 = Date.now();
  await env.core.deleteNamespacedPod({ namespace: ns, name });
  await waitUntil(`${name} deleted`, () => tracker.view(name).deleted, 5 * 60_000);
  return Date.now() - t0;
}

const row = (what: string, ms: number[]) => [
  what,
  String(ms.length),
  fmtS(pct(ms, 50)),
  fmtS(pct(ms, 99)),
  fmtS(max(ms)),
];

bench.run(async () => {
  const g = await bench.startGround();
  const env = await bench.newEnv('fair', { pods: A_PODS + 2 * B_PODS });
  const nsA = await newNamespace(env.core, 'fair-a');
  const trackerA = new PodTracker(env.kc, env.core, nsA);
  const trackerB = new PodTracker(env.kc, env.core, env.ns);
  await trackerA.start(2000);
  await trackerB.start(2000);

  // A first burst warms the daemon and the simulator (first clone, JIT): not measured.
  bench.log(`warm-up: B creates ${B_PODS} clones (not measured)`);
  await burstB(env, trackerB, 'warm');
  bench.log(`idle node: B creates ${B_PODS} clones`);
  const idle = await burstB(env, trackerB, 'idle');

  bench.log(`A: ${A_PODS} run-mode pods whose image pull takes ${fmtS(PULL_MS)}`);
  await env.sim.mergeKnobs({ latency: { 'image pull': PULL_MS } });
  const aNames = Array.from({ length: A_PODS }, (_, i) => `a-${i}`);
  await create(
    env,
    nsA,
    trackerA,
    Object.fromEntries(
      aNames.map((n, i) => [
        n,
        {
          'vm.cocoonstack.io/name': `vk-${n}`,
          'cocoonset.cocoonstack.io/mode': 'run',
          'cocoonset.cocoonstack.io/image': `ghcr.io/fair/slow-${i}:1`,
          'cocoonset.cocoonstack.io/managed': 'true',
        },
      ]),
    ),
  );
  await waitUntil(
    'A creating',
    () => aNames.every((n) => trackerA.view(n).lifecycle === 'creating'),
    5 * 60_000,
  );
  // Let A's pulls take their slots and queue the rest.
  await sleep(5000);

  bench.log(`loaded node: B creates ${B_PODS} clones while A's ${A_PODS} pulls are in flight or queued`);
  const loaded = await burstB(env, trackerB, 'load');
  bench.log('deleting one of A’s pods mid-pull');
  const aDelete = await deleteAndWait(env, nsA, trackerA, 'a-0');
  const stillPulling = aNames.filter(
    (n) => !trackerA.view(n).deleted && trackerA.view(n).lifecycle === 'creating',
  ).length;

  trackerA.stop();
  trackerB.stop();
  console.log('');
  for (const l of machineLines(g, bench)) console.log(l);
  console.log(
    `settings: ${A_PODS} pulls of ${fmtS(PULL_MS)} in namespace A (VK_TRANSFER_SLOTS=${process.env.VK_TRANSFER_SLOTS ?? '8 (default)'}), ${B_PODS} clones in namespace B, zero clone latency`,
  );
  console.log('');
  console.log(
    markdownTable(
      ['B, created → ready', 'pods', 'p50', 'p99', 'max'],
      [row('idle node', idle.ready), row(`A holding ${A_PODS} pulls`, loaded.ready)],
    ),
  );
  console.log('');
  console.log(
    markdownTable(
      ['deletes', 'pods', 'p50', 'p99', 'max'],
      [
        row('B, idle node', idle.deleteMs),
        row('B, under load', loaded.deleteMs),
        row('A, mid-pull (aborted)', [aDelete]),
      ],
    ),
  );
  console.log('');
  const ratio = pct(loaded.ready, 99) / Math.max(1, pct(idle.ready, 99));
  console.log(`B p99 created→ready under load / idle: ${fmtN(ratio, 2)}x (goal: within 1.5x)`);
  console.log(`A pods still pulling at the end: ${stillPulling} of ${A_PODS - 1}`);
  await env.core.deleteCollectionNamespacedPod({ namespace: nsA, gracePeriodSeconds: 0 }).catch(() => {});
  await bench.dropEnv(env);
});
