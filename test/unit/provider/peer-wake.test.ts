// The peer step of a wake in process (fake Kubernetes client, fake cocoon runner, fake snapshot
// store, a recording PeerRestorer; docs/peer-restore.md "When a wake asks a peer"): its order
// against the local copy and the registry, the skips, the fallback, the staged directory's
// clone and release, the metric and the event. The wire (server, client, slices, trailer) is in
// test/unit/peer/, the real hosts in test/integration/fleet-*.test.ts.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { PeerRestorer, PeerStaged } from '../../../src/provider/cocoon/context.ts';
import { type LifecycleMetrics, noMetrics } from '../../../src/provider/cocoon/metrics.ts';
import type { SnapshotConfig } from '../../../src/registry/artifact-config.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/peer-wake', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const VM_ID = 'vm.cocoonstack.io/id';
  const HIBERNATE = 'vm.cocoonstack.io/hibernate';

  /** A PeerRestorer that records its calls and answers as told. */
  class FakePeer implements PeerRestorer {
    readonly stamp = { address: '127.0.0.9:12501', pin: 'ab'.repeat(32) };
    readonly calls: { vmName: string; fromNode: string; snapshotId: string; stamp?: string }[] = [];
    readonly released: string[] = [];
    answer: 'staged' | 'skip' | 'fail' | 'hang' = 'staged';
    aborted = 0;
    async restore(args: {
      vmName: string;
      fromNode: string;
      stamp?: { address: string; pin: string };
      config: SnapshotConfig;
      signal?: AbortSignal;
    }): Promise<PeerStaged | { skip: string }> {
      this.calls.push({
        vmName: args.vmName,
        fromNode: args.fromNode,
        snapshotId: args.config.snapshotId,
        ...(args.stamp ? { stamp: `${args.stamp.address} ${args.stamp.pin.slice(0, 4)}` } : {}),
      });
      if (this.answer === 'skip') return { skip: `node ${args.fromNode} not found` };
      if (this.answer === 'fail') throw new Error('checksum mismatch');
      if (this.answer === 'hang') {
        // A transfer that lasts until its signal aborts it.
        return await new Promise((_, reject) =>
          args.signal?.addEventListener('abort', () => {
            this.aborted++;
            reject(new Error('aborted'));
          }),
        );
      }
      const dir = `/staging/${args.vmName}-1`;
      return { dir, bytes: 4096, release: async () => void this.released.push(dir) };
    }
  }

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  function setup() {
    let store: FakeStore | undefined;
    const peer = new FakePeer();
    const peerMetrics: string[] = [];
    const metrics: LifecycleMetrics = {
      ...noMetrics,
      peerRestore: (ns, result, seconds) =>
        void peerMetrics.push(`${ns} ${result} ${seconds > 0 ? '>0' : '0'}`),
    };
    h = harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
      peer: () => peer,
      metrics,
    });
    return { hh: h, store: () => store as FakeStore, peer, peerMetrics };
  }

  const lastState = (hh: Harness, name: string) =>
    hh
      .patches(name)
      .flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []))
      .at(-1);

  let rv = 700_000;
  function apiCopy(hh: Harness, pod: V1Pod, changes: Record<string, string | null> = {}): V1Pod {
    return withAnnotations(
      pod,
      { ...Object.assign({}, ...hh.patches(pod.metadata!.name!)), ...changes },
      String(++rv),
    );
  }

  /** A ready pod hibernated on this host; then its state is made to look pushed by `fromNode`
   * (and, with `dropLocal`, as if the pod was recreated on this host: no local copy). */
  async function hibernatedElsewhere(
    s: ReturnType<typeof setup>,
    name: string,
    o: { fromNode: string; dropLocal?: boolean; snapshotId?: string },
  ) {
    const hh = s.hh;
    hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name, {});
    await hh.provider.createPod(pod);
    await until('bound', () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`)!;
    hh.lease(vm.nics[0]!.mac, '10.0.0.20');
    await until('ready', () => lastState(hh, name) === 'ready');
    await hh.provider.updatePod(apiCopy(hh, pod, { [HIBERNATE]: 'true' }));
    await until('hibernated', () => lastState(hh, name) === 'hibernated');
    const key = `vk-${name}:hibernate`;
    const id = s.store().tags.get(key)!;
    const snapshotId = o.snapshotId ?? id.snapshotId;
    s.store().tags.set(key, {
      ...id,
      snapshotId,
      fromNode: o.fromNode,
      peerAddress: '127.9.9.9:12501',
      peerPin: 'cd'.repeat(32),
      config: { schemaVersion: 'v1', snapshotId, hypervisor: 'cloud-hypervisor', files: {}, raw: {} },
    });
    if (o.dropLocal) hh.cocoon.snapshots.delete(`vk-${name}`);
    return pod;
  }

  describe('a wake asks the pushing host', () => {
    test('no local copy: the peer stages it, the clone reads the directory, no pull, the directory is released', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'p-0', { fromNode: 'host-b', dropLocal: true });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.deepEqual(s.peer.calls, [
        { vmName: 'vk-p-0', fromNode: 'host-b', snapshotId: 'snap-vk-p-0', stamp: '127.9.9.9:12501 cdcd' },
      ]);
      const clone = s.hh.cocoon.callsOf('vm clone').at(-1)!.argv;
      assert.equal(clone[clone.indexOf('--from-dir') + 1], '/staging/vk-p-0-1');
      assert.ok(clone.includes('--pull'), 'a --from-dir clone always pulls its base image');
      assert.equal(s.store().calls.filter((c) => c.startsWith('pull')).length, 0, 'no registry pull');
      assert.deepEqual(s.peer.released, ['/staging/vk-p-0-1']);
      assert.equal(s.hh.events.find((e) => e.reason === 'Woken')!.message, 'cloned from peer host-b');
      assert.deepEqual(s.peerMetrics, ['ns ok >0']);
    });

    test('a stale local copy (another snapshot id) is removed, then the peer is asked', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'p-1', { fromNode: 'host-b', snapshotId: 'newer' });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.ok(s.hh.cocoon.callsOf('snapshot rm vk-p-1').length >= 1, 'stale copy removed');
      assert.equal(s.peer.calls.length, 1);
      assert.equal(s.peer.calls[0]!.snapshotId, 'newer');
    });

    test('a failed peer restore is counted and the wake pulls from the registry', async () => {
      const s = setup();
      s.peer.answer = 'fail';
      const pod = await hibernatedElsewhere(s, 'p-2', { fromNode: 'host-b', dropLocal: true });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.equal(s.peer.calls.length, 1);
      assert.deepEqual(s.peerMetrics, ['ns failed 0']);
      assert.equal(s.store().calls.filter((c) => c === 'pull vk-p-2:hibernate').length, 1);
      assert.equal(s.hh.cocoon.callsOf('vm clone').at(-1)!.argv.at(-1), 'vk-p-2-hibernate-import');
      assert.equal(s.hh.events.find((e) => e.reason === 'Woken')!.message, 'cloned from vk-p-2:hibernate');
    });

    test('a skipped peer (its node is gone) is not counted; the wake pulls', async () => {
      const s = setup();
      s.peer.answer = 'skip';
      const pod = await hibernatedElsewhere(s, 'p-3', { fromNode: 'host-gone', dropLocal: true });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.equal(s.peer.calls.length, 1);
      assert.deepEqual(s.peerMetrics, []);
      assert.equal(s.store().calls.filter((c) => c === 'pull vk-p-3:hibernate').length, 1);
    });
  });

  describe('a wake does not ask a peer', () => {
    test('state pushed by this host: no peer, the registry pull', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'q-0', { fromNode: 'cocoon-pool', dropLocal: true });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.equal(s.peer.calls.length, 0);
      assert.equal(s.store().calls.filter((c) => c === 'pull vk-q-0:hibernate').length, 1);
    });

    test('a verified local copy: cloned from it, no peer, no pull', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'q-1', { fromNode: 'host-b' });
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('woken', () => s.hh.events.some((e) => e.reason === 'Woken'));
      assert.equal(s.peer.calls.length, 0);
      assert.equal(s.hh.cocoon.callsOf('vm clone').at(-1)!.argv.at(-1), 'vk-q-1');
      assert.equal(s.store().calls.filter((c) => c.startsWith('pull')).length, 0);
    });

    test('the tag is gone: the stale local copy is removed, no peer, the wake fails as absent', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'q-2', { fromNode: 'host-b' });
      s.store().tags.delete('vk-q-2:hibernate');
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('failed', () => lastState(s.hh, 'q-2') === 'failed');
      assert.equal(s.peer.calls.length, 0);
      assert.ok(s.hh.cocoon.callsOf('snapshot rm vk-q-2').length >= 1);
    });

    test('a staged state of another hypervisor is refused before the clone and still released', async () => {
      const s = setup();
      const pod = await hibernatedElsewhere(s, 'q-3', { fromNode: 'host-b', dropLocal: true });
      const key = 'vk-q-3:hibernate';
      const id = s.store().tags.get(key)!;
      s.store().tags.set(key, { ...id, config: { ...id.config!, hypervisor: 'firecracker' } });
      const clones = s.hh.cocoon.callsOf('vm clone').length;
      await s.hh.provider.updatePod(apiCopy(s.hh, pod, { [HIBERNATE]: null }));
      await until('failed', () => lastState(s.hh, 'q-3') === 'failed');
      assert.equal(s.hh.cocoon.callsOf('vm clone').length, clones, 'no clone of a mismatching state');
      assert.deepEqual(s.peer.released, ['/staging/vk-q-3-1']);
    });

    test('a delete during the peer transfer aborts it: not counted as a failed peer, no registry pull after it', async () => {
      const s = setup();
      s.peer.answer = 'hang';
      const pod = await hibernatedElsewhere(s, 'q-4', { fromNode: 'host-b', dropLocal: true });
      const woken = apiCopy(s.hh, pod, { [HIBERNATE]: null });
      await s.hh.provider.updatePod(woken);
      await until('the peer asked', () => s.peer.calls.length === 1);
      await s.hh.provider.deletePod({
        ...woken,
        metadata: { ...woken.metadata, deletionTimestamp: new Date() },
      });
      await until('the transfer aborted', () => s.peer.aborted === 1);
      await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(s.peerMetrics, []);
      assert.equal(s.store().calls.filter((c) => c.startsWith('pull')).length, 0);
    });
  });
});
