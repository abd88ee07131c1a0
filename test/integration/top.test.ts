// `kubectl top` through a real metrics-server (issue 12): metrics-server v0.8 built from the
// Go module proxy (scripts/metricsserverbin.sh) runs against a private ground's apiserver with
// its own service account and the release manifests' RBAC, is registered as the APIService
// v1beta1.metrics.k8s.io (ground/metrics-server.ts), and scrapes our kubelet API's
// /metrics/resource with its service-account token, which the daemon checks with a
// TokenReview and a SubjectAccessReview on nodes/metrics (VK_KUBELET_AUTH stays webhook).
// `kubectl top pod` / `kubectl top node` (the ground's kubectl, admin kubeconfig) then print
// values for the VM pods that follow what the simulator's stand-ins use (the `standin` knob:
// CPU burnt, memory held; docs/simulator.md "Stand-ins").
//
// A private ground: the APIService and its Service are cluster-wide, and metrics-server scrapes
// every node of the cluster on the one kubelet port it is given (this world's daemon's).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { kubectl } from '../../ground/cluster.ts';
import { startDaemon } from '../../ground/daemon.ts';
import { podReady, vmPod, waitForPod } from '../../ground/kube.ts';
import {
  type MetricsServer,
  parseTop,
  startMetricsServer,
  type TopRow,
} from '../../ground/metrics-server.ts';
import { freePort, waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { fixture } from './helpers.ts';

const SNAPSHOT = 'acme/agent';
const MiB = 1024 * 1024;
// The daemon is started by the test itself, on a kubelet port chosen here and given to
// metrics-server (--kubelet-port): the world's default is a port of the daemon's own choosing.
const world = useWorld({ privateGround: true, deferDaemon: true });
let w: World;
let ms: MetricsServer | undefined;
/** The hot pod's stand-in burns this much CPU and holds this much memory from boot on. */
const HOT = { cpuMillicores: 300, rssMiB: 256 };
/** What the cold pod's stand-in is then asked for. */
const WARMED = { cpuMillicores: 250, rssMiB: 192 };

before(async () => {
  w = await world();
  await fixture(w, SNAPSHOT, 'linux');
  // Set before the VMs boot: their stand-ins are the node ones, which follow the knob.
  await w.simulator.setKnobs({ standin: { vms: [{ match: '-hot$', ...HOT }] } });
  const kubeletPort = await freePort();
  w.daemon = await startDaemon({
    cluster: w.ground.cluster,
    nodeName: w.nodeName,
    cocoonBin: w.cocoonBin,
    rootDir: w.simRoot,
    leasesPath: w.leasesPath,
    logFile: w.logFile,
    // A node of a size kubectl top can show a non-zero MEMORY% for (the ground's default
    // advertises 2 TiB so admission never refuses a simulated VM); room for its few VMs.
    env: { ...w.simulator.env(), VK_NODE_CPU: '64', VK_NODE_MEM: '8Gi' },
    kubeletPort,
  });
  ms = await startMetricsServer({
    cluster: w.ground.cluster,
    dir: join(dirname(w.logFile), 'metrics-server'),
    kubeletPort,
    resolution: '15s',
  });
});

function vmName(pod: string): string {
  return `vk-${w.namespace}-${pod}`;
}

function kubeletGet(path: string, token?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: w.daemon.kubeletPort,
        path,
        rejectUnauthorized: false,
        headers: token ? { authorization: `Bearer ${token}` } : {},
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** `kubectl top pod -n <ns>` until `check` accepts its rows (it fails while metrics are missing). */
async function topPods(what: string, check: (rows: Map<string, TopRow>) => boolean, timeoutMs = 120_000) {
  let text = '';
  let rows = new Map<string, TopRow>();
  await waitFor(
    `kubectl top pod: ${what} (last: ${JSON.stringify(text)})`,
    async () => {
      text = await kubectl(w.ground.cluster, ['top', 'pod', '-n', w.namespace]).catch(
        (e: Error) => e.message,
      );
      try {
        rows = new Map(parseTop(text).map((r) => [r.name, r]));
      } catch {
        return false;
      }
      return check(rows);
    },
    timeoutMs,
    2000,
  );
  return { text, rows };
}

describe('kubectl top through metrics-server', () => {
  after(async () => {
    await ms?.stop();
  });

  test('VM pods become ready on the node metrics-server scrapes', async () => {
    for (const pod of ['hot', 'cold']) {
      await w.core.createNamespacedPod({
        namespace: w.namespace,
        body: vmPod(pod, w.nodeName, {
          'vm.cocoonstack.io/name': vmName(pod),
          'cocoonset.cocoonstack.io/image': SNAPSHOT,
          'cocoonset.cocoonstack.io/managed': 'true',
        }),
      });
    }
    for (const pod of ['hot', 'cold']) await waitForPod(w.core, w.namespace, pod, 'Ready', podReady, 60_000);
  });

  test("VM CPU comes from each VM's cgroup scope (the simulator's tree, VK_CGROUP_ROOT), not /proc", async () => {
    // The daemon's shared sample is up to 2 s old: the new VMs are in the next one.
    let text = '';
    await waitFor(
      'both VMs in a stats sample',
      async () => {
        text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
        return (
          /^cocoon_vk_vm_cpu_source\{source="(cgroup|proc)"\} [1-9]/m.test(text) &&
          /^cocoon_vk_vm_cpu_source\{[^}]*\} 2$/m.test(text)
        );
      },
      15_000,
      250,
    );
    assert.match(text, /^cocoon_vk_vm_cpu_source\{source="cgroup"\} 2$/m, 'hot and cold read from cpu.stat');
    assert.match(text, /^cocoon_vk_vm_cpu_source\{source="proc"\} 0$/m);
  });

  test('metrics-server reaches our kubelet API with its own token: TokenReview + SubjectAccessReview', async () => {
    assert.ok(ms);
    // The token metrics-server presents is accepted for nodes/metrics (and nodes/stats is not in
    // its role), in the bare and trailing-slash forms; others are refused.
    const token = ms.token;
    for (const path of ['/metrics/resource', '/metrics/resource/']) {
      let last = { status: 0, body: '' };
      // The daemon's shared sample is up to 2 s old: the new VMs are in the next one.
      await waitFor(
        `${path} with the pods`,
        async () => {
          last = await kubeletGet(path, token);
          assert.equal(last.status, 200, `${path}: ${last.body}`);
          return /container_cpu_usage_seconds_total\{[^}]*pod="hot"/.test(last.body);
        },
        10_000,
        500,
      );
    }
    const stats = await kubeletGet('/stats/summary/', ms.token);
    assert.equal(stats.status, 403, 'system:metrics-server grants nodes/metrics, not nodes/stats');
    assert.match(stats.body, /user=system:serviceaccount:kube-system:metrics-server/);
    assert.equal((await kubeletGet('/metrics/resource', w.ground.cluster.tokens.nobody)).status, 403);
    assert.equal((await kubeletGet('/metrics/resource')).status, 401);
    assert.equal((await kubeletGet('/stats/summary/', w.ground.cluster.tokens.admin)).status, 200);
    // And metrics-server's own scrapes (with that token) succeed and carry both pods.
    const logFile = ms.logFile;
    await waitFor(
      `a metrics-server scrape with both pods (log: ${logFile})`,
      async () => /"Scrape finished".*podCount=2/.test(readFileSync(logFile, 'utf8')),
      40_000,
      1000,
    );
    assert.doesNotMatch(readFileSync(logFile, 'utf8'), /Failed to scrape|Unauthorized|Forbidden/);
  });

  test('kubectl top pod prints CPU and memory that follow the stand-ins', async (t) => {
    const { text, rows } = await topPods(
      'hot and cold listed, the hot one burning',
      (r) => r.has('hot') && r.has('cold') && (r.get('hot')?.cpuMillicores ?? 0) >= 100,
    );
    t.diagnostic(`kubectl top pod -n ${w.namespace}:\n${text.trimEnd()}`);
    console.log(`# kubectl top pod -n ${w.namespace}\n${text.trimEnd().replace(/^/gm, '# ')}`);
    const hot = rows.get('hot') as TopRow;
    const cold = rows.get('cold') as TopRow;
    // 300m asked; a loaded 2-core host may give it less, never much more.
    assert.ok(hot.cpuMillicores >= 100 && hot.cpuMillicores <= 450, `hot CPU ${hot.cpuMillicores}m`);
    assert.ok(cold.cpuMillicores < 60, `cold CPU ${cold.cpuMillicores}m`);
    assert.ok(hot.memoryBytes >= HOT.rssMiB * MiB, `hot memory ${hot.memoryBytes / MiB} MiB`);
    assert.ok(
      hot.memoryBytes - cold.memoryBytes >= (HOT.rssMiB - 40) * MiB,
      `hot ${hot.memoryBytes / MiB} MiB vs cold ${cold.memoryBytes / MiB} MiB`,
    );
  });

  test('kubectl top node prints the node', async (t) => {
    let text = '';
    let row: TopRow | undefined;
    await waitFor(
      `kubectl top node ${w.nodeName}`,
      async () => {
        text = await kubectl(w.ground.cluster, ['top', 'node', w.nodeName]).catch((e: Error) => e.message);
        try {
          row = parseTop(text).find((r) => r.name === w.nodeName);
        } catch {
          return false;
        }
        return row !== undefined;
      },
      60_000,
      2000,
    );
    t.diagnostic(`kubectl top node ${w.nodeName}:\n${text.trimEnd()}`);
    console.log(`# kubectl top node ${w.nodeName}\n${text.trimEnd().replace(/^/gm, '# ')}`);
    assert.ok(row);
    // The node is the host: its busy CPU includes the hot stand-in, its memory everything.
    assert.ok(row.cpuMillicores > 0, `node CPU ${row.cpuMillicores}m`);
    assert.ok(row.memoryBytes > HOT.rssMiB * MiB, `node memory ${row.memoryBytes / MiB} MiB`);
    // kubectl's CPU% is the usage over the node's allocatable (VK_NODE_CPU=64 less the
    // reserve), cut to a whole percent: the figure the daemon advertised, not the host's.
    const alloc = String((await w.core.readNode({ name: w.nodeName })).status?.allocatable?.cpu ?? '');
    const allocMilli = alloc.endsWith('m') ? Number(alloc.slice(0, -1)) : Number(alloc) * 1000;
    assert.ok(allocMilli > 0 && allocMilli <= 64_000, `allocatable cpu ${alloc}`);
    const exact = (row.cpuMillicores * 100) / allocMilli;
    assert.ok(
      Math.abs((row.cpuPercent ?? -1) - exact) < 1,
      `CPU% ${row.cpuPercent} against ${exact.toFixed(2)} (${alloc})`,
    );
    assert.ok(row.memoryPercent !== undefined && row.memoryPercent > 0);
  });

  test('the values move with the stand-in: the cold pod asked to burn and hold memory shows it', async (t) => {
    const before = (await topPods('cold listed', (r) => r.has('cold'))).rows.get('cold') as TopRow;
    await w.simulator.setKnobs({
      standin: {
        vms: [
          { match: '-hot$', ...HOT },
          { match: '-cold$', ...WARMED },
        ],
      },
    });
    const { text, rows } = await topPods(
      `cold at >= 100m and >= +${WARMED.rssMiB - 40} MiB (was ${before.cpuMillicores}m, ${before.memoryBytes / MiB} MiB)`,
      (r) => {
        const c = r.get('cold');
        return (
          c !== undefined &&
          c.cpuMillicores >= 100 &&
          c.memoryBytes - before.memoryBytes >= (WARMED.rssMiB - 40) * MiB
        );
      },
    );
    t.diagnostic(`kubectl top pod -n ${w.namespace} after the knob change:\n${text.trimEnd()}`);
    console.log(`# kubectl top pod -n ${w.namespace} (cold warmed)\n${text.trimEnd().replace(/^/gm, '# ')}`);
    const cold = rows.get('cold') as TopRow;
    assert.ok(cold.cpuMillicores <= 400, `cold CPU ${cold.cpuMillicores}m`);
  });
});
