// `npm run cluster -- up|down|status [--dir DIR]`: a long-lived local control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) plus registry for development. `up` is idempotent and prints
// `KUBECONFIG=<path>` as its last line; `down` stops every process it started, by PID.
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { clusterHealthy, repoRoot } from './cluster.ts';
import { type Ground, readGround, startGround, stopGround } from './ground.ts';
import { isAlive } from './proc.ts';

const args = process.argv.slice(2);
const cmd = args[0] ?? 'status';
const dirFlag = args.indexOf('--dir');
const dir = dirFlag >= 0 && args[dirFlag + 1] ? args[dirFlag + 1]! : join(repoRoot, '.run', 'ground');

async function healthy(g: Ground): Promise<boolean> {
  return (await clusterHealthy(g.cluster)) && isAlive(g.registry.pid);
}

function describe(g: Ground): void {
  console.log(`kube-apiserver ${g.cluster.version} at ${g.cluster.url} (pid ${g.cluster.pids.apiserver})`);
  console.log(`etcd at 127.0.0.1:${g.cluster.etcdPort} (pid ${g.cluster.pids.etcd})`);
  console.log(
    `kube-controller-manager at https://127.0.0.1:${g.cluster.controllerManagerPort} (pid ${g.cluster.pids.controllerManager})`,
  );
  console.log(
    `kube-scheduler at https://127.0.0.1:${g.cluster.schedulerPort} (pid ${g.cluster.pids.scheduler})`,
  );
  console.log(
    `registry at ${g.registry.url} (pid ${g.registry.pid}); OCI_REGISTRY=${g.registry.hostPort}/cocoon`,
  );
  console.log(`kubectl: ${join(g.cluster.binDir, 'kubectl')}`);
  console.log(`KUBECONFIG=${g.cluster.kubeconfig}`);
}

switch (cmd) {
  case 'up': {
    const existing = readGround(dir);
    if (existing && (await healthy(existing))) {
      describe(existing);
      break;
    }
    if (existing) await stopGround(existing);
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    const g = await startGround(dir, { detached: true, log: (l) => console.log(`cluster: ${l}`) });
    describe(g);
    break;
  }
  case 'down': {
    const g = readGround(dir);
    if (g) await stopGround(g);
    rmSync(dir, { recursive: true, force: true });
    console.log(g ? 'cluster: stopped' : 'cluster: nothing running');
    break;
  }
  case 'status': {
    const g = readGround(dir);
    if (!g) {
      console.log('cluster: not running');
      process.exit(1);
    }
    console.log(`cluster: ${(await healthy(g)) ? 'healthy' : 'unhealthy'}`);
    describe(g);
    break;
  }
  default:
    console.error('usage: npm run cluster -- up|down|status [--dir DIR]');
    process.exit(2);
}
