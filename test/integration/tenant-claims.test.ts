// What a pod author may name on the host (contracts/annotations.md, "Clone-from-dir roots" and
// "Network allow-list"), against the real apiserver and the simulator: clone-from-dir only
// under <root>/<namespace>/ (a real export outside the roots, a missing path, a symlink out of
// the root and another namespace's export are all refused with one message that names the
// rule and leaks nothing), and the network allow-list (a namespace's own list, the node list
// for the others, the default network always).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { newNamespace, vmPod, waitForPod } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { cliCalls, fixture, lifecycle, OCI_IMAGE } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
/** Holds `roots/` (VK_CLONE_FROM_DIR_ROOTS) and `outside/`, a valid export no root covers. */
let scratch: string;
let roots: string;
let outside: string;
/** A second namespace: not listed in VK_NAMESPACE_NETWORKS. */
let other: string;

const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
const READY_MS = 120_000;

/** A directory `cocoon vm clone --from-dir` accepts (the simulator reads snapshot.json). */
function exportAt(dir: string): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, 'snapshot.json'),
    JSON.stringify({
      version: 1,
      config: { name: 'exported', hypervisor: 'cloud-hypervisor', image: OCI_IMAGE, image_type: 'oci' },
    }),
  );
  return dir;
}

before(async () => {
  w = await world();
  other = await newNamespace(w.core);
  scratch = realpathSync(mkdtempSync(join(tmpdir(), 'vk-tenant-claims-')));
  roots = join(scratch, 'roots');
  outside = exportAt(join(scratch, 'outside', 'snap'));
  exportAt(join(roots, w.namespace, 'snap'));
  exportAt(join(roots, other, 'snap'));
  symlinkSync(outside, join(roots, w.namespace, 'escape'));
  symlinkSync(join(roots, w.namespace, 'snap'), join(roots, w.namespace, 'alias'));
  await fixture(w, 'acme/agent', 'linux');
  await w.restart({
    VK_CLONE_FROM_DIR_ROOTS: roots,
    VK_ALLOWED_NETWORKS: 'shared',
    VK_NAMESPACE_NETWORKS: `${w.namespace}=net-a|lab`,
  });
});

after(async () => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  if (other) await w.core.deleteNamespace({ name: other }).catch(() => {});
});

async function create(namespace: string, name: string, annotations: Record<string, string>): Promise<void> {
  const body = vmPod(name, w.nodeName, {
    'vm.cocoonstack.io/name': `vk-${name}`,
    'cocoonset.cocoonstack.io/managed': 'true',
    ...annotations,
  });
  await w.core.createNamespacedPod({ namespace, body });
}

const ready = (namespace: string, name: string) =>
  waitForPod(w.core, namespace, name, 'ready', (p) => lifecycle(p) === 'ready', READY_MS);

async function failedWith(namespace: string, name: string): Promise<string> {
  const pod = await waitForPod(w.core, namespace, name, 'failed', (p) => lifecycle(p) === 'failed', READY_MS);
  return pod.metadata?.annotations?.[MESSAGE] ?? '';
}

async function warnings(namespace: string, name: string): Promise<string[]> {
  const list = await w.core.listNamespacedEvent({ namespace, fieldSelector: `involvedObject.name=${name}` });
  return list.items.filter((e) => e.type === 'Warning').map((e) => e.reason ?? '');
}

const clonesOf = (vmName: string) =>
  cliCalls(w).filter((c) => c.argv[0] === 'vm' && c.argv[1] === 'clone' && c.argv.includes(vmName));

describe('clone-from-dir roots', () => {
  test('a link inside <root>/<namespace>/ to an export there: ready, cloned from the resolved dir', async () => {
    await create(w.namespace, 'dir-ok', {
      'vm.cocoonstack.io/clone-from-dir': join(roots, w.namespace, 'alias'),
    });
    await ready(w.namespace, 'dir-ok');
    const argv = clonesOf('vk-dir-ok')[0]?.argv ?? [];
    assert.deepEqual(argv.slice(-2), ['--from-dir', join(roots, w.namespace, 'snap')]);
  });

  test('outside the roots, missing, a link out, another namespace: failed, one message, no clone', async () => {
    const cases = {
      'dir-outside': outside,
      'dir-missing': join(roots, w.namespace, 'missing'),
      'dir-link': join(roots, w.namespace, 'escape'),
      'dir-other-ns': join(roots, other, 'snap'),
    };
    for (const [name, path] of Object.entries(cases))
      await create(w.namespace, name, { 'vm.cocoonstack.io/clone-from-dir': path });
    const texts: string[] = [];
    for (const [name, path] of Object.entries(cases)) {
      const message = await failedWith(w.namespace, name);
      assert.match(
        message,
        /refused: a pod clones only from an existing directory whose resolved path \(symlinks followed\) lies under <root>\/<its namespace>\/ for a root of VK_CLONE_FROM_DIR_ROOTS/,
        name,
      );
      assert.ok(
        message.includes(`here ${join(roots, w.namespace)}/`),
        `${name}: names where it may clone from`,
      );
      // Nothing tells whether the path exists: the text without the pod's own path is the same
      // for an existing export outside, a missing path and a link out.
      texts.push(message.replace(JSON.stringify(path), '<path>'));
      assert.doesNotMatch(message, /no such|not found|does not exist|snapshot\.json|ENOENT/i, name);
      assert.ok(!message.includes(outside) || path === outside, `${name}: the link target is not revealed`);
      assert.deepEqual(clonesOf(`vk-${name}`), [], `${name}: no cocoon clone`);
      assert.ok((await warnings(w.namespace, name)).includes('CloneFromDirRefused'), name);
    }
    assert.equal(new Set(texts).size, 1, `one text for every refusal:\n${texts.join('\n')}`);
  });
});

describe('network allow-list', () => {
  test('a listed namespace: its own network goes ready, one of the node list is refused', async () => {
    await create(w.namespace, 'net-own', {
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/network': 'net-a',
    });
    await create(w.namespace, 'net-node', {
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/network': 'shared',
    });
    await ready(w.namespace, 'net-own');
    const argv = clonesOf('vk-net-own')[0]?.argv ?? [];
    assert.equal(argv[argv.indexOf('--network') + 1], 'net-a');
    assert.equal(
      await failedWith(w.namespace, 'net-node'),
      `network "shared" refused: VK_NAMESPACE_NETWORKS limits namespace ${w.namespace} to net-a, lab (leave cocoonset.cocoonstack.io/network unset for the default network)`,
    );
    assert.deepEqual(clonesOf('vk-net-node'), []);
    assert.ok((await warnings(w.namespace, 'net-node')).includes('NetworkRefused'));
  });

  test('an unlisted namespace: the node list applies, and the default network always', async () => {
    await create(other, 'net-shared', {
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/network': 'shared',
    });
    await create(other, 'net-foreign', {
      'cocoonset.cocoonstack.io/image': 'acme/agent',
      'cocoonset.cocoonstack.io/network': 'net-a',
    });
    await create(other, 'net-default', { 'cocoonset.cocoonstack.io/image': 'acme/agent' });
    await ready(other, 'net-shared');
    await ready(other, 'net-default');
    assert.ok(!clonesOf('vk-net-default')[0]?.argv.includes('--network'), 'no --network for the default');
    assert.match(
      await failedWith(other, 'net-foreign'),
      /^network "net-a" refused: VK_ALLOWED_NETWORKS limits pods of this node to shared /,
    );
    assert.deepEqual(clonesOf('vk-net-foreign'), []);
  });
});
