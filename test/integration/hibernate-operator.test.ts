// What cocoon-operator does with hibernate, wake, restore, fork and delete (issue 10,
// "Acceptance"), driven the way the operator writes its annotations, and checked the way it
// checks them: hibernate is complete when `lifecycle-state` is `hibernated` with
// `lifecycle-observed-generation` ≥ the set's generation AND `HEAD <vmName>:hibernate` is 200;
// a wake when the container runs AND `vm.cocoonstack.io/id` is non-empty. A watch records
// every version of every pod of the world's namespace: no pod is ever `ready` and then
// `failed`. Also: crane reading what a hibernate pushed, fork-from, and the delete-time
// snapshot (`snapshot-policy: always`) with the registry up, and down (deferred). The daemon's
// OCI_REGISTRY is the fault-injecting proxy of registry-proxy.ts in front of the ground's
// registry; the test reads the registry directly.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { newNamespace, vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { MEDIA_TYPE, parseManifestDocument, validateSnapshotManifest } from '../../src/registry/artifact.ts';
import { parseSnapshotConfig } from '../../src/registry/artifact-config.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { parseReference } from '../../src/registry/reference.ts';
import {
  annotate,
  callsSince,
  containerRunning,
  fixture,
  isReady,
  lifecycle,
  lifecycleMessage,
  observedGeneration,
  simSnapshotId,
  simVmRecord,
  vmIdOf,
} from './helpers.ts';
import { RegistryProxy } from './registry-proxy.ts';

const run = promisify(execFile);
const repoRoot = path.resolve(import.meta.dirname, '..', '..');
const world = useWorld({ deferDaemon: true });
let w: World;
let proxy: RegistryProxy;
let registry: RegistryClient;
let env: Record<string, string>;
let crane: string;

const HIBERNATE = 'vm.cocoonstack.io/hibernate';
const GENERATION = 'cocoonset.cocoonstack.io/generation';
const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

// ---- every version of every pod --------------------------------------------------------

interface Version {
  rv: string;
  lifecycle: string;
  message: string;
  vmId: string;
}
/** Versions per pod incarnation (`name/uid`), in the order the apiserver stored them. */
const history = new Map<string, Version[]>();
let watchReq: { abort(): void } | undefined;
let watching = false;

async function startWatch(resourceVersion?: string): Promise<void> {
  const watch = new Watch(w.kc);
  let last = resourceVersion;
  watchReq = await watch.watch(
    `/api/v1/namespaces/${w.namespace}/pods`,
    resourceVersion ? { resourceVersion } : {},
    (_type: string, p: V1Pod) => {
      const key = `${p.metadata?.name}/${p.metadata?.uid}`;
      const list = history.get(key) ?? [];
      const rv = p.metadata?.resourceVersion ?? '';
      last = rv;
      if (list.at(-1)?.rv !== rv)
        list.push({ rv, lifecycle: lifecycle(p), message: lifecycleMessage(p), vmId: vmIdOf(p) });
      history.set(key, list);
    },
    () => {
      // A watch the apiserver closed is opened again from the last version seen.
      if (watching) void startWatch(last).catch(() => {});
    },
  );
}

/** The lifecycle states an incarnation went through, repeats collapsed. */
function states(name: string): string[] {
  const out: string[] = [];
  for (const [key, versions] of history) {
    if (!key.startsWith(`${name}/`)) continue;
    for (const v of versions) if (v.lifecycle !== '' && out.at(-1) !== v.lifecycle) out.push(v.lifecycle);
  }
  return out;
}

/** No incarnation of the pod was ever `ready` and then `failed` (and none `failed` at all:
 * every sequence of this file succeeds, and the operator reads `failed` as terminal). */
function assertNeverFailed(name: string): void {
  for (const [key, versions] of history) {
    if (!key.startsWith(`${name}/`)) continue;
    const seq = versions.map((v) => v.lifecycle);
    const ready = seq.indexOf('ready');
    const failed = versions.find((v) => v.lifecycle === 'failed');
    assert.ok(
      ready < 0 || !seq.slice(ready).includes('failed'),
      `${key} was ready and then failed: ${seq.join(' → ')} (${failed?.message})`,
    );
    assert.equal(failed, undefined, `${key} was failed: ${failed?.message} (${seq.join(' → ')})`);
  }
}

// ---- the world ---------------------------------------------------------------------------

async function craneBin(): Promise<string> {
  if (process.env.VK_CRANE_BIN) return process.env.VK_CRANE_BIN;
  const { stdout } = await run('bash', [path.join(repoRoot, 'scripts', 'cranebin.sh')], {
    maxBuffer: 1 << 20,
  });
  return path.join(stdout.trim().split('\n').pop() ?? '', 'crane');
}

async function craneBytes(...args: string[]): Promise<Buffer> {
  const { stdout } = await run(crane, [...args, '--insecure'], { maxBuffer: 64 << 20, encoding: 'buffer' });
  return stdout;
}

before(async () => {
  w = await world();
  proxy = await RegistryProxy.start(w.ground.registry.hostPort);
  registry = new RegistryClient({ base: `${w.ground.registry.hostPort}/${w.namespace}`, credentials: [] });
  env = { OCI_REGISTRY: `${proxy.hostPort}/${w.namespace}` };
  crane = await craneBin();
  await w.restart(env);
  watching = true;
  await startWatch();
});

after(async () => {
  watching = false;
  watchReq?.abort();
  registry?.close();
  await proxy?.stop();
});

async function tagStatus(vmName: string, tag = 'hibernate'): Promise<200 | 404> {
  const r = await registry.headManifest(registry.repository(vmName), parseReference(tag));
  return r === 'absent' ? 404 : 200;
}

const read = (name: string, ns = w.namespace) => w.core.readNamespacedPod({ namespace: ns, name });

function podSpec(name: string, image: string, extra: Record<string, string> = {}): V1Pod {
  return vmPod(name, w.nodeName, {
    'vm.cocoonstack.io/name': `vk-${name}`,
    'cocoonset.cocoonstack.io/image': image,
    'cocoonset.cocoonstack.io/managed': 'true',
    ...extra,
  });
}

async function create(name: string, image: string, extra: Record<string, string> = {}): Promise<void> {
  await w.core.createNamespacedPod({ namespace: w.namespace, body: podSpec(name, image, extra) });
}

async function waitReady(name: string, timeoutMs = 90_000, ns = w.namespace): Promise<V1Pod> {
  return await waitForPod(
    w.core,
    ns,
    name,
    'ready',
    (p) => lifecycle(p) === 'ready' && isReady(p),
    timeoutMs,
  );
}

/** The operator's hibernate check (it gives a hibernate 3 minutes). */
async function operatorHibernated(name: string, generation: number): Promise<V1Pod> {
  let last: V1Pod | undefined;
  await waitFor(
    `${name}: hibernated, observed generation ≥ ${generation}, HEAD vk-${name}:hibernate 200`,
    async () => {
      last = await read(name);
      return (
        lifecycle(last) === 'hibernated' &&
        observedGeneration(last) >= generation &&
        (await tagStatus(`vk-${name}`)) === 200
      );
    },
    180_000,
    250,
  );
  return last as V1Pod;
}

/** The operator's wake check (container running, VM id present; it gives a wake 5 minutes),
 * then the pod's own `ready`. */
async function operatorWoken(name: string): Promise<V1Pod> {
  await waitForPod(
    w.core,
    w.namespace,
    name,
    'container running and a VM id',
    (p) => containerRunning(p) && vmIdOf(p) !== '',
    300_000,
  );
  return await waitReady(name, 60_000);
}

// ---- the operator's sequences ------------------------------------------------------------

test('a set suspended and resumed: generation bump + hibernate on every pod ⇒ hibernated with the manifest; bump + hibernate removed ⇒ ready on new VMs with the hibernated disks', async () => {
  const set = ['set-0', 'set-1', 'set-2'];
  await fixture(w, 'op/set', 'linux');
  await Promise.all(set.map((n) => create(n, 'op/set', { [GENERATION]: '1' })));
  const first = await Promise.all(set.map((n) => waitReady(n)));
  for (const n of set) await w.simulator.diskWrite(`vk-${n}`, `state-of-${n}`);

  // suspend: true — one patch per pod, generation and hibernate together.
  await Promise.all(
    set.map((n) => annotate(w.core, w.namespace, n, { [GENERATION]: '2', [HIBERNATE]: 'true' })),
  );
  const hibernated = await Promise.all(set.map((n) => operatorHibernated(n, 2)));
  for (const [i, p] of hibernated.entries()) {
    const n = set[i] as string;
    assert.equal(vmIdOf(p), '', `${n}: no VM id`);
    assert.equal(p.status?.phase, 'Pending');
    assert.equal(await simVmRecord(w, `vk-${n}`), undefined, `${n}: the VM is removed`);
  }

  // suspend: false — bump again and remove hibernate.
  await Promise.all(
    set.map((n) => annotate(w.core, w.namespace, n, { [GENERATION]: '3', [HIBERNATE]: null })),
  );
  const woken = await Promise.all(set.map((n) => operatorWoken(n)));
  for (const [i, p] of woken.entries()) {
    const n = set[i] as string;
    assert.notEqual(vmIdOf(p), vmIdOf(first[i] as V1Pod), `${n}: a new VM`);
    assert.equal(vmIdOf(p), (await simVmRecord(w, `vk-${n}`))?.id);
    assert.ok(observedGeneration(p) >= 3, `${n}: generation echoed`);
    assert.equal(await w.simulator.diskRead(`vk-${n}`), `state-of-${n}`, `${n}: the hibernated disk`);
    assert.equal(await tagStatus(`vk-${n}`), 200, `${n}: the tag is the operator's to delete`);
    assert.deepEqual(states(n), ['creating', 'ready', 'hibernating', 'hibernated', 'creating', 'ready']);
    assertNeverFailed(n);
  }
});

test('a rebuilt pod: deleted while hibernated, recreated with the same VM name and restore-from-hibernate ⇒ ready with the hibernated disk', async () => {
  const name = 'rebuild-0';
  const vmName = `vk-${name}`;
  await fixture(w, 'op/rebuild', 'linux');
  await create(name, 'op/rebuild', { [GENERATION]: '1' });
  await waitReady(name);
  await w.simulator.diskWrite(vmName, 'rebuilt-state');
  await annotate(w.core, w.namespace, name, { [GENERATION]: '2', [HIBERNATE]: 'true' });
  await operatorHibernated(name, 2);
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
  await waitForPodGone(w.core, w.namespace, name, 30_000);
  assert.equal(await simSnapshotId(w, vmName), undefined, 'the local copy went with the pod');

  const mark = w.simulator.calls().length;
  await create(name, 'op/rebuild', { [GENERATION]: '2', 'vm.cocoonstack.io/restore-from-hibernate': 'true' });
  const p = await operatorWoken(name);
  assert.equal(vmIdOf(p), (await simVmRecord(w, vmName))?.id);
  assert.equal(await w.simulator.diskRead(vmName), 'rebuilt-state');
  assert.ok(
    callsSince(w, mark).some(
      (c) => c.cmd === `snapshot import --name ${vmName}-hibernate-import` && c.exit === 0,
    ),
    'restored from the registry',
  );
  assertNeverFailed(name);
});

test('hibernate=true written while the create is still in flight ⇒ hibernated (never ready then failed); then woken', async () => {
  const name = 'late-0';
  const vmName = `vk-${name}`;
  await fixture(w, 'op/late', 'linux');
  await w.simulator.mergeKnobs({ latency: { 'vm clone': 3000 } });
  try {
    await create(name, 'op/late');
    await waitFor(
      'the clone in flight',
      async () => (await simVmRecord(w, vmName))?.state === 'creating',
      30_000,
      100,
    );
    // A CocoonHibernation writes only the hibernate annotation.
    await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  } finally {
    await w.simulator.mergeKnobs({ latency: null });
  }
  const hib = await operatorHibernated(name, 0);
  assert.equal(vmIdOf(hib), '');
  assert.equal(await simVmRecord(w, vmName), undefined);
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  const woken = await operatorWoken(name);
  assert.notEqual(vmIdOf(woken), '');
  assertNeverFailed(name);
});

// ---- crane reads what a hibernate pushed ---------------------------------------------------

test('crane lists, fetches and validates the :hibernate artifact (from-node, baseimage, snapshotId)', async () => {
  const name = 'crane-0';
  const vmName = `vk-${name}`;
  await fixture(w, 'op/crane', 'linux');
  await create(name, 'op/crane');
  await waitReady(name);
  await w.simulator.diskWrite(vmName, 'crane-state');
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await operatorHibernated(name, 0);
  const repo = `${w.ground.registry.hostPort}/${w.namespace}/${vmName}`;
  const ref = `${repo}:hibernate`;

  assert.deepEqual((await craneBytes('ls', repo)).toString().trim().split('\n'), ['hibernate']);
  const manifestBytes = await craneBytes('manifest', ref);
  assert.equal((await craneBytes('digest', ref)).toString().trim(), sha(manifestBytes));
  const doc = parseManifestDocument(manifestBytes);
  assert.ok(doc.ok);
  assert.equal(doc.value.kind === 'manifest' && doc.value.manifest.artifactType, MEDIA_TYPE.snapshotV1);
  const manifest = validateSnapshotManifest(doc.value);
  assert.ok(manifest.ok, manifest.ok ? '' : manifest.error);
  const a = manifest.value.annotations;
  assert.equal(a['cocoonstack.snapshot.baseimage'], 'op/crane');
  assert.equal(a['cocoonstack.snapshot.from-node'], w.nodeName);

  const configBytes = await craneBytes('config', ref);
  assert.equal(sha(configBytes), manifest.value.config.digest);
  const config = parseSnapshotConfig(configBytes, manifest.value);
  assert.ok(config.ok, config.ok ? '' : config.error);
  const localId = await simSnapshotId(w, vmName);
  assert.ok(localId);
  assert.equal(config.value.snapshotId, localId, 'the snapshotId of the local save');

  for (const layer of manifest.value.layers) {
    const blob = await craneBytes('blob', `${repo}@${layer.digest}`);
    assert.equal(blob.length, layer.size, layer.title);
    assert.equal(sha(blob), layer.digest, layer.title);
  }
  await craneBytes('validate', '--remote', ref);
  assertNeverFailed(name);
});

// ---- fork-from ---------------------------------------------------------------------------

test('fork-from: three concurrent forks of one main ⇒ one snapshot save of fork-<main>, three clones of it, all ready with the main state', async () => {
  const main = 'main-0';
  const mainVm = `vk-${main}`;
  await fixture(w, 'op/main', 'linux');
  await create(main, 'op/main');
  await waitReady(main);
  await w.simulator.diskWrite(mainVm, 'main-state');
  const mark = w.simulator.calls().length;
  const subs = ['sub-0', 'sub-1', 'sub-2'];
  await Promise.all(subs.map((n) => create(n, 'op/main', { 'vm.cocoonstack.io/fork-from': mainVm })));
  await Promise.all(subs.map((n) => waitReady(n)));
  const calls = callsSince(w, mark);
  const saves = calls.filter((c) => c.cmd.startsWith(`snapshot save --name fork-${mainVm} `));
  assert.equal(saves.length, 1, saves.map((c) => c.cmd).join('\n'));
  assert.equal(saves[0]?.exit, 0);
  const clones = calls.filter((c) => c.cmd.startsWith('vm clone ') && c.argv.at(-1) === `fork-${mainVm}`);
  assert.deepEqual(
    clones.map((c) => c.argv[c.argv.indexOf('--name') + 1]).sort(),
    subs.map((n) => `vk-${n}`),
  );
  for (const n of subs) {
    assert.equal(await w.simulator.diskRead(`vk-${n}`), 'main-state', `${n} forks the main's state`);
    assertNeverFailed(n);
  }
  assertNeverFailed(main);
});

test("fork-from a VM of another namespace fails with the namespace message; the main's VM is not touched", async () => {
  const ns2 = await newNamespace(w.core);
  const mainVm = 'vk-main-0';
  const mark = w.simulator.calls().length;
  await w.core.createNamespacedPod({
    namespace: ns2,
    body: podSpec('thief-0', 'op/main', { 'vm.cocoonstack.io/fork-from': mainVm }),
  });
  const p = await waitForPod(w.core, ns2, 'thief-0', 'failed', (x) => lifecycle(x) === 'failed', 30_000);
  assert.match(
    lifecycleMessage(p),
    new RegExp(
      `fork-from: VM ${mainVm} is not held by a pod in namespace ${ns2}; a pod forks only a VM of its own namespace`,
    ),
  );
  const touched = callsSince(w, mark).filter(
    (c) => c.argv.includes('vk-thief-0') || c.cmd.includes(`fork-${mainVm}`),
  );
  assert.deepEqual(
    touched.map((c) => c.cmd),
    [],
  );
  assert.equal(await simVmRecord(w, 'vk-thief-0'), undefined);
});

// ---- delete with a snapshot policy ---------------------------------------------------------

test('delete with snapshot-policy always: save and push <vmName>:latest before the VM is removed', async () => {
  const name = 'del-0';
  const vmName = `vk-${name}`;
  await fixture(w, 'op/del', 'linux');
  await create(name, 'op/del', { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' });
  const id = vmIdOf(await waitReady(name));
  const mark = w.simulator.calls().length;
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
  await waitForPodGone(w.core, w.namespace, name, 60_000);
  const cmds = callsSince(w, mark).map((c) => c.cmd);
  const save = cmds.indexOf(`snapshot save --name ${vmName} ${id}`);
  const exp = cmds.indexOf(`snapshot export ${vmName} -o -`);
  const rm = cmds.indexOf(`vm rm --force ${id}`);
  assert.ok(save >= 0 && exp > save && rm > exp, `save, export, then rm: ${cmds.join('; ')}`);
  assert.equal(await tagStatus(vmName, 'latest'), 200);
  assert.equal(await simVmRecord(w, vmName), undefined);
  assertNeverFailed(name);
});

test('delete with snapshot-policy always and the registry down: the pod goes, the VM is removed, :latest is pushed when the registry returns', async () => {
  const name = 'del-1';
  const vmName = `vk-${name}`;
  await create(name, 'op/del', { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' });
  const id = vmIdOf(await waitReady(name));
  const mark = w.simulator.calls().length;
  await proxy.down();
  try {
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
    // Within its grace period (30 s), whatever the registry does.
    await waitForPodGone(w.core, w.namespace, name, 35_000);
    assert.equal(await simVmRecord(w, vmName), undefined, 'the VM is removed');
    assert.ok(callsSince(w, mark).some((c) => c.cmd === `vm rm --force ${id}` && c.exit === 0));
    assert.equal(await tagStatus(vmName, 'latest'), 404);
  } finally {
    await proxy.up();
  }
  // The deferred push (docs/registry.md, "Delete during a registry outage"); more in
  // test/integration/deferred-push.test.ts.
  await waitFor('the deferred :latest', async () => (await tagStatus(vmName, 'latest')) === 200, 90_000, 500);
  assertNeverFailed(name);
});
