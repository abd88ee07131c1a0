// Benchmark: VM deaths: the time from the VM's death to the pod's eviction.
// Brings up N ready pods (VK_BENCH_PODS, default 24) on one daemon with default settings,
// then, one at a time:
//   1. crashes each pod's VM (`cocoon __sim crash`: the VMM process killed, the record left
//      `stopped (stale)`) and measures crash → restart: the start of the daemon's `vm start`
//      call in the simulator's call log (and its end, the VM running again);
//   2. deletes each pod's VM behind the daemon's back (`cocoon __sim delete-behind-back`:
//      record and files removed, the VMM killed) and measures death → eviction: the first
//      version of the pod a watch delivers with a deletionTimestamp or phase Failed.
// The death is timed from the wall clock just before the `__sim` call is started (so the
// call's own duration, printed apart, is inside the figure: an upper bound); "from the call's
// return" is a lower bound. At least 20 deaths of each kind (VK_BENCH_DEATHS, default N).
//   npm run bench:death
//   VK_BENCH_PODS=30 node bench/vm-death.ts
import { setTimeout as sleep } from 'node:timers/promises';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import type { CallRecord } from '../sim/client.ts';
import { bringUp, bringUpLine } from './lib/bringup.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes } from './lib/procfs.ts';
import { markdownTable, max, pct } from './lib/stats.ts';

const N = envInt('VK_BENCH_PODS', 24);
const DEATHS = Math.min(N, envInt('VK_BENCH_DEATHS', N));
const OUTCOME_TIMEOUT_MS = envInt('VK_BENCH_DEATH_TIMEOUT_S', 30) * 1000;
/** Pause between two deaths, so each is measured on a quiet daemon. */
const GAP_MS = 300;
const TARGET_MS = 1000;
const VM_ID = 'vm.cocoonstack.io/id';

interface Sample {
  /** From the wall clock just before the `__sim` call to the outcome, ms. */
  fromCall: number;
  /** From the `__sim` call's return to the outcome, ms (may be negative: a lower bound). */
  fromReturn: number;
  /** The `__sim` call's own duration (client-measured), ms. */
  callMs: number;
}

/** First time a watch saw each pod evicted (deletionTimestamp, phase Failed, or DELETED). */
class EvictionWatch {
  readonly firstSeen = new Map<string, { at: number; how: string }>();
  #req: AbortController | undefined;
  #on = true;
  restarts = 0;
  readonly #kc: ConstructorParameters<typeof Watch>[0];
  readonly #ns: string;

  constructor(kc: ConstructorParameters<typeof Watch>[0], ns: string) {
    this.#kc = kc;
    this.#ns = ns;
  }

  async start(): Promise<void> {
    this.#req = await new Watch(this.#kc).watch(
      `/api/v1/namespaces/${this.#ns}/pods`,
      {},
      (type: string, p: V1Pod) => {
        const name = p.metadata?.name ?? '';
        if (this.firstSeen.has(name)) return;
        const how =
          type === 'DELETED'
            ? 'DELETED'
            : p.metadata?.deletionTimestamp
              ? 'deletionTimestamp'
              : p.status?.phase === 'Failed'
                ? 'Failed'
                : '';
        if (how) this.firstSeen.set(name, { at: Date.now(), how });
      },
      () => {
        if (!this.#on) return;
        this.restarts++;
        setTimeout(() => void this.start().catch(() => {}), 100);
      },
    );
  }

  stop(): void {
    this.#on = false;
    this.#req?.abort();
  }
}

async function until<T>(what: string, fn: () => T | undefined, timeoutMs: number, everyMs = 10): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

const bench = new Bench('bench-vm-death');
bench.run(async () => {
  const g = await bench.startGround();
  const env = await bench.newEnv('death', { pods: N });
  const { result, tracker } = await bringUp(bench, env, N, { prefix: 'd' });
  tracker.stop();
  bench.log(bringUpLine(result));
  const pods = [...tracker.pods.values()]
    .filter((v) => v.vmId)
    .sort((a, b) => a.name.localeCompare(b.name, 'en', { numeric: true }))
    .slice(0, DEATHS);
  if (pods.length < DEATHS) throw new Error(`only ${pods.length} pods with a VM id`);
  const vmName = (pod: string) => `vk-${env.label}-${pod}`;
  const sim = async (args: string[]) => {
    const at = Date.now();
    const r = await env.sim.run(['__sim', ...args]);
    const returned = Date.now();
    if (r.code !== 0) throw new Error(`__sim ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
    return { at, returned, callMs: r.durationMs };
  };
  const daemonCpu0 = cpuTimes(env.daemon.pid).selfMs;

  // 1. Crash → restart.
  const restarts: Sample[] = [];
  const restartDone: number[] = [];
  let seen = env.sim.calls().length;
  const startCall = (vmId: string): CallRecord | undefined => {
    const calls = env.sim.calls();
    const found = calls.slice(seen).find((c) => c.argv.join(' ') === `vm start ${vmId}`);
    return found;
  };
  for (const [i, p] of pods.entries()) {
    bench.check();
    seen = env.sim.calls().length;
    const t = await sim(['crash', vmName(p.name)]);
    const call = await until(`vm start of ${p.name}`, () => startCall(p.vmId), OUTCOME_TIMEOUT_MS, 20);
    if (call.exit !== 0) throw new Error(`vm start ${p.vmId} exited ${call.exit}`);
    const at = Date.parse(call.startedAt);
    restarts.push({ fromCall: at - t.at, fromReturn: at - t.returned, callMs: t.callMs });
    restartDone.push(at + call.durationMs - t.at);
    if ((i + 1) % 8 === 0) bench.log(`crash → restart: ${i + 1}/${pods.length}`);
    await sleep(GAP_MS);
  }

  // 2. Death → eviction.
  const watch = new EvictionWatch(env.kc, env.ns);
  await watch.start();
  const evictions: Sample[] = [];
  const how: Record<string, number> = {};
  for (const [i, p] of pods.entries()) {
    bench.check();
    const live = await env.core.readNamespacedPod({ namespace: env.ns, name: p.name });
    if (live.metadata?.deletionTimestamp || live.metadata?.annotations?.[VM_ID] !== p.vmId)
      throw new Error(`${p.name} is not the ready pod it was before the deaths`);
    const t = await sim(['delete-behind-back', vmName(p.name)]);
    const seenAt = await until(
      `eviction of ${p.name}`,
      () => watch.firstSeen.get(p.name),
      OUTCOME_TIMEOUT_MS,
      5,
    );
    evictions.push({ fromCall: seenAt.at - t.at, fromReturn: seenAt.at - t.returned, callMs: t.callMs });
    how[seenAt.how] = (how[seenAt.how] ?? 0) + 1;
    if ((i + 1) % 8 === 0) bench.log(`death → eviction: ${i + 1}/${pods.length}`);
    await sleep(GAP_MS);
  }
  watch.stop();
  const daemonCpuMs = cpuTimes(env.daemon.pid).selfMs - daemonCpu0;

  const ms = (v: number) => (Number.isFinite(v) ? `${Math.round(v)} ms` : '–');
  const row = (label: string, xs: number[]) => [
    label,
    String(xs.length),
    ms(pct(xs, 50)),
    ms(pct(xs, 99)),
    ms(max(xs)),
  ];
  const evict = evictions.map((s) => s.fromCall);
  console.log('');
  for (const l of machineLines(g, bench)) console.log(l);
  console.log(`bring-up: ${bringUpLine(result)}`);
  console.log('');
  console.log(
    markdownTable(
      ['VM deaths, one at a time', 'n', 'p50', 'p99', 'max'],
      [
        row(
          `**death → eviction** (delete-behind-back → first evicted version; target < ${TARGET_MS} ms)`,
          evict,
        ),
        row(
          '· from the __sim call’s return',
          evictions.map((s) => s.fromReturn),
        ),
        row(
          '· the __sim delete-behind-back call itself',
          evictions.map((s) => s.callMs),
        ),
        row(
          '**crash → restart** (__sim crash → `vm start` begins)',
          restarts.map((s) => s.fromCall),
        ),
        row(
          '· from the __sim call’s return',
          restarts.map((s) => s.fromReturn),
        ),
        row('· crash → `vm start` returned (VM running again)', restartDone),
        row(
          '· the __sim crash call itself',
          restarts.map((s) => s.callMs),
        ),
      ],
    ),
  );
  console.log('');
  console.log(
    `eviction first seen as: ${Object.entries(how)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}; ` +
      `death → eviction over ${TARGET_MS} ms: ${evict.filter((v) => v >= TARGET_MS).length}/${evict.length}; ` +
      `daemon CPU over both phases ${Math.round(daemonCpuMs)} ms; pod watch restarts ${watch.restarts}`,
  );
});
