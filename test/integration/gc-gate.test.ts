// Local snapshot GC and the snapshot CPU-class gate (issue 11; docs/decisions.md "Snapshot GC
// and the CPU-class gate") against the real apiserver, the ground's real registry and the
// cocoon simulator. The GC runs at start (and every 10 min): each phase restarts the daemon and waits
// for the pass's summary line in its log.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod, waitForPodGone } from '../../ground/kube.ts';
import { freePort, waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import {
  annotate,
  fixture,
  isReady,
  lifecycle,
  lifecycleMessage,
  podEvents,
  simVmRecord,
} from './helpers.ts';

const gcWorld = useWorld({ deferDaemon: true });
const gateWorld = useWorld({ env: { VK_SNAPSHOT_CPU_CLASS: 'skylake' } });

const SOURCE = 'gc/base';

interface LogLine {
  msg?: string;
  removed?: string[];
  errors?: string[];
  current?: string[];
  used?: string[];
  err?: string;
}

function logLines(w: World): LogLine[] {
  return readFileSync(w.logFile, 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as LogLine);
}

const gcDone = (w: World) => logLines(w).filter((l) => l.msg?.startsWith('snapshot GC done'));

/** Restarts the daemon (graceful) with `registry` and waits for the GC pass it runs at start. */
async function restartAndGc(w: World, registry: string): Promise<LogLine> {
  const before = gcDone(w).length;
  await w.daemon?.stop();
  await w.restart({ OCI_REGISTRY: registry });
  await waitFor('the GC pass at start', async () => gcDone(w).length > before, 120_000, 200);
  return gcDone(w).at(-1) as LogLine;
}

async function localSnapshots(w: World): Promise<Map<string, string>> {
  const r = await w.simulator.run(['snapshot', 'list', '-o', 'json']);
  if (r.code !== 0) throw new Error(`snapshot list: ${r.stderr.trim()}`);
  const text = r.stdout.trim();
  const list = text.startsWith('[') ? (JSON.parse(text) as { id: string; name: string }[]) : [];
  return new Map(list.map((s) => [s.name, s.id]));
}

async function hibernatedPod(w: World, name: string, extra: Record<string, string> = {}): Promise<V1Pod> {
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': SOURCE,
      'cocoonset.cocoonstack.io/managed': 'true',
      ...extra,
    }),
  });
  await waitForPod(w.core, w.namespace, name, 'ready', (p) => lifecycle(p) === 'ready' && isReady(p), 90_000);
  await annotate(w.core, w.namespace, name, { 'vm.cocoonstack.io/hibernate': 'true' });
  return await waitForPod(
    w.core,
    w.namespace,
    name,
    'hibernated',
    (p) => lifecycle(p) === 'hibernated',
    90_000,
  );
}

const run = promisify(execFile);

/** crane: VK_CRANE_BIN (scripts/test.sh), else built or found by scripts/cranebin.sh. */
async function craneBin(): Promise<string> {
  if (process.env.VK_CRANE_BIN) return process.env.VK_CRANE_BIN;
  const root = path.resolve(import.meta.dirname, '..', '..');
  const { stdout } = await run('bash', [path.join(root, 'scripts', 'cranebin.sh')], { maxBuffer: 1 << 20 });
  return path.join(stdout.trim().split('\n').pop() ?? '', 'crane');
}

describe('local snapshot GC', () => {
  let w: World;
  let base: string;

  before(async () => {
    w = await gcWorld();
    base = `${w.ground.registry.hostPort}/${w.namespace}`;
    await fixture(w, SOURCE, 'linux');
    await w.restart({ OCI_REGISTRY: base });
    const keep = { 'vm.cocoonstack.io/keep-snapshot-on-delete': 'true' };
    // `sleep` stays tracked and hibernated; `kept` and `replaced` are hibernated and then
    // deleted with their local copies kept (their :hibernate tags stay).
    await Promise.all([
      hibernatedPod(w, 'sleep'),
      hibernatedPod(w, 'kept', keep),
      hibernatedPod(w, 'replaced', keep),
    ]);
    for (const name of ['kept', 'replaced']) {
      await w.core.deleteNamespacedPod({ namespace: w.namespace, name });
      await waitForPodGone(w.core, w.namespace, name, 60_000);
    }
    // `vk-replaced:hibernate` now names another snapshot (vk-kept's) than the local copy the
    // daemon saved: that copy is stale. (A local copy replaced by hand behind the daemon's back
    // is not the one its ledger recorded, and is never collected.)
    await run(await craneBin(), [
      'copy',
      '--insecure',
      `${base}/vk-kept:hibernate`,
      `${base}/vk-replaced:hibernate`,
    ]);
    await fixture(w, 'vk-gone', 'linux'); // made by hand: no ledger entry, never collected
    await fixture(w, 'fork-vk-gone', 'linux'); // not a vk-* name
    await fixture(w, 'other/snap', 'linux');
  });

  test('a registry that errors keeps every snapshot', async () => {
    const before = await localSnapshots(w);
    for (const n of ['vk-sleep', 'vk-kept', 'vk-replaced', 'vk-gone']) assert.ok(before.has(n), n);
    const dead = `127.0.0.1:${await freePort()}`;
    const pass = await restartAndGc(w, dead);
    assert.deepEqual(pass.removed, []);
    // vk-gone was not written by vk-cocoon (no ledger entry): not even asked about.
    assert.deepEqual(pass.errors?.sort(), ['vk-kept', 'vk-replaced']);
    assert.deepEqual(await localSnapshots(w), before, 'nothing removed');
    assert.ok(
      logLines(w).some((l) => l.msg?.startsWith('snapshot GC: cannot read vk-kept:hibernate')),
      'each registry error is logged with the name',
    );
    // The tracked hibernated pod is still hibernated.
    const sleep = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'sleep' });
    assert.equal(lifecycle(sleep), 'hibernated');
  });

  test('with the registry: only unused vk-* snapshots stale against :hibernate are removed', async () => {
    // A wake that crashed half-way left its import behind; no wake of vk-sleep is in flight.
    await fixture(w, 'vk-sleep-hibernate-import', 'linux');
    const before = await localSnapshots(w);
    const pass = await restartAndGc(w, base);
    assert.deepEqual(pass.removed?.sort(), ['vk-replaced', 'vk-sleep-hibernate-import']);
    assert.deepEqual(pass.current, ['vk-kept'], 'the tag names this very snapshot');
    assert.ok(pass.used?.includes('vk-sleep'), 'the tracked pod uses its copy');
    assert.deepEqual(pass.errors, []);
    const after = await localSnapshots(w);
    // vk-gone: a vk-* snapshot vk-cocoon did not write is never collected (docs/security.md).
    for (const n of ['vk-sleep', 'vk-kept', 'vk-gone', 'fork-vk-gone', 'other/snap', SOURCE])
      assert.equal(after.get(n), before.get(n), `${n} kept`);
    for (const n of ['vk-replaced', 'vk-sleep-hibernate-import']) assert.ok(!after.has(n), `${n} removed`);
    // The kept copy still serves its pod: waking `sleep` ends ready.
    await annotate(w.core, w.namespace, 'sleep', { 'vm.cocoonstack.io/hibernate': null });
    await waitForPod(
      w.core,
      w.namespace,
      'sleep',
      'woken',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      90_000,
    );
  });
});

describe('snapshot CPU-class gate', () => {
  const LABEL = 'cocoonstack.io/snapshot-cpu-class';
  // Bound directly to the node (spec.nodeName): the scheduler, which would match the
  // nodeSelector against the node's labels, is bypassed, so the provider's gate decides.
  const classPod = (name: string, cls: string) =>
    vmPod(
      name,
      w.nodeName,
      {
        'vm.cocoonstack.io/name': `vk-${name}`,
        'cocoonset.cocoonstack.io/image': SOURCE,
        'cocoonset.cocoonstack.io/managed': 'true',
      },
      { nodeSelector: { [LABEL]: cls } },
    );
  let w: World;

  before(async () => {
    w = await gateWorld();
    await fixture(w, SOURCE, 'linux');
  });

  test('the node carries its class; a matching pod boots; a mismatching one is refused with the reason', async () => {
    const node = await w.core.readNode({ name: w.nodeName });
    assert.equal(node.metadata?.labels?.[LABEL], 'skylake');
    for (const [name, cls] of [
      ['sky', 'skylake'],
      ['ice', 'icelake'],
    ] as const) {
      await w.core.createNamespacedPod({ namespace: w.namespace, body: classPod(name, cls) });
    }
    await waitForPod(
      w.core,
      w.namespace,
      'sky',
      'ready',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      90_000,
    );
    const ice = await waitForPod(
      w.core,
      w.namespace,
      'ice',
      'failed',
      (p) => lifecycle(p) === 'failed',
      30_000,
    );
    assert.match(lifecycleMessage(ice), /snapshot-cpu-class="icelake".*VK_SNAPSHOT_CPU_CLASS \("skylake"\)/);
    assert.equal(await simVmRecord(w, 'vk-ice'), undefined, 'never a VM');
    let events: Awaited<ReturnType<typeof podEvents>> = [];
    await waitFor(
      'the Warning',
      async () => {
        events = await podEvents(w.core, w.namespace, 'ice');
        return events.some((e) => e.reason === 'snapshot_cpu_class_mismatch');
      },
      30_000,
      200,
    );
    const ev = events.find((e) => e.reason === 'snapshot_cpu_class_mismatch');
    assert.equal(ev?.type, 'Warning');
    assert.match(ev?.message ?? '', /^create: .*icelake/);
    const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
    assert.match(
      text,
      /cocoon_vk_pod_lifecycle_total\{[^}]*op="create"[^}]*result="failed"[^}]*reason="snapshot_cpu_class_mismatch"[^}]*\} 1/,
    );
  });

  test('startup refuses while a mismatching pod is on the node, naming it; starts once it is gone', async () => {
    assert.equal(await w.daemon.stop(), 0);
    const logBefore = readFileSync(w.logFile, 'utf8').length;
    // (ground/daemon.ts notices an early exit only when its 60 s wait for the kubelet API ends.)
    await assert.rejects(w.restart(), /vk-cocoon exited with 1/);
    const lines = readFileSync(w.logFile, 'utf8')
      .slice(logBefore)
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as LogLine & { level?: string });
    const fatal = lines.find((l) => l.level === 'fatal');
    assert.equal(fatal?.msg, 'startup reconcile failed; refusing to register node');
    assert.match(fatal?.err ?? '', new RegExp(`${w.namespace}/ice \\("icelake"\\)`));
    assert.match(fatal?.err ?? '', /VK_SNAPSHOT_CPU_CLASS \("skylake"\)/);
    assert.doesNotMatch(fatal?.err ?? '', /\/sky\b/);
    // The operator's way out: the pod goes (force: no kubelet confirms it), the node starts.
    await w.core.deleteNamespacedPod({ namespace: w.namespace, name: 'ice', gracePeriodSeconds: 0 });
    await waitForPodGone(w.core, w.namespace, 'ice', 30_000);
    await w.restart();
    const sky = await waitForPod(
      w.core,
      w.namespace,
      'sky',
      'ready after restart',
      (p) => isReady(p),
      60_000,
    );
    assert.equal(lifecycle(sky), 'ready');
  });
});
