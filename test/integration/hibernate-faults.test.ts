// Hibernate and wake under faults (issue 10, "Acceptance: Faults"; docs/contracts/pod-to-vm.md
// "Hibernate", "Rollback", "Wake", "Op retry"; docs/registry.md "Evidence", "Wake source"):
// the real apiserver, the ground's real registry behind the fault-injecting proxy of
// registry-proxy.ts (the daemon's OCI_REGISTRY points at the proxy; the test reads the
// registry directly), and the cocoon simulator's faults and latency knobs. Each pod has a VM
// name of its own, so the tests of this file share one world and one daemon.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { parseReference } from '../../src/registry/reference.ts';
import {
  annotate,
  callsSince,
  type FixtureKind,
  fixture,
  guestCalls,
  isReady,
  lifecycle,
  lifecycleMessage,
  podEvents,
  simSnapshotId,
  simVmRecord,
  vmIdOf,
} from './helpers.ts';
import { RegistryProxy } from './registry-proxy.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
let proxy: RegistryProxy;
/** The real registry, under the world's own path (what the daemon reaches through the proxy). */
let registry: RegistryClient;
/** The daemon's environment, again on every restart. */
let env: Record<string, string>;

before(async () => {
  w = await world();
  proxy = await RegistryProxy.start(w.ground.registry.hostPort);
  registry = new RegistryClient({ base: `${w.ground.registry.hostPort}/${w.namespace}`, credentials: [] });
  env = { OCI_REGISTRY: `${proxy.hostPort}/${w.namespace}` };
  await w.restart(env);
});

after(async () => {
  registry?.close();
  await proxy?.stop();
});

const HIBERNATE = 'vm.cocoonstack.io/hibernate';

/** HEAD `<vmName>:<tag>` on the real registry: 200 or 404. */
async function tagStatus(vmName: string, tag = 'hibernate'): Promise<200 | 404> {
  const r = await registry.headManifest(registry.repository(vmName), parseReference(tag));
  return r === 'absent' ? 404 : 200;
}

const read = (name: string) => w.core.readNamespacedPod({ namespace: w.namespace, name });

function podSpec(name: string, kind: FixtureKind, image: string, vmName = `vk-${name}`): V1Pod {
  return vmPod(name, w.nodeName, {
    'vm.cocoonstack.io/name': vmName,
    'cocoonset.cocoonstack.io/image': image,
    'cocoonset.cocoonstack.io/managed': 'true',
    ...(kind === 'firecracker' ? { 'vm.cocoonstack.io/backend': 'firecracker' } : {}),
    ...(kind === 'windows' ? { 'cocoonset.cocoonstack.io/os': 'windows' } : {}),
  });
}

/** A pod `<name>` (VM `vk-<name>`, a fixture of its own) that reached ready. */
async function readyPod(name: string, kind: FixtureKind = 'linux'): Promise<V1Pod> {
  await fixture(w, `hf/${name}`, kind);
  await w.core.createNamespacedPod({ namespace: w.namespace, body: podSpec(name, kind, `hf/${name}`) });
  return await waitState(name, 'ready', 90_000);
}

async function waitState(name: string, state: string, timeoutMs: number): Promise<V1Pod> {
  return await waitForPod(
    w.core,
    w.namespace,
    name,
    state,
    (p) => lifecycle(p) === state && (state !== 'ready' || isReady(p)),
    timeoutMs,
  );
}

async function waitEvent(name: string, reason: string, type = 'Warning') {
  let events: Awaited<ReturnType<typeof podEvents>> = [];
  await waitFor(
    `event ${reason} on ${name}`,
    async () => {
      events = await podEvents(w.core, w.namespace, name);
      return events.some((e) => e.reason === reason && e.type === type);
    },
    20_000,
    200,
  ).catch((err: unknown) => {
    throw new Error(`${String(err)}; events: ${events.map((e) => `${e.type}/${e.reason}`).join(', ')}`);
  });
  return events.find((e) => e.reason === reason) as (typeof events)[number];
}

/** Hibernated as the operator checks it: lifecycle, no id, the manifest, no VM. */
async function assertHibernated(p: V1Pod, vmName: string): Promise<void> {
  assert.equal(lifecycle(p), 'hibernated');
  assert.equal(vmIdOf(p), '', 'no VM id on a hibernated pod');
  assert.equal(p.status?.phase, 'Pending');
  assert.equal(await tagStatus(vmName), 200, `HEAD ${vmName}:hibernate`);
  assert.equal(await simVmRecord(w, vmName), undefined, 'the VM is removed');
}

/** A `snapshot save` of that name holds a pending record in the simulator (it is in flight). */
function savePending(name: string): boolean {
  try {
    const db = JSON.parse(readFileSync(join(w.simRoot, 'snapshot', 'db', 'snapshots.json'), 'utf8')) as {
      names?: Record<string, string>;
      snapshots?: Record<string, { pending?: boolean }>;
    };
    const id = db.names?.[name];
    return id !== undefined && db.snapshots?.[id]?.pending === true;
  } catch {
    return false;
  }
}

const cloneCalls = (from: number, vmName: string) =>
  callsSince(w, from).filter((c) => c.cmd.startsWith('vm clone ') && c.argv.includes(vmName));

test('registry down during the push: rollback (VM running, id back, HibernatePushFailed), then the op retry hibernates once it is back', async () => {
  const name = 'push-down';
  const vmName = `vk-${name}`;
  const ready = await readyPod(name);
  const id = vmIdOf(ready);
  // The export waits 2 s, so the registry goes away after the save, inside the push.
  await w.simulator.mergeKnobs({ latency: { 'snapshot export': 2000 } });
  const mark = w.simulator.calls().length;
  try {
    await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
    await waitFor(
      'the hibernate snapshot saved',
      () =>
        callsSince(w, mark).some((c) => c.cmd.startsWith(`snapshot save --name ${vmName} `) && c.exit === 0),
      30_000,
      50,
    );
    await proxy.down();
    const failed = await waitState(name, 'failed', 30_000);
    assert.match(lifecycleMessage(failed), /^hibernate: push vk-push-down:hibernate: /);
    assert.equal(vmIdOf(failed), id, 'the VM id is published again');
    assert.equal((await simVmRecord(w, vmName))?.state, 'running', 'the VM keeps running');
    assert.ok(!callsSince(w, mark).some((c) => c.cmd.startsWith('vm rm ')), 'no VM removal');
    await waitEvent(name, 'HibernatePushFailed');
  } finally {
    await w.simulator.mergeKnobs({ latency: { 'snapshot export': null } });
    await proxy.up();
  }
  assert.equal(await tagStatus(vmName), 404, 'no manifest from the failed push');
  assert.ok(!(await podEvents(w.core, w.namespace, name)).some((e) => e.reason === 'Hibernated'));
  // The op retry (15 s) re-runs the hibernate while the annotation stays.
  const hib = await waitState(name, 'hibernated', 60_000);
  await assertHibernated(hib, vmName);
  await waitEvent(name, 'Hibernated', 'Normal');
});

test('manifest PUT refused: rollback, the tag stays absent; withdrawing the hibernate lifts the pod back to ready on the same VM', async () => {
  const name = 'put-refused';
  const vmName = `vk-${name}`;
  const ready = await readyPod(name);
  const id = vmIdOf(ready);
  proxy.refuseManifestPut(400);
  const from = proxy.requests.length;
  try {
    await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
    const failed = await waitState(name, 'failed', 30_000);
    assert.match(lifecycleMessage(failed), /^hibernate: push vk-put-refused:hibernate: .*MANIFEST_INVALID/);
    assert.equal(vmIdOf(failed), id);
    assert.ok(
      proxy.since(from).some((r) => r.startsWith('PUT ') && r.includes(`/${vmName}/manifests/hibernate`)),
      `a manifest PUT was refused: ${proxy.since(from).join(', ')}`,
    );
    await waitEvent(name, 'HibernatePushFailed');
  } finally {
    proxy.clear();
  }
  assert.equal(await tagStatus(vmName), 404, 'the tag is absent');
  assert.equal((await simVmRecord(w, vmName))?.state, 'running');
  assert.ok(
    !(await podEvents(w.core, w.namespace, name)).some((e) => e.reason === 'Hibernated'),
    'never hibernated without the manifest',
  );
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  const back = await waitState(name, 'ready', 30_000);
  assert.equal(vmIdOf(back), id, 'the same VM');
});

test('snapshot save: name "already in use by <id>" once: the holder is removed, the save runs again, hibernated', async () => {
  const name = 'in-use';
  const vmName = `vk-${name}`;
  await readyPod(name);
  // A pending record (an interrupted save) holds the name: cocoon answers `already in use by <ID>`.
  const held = JSON.parse(await w.sim(['__sim', 'pending-snapshot', vmName])) as { id: string };
  const mark = w.simulator.calls().length;
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  const hib = await waitState(name, 'hibernated', 60_000);
  await assertHibernated(hib, vmName);
  const seq = callsSince(w, mark)
    .filter((c) => c.cmd.startsWith(`snapshot save --name ${vmName} `) || c.cmd.startsWith('snapshot rm '))
    .map((c) =>
      c.argv[1] === 'save'
        ? `save ${c.exit}`
        : `rm ${c.argv[2] === held.id ? '<holder>' : c.argv[2]} ${c.exit}`,
    );
  assert.deepEqual(seq.slice(0, 3), ['save 1', 'rm <holder> 0', 'save 0'], seq.join('\n'));
  assert.notEqual(await simSnapshotId(w, vmName), held.id, 'a new snapshot under the name');
});

test('CH+Windows NIC drop failure: HibernateNetResizeFailed, VM running, ipconfig /renew sent; withdrawn ⇒ ready on the same VM', async () => {
  const name = 'nic-fail';
  const vmName = `vk-${name}`;
  const ready = await readyPod(name, 'windows');
  const id = vmIdOf(ready);
  await w.simulator.mergeKnobs({
    faults: [
      {
        argvRegex: '^vm net --nics 0 ',
        match: `^${vmName}$`,
        error: 'hot-remove net0: device busy',
        times: 1,
      },
    ],
  });
  const mark = w.simulator.calls().length;
  const guestMark = Date.now();
  try {
    await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
    const failed = await waitState(name, 'failed', 30_000);
    assert.match(lifecycleMessage(failed), /^hibernate: dropping the NIC of VM vk-nic-fail: .*device busy/);
    assert.equal(vmIdOf(failed), id);
    await waitEvent(name, 'HibernateNetResizeFailed');
    assert.equal((await simVmRecord(w, vmName))?.state, 'running');
    const cmds = () =>
      guestCalls(w, vmName)
        .filter((g) => Date.parse(g.ts) >= guestMark - 50)
        .map((g) => g.argv.join(' '));
    await waitFor(
      'ipconfig /renew in the guest',
      () => cmds().includes('cmd /c ipconfig /renew'),
      20_000,
      100,
    );
    assert.ok(cmds().includes('cmd /c ipconfig /release'), 'the release came first');
    const calls = callsSince(w, mark);
    assert.ok(calls.some((c) => c.cmd === `vm net --nics 0 ${id}` && c.exit === 1));
    assert.ok(!calls.some((c) => c.cmd.startsWith('snapshot save ')), 'no save after a failed NIC drop');
  } finally {
    await w.simulator.mergeKnobs({ faults: null });
  }
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  const back = await waitState(name, 'ready', 60_000);
  assert.equal(vmIdOf(back), id, 'the same VM');
});

test('wake with the registry unreachable and a local copy: the wake fails (WakePullFailed), the local copy is not used; the registry back ⇒ ready', async () => {
  const name = 'wake-down';
  const vmName = `vk-${name}`;
  await readyPod(name);
  await w.simulator.diskWrite(vmName, 'wake-down-state');
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await assertHibernated(await waitState(name, 'hibernated', 60_000), vmName);
  assert.ok(await simSnapshotId(w, vmName), 'the local copy is there');
  const mark = w.simulator.calls().length;
  await proxy.down();
  try {
    await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
    const failed = await waitForPod(
      w.core,
      w.namespace,
      name,
      'failed wake',
      (p) => lifecycle(p) === 'failed',
      30_000,
    );
    assert.match(lifecycleMessage(failed), /^wake: cannot verify the local snapshot vk-wake-down/);
    assert.equal(vmIdOf(failed), '');
    await waitEvent(name, 'WakePullFailed');
    assert.deepEqual(cloneCalls(mark, vmName), [], 'no clone from the unverified local copy');
  } finally {
    await proxy.up();
  }
  // The op retry (15 s) wakes it.
  const woken = await waitState(name, 'ready', 60_000);
  assert.notEqual(vmIdOf(woken), '');
  assert.equal(await w.simulator.diskRead(vmName), 'wake-down-state');
  assert.equal(cloneCalls(mark, vmName).length, 1);
  await waitEvent(name, 'Woken', 'Normal');
  assert.equal(await tagStatus(vmName), 200, 'the :hibernate tag is kept on wake');
});

test('wake with a local copy stale against the registry: the copy is removed, the registry pull is used (-hibernate-import, removed after the clone)', async () => {
  const name = 'stale';
  const vmName = `vk-${name}`;
  const importName = `${vmName}-hibernate-import`;
  await readyPod(name);
  await w.simulator.diskWrite(vmName, 'registry-state');
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await assertHibernated(await waitState(name, 'hibernated', 60_000), vmName);
  const pushedId = await simSnapshotId(w, vmName);
  // Replace the local `<vmName>` with a save of another VM (another snapshot id, other content).
  const other = await w.simulator.json<{ id: string }>([
    'vm',
    'clone',
    '--output',
    'json',
    '--pull',
    '--name',
    `${vmName}-other`,
    `hf/${name}`,
  ]);
  await w.simulator.diskWrite(`${vmName}-other`, 'stale-local');
  await w.sim(['snapshot', 'rm', vmName]);
  await w.sim(['snapshot', 'save', '--name', vmName, other.id]);
  await w.sim(['vm', 'rm', '--force', other.id]);
  const staleId = await simSnapshotId(w, vmName);
  assert.ok(staleId && staleId !== pushedId);

  const mark = w.simulator.calls().length;
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  const woken = await waitState(name, 'ready', 60_000);
  assert.notEqual(vmIdOf(woken), '');
  assert.equal(
    await w.simulator.diskRead(vmName),
    'registry-state',
    'the registry state, not the stale copy',
  );
  await waitFor(
    'the import removed',
    () => callsSince(w, mark).some((c) => c.cmd === `snapshot rm ${importName}` && c.exit === 0),
    20_000,
    100,
  );
  const seq = callsSince(w, mark)
    .map((c) => c.cmd)
    .filter(
      (c) =>
        c === `snapshot rm ${vmName}` ||
        c.startsWith(`snapshot import --name ${importName}`) ||
        c.startsWith('vm clone ') ||
        c === `snapshot rm ${importName}`,
    )
    .map((c) => (c.startsWith('vm clone ') ? `vm clone … ${c.split(' ').at(-1)}` : c));
  // The pull clears a leftover import of that name before importing (a `snapshot rm` of it).
  const imported = seq.indexOf(`snapshot import --name ${importName}`);
  assert.deepEqual(
    seq.filter((c, i) => !(c === `snapshot rm ${importName}` && i < imported)),
    [
      `snapshot rm ${vmName}`,
      `snapshot import --name ${importName}`,
      `vm clone … ${importName}`,
      `snapshot rm ${importName}`,
    ],
    seq.join('\n'),
  );
  assert.equal(await simSnapshotId(w, vmName), undefined, 'the stale copy is gone');
  assert.equal(await simSnapshotId(w, importName), undefined, 'the import is gone');
});

test('evidence with a conflicting image: the create fails, telling the user what to delete; no VM', async () => {
  const vmName = 'vk-ev';
  await fixture(w, 'hf/ev-a', 'linux');
  await fixture(w, 'hf/ev-b', 'linux');
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: podSpec('ev-a', 'linux', 'hf/ev-a', vmName),
  });
  await waitState('ev-a', 'ready', 60_000);
  await annotate(w.core, w.namespace, 'ev-a', { [HIBERNATE]: 'true' });
  await assertHibernated(await waitState('ev-a', 'hibernated', 60_000), vmName);
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'ev-a' });
  await waitForPodGone(w.core, w.namespace, 'ev-a', 30_000);

  const mark = w.simulator.calls().length;
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: podSpec('ev-b', 'linux', 'hf/ev-b', vmName),
  });
  const failed = await waitState('ev-b', 'failed', 30_000);
  const message = lifecycleMessage(failed);
  assert.match(message, /hibernated state taken from image hf\/ev-a/);
  assert.match(
    message,
    /set the image back to hf\/ev-a to restore it, or delete the vk-ev:hibernate tag to boot hf\/ev-b fresh/,
  );
  const ev = await waitEvent('ev-b', 'HibernateEvidenceFailed');
  assert.match(ev.message, /delete the vk-ev:hibernate tag/);
  assert.deepEqual(cloneCalls(mark, vmName), [], 'never booted fresh');
  assert.equal(await simVmRecord(w, vmName), undefined);
  assert.equal(await tagStatus(vmName), 200, 'the hibernated state is left alone');
});

test('evidence unreachable on create: HibernateEvidenceUnavailable, the pod stays creating (no VM), and is restored once the registry is back', async () => {
  const vmName = 'vk-ev';
  await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'ev-b' });
  await waitForPodGone(w.core, w.namespace, 'ev-b', 30_000);
  const mark = w.simulator.calls().length;
  await proxy.down();
  try {
    await w.core.createNamespacedPod({
      namespace: w.namespace,
      body: podSpec('ev-c', 'linux', 'hf/ev-a', vmName),
    });
    await waitEvent('ev-c', 'HibernateEvidenceUnavailable');
    const p = await read('ev-c');
    assert.equal(lifecycle(p), 'creating');
    assert.deepEqual(cloneCalls(mark, vmName), []);
  } finally {
    await proxy.up();
  }
  // The transient create retry (10 s) finds the evidence and restores it.
  const ready = await waitState('ev-c', 'ready', 60_000);
  assert.notEqual(vmIdOf(ready), '');
  await waitEvent('ev-c', 'HibernateSnapshotExists');
});

// ---- SIGKILL of the daemon in each phase -------------------------------------------------

/** SIGKILL now; the latency knobs are dropped before the restart (a killed call's own
 * invocation keeps what it read). */
async function kill(): Promise<void> {
  await w.daemon.kill();
  await w.simulator.mergeKnobs({ latency: null });
}

test('SIGKILL during the snapshot phase: the restart hibernates again from the running VM', async () => {
  const name = 'kill-snap';
  const vmName = `vk-${name}`;
  const ready = await readyPod(name);
  await w.simulator.mergeKnobs({ latency: { 'snapshot save': 5000 } });
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await waitFor('the save in flight', () => savePending(vmName), 20_000, 50);
  await kill();
  const mid = await read(name);
  assert.equal(lifecycle(mid), 'hibernating');
  assert.equal(vmIdOf(mid), vmIdOf(ready), 'the id stays while the VM does');
  assert.equal((await simVmRecord(w, vmName))?.state, 'running');
  assert.equal(await tagStatus(vmName), 404);
  await w.restart(env);
  await assertHibernated(await waitState(name, 'hibernated', 90_000), vmName);
});

test('SIGKILL during the push: the restart hibernates again from the running VM', async () => {
  const name = 'kill-push';
  const vmName = `vk-${name}`;
  const ready = await readyPod(name);
  await w.simulator.mergeKnobs({ latency: { 'snapshot export': 5000 } });
  const mark = w.simulator.calls().length;
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await waitFor(
    'the save done (the push in flight)',
    () =>
      callsSince(w, mark).some((c) => c.cmd.startsWith(`snapshot save --name ${vmName} `) && c.exit === 0),
    20_000,
    50,
  );
  const killedPid = w.daemon.pid;
  // The push's spool, named after the daemon (src/registry/spool-dirs.ts).
  const spools = () => readdirSync(tmpdir()).filter((n) => n.startsWith(`vk-push-${killedPid}-`));
  await waitFor('the push spool', () => spools().length === 1, 20_000, 50);
  await kill();
  const mid = await read(name);
  assert.equal(lifecycle(mid), 'hibernating');
  assert.equal(vmIdOf(mid), vmIdOf(ready));
  assert.equal((await simVmRecord(w, vmName))?.state, 'running');
  assert.equal(await tagStatus(vmName), 404, 'no manifest yet');
  assert.equal(spools().length, 1, 'the killed push left its spool');
  await w.restart(env);
  assert.deepEqual(spools(), [], 'the restarted daemon removed it at its start');
  await assertHibernated(await waitState(name, 'hibernated', 90_000), vmName);
});

test('SIGKILL between the VM removal and `hibernated`: the restart confirms hibernated from the registry', async () => {
  const name = 'kill-rm';
  const vmName = `vk-${name}`;
  await readyPod(name);
  await w.simulator.mergeKnobs({ latency: { 'vm rm': 8000 } });
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  // The commit: the id is cleared on the pod, then `vm rm` (held 8 s). The daemon issues the
  // rm once the id write has returned to it, which a loaded machine can delay past the moment
  // the test sees the id gone: the kill waits 3 s more, well inside the rm (it cannot have
  // ended by then), so it lands between the removal's start and `hibernated`.
  await waitForPod(w.core, w.namespace, name, 'id cleared', (p) => vmIdOf(p) === '', 30_000);
  await sleep(3000);
  await kill();
  const mid = await read(name);
  assert.equal(lifecycle(mid), 'hibernating');
  assert.equal(await tagStatus(vmName), 200, 'the manifest came before the id went');
  // The killed daemon's `vm rm` finishes on its own.
  await waitFor('the VM removed', async () => (await simVmRecord(w, vmName)) === undefined, 30_000, 200);
  const mark = w.simulator.calls().length;
  await w.restart(env);
  await assertHibernated(await waitState(name, 'hibernated', 60_000), vmName);
  const after = callsSince(w, mark).map((c) => c.cmd);
  assert.ok(
    !after.some((c) => c.startsWith('snapshot save ') || c.startsWith('vm clone ')),
    `confirmed, not redone: ${after.join('; ')}`,
  );
});

test('SIGKILL during the wake clone: after the restart the pod reaches ready', async () => {
  const name = 'kill-wake';
  const vmName = `vk-${name}`;
  await readyPod(name);
  await w.simulator.diskWrite(vmName, 'kill-wake-state');
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await assertHibernated(await waitState(name, 'hibernated', 60_000), vmName);
  await w.simulator.mergeKnobs({ latency: { 'vm clone': 5000 } });
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  await waitFor(
    'the wake clone in flight',
    async () => (await simVmRecord(w, vmName))?.state === 'creating',
    30_000,
    100,
  );
  await kill();
  await w.restart(env);
  const woken = await waitState(name, 'ready', 90_000);
  const vm = await simVmRecord(w, vmName);
  assert.equal(vmIdOf(woken), vm?.id);
  assert.equal(vm?.state, 'running');
  assert.equal(await w.simulator.diskRead(vmName), 'kill-wake-state');
});

test('SIGKILL during a CH+Windows wake clone: the restart keeps the restore flag (provenance ledger), so the restored guest gets no PnP fixup', async () => {
  const name = 'kill-wake-win';
  const vmName = `vk-${name}`;
  await readyPod(name, 'windows');
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: 'true' });
  await assertHibernated(await waitState(name, 'hibernated', 60_000), vmName);
  await w.simulator.mergeKnobs({ latency: { 'vm clone': 5000 } });
  const guestMark = Date.now();
  await annotate(w.core, w.namespace, name, { [HIBERNATE]: null });
  await waitFor(
    'the wake clone in flight',
    async () => (await simVmRecord(w, vmName))?.state === 'creating',
    30_000,
    100,
  );
  await kill();
  await w.restart(env);
  const woken = await waitState(name, 'ready', 90_000);
  const vm = await simVmRecord(w, vmName);
  assert.equal(vmIdOf(woken), vm?.id);
  const pnp = guestCalls(w, vmName).filter(
    (g) => Date.parse(g.ts) >= guestMark - 50 && g.argv.join(' ').includes('Get-PnpDevice'),
  );
  assert.deepEqual(pnp, [], 'a restored CH+Windows guest never gets the PnP re-enumerate');
});
