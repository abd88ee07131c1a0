// Tests of the test ground itself: a real kube-apiserver + etcd with kube-controller-manager
// and kube-scheduler on a kubeadm-shaped PKI, real kubectl, and the ground's OCI registry
// (CNCF distribution v3 by default, ground/registry.ts). No mock of the Kubernetes API anywhere.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import { join } from 'node:path';
import { before, test } from 'node:test';
import { KubeConfig, type V1Pod, Watch } from '@kubernetes/client-node';
import { kubectl } from '../../ground/cluster.ts';
import { type Ground, useGround } from '../../ground/ground.ts';
import { adminClients, newNamespace, vmPod } from '../../ground/kube.ts';
import { httpsGet, run, waitFor } from '../../ground/proc.ts';

const ground = useGround();
let g: Ground;
before(async () => {
  g = await ground();
});

test('the apiserver is the version the suite was built for and kubectl talks to it', async () => {
  assert.match(g.cluster.version, /^Kubernetes v1\.3[4-6]\./);
  const out = await kubectl(g.cluster, ['get', 'ns', '-o', 'name']);
  assert.match(out, /namespace\/kube-node-lease/);
  const v = JSON.parse(await kubectl(g.cluster, ['version', '-o', 'json'])) as {
    serverVersion: { gitVersion: string };
  };
  assert.equal(`Kubernetes ${v.serverVersion.gitVersion}`, g.cluster.version);
});

/** GET with the server certificate verified against `ca` (hostname 127.0.0.1). */
function verifiedGet(url: string, ca: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { ca: readFileSync(ca), agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

test('the PKI is kubeadm-shaped: one cluster CA is every kubeconfig CA, verifies the apiserver and signs its kubelet client and the component identities', async () => {
  const c = g.cluster;
  const ca = c.certs.caCert;
  for (const file of [
    c.kubeconfig,
    c.providerKubeconfig,
    c.controllerManagerKubeconfig,
    c.schedulerKubeconfig,
  ]) {
    const kc = new KubeConfig();
    kc.loadFromFile(file);
    assert.equal(kc.getCurrentCluster()?.caFile, ca, file);
  }
  assert.equal(
    await verifiedGet(`${c.url}/readyz`, ca),
    200,
    'the cluster CA verifies the apiserver at 127.0.0.1',
  );
  assert.equal(await verifiedGet(`https://localhost:${c.apiserverPort}/readyz`, ca), 200, 'and at localhost');
  await assert.rejects(verifiedGet(`${c.url}/readyz`, c.certs.rogueCaCert), /self[- ]signed|issuer|verify/i);
  const apiserverArgs = readFileSync(`/proc/${c.pids.apiserver}/cmdline`, 'utf8').split('\0');
  assert.ok(apiserverArgs.includes(`--client-ca-file=${ca}`));
  assert.ok(apiserverArgs.includes(`--kubelet-client-certificate=${c.certs.kubeletClientCert}`));
  const verify = await run('openssl', [
    'verify',
    '-CAfile',
    ca,
    c.certs.kubeletClientCert,
    c.certs.controllerManagerCert,
    c.certs.schedulerCert,
  ]);
  assert.equal(verify.stdout.match(/: OK$/gm)?.length, 3, verify.stdout);
  await assert.rejects(run('openssl', ['verify', '-CAfile', ca, c.certs.rogueClientCert]));
});

test('kube-controller-manager and kube-scheduler run as their own identities and the controllers act', async () => {
  const c = g.cluster;
  for (const port of [c.controllerManagerPort, c.schedulerPort])
    assert.equal((await httpsGet(`https://127.0.0.1:${port}/healthz`)).status, 200, `healthz on ${port}`);
  const whoami = async (kubeconfig: string) =>
    (
      JSON.parse(
        (await run(join(c.binDir, 'kubectl'), ['--kubeconfig', kubeconfig, 'auth', 'whoami', '-o', 'json']))
          .stdout,
      ) as { status: { userInfo: { username: string } } }
    ).status.userInfo.username;
  assert.equal(await whoami(c.controllerManagerKubeconfig), 'system:kube-controller-manager');
  assert.equal(await whoami(c.schedulerKubeconfig), 'system:kube-scheduler');
  const { core } = adminClients(c);
  const ns = await newNamespace(core);
  // serviceaccount controller and root-ca-cert-publisher
  await waitFor(
    `ServiceAccount ${ns}/default`,
    async () => !!(await core.readNamespacedServiceAccount({ namespace: ns, name: 'default' })),
    30_000,
    200,
  );
  let rootCa = '';
  await waitFor(
    `ConfigMap ${ns}/kube-root-ca.crt`,
    async () => {
      rootCa = (await core.readNamespacedConfigMap({ namespace: ns, name: 'kube-root-ca.crt' })).data?.[
        'ca.crt'
      ] as string;
      return !!rootCa;
    },
    30_000,
    200,
  );
  assert.equal(rootCa.trim(), readFileSync(c.certs.caCert, 'utf8').trim());
  // garbage collector: a dependent goes with its owner
  const owner = await core.createNamespacedConfigMap({
    namespace: ns,
    body: { metadata: { name: 'owner' } },
  });
  await core.createNamespacedConfigMap({
    namespace: ns,
    body: {
      metadata: {
        name: 'dependent',
        ownerReferences: [
          { apiVersion: 'v1', kind: 'ConfigMap', name: 'owner', uid: owner.metadata?.uid ?? '' },
        ],
      },
    },
  });
  await core.deleteNamespacedConfigMap({ namespace: ns, name: 'owner' });
  await waitFor(
    'the garbage collector to delete the dependent ConfigMap',
    async () => {
      try {
        await core.readNamespacedConfigMap({ namespace: ns, name: 'dependent' });
        return false;
      } catch (err) {
        if ((err as { code?: number }).code === 404) return true;
        throw err;
      }
    },
    30_000,
    200,
  );
});

test('a pod bound to a node is created and its watch delivers ADDED then DELETED', async () => {
  const { kc, core } = adminClients(g.cluster);
  const ns = await newNamespace(core);
  const seen: string[] = [];
  const watch = new Watch(kc);
  const req = await watch.watch(
    `/api/v1/namespaces/${ns}/pods`,
    {},
    (type: string, obj: V1Pod) => seen.push(`${type}:${obj.metadata?.name}`),
    () => {},
  );
  await core.createNamespacedPod({ namespace: ns, body: vmPod('p1', 'some-node', {}) });
  const pod = await core.readNamespacedPod({ namespace: ns, name: 'p1' });
  assert.equal(pod.spec?.nodeName, 'some-node');
  // Without a kubelet, a graceful delete of a bound pod only sets deletionTimestamp...
  await core.deleteNamespacedPod({ namespace: ns, name: 'p1' });
  const deleting = await core.readNamespacedPod({ namespace: ns, name: 'p1' });
  assert.ok(deleting.metadata?.deletionTimestamp, 'graceful delete must leave the pod Terminating');
  // ...and a force delete removes it.
  await core.deleteNamespacedPod({ namespace: ns, name: 'p1', gracePeriodSeconds: 0 });
  for (let i = 0; i < 50 && !seen.includes('DELETED:p1'); i++) await new Promise((r) => setTimeout(r, 100));
  req.abort();
  assert.equal(seen[0], 'ADDED:p1');
  assert.ok(seen.includes('DELETED:p1'), seen.join(','));
});

test('the apiserver authorizes like kubeadm (Node,RBAC + NodeRestriction), and the provider identity has exactly the verbs the daemon calls', async () => {
  const apiserverArgs = readFileSync(`/proc/${g.cluster.pids.apiserver}/cmdline`, 'utf8').split('\0');
  assert.ok(apiserverArgs.includes('--authorization-mode=Node,RBAC'), apiserverArgs.join(' '));
  assert.ok(apiserverArgs.includes('--enable-admission-plugins=NodeRestriction'));
  // deploy/rbac-provider-identity.yaml, for daemons started with identity 'provider'.
  // `pods/status` is the subresource (kubectl reads `pods/x` as the pod named x).
  const can = async (verb: string, resource: string) => {
    const [type, sub] = resource.split('/');
    return (
      await run(join(g.cluster.binDir, 'kubectl'), [
        '--kubeconfig',
        g.cluster.providerKubeconfig,
        'auth',
        'can-i',
        verb,
        type!,
        ...(sub ? [`--subresource=${sub}`] : []),
        '--all-namespaces',
      ]).catch((e: Error) => ({ stdout: e.message }))
    ).stdout.trim();
  };
  const yes = [
    ['patch', 'pods/status'],
    ['list', 'pods'],
    ['delete', 'pods'],
    ['create', 'tokenreviews.authentication.k8s.io'],
    ['update', 'leases.coordination.k8s.io'],
    ['patch', 'nodes'],
    ['patch', 'nodes/status'],
    ['get', 'secrets'],
    ['get', 'configmaps'],
  ];
  const no = [
    ['create', 'pods'],
    ['patch', 'pods'],
    ['update', 'pods/status'],
    ['list', 'secrets'],
    ['watch', 'configmaps'],
    ['get', 'services'],
    ['update', 'nodes'],
    ['delete', 'nodes'],
    ['create', 'events.events.k8s.io'],
  ];
  for (const [verb, resource] of yes) assert.equal(await can(verb!, resource!), 'yes', `${verb} ${resource}`);
  for (const [verb, resource] of no) assert.match(await can(verb!, resource!), /no/, `${verb} ${resource}`);
});

test('the registry stores and serves a blob and an OCI manifest', async () => {
  const base = `${g.registry.url}/v2/cocoon/ground-test`;
  const blob = Buffer.from('hello cocoon');
  const digest = `sha256:${createHash('sha256').update(blob).digest('hex')}`;
  const start = await fetch(`${base}/blobs/uploads/`, { method: 'POST' });
  assert.equal(start.status, 202);
  const location = new URL(start.headers.get('location') ?? '', g.registry.url);
  location.searchParams.set('digest', digest);
  const put = await fetch(location, {
    method: 'PUT',
    body: blob,
    headers: { 'content-type': 'application/octet-stream' },
  });
  assert.equal(put.status, 201);
  const config = Buffer.from('{}');
  const cfgDigest = `sha256:${createHash('sha256').update(config).digest('hex')}`;
  const s2 = await fetch(`${base}/blobs/uploads/`, { method: 'POST' });
  const l2 = new URL(s2.headers.get('location') ?? '', g.registry.url);
  l2.searchParams.set('digest', cfgDigest);
  assert.equal((await fetch(l2, { method: 'PUT', body: config })).status, 201);
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    artifactType: 'application/vnd.cocoonstack.snapshot.v1+json',
    config: {
      mediaType: 'application/vnd.cocoonstack.snapshot.config.v1+json',
      digest: cfgDigest,
      size: config.length,
    },
    layers: [
      {
        mediaType: 'application/octet-stream',
        digest,
        size: blob.length,
        annotations: { 'org.opencontainers.image.title': 'x' },
      },
    ],
  });
  const mput = await fetch(`${base}/manifests/v1`, {
    method: 'PUT',
    body: manifest,
    headers: { 'content-type': 'application/vnd.oci.image.manifest.v1+json' },
  });
  assert.equal(mput.status, 201);
  // CNCF distribution (v3 and 2.8) only serves an OCI manifest when Accept lists its media type.
  const without = await fetch(`${base}/manifests/v1`);
  assert.equal(without.status, 404);
  const got = await fetch(`${base}/manifests/v1`, {
    headers: { accept: 'application/vnd.oci.image.manifest.v1+json' },
  });
  assert.equal(got.status, 200);
  assert.equal(await got.text(), manifest);
  const back = await fetch(`${base}/blobs/${digest}`);
  assert.equal(Buffer.from(await back.arrayBuffer()).toString(), 'hello cocoon');
});
