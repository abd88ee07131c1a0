// VMs that die behind the daemon's back (issue 11, the first two Acceptance bullets;
// docs/contracts/pod-to-vm.md "VM event watcher and eviction"), against the real apiserver
// and the cocoon simulator, default daemon settings: a crashed VM is restarted and the pod
// stays the same pod; crashed twice within 30 s it is evicted RestartCooldown; deleted behind
// its back it is evicted VMGone; a VM put in `error` is restarted; the event stream's process
// killed is restarted and a death meanwhile is still handled within a tick; a pod asking for
// hibernate is left alone. The in-process cases (a failed start, a failed eviction re-driven)
// are in test/unit/provider/vm-events.test.ts.
//
// Every pod has a VM name of its own (vk-<pod>), so the tests share one world and one daemon;
// one watch on the namespace records every version of every pod (the eviction's Failed status
// is written on a pod that is being deleted: only a watch sees it before it is gone).
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import {
  annotate,
  callsSince,
  fixture,
  isReady,
  lifecycle,
  type PodEvent,
  podEvents,
  simVmRecord,
  vmIdOf,
} from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;

/** Every version of every pod of the namespace the watch delivered, in order. */
const versions = new Map<string, { type: string; at: number; pod: V1Pod }[]>();
let stopWatch: (() => void) | undefined;

before(async () => {
  w = await world();
  await fixture(w, 'ev/base', 'linux');
  await w.restart();
  const watch = new Watch(w.kc);
  const req = await watch.watch(
    `/api/v1/namespaces/${w.namespace}/pods`,
    {},
    (type: string, p: V1Pod) => {
      const name = p.metadata?.name ?? '';
      versions.set(name, [...(versions.get(name) ?? []), { type, at: Date.now(), pod: p }]);
    },
    () => {},
  );
  stopWatch = () => req.abort();
});

after(() => stopWatch?.());

const read = (name: string) => w.core.readNamespacedPod({ namespace: w.namespace, name });

async function readyPod(name: string, annotations: Record<string, string> = {}): Promise<V1Pod> {
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': 'ev/base',
      'cocoonset.cocoonstack.io/managed': 'true',
      ...annotations,
    }),
  });
  return await waitForPod(
    w.core,
    w.namespace,
    name,
    'ready',
    (p) => lifecycle(p) === 'ready' && isReady(p),
    90_000,
  );
}

/** Runs `cocoon __sim <args>`; returns the wall time just before the call and its duration. */
async function simAction(args: string[]): Promise<{ at: number; durationMs: number }> {
  const at = Date.now();
  const r = await w.simulator.run(['__sim', ...args]);
  if (r.code !== 0) throw new Error(`__sim ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
  return { at, durationMs: r.durationMs };
}

const terminated = (p: V1Pod) => p.status?.containerStatuses?.[0]?.state?.terminated;

/** The first version of the pod showing the eviction (a deletionTimestamp or phase Failed). */
function evictionSeen(name: string) {
  return (versions.get(name) ?? []).find(
    (v) => v.type === 'DELETED' || !!v.pod.metadata?.deletionTimestamp || v.pod.status?.phase === 'Failed',
  );
}

/** Waits for an event of pod `name` that `match` accepts (events are posted apart from the pod's
 * writes, so one may land after the pod is gone). */
async function waitForEvent(name: string, match: (e: PodEvent) => boolean): Promise<void> {
  await waitFor(
    `an event of pod ${name}`,
    async () => (await podEvents(w.core, w.namespace, name)).some(match),
    15_000,
    200,
  );
}

/**
 * Waits for the eviction of `name` (uid `uid`): the pod carries a deletionTimestamp or
 * disappears, then is gone. Returns the first version that showed it and the last version
 * the watch saw (the last status the daemon wrote).
 */
async function waitEvicted(name: string, uid: string, timeoutMs = 30_000) {
  await waitFor(`pod ${name} evicted`, () => evictionSeen(name) !== undefined, timeoutMs, 50);
  const first = evictionSeen(name);
  // The pod is gone once the daemon completed its own deletion (grace 0).
  await waitFor(
    `pod ${name} gone`,
    async () => {
      try {
        const p = await read(name);
        return p.metadata?.uid !== uid;
      } catch (err) {
        if ((err as { code?: number }).code === 404) return true;
        throw err;
      }
    },
    60_000,
    100,
  );
  const mine = () => (versions.get(name) ?? []).filter((v) => v.pod.metadata?.uid === uid);
  await waitFor(
    `the watch delivered the deletion of ${name}`,
    () => mine().at(-1)?.type === 'DELETED',
    5000,
    50,
  );
  return { first, last: mine().at(-1) };
}

/** The versions of a pod the watch saw, one line each (for failure messages). */
function history(name: string): string {
  return (versions.get(name) ?? [])
    .map(({ type, at, pod }) => {
      const term = terminated(pod);
      return (
        `${new Date(at).toISOString()} ${type} rv=${pod.metadata?.resourceVersion} ` +
        `phase=${pod.status?.phase} ready=${isReady(pod)} lifecycle=${lifecycle(pod)}` +
        (pod.metadata?.deletionTimestamp
          ? ` deletionTimestamp=${String(pod.metadata.deletionTimestamp)}`
          : '') +
        (term ? ` terminated=${term.reason}/${term.exitCode}` : '')
      );
    })
    .join('\n');
}

/** Asserts the last status the daemon wrote: phase Failed, the container terminated with `reason`. */
function assertFailedWith(name: string, last: V1Pod | undefined, reason: string): void {
  assert.ok(last, 'a last version');
  const seen = `versions of ${name}:\n${history(name)}`;
  assert.equal(last.status?.phase, 'Failed', `phase of the last version; ${seen}`);
  const term = terminated(last);
  assert.equal(term?.reason, reason, `container state; ${seen}`);
  assert.equal(term?.exitCode, 1);
}

/** The daemon's `vm status --event` stream processes (children of the daemon, by /proc). */
function streamPids(): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'latin1');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== w.daemon.pid) continue;
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (argv.join(' ').includes('vm status --event')) out.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

test('a ready VM crashed behind our back is restarted; the pod stays the same pod', async (t) => {
  const ready = await readyPod('crash-1');
  const uid = ready.metadata?.uid ?? '';
  const vmId = vmIdOf(ready);
  const vm0 = await w.simulator.json<{ pid: number }>(['vm', 'inspect', vmId]);
  const from = w.simulator.calls().length;
  const crash = await simAction(['crash', 'vk-crash-1']);
  await waitFor(
    `vm start ${vmId}`,
    () => callsSince(w, from).some((c) => c.cmd === `vm start ${vmId}` && c.exit === 0),
    15_000,
    50,
  );
  const start = w.simulator.calls().find((c, i) => i >= from && c.argv.join(' ') === `vm start ${vmId}`);
  t.diagnostic(`crash → vm start: ${Date.parse(start?.startedAt ?? '') - crash.at} ms`);
  const vm1 = await simVmRecord(w, 'vk-crash-1');
  assert.equal(vm1?.state, 'running');
  assert.equal(vm1?.id, vmId, 'the same VM');
  const vmNow = await w.simulator.json<{ pid: number }>(['vm', 'inspect', vmId]);
  assert.notEqual(vmNow.pid, vm0.pid, 'a new VMM process');
  await waitForEvent('crash-1', (e) => e.type === 'Warning' && e.reason === 'VMRestarted');
  const p = await waitForPod(w.core, w.namespace, 'crash-1', 'ready again', (x) => isReady(x), 15_000);
  assert.equal(p.metadata?.uid, uid, 'the same pod');
  assert.equal(p.metadata?.deletionTimestamp, undefined);
  assert.equal(lifecycle(p), 'ready');
  assert.equal(vmIdOf(p), vmId);
  assert.equal(p.status?.phase, 'Running');
  // Still the same a few seconds later (a stream tick came by): no second restart, no eviction.
  await sleep(6000);
  const later = await read('crash-1');
  assert.equal(later.metadata?.uid, uid);
  assert.equal(later.metadata?.deletionTimestamp, undefined);
  assert.ok(isReady(later));
  assert.equal(callsSince(w, from).filter((c) => c.cmd === `vm start ${vmId}`).length, 1);
  assert.ok(!(await podEvents(w.core, w.namespace, 'crash-1')).some((e) => e.reason === 'Evicted'));
});

test('crashed twice within 30 s: evicted RestartCooldown, status Failed, the VM removed', async () => {
  const ready = await readyPod('crash-2');
  const uid = ready.metadata?.uid ?? '';
  const vmId = vmIdOf(ready);
  const from = w.simulator.calls().length;
  await simAction(['crash', 'vk-crash-2']);
  await waitFor(
    `vm start ${vmId}`,
    () => callsSince(w, from).some((c) => c.cmd === `vm start ${vmId}` && c.exit === 0),
    15_000,
    50,
  );
  await waitFor('running again', async () => (await simVmRecord(w, vmId))?.state === 'running', 10_000, 50);
  await simAction(['crash', 'vk-crash-2']);
  const { first, last } = await waitEvicted('crash-2', uid);
  assert.ok(first, 'the eviction was seen');
  assertFailedWith('crash-2', last?.pod, 'RestartCooldown');
  assert.match(terminated(last?.pod as V1Pod)?.message ?? '', /within 30s of its restart/);
  assert.equal(await simVmRecord(w, vmId), undefined, 'the VM is removed');
  const calls = callsSince(w, from);
  assert.equal(calls.filter((c) => c.cmd === `vm start ${vmId}`).length, 1, 'one restart only');
  assert.ok(
    calls.some((c) => c.cmd === `vm rm --force ${vmId}`),
    'vm rm --force',
  );
  // Events are posted apart from the pod's own writes: the pod may be gone before its event.
  await waitForEvent(
    'crash-2',
    (e) => e.type === 'Warning' && e.reason === 'Evicted' && /^RestartCooldown/.test(e.message),
  );
  const events = await podEvents(w.core, w.namespace, 'crash-2');
  assert.ok(events.some((e) => e.reason === 'VMRestarted'));
});

test('deleted behind our back: evicted VMGone', async (t) => {
  const ready = await readyPod('gone-1');
  const uid = ready.metadata?.uid ?? '';
  const vmId = vmIdOf(ready);
  const from = w.simulator.calls().length;
  const del = await simAction(['delete-behind-back', 'vk-gone-1']);
  const { first, last } = await waitEvicted('gone-1', uid);
  t.diagnostic(
    `deletion → eviction seen: ${(first?.at ?? 0) - del.at} ms (the __sim call took ${del.durationMs} ms)`,
  );
  assert.ok((first?.at ?? Infinity) - del.at < 5000, 'evicted within 5 s');
  assertFailedWith('gone-1', last?.pod, 'VMGone');
  assert.equal(callsSince(w, from).filter((c) => c.cmd.startsWith('vm start')).length, 0, 'no restart');
  await waitForEvent(
    'gone-1',
    (e) => e.type === 'Warning' && e.reason === 'Evicted' && /^VMGone/.test(e.message),
  );
  assert.equal(await simVmRecord(w, vmId), undefined);
});

test('a VM put in error is restarted', async () => {
  const ready = await readyPod('err-1');
  const uid = ready.metadata?.uid ?? '';
  const vmId = vmIdOf(ready);
  const from = w.simulator.calls().length;
  await simAction(['set-state', 'vk-err-1', 'error']);
  await waitFor(
    `vm start ${vmId}`,
    () => callsSince(w, from).some((c) => c.cmd === `vm start ${vmId}` && c.exit === 0),
    15_000,
    50,
  );
  assert.equal((await simVmRecord(w, vmId))?.state, 'running');
  await waitFor(
    'Warning VMRestarted',
    async () =>
      (await podEvents(w.core, w.namespace, 'err-1')).some(
        (e) => e.type === 'Warning' && e.reason === 'VMRestarted' && / was error;/.test(e.message),
      ),
    15_000,
    200,
  );
  const p = await waitForPod(w.core, w.namespace, 'err-1', 'ready', (x) => isReady(x), 15_000);
  assert.equal(p.metadata?.uid, uid);
  assert.equal(p.metadata?.deletionTimestamp, undefined);
  assert.equal(callsSince(w, from).filter((c) => c.cmd === `vm start ${vmId}`).length, 1);
});

test('the event stream killed: restarted, and a death meanwhile is still handled within a tick', async (t) => {
  const ready = await readyPod('stream-1');
  const uid = ready.metadata?.uid ?? '';
  await waitFor('one event stream process', () => streamPids().length === 1, 10_000, 100);
  const [old] = streamPids();
  const from = w.simulator.calls().length;
  const killedAt = Date.now();
  process.kill(old as number, 'SIGKILL');
  // Right after the kill, while no stream runs (the restart backoff is at least 1 s).
  const del = await simAction(['delete-behind-back', 'vk-stream-1']);
  assert.ok(streamPids().every((p) => p !== old));
  const { first, last } = await waitEvicted('stream-1', uid);
  const took = (first?.at ?? Infinity) - del.at;
  t.diagnostic(`deletion → eviction seen: ${took} ms (the stream was killed ${del.at - killedAt} ms before)`);
  assert.ok(took < 5000, `evicted ${took} ms after the deletion (one tick is 15 s)`);
  assertFailedWith('stream-1', last?.pod, 'VMGone');
  await waitFor('a new event stream process', () => streamPids().some((p) => p !== old), 15_000, 100);
  const now = streamPids();
  assert.equal(now.length, 1, `one stream: ${now.join(', ')}`);
  t.diagnostic(`new stream pid ${now[0]} (was ${old})`);
  // The re-check after the restart (a `vm list`) ran.
  await waitFor(
    'vm list after the stream restarted',
    () => callsSince(w, from).some((c) => c.argv[0] === 'vm' && c.argv[1] === 'list'),
    10_000,
    100,
  );
  // The new stream serves: a crash is still restarted.
  const other = await readyPod('stream-2');
  const vmId = vmIdOf(other);
  const from2 = w.simulator.calls().length;
  await simAction(['set-state', 'vk-stream-2', 'stopped']);
  await waitFor(
    `vm start ${vmId}`,
    () => callsSince(w, from2).some((c) => c.cmd === `vm start ${vmId}`),
    15_000,
    50,
  );
});

test('hibernate asked for: a VM deleted during its save is neither restarted nor evicted', async (t) => {
  // Without a registry the daemon hibernates locally: save, then remove. The save is made slow
  // so the deletion lands inside it (the VM is still bound and the hibernate in flight).
  await w.simulator.mergeKnobs({ latency: { 'snapshot save': 4000 } });
  try {
    const ready = await readyPod('hib-1');
    const uid = ready.metadata?.uid ?? '';
    const vmId = vmIdOf(ready);
    const from = w.simulator.calls().length;
    await annotate(w.core, w.namespace, 'hib-1', { 'vm.cocoonstack.io/hibernate': 'true' });
    await waitForPod(
      w.core,
      w.namespace,
      'hib-1',
      'hibernating',
      (p) => lifecycle(p) === 'hibernating',
      15_000,
    );
    // The save is in flight once its pending snapshot record exists.
    const snapDb = `${w.simRoot}/snapshot/db/snapshots.json`;
    await waitFor(
      'snapshot save in flight',
      () => {
        try {
          const db = JSON.parse(readFileSync(snapDb, 'utf8')) as { names: Record<string, string> };
          return db.names['vk-hib-1'] !== undefined;
        } catch {
          return false;
        }
      },
      10_000,
      50,
    );
    await simAction(['delete-behind-back', 'vk-hib-1']);
    // Past the save, the commit, two pid checks and a stream tick (5 s).
    const end = await waitForPod(
      w.core,
      w.namespace,
      'hib-1',
      'hibernated or failed',
      (p) => lifecycle(p) === 'hibernated' || lifecycle(p) === 'failed',
      30_000,
    );
    t.diagnostic(
      `ended ${lifecycle(end)}: ${end.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? ''}`,
    );
    await sleep(7000);
    const p = await read('hib-1');
    assert.equal(p.metadata?.uid, uid, 'the same pod');
    assert.equal(p.metadata?.deletionTimestamp, undefined, 'not deleted');
    assert.notEqual(p.status?.phase, 'Failed');
    assert.equal(lifecycle(p), 'hibernated');
    assert.equal(vmIdOf(p), '');
    assert.equal(callsSince(w, from).filter((c) => c.cmd.startsWith('vm start')).length, 0, 'no vm start');
    assert.equal(await simVmRecord(w, vmId), undefined);
    const events = await podEvents(w.core, w.namespace, 'hib-1');
    assert.ok(
      !events.some((e) => e.reason === 'Evicted' || e.reason === 'VMRestarted'),
      JSON.stringify(events),
    );
    assert.ok(!(versions.get('hib-1') ?? []).some((v) => v.pod.metadata?.deletionTimestamp));
  } finally {
    await w.simulator.mergeKnobs({ latency: { 'snapshot save': null } });
  }
});
