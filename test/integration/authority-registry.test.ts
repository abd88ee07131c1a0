// VM authority through the registry (docs/security.md, rows 7-9): owner stamps on what we
// push, a clone source stamped with another namespace refused before anything is pulled, a
// base image's tag never overwritten by a delete-time push, and unstamped state from Go hosts
// accepted or refused by VK_ACCEPT_UNSTAMPED_STATE. The real apiserver, registry and
// the simulator; "Go host" and "base image" tags are pushed by the test with the push code
// alone (no owner stamps), as those writers do.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { newNamespace, vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { CocoonCli } from '../../src/cocoon/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { readSnapshotIdentity } from '../../src/registry/identity.ts';
import { pushSnapshot } from '../../src/registry/push.ts';
import { annotate, cliCalls, fixture, lifecycle, managedAnnotations, podEvents } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
let registry: RegistryClient;
let base: string;
let nsA: string;
let nsB: string;
const lifetime = new AbortController();

const MANAGED = managedAnnotations;
const create = (name: string, ns: string, annotations: Record<string, string>) =>
  w.core.createNamespacedPod({ namespace: ns, body: vmPod(name, w.nodeName, annotations) });
const message = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
const waitState = (name: string, ns: string, state: string, timeoutMs = 90_000) =>
  waitForPod(w.core, ns, name, `lifecycle ${state}`, (p) => lifecycle(p) === state, timeoutMs);

/** Pushes the fixture `acme/agent` under `<repo>:<tag>` as a writer without owner stamps. */
async function pushUnstamped(repo: string, tag: string, fromNode?: string): Promise<string> {
  const cli = new CocoonCli(w.cocoonBin, lifetime.signal, silentLogger);
  const r = await pushSnapshot({
    registry,
    cli,
    localName: 'acme/agent',
    repo,
    tag,
    baseImage: '',
    fromNode,
  });
  return r.digest;
}

before(async () => {
  w = await world();
  Object.assign(process.env, w.simulator.env());
  base = `${w.ground.registry.hostPort}/${w.namespace}`;
  registry = new RegistryClient({ base, credentials: [] });
  await fixture(w, 'acme/agent', 'linux');
  await w.restart({ OCI_REGISTRY: base });
  nsA = await newNamespace(w.core, 'reg-a');
  nsB = await newNamespace(w.core, 'reg-b');
});

after(() => {
  registry?.close();
  lifetime.abort();
});

test('a hibernate push carries the owner stamps; tenant B cloning it by image name is refused before any pull', async () => {
  await create('main-0', nsA, MANAGED('vk-ra-main'));
  await waitState('main-0', nsA, 'ready');
  await annotate(w.core, nsA, 'main-0', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitState('main-0', nsA, 'hibernated');
  const id = await readSnapshotIdentity(registry, 'vk-ra-main', 'hibernate');
  assert.ok(id !== 'absent');
  assert.equal(id.namespace, nsA);
  const imports = () => cliCalls(w).filter((c) => c.argv[0] === 'snapshot' && c.argv[1] === 'import').length;
  const before = imports();
  await create('copy-0', nsB, MANAGED('vk-rb-copy', 'vk-ra-main:hibernate'));
  const p = await waitState('copy-0', nsB, 'failed');
  assert.match(message(p), /rule source-foreign/);
  assert.equal(imports(), before, 'nothing pulled');
  // A's own wake still works from its stamped state.
  await annotate(w.core, nsA, 'main-0', { 'vm.cocoonstack.io/hibernate': null });
  await waitState('main-0', nsA, 'ready');
});

test('a base image tag is never overwritten by a delete-time push of a VM named like it', async () => {
  const digest = await pushUnstamped('rgolden', 'latest');
  await create(
    'golden-0',
    nsB,
    MANAGED('rgolden', 'acme/agent', { 'vm.cocoonstack.io/snapshot-policy': 'always' }),
  );
  await waitState('golden-0', nsB, 'ready');
  await w.core.deleteNamespacedPod({ namespace: nsB, name: 'golden-0' });
  await waitForPodGone(w.core, nsB, 'golden-0', 60_000);
  const after = await readSnapshotIdentity(registry, 'rgolden', 'latest');
  assert.ok(after !== 'absent');
  assert.equal(after.digest, digest, 'the base image is untouched');
  const events = await podEvents(w.core, nsB, 'golden-0');
  assert.ok(
    events.some((e) => e.reason === 'SnapshotPushRefused' && /rule tag-unstamped/.test(e.message)),
    JSON.stringify(events),
  );
});

test('unstamped state (a Go host`s push): restored while VK_ACCEPT_UNSTAMPED_STATE is on, refused when off', async () => {
  await pushUnstamped('vk-rb-go1', 'hibernate', 'go-host');
  await pushUnstamped('vk-rb-go2', 'hibernate', 'go-host');
  const restore = { 'vm.cocoonstack.io/restore-from-hibernate': 'true' };
  await create('go1', nsB, MANAGED('vk-rb-go1', 'acme/agent', restore));
  await waitState('go1', nsB, 'ready');
  await w.daemon.stop();
  await w.restart({ OCI_REGISTRY: base, VK_ACCEPT_UNSTAMPED_STATE: 'false' });
  await create('go2', nsB, MANAGED('vk-rb-go2', 'acme/agent', restore));
  const p = await waitState('go2', nsB, 'failed');
  assert.match(message(p), /rule state-unstamped/);
  assert.equal(
    (await w.core.readNamespacedPod({ namespace: nsB, name: 'go1' })).metadata?.annotations?.[
      'vm.cocoonstack.io/lifecycle-state'
    ],
    'ready',
    'a VM already running is not touched',
  );
});

test('tenant B cloning A`s delete-time :latest or A`s fork snapshot by image name is refused before any pull', async () => {
  await create(
    'gone-0',
    nsA,
    MANAGED('vk-ra-gone', 'acme/agent', { 'vm.cocoonstack.io/snapshot-policy': 'always' }),
  );
  await waitState('gone-0', nsA, 'ready');
  await w.core.deleteNamespacedPod({ namespace: nsA, name: 'gone-0' });
  await waitForPodGone(w.core, nsA, 'gone-0', 60_000);
  const latest = await readSnapshotIdentity(registry, 'vk-ra-gone', 'latest');
  assert.ok(latest !== 'absent');
  assert.equal(latest.namespace, nsA, 'the delete-time push carries the owner stamps');
  const imports = () => cliCalls(w).filter((c) => c.argv[0] === 'snapshot' && c.argv[1] === 'import').length;
  const before = imports();
  await create('latest-0', nsB, MANAGED('vk-rb-latest', 'vk-ra-gone'));
  assert.match(message(await waitState('latest-0', nsB, 'failed')), /rule source-foreign/);
  await create('latest-1', nsB, MANAGED('vk-rb-latest1', 'vk-ra-gone:latest'));
  assert.match(message(await waitState('latest-1', nsB, 'failed')), /rule source-foreign/);
  await create('fork-0', nsB, MANAGED('vk-rb-fork', 'fork-vk-ra-main'));
  assert.match(message(await waitState('fork-0', nsB, 'failed')), /rule source-reserved/);
  assert.equal(imports(), before, 'nothing pulled');
});
