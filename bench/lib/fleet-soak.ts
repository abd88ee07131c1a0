// The fleet soak (`node bench/fleet.ts soak [hosts [pods-per-host]]`): a fleet bring-up with
// faults injected through the simulators' knobs (clone latency jitter, a few failing clones the
// daemons retry), one host killed for good mid-run (FleetHost.killHost: daemon, VMs and
// simulator gone), its pods force-deleted (grace 0: no kubelet is left to confirm) and recreated
// on the surviving hosts (new pod names, the same VM names: the identities move), then every
// pod deleted. Prints an outcome table: pods stranded (not ready by the deadline), lost,
// identities with two VMs across the surviving hosts, VMs left after the delete.
import { setTimeout as sleep } from 'node:timers/promises';
import type { FleetHost } from '../../ground/fleet.ts';
import type { Knobs } from '../../sim/client.ts';
import { countWrites, selectWrites } from './audit.ts';
import { waitQuiet } from './bringup.ts';
import {
  apiReadyTimes,
  auditPodTimes,
  type BenchFleet,
  createFleetPods,
  fleetPods,
  HostMeter,
  hostUser,
  listVms,
  type PodSpec,
  printLogDigests,
  startBenchFleet,
  type VmEntry,
} from './fleet.ts';
import { Bench, machineLines } from './harness.ts';
import { fmtMiB, fmtN, fmtS, markdownTable, pct } from './stats.ts';
import { PodTracker, settledReady } from './watchers.ts';

/** The faults of every host's simulator (docs/simulator.md "Knobs"). */
export const SOAK_KNOBS: Knobs = {
  // Every clone takes 100 ms plus a uniform 0–900 ms.
  latency: { 'vm clone': { ms: 100, jitterMs: 900 } },
  faults: [
    // Lock contention before anything is done: an inconclusive error, a transient create failure.
    { argvRegex: '^vm clone ', error: 'database is locked', probability: 0.03, times: 6 },
    // A clone that fails after creating its VM: the simulator rolls the VM back.
    { argvRegex: '^vm clone ', phase: 'start', error: 'start vm: boot timeout', probability: 0.02, times: 4 },
  ],
};

export function soak({ hosts, perHost }: { hosts: number; perHost: number }): void {
  if (hosts < 2) throw new Error('soak: at least 2 hosts (one is killed)');
  const bench = new Bench('fleet-soak');
  bench.run(async () => {
    bench.log(`load average (1 min) at the start: ${bench.loadAtStart.toFixed(1)}`);
    const g = await bench.startGround();
    const audit = bench.audit;
    if (!audit) throw new Error('the bench has no audit log');
    // A survivor ends with its own pods and its share of the dead host's.
    const capacity = perHost + Math.ceil(perHost / (hosts - 1)) + 8;
    const bf = await startBenchFleet(bench, g, { hosts, capacity, knobs: SOAK_KNOBS });
    const tracker = new PodTracker(bf.kc, bf.core, bf.ns);
    try {
      await tracker.start();
      const out = await run(bench, bf, tracker, perHost);
      console.log('');
      for (const l of machineLines(g, bench)) console.log(l);
      console.log(out.header);
      console.log('');
      console.log(out.table);
    } finally {
      tracker.stop();
      await bf.stop();
    }
  });
}

async function run(
  bench: Bench,
  bf: BenchFleet,
  tracker: PodTracker,
  perHost: number,
): Promise<{ header: string; table: string }> {
  const audit = bench.audit;
  if (!audit) throw new Error('no audit log');
  const victim = bf.hosts.at(-1) as FleetHost;
  const survivors = bf.hosts.filter((h) => h !== victim);
  const original = fleetPods(bf.hosts, perHost);
  const total = original.length;
  const killAt = Number(process.env.VK_SOAK_KILL_AT ?? 0.5);
  const deadlineS = Number(process.env.VK_SOAK_DEADLINE_S) || 300 + total;
  const meters = survivors.map((h) => new HostMeter(h));
  /** The pods that must end ready: the survivors' own, then the dead host's replacements. */
  const expected = new Map<string, PodSpec>(
    original.filter((p) => p.node !== victim.name).map((p) => [p.name, p]),
  );
  const recreated: PodSpec[] = [];
  const t0 = Date.now();
  const deadline = t0 + deadlineS * 1000;
  let phase = 'bring-up';
  let killedAt: number | undefined;
  let recreatedAt: number | undefined;
  const progress = setInterval(() => {
    const per = bf.hosts.map((h) => {
      if (h === victim && killedAt) return `${h.name} dead`;
      const names = [...original, ...recreated].filter((p) => p.node === h.name).map((p) => p.name);
      const ready = names.filter((n) => isReady(tracker, n)).length;
      return `${h.name} ${ready}/${names.length}`;
    });
    bench.log(`${Math.round((Date.now() - t0) / 1000)} s [${phase}]: ready ${per.join(', ')}`);
  }, 10_000);
  let stranded: string[] = [];
  try {
    bench.log(
      `creating ${total} pods (${perHost} on each of ${bf.hosts.length} hosts); ${victim.name} dies once ` +
        `${Math.round(killAt * 100)}% of all pods are ready`,
    );
    await createFleetPods(bf, tracker, original);
    // Mid-run: the victim dies whole once enough of the fleet is ready.
    while (original.filter((p) => isReady(tracker, p.name)).length < killAt * total) {
      bench.check();
      if (Date.now() > deadline) throw new Error('deadline before the kill');
      await sleep(100);
    }
    const victimPods = original.filter((p) => p.node === victim.name);
    const readyAtKill = victimPods.filter((p) => isReady(tracker, p.name)).length;
    phase = 'host killed';
    await victim.killHost();
    killedAt = Date.now();
    bench.log(
      `killed ${victim.name} (daemon, VMs, simulator) at ${fmtS(killedAt - t0)}; ${readyAtKill}/${victimPods.length} ` +
        'of its pods were ready; force-deleting them',
    );
    await forceDelete(
      bf,
      victimPods.map((p) => p.name),
    );
    victimPods.forEach((p, i) => {
      const spec = {
        name: `${p.name}-r`,
        node: (survivors[i % survivors.length] as FleetHost).name,
        vmName: p.vmName,
      };
      recreated.push(spec);
      expected.set(spec.name, spec);
    });
    phase = 'recreated';
    await createFleetPods(bf, tracker, recreated);
    recreatedAt = Date.now();
    bench.log(
      `recreated ${recreated.length} pods on ${survivors.map((h) => h.name).join(', ')} at ${fmtS(recreatedAt - t0)}`,
    );
    let lastList = Date.now();
    while ([...expected.keys()].some((n) => !isReady(tracker, n)) && Date.now() < deadline) {
      bench.check();
      for (const h of survivors)
        if (h.daemon.child.exitCode !== null || h.daemon.child.signalCode !== null)
          throw new Error(`vk-cocoon of ${h.name} exited; see ${h.logFile}`);
      if (Date.now() - lastList > 5000) {
        await tracker.relist().catch(() => {});
        lastList = Date.now();
      }
      await sleep(200);
    }
    stranded = [...expected.keys()].filter((n) => !isReady(tracker, n));
  } finally {
    clearInterval(progress);
  }
  const allReadyAt = Date.now();
  bench.log(
    `${expected.size - stranded.length}/${expected.size} ready at ${fmtS(allReadyAt - t0)}; converging`,
  );
  for (const n of stranded.slice(0, 10)) {
    const v = tracker.view(n);
    bench.log(`  stranded ${n} (${expected.get(n)?.node}): lifecycle ${v.lifecycle || '–'} ${v.message}`);
  }

  // Convergence: the daemons' pod writes quiet, no VM of a survivor still being made.
  await waitQuiet(audit, t0, { quietMs: 3000, capMs: 60_000 });
  let vms = await survivorVms(survivors);
  for (let i = 0; i < 60 && [...vms.values()].flat().some((v) => v.state === 'creating'); i++) {
    await sleep(500);
    vms = await survivorVms(survivors);
  }
  const t1 = Date.now();
  for (const m of meters) m.finish();
  await tracker.relist();
  const present = new Set(
    (await bf.core.listNamespacedPod({ namespace: bf.ns })).items.map((p) => p.metadata?.name ?? ''),
  );
  const lost: string[] = [];
  for (const [name, spec] of expected) {
    const onHost = vms.get(spec.node) ?? [];
    const v = tracker.view(name);
    if (!present.has(name)) lost.push(`${name}: pod gone`);
    else if (isReady(tracker, name) && !onHost.some((vm) => vm.id === v.vmId && vm.state === 'running'))
      lost.push(`${name}: ready but VM ${v.vmId} not running on ${spec.node}`);
  }
  const byName = new Map<string, string[]>();
  for (const [host, list] of vms)
    for (const vm of list)
      byName.set(vm.name, [...(byName.get(vm.name) ?? []), `${host}:${vm.id}(${vm.state})`]);
  const dups = [...byName.entries()].filter(([, where]) => where.length > 1);
  const claimed = new Set([...expected.values()].map((p) => `${p.node}/${p.vmName}`));
  const orphans = [...vms.entries()].flatMap(([host, list]) =>
    list.filter((vm) => !claimed.has(`${host}/${vm.name}`)).map((vm) => `${host}:${vm.name}`),
  );
  const failed = [...expected.keys()].filter((n) => tracker.view(n).lifecycle === 'failed');
  for (const l of lost.slice(0, 10)) bench.log(`  lost ${l}`);
  for (const [name, where] of dups.slice(0, 10)) bench.log(`  two VMs of ${name}: ${where.join(', ')}`);
  for (const o of orphans.slice(0, 10)) bench.log(`  orphan VM ${o}`);
  audit.poll();
  const writes = survivors.map((h) =>
    countWrites(selectWrites(audit.writes, { user: hostUser(h), from: t0, to: t1 })),
  );

  // Every pod deleted (graceful: each survivor's daemon removes the VM, then the pod).
  phase = 'delete';
  const delT0 = Date.now();
  await bf.core.deleteCollectionNamespacedPod({ namespace: bf.ns });
  const delDeadline = delT0 + (Number(process.env.VK_SOAK_DELETE_S) || 300) * 1000;
  let podsLeft = Number.POSITIVE_INFINITY;
  let lastLog = Date.now();
  while (Date.now() < delDeadline) {
    bench.check();
    podsLeft = (await bf.core.listNamespacedPod({ namespace: bf.ns })).items.length;
    if (podsLeft === 0) break;
    if (Date.now() - lastLog >= 10_000) {
      lastLog = Date.now();
      bench.log(`${Math.round((lastLog - t0) / 1000)} s [delete]: ${podsLeft} pods left`);
    }
    await sleep(1000);
  }
  const deleteMs = Date.now() - delT0;
  await sleep(2000); // a VM removal that follows its pod's
  const vmsLeft = [...(await survivorVms(survivors)).entries()].flatMap(([h, l]) =>
    l.map((v) => `${h}:${v.name}`),
  );
  bench.log(`delete: ${podsLeft} pods left after ${fmtS(deleteMs)}; ${vmsLeft.length} VMs left`);
  for (const v of vmsLeft.slice(0, 10)) bench.log(`  VM left ${v}`);
  printLogDigests(bench, bf.hosts);

  // The outcome.
  // Times on the apiserver's clock (the audit log): create answered → ready write answered.
  const api = auditPodTimes(audit.path, bf.ns);
  const readyWrite = (p: PodSpec) => apiReadyTimes(tracker.view(p.name), api.get(p.name));
  const latency = (specs: PodSpec[]) => {
    const out: number[] = [];
    for (const p of specs) {
      const a = readyWrite(p);
      if (a) out.push(a.latency);
    }
    return `${fmtN(pct(out, 50), 0)} / ${fmtN(pct(out, 99), 0)} ms (${out.length} pods)`;
  };
  const lastRecreatedReady = Math.max(
    ...recreated.map((p) => readyWrite(p)?.readyAt ?? Number.POSITIVE_INFINITY),
  );
  const cloneCalls = bf.hosts.flatMap((h) =>
    h === victim ? [] : h.simulator.calls().filter((c) => c.argv[0] === 'vm' && c.argv[1] === 'clone'),
  );
  const rows: string[][] = [
    [
      'pods created / force-deleted with the dead host / recreated',
      `${total} / ${recreated.length} / ${recreated.length}`,
    ],
    ['**pods stranded** (not ready by the deadline)', `**${stranded.length}** of ${expected.size}`],
    ['· of which lifecycle failed', String(failed.length)],
    ['**pods lost** (pod gone, or ready without its VM running)', `**${lost.length}**`],
    ['**identities with two VMs** (surviving hosts)', `**${dups.length}**`],
    ['VMs no expected pod claims (surviving hosts, after convergence)', String(orphans.length)],
    ['**VMs left after delete** (surviving hosts)', `**${vmsLeft.length}**`],
    ['pods left after delete', `${podsLeft} (after ${fmtS(deleteMs)})`],
    [
      'clone calls on the survivors / failed (faults)',
      `${cloneCalls.length} / ${cloneCalls.filter((c) => c.exit !== 0).length}`,
    ],
    ['host killed at', `${fmtS((killedAt ?? Number.NaN) - t0)} (${Math.round(killAt * 100)}% of pods ready)`],
    ['kill → every replacement ready', fmtS(lastRecreatedReady - (killedAt ?? Number.NaN))],
    [
      'created → ready p50 / p99 (apiserver clock), survivors’ own pods',
      latency(original.filter((p) => p.node !== victim.name)),
    ],
    ['created → ready p50 / p99 (apiserver clock), replacements', latency(recreated)],
    ...survivors.map((h, i) => {
      const m = meters[i] as HostMeter;
      const w = writes[i];
      return [
        `${h.name}: daemon CPU / peak RSS / writes (failed)`,
        `${fmtN(m.cpuMs, 0)} ms / ${fmtMiB(m.rss.maxKiB)} / ${w?.total ?? 0} (${w?.failed ?? 0})`,
      ];
    }),
  ];
  return {
    header:
      `soak: ${bf.hosts.length} hosts × ${perHost} clone pods; ${victim.name} killed for good; ` +
      `knobs ${JSON.stringify(SOAK_KNOBS)}; deadline ${deadlineS} s`,
    table: markdownTable(['fleet soak', 'outcome'], rows),
  };
}

function isReady(t: PodTracker, name: string): boolean {
  const v = t.pods.get(name);
  return v !== undefined && !v.deleted && settledReady(v);
}

/** Deletes the pods at once (grace 0), at most 50 in flight, and waits until they are gone. */
async function forceDelete(bf: BenchFleet, names: string[]): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(50, names.length) }, async () => {
      while (next < names.length) {
        const name = names[next++] as string;
        await bf.core
          .deleteNamespacedPod({ namespace: bf.ns, name, gracePeriodSeconds: 0 })
          .catch((e: unknown) => {
            if ((e as { code?: number }).code !== 404) throw e;
          });
      }
    }),
  );
  const gone = new Set(names);
  for (let i = 0; i < 120; i++) {
    const left = (await bf.core.listNamespacedPod({ namespace: bf.ns })).items.filter((p) =>
      gone.has(p.metadata?.name ?? ''),
    );
    if (left.length === 0) return;
    await sleep(500);
  }
  throw new Error('force-deleted pods still present after 60 s');
}

async function survivorVms(hosts: readonly FleetHost[]): Promise<Map<string, VmEntry[]>> {
  return new Map(await Promise.all(hosts.map(async (h) => [h.name, await listVms(h)] as const)));
}
