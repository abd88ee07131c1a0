// `npm run cluster -- up|down|status [--dir DIR] [--hosts N]`: a long-lived local control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) plus registry for development,
// and with `--hosts N` a fleet of N vk-cocoon hosts against it (ground/fleet.ts: nodes
// cocoon-pool-1..N, each with its own simulator root and loopback IP). `up` is idempotent (a
// healthy ground is kept; its fleet is replaced when N differs) and prints `KUBECONFIG=<path>`
// as its last line; `down` stops every process it started, hosts first, by PID.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { clusterHealthy, repoRoot } from './cluster.ts';
import { type FleetRecord, fleetRecord, startFleet, stopFleetRecord } from './fleet.ts';
import { type Ground, readGround, startGround, stopGround } from './ground.ts';
import { isAlive, procStart } from './proc.ts';

const USAGE = 'usage: npm run cluster -- up|down|status [--dir DIR] [--hosts N]';
const args = process.argv.slice(2);
const cmd = args[0] ?? 'status';
if (cmd === '--help' || cmd === '-h' || cmd === 'help') {
  console.log(USAGE);
  console.log(
    '  up        start the ground (and, with --hosts N, N vk-cocoon hosts); prints KUBECONFIG=<path> last',
  );
  console.log('  down      stop the hosts and the ground');
  console.log('  status    health of the ground and its hosts (exit 1 when not running)');
  console.log('  --dir     the ground directory (default .run/ground)');
  console.log('  --hosts   N vk-cocoon hosts, nodes cocoon-pool-1..N (up only; default: none)');
  process.exit(0);
}
const flag = (name: string) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const dir = flag('--dir') ?? join(repoRoot, '.run', 'ground');
const hostsFlag = flag('--hosts');
const hosts = hostsFlag === undefined ? 0 : Number(hostsFlag);
if (hostsFlag !== undefined && (cmd !== 'up' || !Number.isInteger(hosts) || hosts < 1 || hosts > 253)) {
  console.error(`${USAGE}\n--hosts takes an integer 1..253 and goes with up`);
  process.exit(2);
}
const fleetFile = join(dir, 'fleet.json');

function readFleet(): FleetRecord | undefined {
  return existsSync(fleetFile) ? (JSON.parse(readFileSync(fleetFile, 'utf8')) as FleetRecord) : undefined;
}

const hostAlive = (h: FleetRecord['hosts'][number]) => h.start !== undefined && procStart(h.pid) === h.start;

async function healthy(g: Ground): Promise<boolean> {
  return (await clusterHealthy(g.cluster)) && isAlive(g.registry.pid);
}

function describe(g: Ground, f: FleetRecord | undefined): void {
  console.log(`kube-apiserver ${g.cluster.version} at ${g.cluster.url} (pid ${g.cluster.pids.apiserver})`);
  console.log(`etcd at 127.0.0.1:${g.cluster.etcdPort} (pid ${g.cluster.pids.etcd})`);
  console.log(
    `kube-controller-manager at https://127.0.0.1:${g.cluster.controllerManagerPort} (pid ${g.cluster.pids.controllerManager})`,
  );
  console.log(
    `kube-scheduler at https://127.0.0.1:${g.cluster.schedulerPort} (pid ${g.cluster.pids.scheduler})`,
  );
  console.log(
    `registry ${g.registry.kind} (${g.registry.version}) at ${g.registry.url} (pid ${g.registry.pid}); OCI_REGISTRY=${g.registry.hostPort}/cocoon`,
  );
  if (f) {
    console.log(
      `fleet: ${f.hosts.length} hosts on ${f.subnet}.0/24, peer port ${f.peerPort}, OCI_REGISTRY=${f.registry}`,
    );
    for (const h of f.hosts)
      console.log(
        `  node ${h.name} at ${h.ip} kubelet :${h.kubeletPort} (pid ${h.pid}${hostAlive(h) ? '' : ', NOT running'}); log ${h.logFile}`,
      );
  }
  console.log(`kubectl: ${join(g.cluster.binDir, 'kubectl')}`);
  console.log(`KUBECONFIG=${g.cluster.kubeconfig}`);
}

async function downFleet(): Promise<boolean> {
  const f = readFleet();
  if (f) await stopFleetRecord(f);
  rmSync(fleetFile, { force: true });
  rmSync(join(dir, 'fleet'), { recursive: true, force: true });
  return f !== undefined;
}

switch (cmd) {
  case 'up': {
    let g = readGround(dir);
    let f = readFleet();
    if (!g || !(await healthy(g))) {
      await downFleet();
      if (g) await stopGround(g);
      rmSync(dir, { recursive: true, force: true });
      mkdirSync(dir, { recursive: true });
      g = await startGround(dir, { detached: true, log: (l) => console.log(`cluster: ${l}`) });
      f = undefined;
    }
    const want = hostsFlag === undefined ? (f?.hosts.length ?? 0) : hosts;
    if (f && (f.hosts.length !== want || !f.hosts.every(hostAlive))) {
      console.log(`cluster: replacing the fleet of ${f.hosts.length} hosts`);
      await downFleet();
      f = undefined;
    }
    if (want > 0 && !f) {
      const fleet = await startFleet({
        ground: g,
        hosts: want,
        dir: join(dir, 'fleet'),
        namePrefix: 'cocoon-pool-',
        detached: true,
        log: (l) => console.log(`cluster: ${l}`),
      });
      f = fleetRecord(fleet);
      writeFileSync(fleetFile, JSON.stringify(f, null, 2));
    }
    describe(g, f);
    break;
  }
  case 'down': {
    const g = readGround(dir);
    const hadFleet = await downFleet();
    if (g) await stopGround(g);
    rmSync(dir, { recursive: true, force: true });
    console.log(g || hadFleet ? 'cluster: stopped' : 'cluster: nothing running');
    break;
  }
  case 'status': {
    const g = readGround(dir);
    if (!g) {
      console.log('cluster: not running');
      process.exit(1);
    }
    const f = readFleet();
    const ok = (await healthy(g)) && (f?.hosts.every(hostAlive) ?? true);
    console.log(`cluster: ${ok ? 'healthy' : 'unhealthy'}`);
    describe(g, f);
    break;
  }
  default:
    console.error(USAGE);
    process.exit(2);
}
