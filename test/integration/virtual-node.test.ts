// The virtual node against the real kube-apiserver: node registration and heartbeat, pods
// to VMs through the simulator, kubectl logs/exec through the apiserver (WebSocket proxied
// straight to us, and SPDY when the node does not declare ExtendWebSocketsToKubelet),
// graceful deletion, kubelet API authentication. The main world runs the daemon on its
// defaults for the client CA (VK_TLS_CLIENT_CA unset: the kubeconfig's cluster CA), which on
// the kubeadm-shaped ground is also the CA of the apiserver's kubelet client.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import { kubectl } from '../../ground/cluster.ts';
import { adminClients, podReady, vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { run, waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { CLIENT_CERT_REJECTED } from '../../src/kubelet/auth.ts';
import { fixture, inGuestPool } from './helpers.ts';

const SNAPSHOT = 'acme/agent';
// An empty value is "unset" for the daemon (src/config/env.ts): the client CA defaults to the
// kubeconfig's certificate-authority, whatever the ground's daemon defaults say.
const world = useWorld({ env: { VK_TLS_CLIENT_CA: '' } });
/** Pods of the concurrent create/delete test (VK_IT_PODS, default 100: at 200 it was the
 * suite's longest, CPU-bound job on 2 cores; the benchmarks take 300 and 1,000); its waits scale
 * with it (about 0.6 s per pod on 2 cores next to other test files; 2.4 s allowed). */
const IT_PODS = Number(process.env.VK_IT_PODS ?? 100);
const IT_WAIT_MS = 120_000 + IT_PODS * 2_400;
let w: World;

before(async () => {
  w = await world();
  await fixture(w, SNAPSHOT, 'linux');
});

function annotations(vmName: string): Record<string, string> {
  return {
    'vm.cocoonstack.io/name': vmName,
    'cocoonset.cocoonstack.io/image': SNAPSHOT,
    'cocoonset.cocoonstack.io/managed': 'true',
  };
}

async function simVms(): Promise<{ id: string; config: { name: string }; state: string }[]> {
  const out = (await w.sim(['vm', 'list', '-o', 'json'])).trim();
  return out.startsWith('[') ? JSON.parse(out) : [];
}

function kubeletGet(
  path: string,
  opts: { token?: string; cert?: string; key?: string } = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: w.daemon.kubeletPort,
        path,
        method: 'GET',
        rejectUnauthorized: false,
        headers: opts.token ? { authorization: `Bearer ${opts.token}` } : {},
        cert: opts.cert ? readFileSync(opts.cert) : undefined,
        key: opts.key ? readFileSync(opts.key) : undefined,
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

describe('node', () => {
  test('registers Ready with labels, taint, addresses and the daemon endpoint', async (t) => {
    const node = await w.core.readNode({ name: w.nodeName });
    const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
    assert.equal(ready?.status, 'True');
    assert.equal(ready?.reason, 'KubeletReady');
    assert.equal(node.metadata?.labels?.type, 'virtual-kubelet');
    assert.equal(node.metadata?.labels?.['cocoonstack.io/pool'], 'default');
    assert.ok(
      node.spec?.taints?.some(
        (x) => x.key === 'virtual-kubelet.io/provider' && x.value === 'cocoon' && x.effect === 'NoSchedule',
      ),
    );
    assert.equal(node.status?.addresses?.[0]?.type, 'InternalIP');
    assert.equal(node.status?.addresses?.[0]?.address, '127.0.0.1');
    assert.equal(node.status?.daemonEndpoints?.kubeletEndpoint?.Port, w.daemon.kubeletPort);
    assert.deepEqual([...(node.status?.declaredFeatures ?? [])], ['ExtendWebSocketsToKubelet']);
    const cap = node.status?.capacity ?? {};
    assert.equal(cap.pods, '256');
    // allocatable withholds 20 % of CPU
    const cpuCap = Number(cap.cpu) * 1000;
    assert.equal(node.status?.allocatable?.cpu, `${(cpuCap * 80) / 100}m`);
    t.diagnostic(`node created at ${node.metadata?.creationTimestamp?.toISOString()}`);
  });

  test('the Lease is owned by the node and its renewTime advances', async () => {
    const { coordination } = adminClients(w.ground.cluster);
    const first = await coordination.readNamespacedLease({ name: w.nodeName, namespace: 'kube-node-lease' });
    assert.equal(first.spec?.leaseDurationSeconds, 40);
    assert.equal(first.metadata?.ownerReferences?.[0]?.kind, 'Node');
    const renewed = (l: typeof first) => new Date(String(l.spec?.renewTime ?? 0)).getTime();
    const t1 = renewed(first);
    await waitFor(
      'lease renewTime to advance',
      async () => {
        const l = await coordination.readNamespacedLease({ name: w.nodeName, namespace: 'kube-node-lease' });
        return renewed(l) > t1;
      },
      25_000,
      500,
    );
  });

  test('a deleted node comes back', async () => {
    const before = await w.core.readNode({ name: w.nodeName });
    await w.core.deleteNode({ name: w.nodeName });
    await waitFor(
      'node to be re-created',
      async () => {
        try {
          const n = await w.core.readNode({ name: w.nodeName });
          return (
            n.metadata?.uid !== before.metadata?.uid &&
            n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true
          );
        } catch {
          return false;
        }
      },
      20_000,
      200,
    );
  });
});

describe('pods', () => {
  test('a VM pod reaches Running, serves kubectl logs and exec, and is deleted with its VM', async () => {
    const ns = w.namespace;
    await w.core.createNamespacedPod({
      namespace: ns,
      body: vmPod('agent-0', w.nodeName, annotations('vk-it-agent-0')),
    });
    const pod = await waitForPod(
      w.core,
      ns,
      'agent-0',
      'Running and Ready',
      (p) => p.status?.phase === 'Running' && podReady(p),
    );
    assert.ok(
      inGuestPool(w, pod.status?.podIP ?? ''),
      `${pod.status?.podIP} is a lease of the guest network's pool`,
    );
    const vms = await simVms();
    const vm = vms.find((v) => v.config.name === 'vk-it-agent-0');
    assert.ok(vm, 'the simulator holds the VM');
    assert.equal(pod.metadata?.annotations?.['vm.cocoonstack.io/id'], vm.id);

    const logs = await kubectl(w.ground.cluster, ['-n', ns, 'logs', 'agent-0']);
    assert.match(logs, /vk-it-agent-0/);
    const hi = await kubectl(w.ground.cluster, ['-n', ns, 'exec', 'agent-0', '--', 'echo', 'hi']);
    assert.equal(hi, 'hi\n');
    const echoed = await kubectl(
      w.ground.cluster,
      ['-n', ns, 'exec', '-i', 'agent-0', '--', 'cat'],
      'from stdin\n',
    );
    assert.equal(echoed, 'from stdin\n');
    await assert.rejects(kubectl(w.ground.cluster, ['-n', ns, 'exec', 'agent-0', '--', 'false']), /exited 1/);

    await kubectl(w.ground.cluster, ['-n', ns, 'delete', 'pod', 'agent-0', '--wait=true', '--timeout=30s']);
    await waitForPodGone(w.core, ns, 'agent-0');
    assert.equal(
      (await simVms()).some((v) => v.config.name === 'vk-it-agent-0'),
      false,
      'VM removed',
    );
  });

  test('the kubelet API rejects anonymous, wrong-CA and unauthorized callers and serves the apiserver', async () => {
    const pki = join(w.ground.cluster.dir, 'pki');
    assert.equal((await kubeletGet('/pods')).status, 401, 'anonymous');
    assert.equal(
      (await kubeletGet('/pods', { cert: join(pki, 'rogue-client.crt'), key: join(pki, 'rogue-client.key') }))
        .status,
      401,
      'client certificate from an untrusted CA',
    );
    assert.equal((await kubeletGet('/pods', { token: 'not-a-token' })).status, 401, 'unknown token');
    assert.equal(
      (await kubeletGet('/pods', { token: w.ground.cluster.tokens.nobody })).status,
      403,
      'authenticated but not authorized',
    );
    const viaCert = await kubeletGet('/pods', {
      cert: join(pki, 'kubelet-client.crt'),
      key: join(pki, 'kubelet-client.key'),
    });
    assert.equal(viaCert.status, 200, 'the apiserver kubelet-client certificate');
    assert.equal(JSON.parse(viaCert.body).kind, 'PodList');
    assert.equal(
      (await kubeletGet('/runningpods/', { token: w.ground.cluster.tokens.admin })).status,
      200,
      'admin token via TokenReview',
    );
    assert.equal((await kubeletGet('/healthz')).status, 200);
    assert.equal(
      (await kubeletGet('/nope', { token: w.ground.cluster.tokens.admin })).body,
      '404 request not found',
    );
  });

  test('a pod waiting for a mandatory ConfigMap stays Pending without a VM and starts when it appears', async () => {
    const ns = w.namespace;
    const body = vmPod('needs-cm', w.nodeName, annotations('vk-it-needs-cm'));
    body.spec!.containers[0]!.env = [
      { name: 'X', valueFrom: { configMapKeyRef: { name: 'late-cm', key: 'x' } } },
    ];
    await w.core.createNamespacedPod({ namespace: ns, body });
    await waitFor(
      'MandatoryConfigMapNotFound event',
      async () =>
        (
          await w.core.listNamespacedEvent({ namespace: ns, fieldSelector: 'involvedObject.name=needs-cm' })
        ).items.some((e) => e.reason === 'MandatoryConfigMapNotFound'),
      30_000,
      200,
    );
    assert.equal(
      (await simVms()).some((v) => v.config.name === 'vk-it-needs-cm'),
      false,
      'no VM while blocked',
    );
    await w.core.createNamespacedConfigMap({
      namespace: ns,
      body: { metadata: { name: 'late-cm' }, data: { x: '1' } },
    });
    await waitForPod(
      w.core,
      ns,
      'needs-cm',
      'Running once the ConfigMap exists',
      (p) => p.status?.phase === 'Running',
      30_000,
    );
    await w.core.deleteNamespacedPod({ namespace: ns, name: 'needs-cm' });
    await waitForPodGone(w.core, ns, 'needs-cm');
  });

  test('stats: /stats/summary lists the pod and /metrics/resource has timestamped samples', async () => {
    const ns = w.namespace;
    await w.core.createNamespacedPod({
      namespace: ns,
      body: vmPod('stats-0', w.nodeName, annotations('vk-it-stats-0')),
    });
    await waitForPod(w.core, ns, 'stats-0', 'Running', (p) => p.status?.phase === 'Running');
    const token = w.ground.cluster.tokens.metrics;
    const summary = await kubeletGet('/stats/summary', { token });
    assert.equal(summary.status, 200, summary.body);
    const doc = JSON.parse(summary.body) as {
      node: { nodeName: string };
      pods: { podRef: { name: string }; containers: { name: string }[] }[];
    };
    assert.equal(doc.node.nodeName, w.nodeName);
    const mine = doc.pods.find((p) => p.podRef.name === 'stats-0');
    assert.equal(mine?.containers[0]?.name, 'agent');
    const res = await kubeletGet('/metrics/resource', { token });
    assert.equal(res.status, 200);
    const sample = res.body
      .split('\n')
      .find((l) => l.startsWith('container_memory_working_set_bytes{') && l.includes('pod="stats-0"'));
    assert.ok(sample, res.body.slice(0, 500));
    assert.match(sample, / \d+ \d{13}$/, 'value and a millisecond timestamp');
    assert.equal((await kubeletGet('/stats/summary', { token: w.ground.cluster.tokens.nobody })).status, 403);
    await w.core.deleteNamespacedPod({ namespace: ns, name: 'stats-0' });
    await waitForPodGone(w.core, ns, 'stats-0');
  });

  test(`${IT_PODS} pods created and deleted concurrently: none left Terminating, no VM leaked, one VM per pod`, async (t) => {
    const ns = w.namespace;
    const n = IT_PODS;
    const names = Array.from({ length: n }, (_, i) => `many-${i}`);
    const t0 = Date.now();
    await Promise.all(
      names.map((name) =>
        w.core.createNamespacedPod({
          namespace: ns,
          body: vmPod(name, w.nodeName, annotations(`vk-it-${name}`)),
        }),
      ),
    );
    await waitFor(
      `${n} pods Running`,
      async () => {
        const list = await w.core.listNamespacedPod({ namespace: ns, labelSelector: undefined });
        return (
          list.items.filter((p) => p.metadata?.name?.startsWith('many-') && p.status?.phase === 'Running')
            .length === n
        );
      },
      IT_WAIT_MS,
      1000,
    );
    t.diagnostic(`${n} pods Running after ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    const vms = await simVms();
    const ours = vms.filter((v) => v.config.name.startsWith('vk-it-many-'));
    assert.equal(ours.length, n, 'one VM per pod');
    assert.equal(new Set(ours.map((v) => v.config.name)).size, n, 'no duplicate VM for one pod');
    const calls = readFileSync(join(w.simRoot, 'sim', 'calls.jsonl'), 'utf8')
      .split('\n')
      .filter((l) => l.includes('"clone"') && l.includes('vk-it-many-'));
    assert.equal(calls.length, n, 'exactly one clone per pod');

    const t1 = Date.now();
    await Promise.all(names.map((name) => w.core.deleteNamespacedPod({ namespace: ns, name })));
    await waitFor(
      'all pods gone',
      async () =>
        (await w.core.listNamespacedPod({ namespace: ns })).items.filter((p) =>
          p.metadata?.name?.startsWith('many-'),
        ).length === 0,
      IT_WAIT_MS,
      1000,
    );
    t.diagnostic(`${n} pods deleted after ${((Date.now() - t1) / 1000).toFixed(1)} s`);
    const left = (await simVms()).filter((v) => v.config.name.startsWith('vk-it-many-'));
    assert.equal(left.length, 0, 'no VM leaked');
  });
});

describe('kubelet API on the daemon defaults (no VK_TLS_CLIENT_CA)', () => {
  test('the apiserver kubelet client is trusted through the kubeconfig CA: kubectl logs and exec work; a rogue-CA certificate gets 401, logged once', async () => {
    const env = readFileSync(`/proc/${w.daemon.pid}/environ`, 'utf8').split('\0');
    assert.ok(
      !env.some((kv) => /^VK_TLS_CLIENT_CA=./.test(kv)),
      `the daemon runs without VK_TLS_CLIENT_CA (${env.filter((kv) => kv.startsWith('VK_TLS')).join(' ')})`,
    );
    const ns = w.namespace;
    await w.core.createNamespacedPod({
      namespace: ns,
      body: vmPod('defaults-0', w.nodeName, annotations('vk-it-defaults-0')),
    });
    await waitForPod(
      w.core,
      ns,
      'defaults-0',
      'Running',
      (p) => p.status?.phase === 'Running' && podReady(p),
    );
    assert.match(await kubectl(w.ground.cluster, ['-n', ns, 'logs', 'defaults-0']), /vk-it-defaults-0/);
    assert.equal(
      await kubectl(w.ground.cluster, ['-n', ns, 'exec', 'defaults-0', '--', 'echo', 'defaults']),
      'defaults\n',
    );

    const pki = join(w.ground.cluster.dir, 'pki');
    const rogue = { cert: join(pki, 'rogue-client.crt'), key: join(pki, 'rogue-client.key') };
    for (let i = 0; i < 3; i++) assert.equal((await kubeletGet('/pods', rogue)).status, 401);
    const rejected = () =>
      readFileSync(w.logFile, 'utf8')
        .split('\n')
        .filter((l) => l.includes(CLIENT_CERT_REJECTED))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    await waitFor('the rejected-certificate line', () => rejected().length > 0, 5000, 100);
    const lines = rejected();
    assert.equal(lines.length, 1, 'logged once for one subject and issuer');
    assert.equal(lines[0]?.level, 'warn');
    assert.equal(lines[0]?.subject, 'O=system:masters, CN=rogue');
    assert.equal(lines[0]?.issuer, 'CN=rogue-ca');
    assert.deepEqual(lines[0]?.expectedCa, ['CN=kubernetes']);
    assert.match(String(lines[0]?.hint), /VK_TLS_CLIENT_CA/);

    await w.core.deleteNamespacedPod({ namespace: ns, name: 'defaults-0' });
    await waitForPodGone(w.core, ns, 'defaults-0');
  });
});

describe('shutdown', () => {
  test('SIGTERM stops the daemon with exit code 0; a restart adopts the running VMs', async () => {
    const ns = w.namespace;
    await w.core.createNamespacedPod({
      namespace: ns,
      body: vmPod('survivor', w.nodeName, annotations('vk-it-survivor')),
    });
    const before = await waitForPod(
      w.core,
      ns,
      'survivor',
      'ready',
      (p) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state'] === 'ready',
    );
    assert.equal(await w.daemon.stop(), 0);
    await w.restart();
    await new Promise((r) => setTimeout(r, 3000));
    const after = await w.core.readNamespacedPod({ namespace: ns, name: 'survivor' });
    assert.equal(
      after.metadata?.annotations?.['vm.cocoonstack.io/id'],
      before.metadata?.annotations?.['vm.cocoonstack.io/id'],
    );
    assert.equal(
      (await simVms()).filter((v) => v.config.name === 'vk-it-survivor').length,
      1,
      'no second VM',
    );
    await w.core.deleteNamespacedPod({ namespace: ns, name: 'survivor' });
    await waitForPodGone(w.core, ns, 'survivor');
  });
});

describe('exec over SPDY (node without ExtendWebSocketsToKubelet)', () => {
  const spdyWorld = useWorld({ env: { VK_EXEC_WEBSOCKET: 'false' } });
  test('exit codes, stdin and output survive the apiserver SPDY translation', async () => {
    const sw = await spdyWorld();
    await fixture(sw, SNAPSHOT, 'linux');
    const node = await sw.core.readNode({ name: sw.nodeName });
    assert.equal(node.status?.declaredFeatures, undefined);
    await sw.core.createNamespacedPod({
      namespace: sw.namespace,
      body: vmPod('spdy-0', sw.nodeName, annotations('vk-spdy-0')),
    });
    await waitForPod(sw.core, sw.namespace, 'spdy-0', 'Running', (p) => p.status?.phase === 'Running');
    const hi = await kubectl(sw.ground.cluster, [
      '-n',
      sw.namespace,
      'exec',
      'spdy-0',
      '--',
      'echo',
      'over',
      'spdy',
    ]);
    assert.equal(hi, 'over spdy\n');
    const echoed = await kubectl(
      sw.ground.cluster,
      ['-n', sw.namespace, 'exec', '-i', 'spdy-0', '--', 'cat'],
      'x'.repeat(200_000),
    );
    assert.equal(echoed.length, 200_000);
    await assert.rejects(
      kubectl(sw.ground.cluster, ['-n', sw.namespace, 'exec', 'spdy-0', '--', 'false']),
      /exited 1/,
    );
    const out = await run(join(sw.ground.cluster.binDir, 'kubectl'), [
      '--kubeconfig',
      sw.ground.cluster.kubeconfig,
      '-n',
      sw.namespace,
      'logs',
      'spdy-0',
    ]);
    assert.match(out.stdout, /vk-spdy-0/);
  });
});
