// `npm run demo`: vk-cocoon on embedded defaults. Brings up the local control plane and the
// registry (ground/), a cocoon simulator root with example snapshots, runs the daemon
// against them, creates three example VM pods (Linux clone, Firecracker clone, Windows clone)
// and shows their state live until Ctrl-C.
//
//   npm run demo                  live table (a line per change when stdout is not a terminal)
//   npm run demo -- --check       headless: until every pod is `ready` (or failed, or the
//                                 timeout), one summary line, exit 0/1
//   --timeout <s>                 bound of --check (default 180, or VK_DEMO_TIMEOUT_SECONDS)
//   --hosts <n>                   a fleet of n hosts (ground/fleet.ts; default 1, today's single
//                                 node cocoon-pool): nodes cocoon-pool-1..n, each with its own
//                                 simulator root and loopback IP, and 2 pods per host (the three
//                                 examples' kinds in turn, two consecutive ones per host), each
//                                 pinned to its host with spec.nodeName; --check
//                                 passes when every pod is `ready` on its own host
//
// However it ends (Ctrl-C, SIGTERM, an error, a crash), every process it started is stopped:
// they are all in its PID registry (ground/proc.ts), including the simulator's stand-ins.
// VK_DEMO_FAIL_AT=ground|daemon|pods throws at that point of the start-up (tests of that path);
// VK_DEMO_SECONDS=<n> ends an interactive demo after n seconds.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { CoreV1Api, V1Pod } from '@kubernetes/client-node';
import { type Daemon, startDaemon } from '../ground/daemon.ts';
import { type Fleet, startFleet, stopFleet } from '../ground/fleet.ts';
import { type Ground, startGround, stopGround } from '../ground/ground.ts';
import { adminClients, vmPod } from '../ground/kube.ts';
import { type EndReason, installTeardown, openPidRegistry } from '../ground/proc.ts';
import { newSimRoot, type SimRoot } from '../sim/client.ts';

const NODE = 'cocoon-pool';
const NAMESPACE = 'demo';
const LIFECYCLE = 'vm.cocoonstack.io/lifecycle-state';
const LIFECYCLE_MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';

const USAGE = 'usage: npm run demo [-- [--hosts <n>] [--check [--timeout <seconds>]]]';
const argv = process.argv.slice(2);
if (argv.includes('--help') || argv.includes('-h')) {
  process.stdout.write(
    [
      USAGE,
      '  --check          headless: exit 0 once every pod is ready, 1 on a failed pod, the timeout or an error',
      '  --timeout <s>    bound of --check (default 180, or VK_DEMO_TIMEOUT_SECONDS)',
      '  --hosts <n>      n vk-cocoon hosts (nodes cocoon-pool-1..n), 2 pods pinned to each (default 1:',
      '                   one node, cocoon-pool, and the three example pods)',
      '',
    ].join('\n'),
  );
  process.exit(0);
}
const check = argv.includes('--check');
const flagValue = (flag: string) => (argv.includes(flag) ? argv[argv.indexOf(flag) + 1] : undefined);
const timeoutS = Number(flagValue('--timeout') ?? process.env.VK_DEMO_TIMEOUT_SECONDS ?? (check ? 180 : 0));
const hostsArg = flagValue('--hosts');
const hosts = hostsArg === undefined ? 1 : Number(hostsArg);
const valueFlags = ['--timeout', '--hosts'];
if (
  argv.some(
    (a, i) => a !== '--check' && !valueFlags.includes(a) && !valueFlags.includes(argv[i - 1] ?? ''),
  ) ||
  !Number.isInteger(hosts) ||
  hosts < 1 ||
  hosts > 253
) {
  process.stderr.write(`${USAGE}\n`);
  process.exit(2);
}
const multi = hosts > 1;
const failAt = process.env.VK_DEMO_FAIL_AT ?? '';
const live = !check && process.stdout.isTTY === true;

const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1);
const say = (s: string) => process.stdout.write(`demo: ${s}\n`);

const dir = mkdtempSync(join(tmpdir(), 'vk-demo-'));
const registry = openPidRegistry(join(dir, 'pids'));
say(`work dir ${dir}`);

/** The example pods: name and the annotations that make each a different kind of clone. */
const kinds: [string, Record<string, string>][] = [
  ['linux-0', { 'cocoonset.cocoonstack.io/image': 'demo/ubuntu' }],
  [
    'firecracker-0',
    { 'cocoonset.cocoonstack.io/image': 'demo/ubuntu-fc', 'vm.cocoonstack.io/backend': 'firecracker' },
  ],
  ['windows-0', { 'cocoonset.cocoonstack.io/image': 'demo/win11', 'cocoonset.cocoonstack.io/os': 'windows' }],
];

/** The pods and their nodes: the three examples on NODE; with --hosts n, 2 per host, the kinds
 * in turn (linux-0, firecracker-0, windows-0, linux-1, ...), pods 2h and 2h+1 on host h (so
 * hosts get different kinds). */
const nodeNames = multi ? Array.from({ length: hosts }, (_, i) => `${NODE}-${i + 1}`) : [NODE];
const examples: [string, Record<string, string>, string][] = Array.from(
  { length: multi ? 2 * hosts : kinds.length },
  (_, i) => {
    const [kind, ann] = kinds[i % kinds.length] as [string, Record<string, string>];
    const name = `${kind.replace(/-0$/, '')}-${Math.floor(i / kinds.length)}`;
    return [name, ann, nodeNames[multi ? Math.floor(i / 2) : 0] as string];
  },
);

// Everything started so far; the teardown stops what is set, then the PID registry catches the
// rest (a half-started ground, the simulator's processes, whatever a crash left behind).
let ground: Ground | undefined;
let sim: SimRoot | undefined;
let daemon: Daemon | undefined;
let fleet: Fleet | undefined;
let stopping = false;

const end = installTeardown(
  async (why: EndReason) => {
    stopping = true;
    if (why.kind === 'signal') say(`${why.signal}: stopping`);
    if (check && why.kind !== 'done') {
      const cause = why.kind === 'signal' ? `interrupted by ${why.signal}` : firstLine(why.error);
      say(`check FAILED: ${cause} after ${elapsed()}s`);
    } else if (why.kind === 'error') {
      say(`FAILED: ${firstLine(why.error)}`);
    }
    say('cleaning up');
    if (daemon) await Promise.race([daemon.stop().catch(() => null), sleep(15_000)]);
    await sim?.cleanup({ keepDir: true }).catch(() => {});
    if (fleet) await stopFleet(fleet).catch(() => {});
    if (ground) await stopGround(ground).catch(() => {});
    // Anything still running (a half-started ground included) is stopped by installTeardown
    // through the registry, before the process exits; the work dir goes with it unless the
    // run failed (then it holds the logs).
    const ok = why.kind === 'done' ? why.code === 0 : why.kind === 'signal' && !check;
    if (ok) process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    else say(`logs kept in ${dir} (${multi ? 'fleet/<node>/vk-cocoon.log' : 'vk-cocoon.log'}, ground/)`);
    // An interactive demo stopped with Ctrl-C ends normally.
    return why.kind === 'signal' && !check ? 0 : undefined;
  },
  { registry, log: (l) => say(l) },
);

function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '';
}

/** Throws at the named start-up point when VK_DEMO_FAIL_AT asks for it (tests). */
function failpoint(name: string): void {
  if (failAt === name)
    throw new Error(`VK_DEMO_FAIL_AT=${name}: failing on purpose after the ${name} started`);
}

/** Parks the start-up once the teardown has begun: nothing new may be started then. */
async function proceed(): Promise<void> {
  if (stopping) await new Promise(() => {});
}

interface Row {
  name: string;
  node: string;
  /** Bound to the node the demo pinned it to. */
  onItsNode: boolean;
  phase: string;
  ready: string;
  lifecycle: string;
  step: string;
  postClone: string;
  ip: string;
  vm: string;
  message: string;
}

function rowOf(name: string, node: string, p: V1Pod | undefined): Row {
  const a = p?.metadata?.annotations ?? {};
  const cond = (t: string) => p?.status?.conditions?.find((c) => c.type === t);
  const readiness = cond('vm.cocoonstack.io/Readiness');
  return {
    name,
    node: p?.spec?.nodeName ?? '',
    onItsNode: p?.spec?.nodeName === node,
    phase: p?.status?.phase ?? (p ? '' : 'missing'),
    ready: cond('Ready')?.status === 'True' ? 'yes' : 'no',
    lifecycle: a[LIFECYCLE] ?? '',
    step: readiness?.reason ?? '',
    postClone: a['vm.cocoonstack.io/post-clone-state'] ?? '',
    ip: p?.status?.podIP ?? '',
    vm: (a['vm.cocoonstack.io/id'] ?? '').slice(0, 10),
    message: a[LIFECYCLE_MESSAGE] || readiness?.message || '',
  };
}

const head = [
  'POD',
  ...(multi ? ['NODE'] : []),
  'PHASE',
  'READY',
  'LIFECYCLE',
  'STEP',
  'POST-CLONE',
  'IP',
  'VM ID',
];
const cells = (r: Row) => [
  r.name,
  ...(multi ? [r.node] : []),
  r.phase,
  r.ready,
  r.lifecycle,
  r.step,
  r.postClone,
  r.ip,
  r.vm,
];

function renderTable(rows: Row[], g: Ground): void {
  const body = rows.map(cells);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ');
  process.stdout.write(
    [
      '\x1b[H\x1b[J',
      `vk-cocoon demo: ${multi ? `${hosts} nodes ${nodeNames[0]}..${nodeNames.at(-1)}` : `node ${NODE}`}, ${elapsed()}s\n\n`,
      `${line(head)}\n${body.map(line).join('\n')}\n\n`,
      `KUBECONFIG=${g.cluster.kubeconfig}\n`,
      `kubectl: ${join(g.cluster.binDir, 'kubectl')}  (try: -n ${NAMESPACE} exec linux-0 -- hostname)\n`,
      `vk-cocoon log: ${multi ? join(dir, 'fleet', '<node>', 'vk-cocoon.log') : join(dir, 'vk-cocoon.log')}\n`,
      'Ctrl-C to stop and clean up.\n',
    ].join(''),
  );
}

/** Not a terminal (or --check): one line per pod whenever its row changes. */
const lastLine = new Map<string, string>();
function renderChanges(rows: Row[]): void {
  for (const r of rows) {
    const text = [
      multi ? `node=${r.node || '-'}` : '',
      `phase=${r.phase || '-'}`,
      `ready=${r.ready}`,
      `lifecycle=${r.lifecycle || '-'}`,
      r.step ? `step=${r.step}` : '',
      r.postClone ? `post-clone=${r.postClone}` : '',
      r.ip ? `ip=${r.ip}` : '',
      r.vm ? `vm=${r.vm}` : '',
    ]
      .filter(Boolean)
      .join(' ');
    if (lastLine.get(r.name) === text) continue;
    lastLine.set(r.name, text);
    say(`[${elapsed().padStart(6)}s] ${r.name.padEnd(14)} ${text}`);
  }
}

async function snapshot(core: CoreV1Api): Promise<Row[]> {
  const list = await core.listNamespacedPod({ namespace: NAMESPACE });
  const byName = new Map(list.items.map((p) => [p.metadata?.name ?? '', p]));
  return examples.map(([name, , node]) => rowOf(name, node, byName.get(name)));
}

function summary(rows: Row[]): { passed: boolean; done: boolean; text: string } {
  const ready = rows.filter((r) => r.lifecycle === 'ready' && r.onItsNode);
  const failed = rows.filter((r) => r.lifecycle === 'failed' || r.phase === 'Failed');
  const notReady = rows
    .filter((r) => r.lifecycle !== 'ready' || !r.onItsNode)
    .map(
      (r) =>
        `${r.name} lifecycle=${r.lifecycle || '(none)'}${r.onItsNode ? '' : ` node=${r.node || '(none)'}`}${r.message ? ` (${r.message})` : ''}`,
    );
  return {
    passed: ready.length === rows.length,
    done: ready.length + failed.length === rows.length,
    text: `${ready.length}/${rows.length} pods ready; ${notReady.join(', ')}`,
  };
}

async function main(): Promise<void> {
  say('starting the local control plane (the first run builds the Kubernetes binaries: minutes)');
  ground = await startGround(join(dir, 'ground'), { log: (l) => say(l) });
  const g = ground;
  failpoint('ground');
  await proceed();

  // Clones take a moment and Windows guests get their DHCP lease after a few seconds, as on a
  // real host.
  const knobs = { latency: { 'vm clone': 800 }, dhcp: { vms: [{ match: 'win', leaseDelayMs: 6000 }] } };
  const ubuntu = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';
  const fixtures = async (s: SimRoot) => {
    await s.fixtureSnapshot('demo/ubuntu', { backend: 'cloud-hypervisor', os: 'linux', image: ubuntu });
    await s.fixtureSnapshot('demo/ubuntu-fc', { backend: 'firecracker', os: 'linux', image: ubuntu });
    await s.fixtureSnapshot('demo/win11', {
      backend: 'cloud-hypervisor',
      os: 'windows',
      image: 'https://images.example/win11.qcow2',
    });
  };
  if (multi) {
    // Every host's daemon, simulator server and VM stand-ins are in this run's PID registry
    // (recorded or carrying its marker), also while the fleet is half started.
    fleet = await startFleet({
      ground: g,
      hosts,
      dir: join(dir, 'fleet'),
      namePrefix: `${NODE}-`,
      knobs,
      env: { VK_LOG_LEVEL: 'info' },
      log: (l) => say(l),
    });
    await proceed();
    await Promise.all(fleet.hosts.map((h) => fixtures(h.simulator)));
    say(
      `${hosts} vk-cocoon hosts running: ${fleet.hosts.map((h) => `${h.name} ${h.ip}:${h.kubeletPort}`).join(', ')}`,
    );
  } else {
    sim = await newSimRoot({ parent: dir, knobs });
    await fixtures(sim);
    await proceed();

    const logFile = join(dir, 'vk-cocoon.log');
    daemon = await startDaemon({
      cluster: g.cluster,
      nodeName: NODE,
      cocoonBin: sim.cocoonBin,
      rootDir: sim.root,
      leasesPath: sim.leasesPath,
      logFile,
      env: { ...sim.env(), VK_LOG_LEVEL: 'info' },
    });
    say(`vk-cocoon running (pid ${daemon.pid}, kubelet API :${daemon.kubeletPort}); log: ${logFile}`);
  }
  failpoint('daemon');
  await proceed();

  const { core } = adminClients(g.cluster);
  await core.createNamespace({ body: { metadata: { name: NAMESPACE } } });
  for (const [name, ann, node] of examples) {
    await core.createNamespacedPod({
      namespace: NAMESPACE,
      body: vmPod(name, node, {
        'vm.cocoonstack.io/name': `vk-demo-${name}`,
        'cocoonset.cocoonstack.io/managed': 'true',
        ...ann,
      }),
    });
  }
  say(
    multi
      ? `created ${examples.map(([n, , node]) => `${n} on ${node}`).join(', ')} in namespace ${NAMESPACE}`
      : `created ${examples.map(([n]) => n).join(', ')} in namespace ${NAMESPACE} on node ${NODE}`,
  );
  if (!live) {
    say(`KUBECONFIG=${g.cluster.kubeconfig}`);
    if (!check) say('Ctrl-C to stop and clean up');
  }
  failpoint('pods');

  const deadline = timeoutS > 0 ? t0 + timeoutS * 1000 : Number.POSITIVE_INFINITY;
  const interactiveEnd = process.env.VK_DEMO_SECONDS
    ? Date.now() + Number(process.env.VK_DEMO_SECONDS) * 1000
    : Number.POSITIVE_INFINITY;
  let pollErrors = 0;
  for (;;) {
    await proceed();
    let rows: Row[];
    try {
      rows = await snapshot(core);
      pollErrors = 0;
    } catch (err) {
      // One failed poll is not fatal (a slow apiserver); a run of them is.
      if (++pollErrors >= 20) throw err;
      await sleep(500);
      continue;
    }
    if (live) renderTable(rows, g);
    else renderChanges(rows);
    if (check) {
      const s = summary(rows);
      if (s.passed) {
        const where = multi ? ` on ${hosts} hosts` : '';
        say(`check passed: ${rows.length}/${rows.length} pods ready${where} in ${elapsed()}s`);
        return void (await end({ kind: 'done', code: 0 }));
      }
      if (s.done || Date.now() > deadline) {
        const why = s.done ? 'a pod failed' : `timed out after ${timeoutS}s`;
        say(`check FAILED: ${why}: ${s.text}`);
        return void (await end({ kind: 'done', code: 1 }));
      }
    } else if (Date.now() > interactiveEnd) {
      return void (await end({ kind: 'done', code: 0 }));
    }
    await sleep(500);
  }
}

// installTeardown prints the error (with its stack) and stops everything.
main().catch((err: unknown) => void end({ kind: 'error', error: err }));
