// The cocoon provider's create path, in process (fake Kubernetes client, fake cocoon runner):
// a slow pull does not hold the caller, failed creates are not re-run by our own writes,
// transient failures back off without publishing `failed`, and a staged `ready` is never
// re-sent without an IP (docs/decisions.md: "Create failures", "Decisions that must always be
// possible").
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, mock, test } from 'node:test';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { SnapshotPullError } from '../../../src/registry/pull.ts';
import { apiError } from '../fakes/kube.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/create', () => {
  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    mock.timers.reset();
  });

  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));

  describe('bring-up does not hold the caller', () => {
    test('CreatePod returns once the pod is claimed, while the clone-source pull is still running', async () => {
      let release: () => void = () => {};
      const pulled = new Promise<void>((r) => {
        release = r;
      });
      h = harness({
        puller: {
          ensure: async () => {
            await pulled;
            h?.cocoon.snapshot('acme/agent');
          },
        },
      });
      const pod = clonePod('cold-0');
      await h.provider.createPod(pod); // resolves with the pull still pending
      assert.deepEqual(states(h, 'cold-0'), ['creating']);
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
      // Another pod is served meanwhile (its snapshot is local).
      h.cocoon.snapshot('acme/warm');
      await h.provider.createPod(clonePod('warm-0', { 'cocoonset.cocoonstack.io/image': 'acme/warm' }));
      await until('warm clone', () => h!.cocoon.callsOf('vm clone').length === 1);
      release();
      await until('cold clone', () => h!.cocoon.callsOf('vm clone').length === 2);
      await until(
        'cold bound',
        () => !!h!.provider.getPod('ns', 'cold-0')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
      );
    });
  });

  describe('a failed create', () => {
    test('is not re-run by our own lifecycle writes, status or label updates; an annotation fix re-runs it', async () => {
      h = harness();
      const pod = clonePod('missing-0', { 'cocoonset.cocoonstack.io/image': 'acme/absent' });
      await h.provider.createPod(pod);
      await until('failed', () => states(h!, 'missing-0').includes('failed'));
      const inspects = () => h!.cocoon.callsOf('snapshot inspect acme/absent').length;
      const before = inspects();
      // Our own writes coming back, then a label edit, then a status-only update.
      const back = withAnnotations(pod, Object.assign({}, ...h.patches('missing-0')), '5');
      await h.provider.updatePod(back);
      await h.provider.updatePod({
        ...back,
        metadata: { ...back.metadata, labels: { x: 'y' }, resourceVersion: '6' },
      });
      await h.provider.updatePod({
        ...back,
        status: { phase: 'Pending' },
        metadata: { ...back.metadata, resourceVersion: '7' },
      });
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(inspects(), before, 'no re-run');
      assert.deepEqual(states(h, 'missing-0'), ['creating', 'failed'], 'never failed → creating');
      assert.equal(h.events.filter((e) => e.reason === 'CreateBringUpFailed').length, 1);
      // The fix re-runs the create.
      h.cocoon.snapshot('acme/fixed');
      await h.provider.updatePod(
        withAnnotations(back, { 'cocoonset.cocoonstack.io/image': 'acme/fixed' }, '8'),
      );
      await until('cloned', () => h!.cocoon.callsOf('vm clone').length === 1);
    });

    test('a transient failure stays creating and is retried on the backoff schedule', async () => {
      mock.timers.enable({ apis: ['setTimeout'] });
      h = harness();
      h.cocoon.snapshot('acme/agent');
      let locked = 2;
      h.cocoon.on(/^snapshot inspect /, (argv) => {
        if (locked-- > 0) throw new CocoonCommandError(argv, 'database is locked', 'database is locked', 1);
        return {
          stdout: JSON.stringify({ id: 's', name: 'acme/agent', image: '', hypervisor: 'cloud-hypervisor' }),
          stderr: '',
        };
      });
      await h.provider.createPod(clonePod('flaky-0'));
      await until('first attempt', () => h!.cocoon.callsOf('snapshot inspect').length === 1);
      await new Promise((r) => setImmediate(r));
      assert.deepEqual(
        [...new Set(states(h, 'flaky-0'))],
        ['creating'],
        'a transient failure never publishes failed',
      );
      const cond = h.statuses
        .at(-1)
        ?.status?.conditions?.find((c) => c.type === 'vm.cocoonstack.io/Readiness');
      assert.equal(cond?.reason, 'CreateBackoff');
      const shown = () =>
        (Object.assign({}, ...h!.patches('flaky-0')) as Record<string, string | null>)[
          'vm.cocoonstack.io/lifecycle-state-message'
        ];
      assert.match(
        shown() ?? '',
        /^retrying after attempt 1: .*database is locked/,
        'the last error, while it retries',
      );
      mock.timers.tick(9_000);
      await new Promise((r) => setImmediate(r));
      assert.equal(h.cocoon.callsOf('snapshot inspect').length, 1, 'not before 10 s');
      mock.timers.tick(1_000);
      await until('second attempt', () => h!.cocoon.callsOf('snapshot inspect').length === 2);
      mock.timers.tick(20_000);
      await until('third attempt clones', () => h!.cocoon.callsOf('vm clone').length === 1);
      assert.ok(!states(h, 'flaky-0').includes('failed'));
      await until('the message goes once an attempt gets past the failure', () => shown() === null);
    });
  });

  describe('a clone source the reader cannot decode', () => {
    const pulling = (err: Error) => ({
      ensure: async () => {
        throw err;
      },
    });

    test('fails the pod at once with the reason (an artifact that does not decode reads the same on every retry)', async () => {
      const v2 = new SnapshotPullError(
        'pull snapshot reg/acme/next:v1 into acme/next:v1: memory-ranges chunk 1 (sha256:0b): the zstd stream is truncated',
        { undecodable: true },
      );
      h = harness({ puller: pulling(v2) });
      await h.provider.createPod(clonePod('v2-0', { 'cocoonset.cocoonstack.io/image': 'acme/next:v1' }));
      await until('failed', () => states(h!, 'v2-0').includes('failed'));
      const last = Object.assign({}, ...h.patches('v2-0')) as Record<string, string | null>;
      assert.match(
        last['vm.cocoonstack.io/lifecycle-state-message'] ?? '',
        /memory-ranges chunk 1 \(sha256:0b\): the zstd stream is truncated/,
      );
    });

    test('an unreachable registry stays creating and retries', async () => {
      mock.timers.enable({ apis: ['setTimeout'] });
      h = harness({ puller: pulling(new SnapshotPullError('pull snapshot x: connect ECONNREFUSED')) });
      await h.provider.createPod(clonePod('down-0', { 'cocoonset.cocoonstack.io/image': 'acme/next:v1' }));
      await until('backoff', () =>
        h!.statuses.some((st) =>
          st.status?.conditions?.some(
            (c) => c.type === 'vm.cocoonstack.io/Readiness' && c.reason === 'CreateBackoff',
          ),
        ),
      );
      assert.ok(!states(h, 'down-0').includes('failed'));
    });
  });

  describe('ready is never published without an IP', () => {
    test('a ready write that failed is re-checked against the lease file before it is re-sent', async () => {
      // Changed with issue 9: the status and the ready annotation are one write now, so the
      // failed write is that one (it used to be the status write that preceded the annotation).
      let failReady = true;
      let readyAttempts = 0;
      h = harness({
        statusWriter: async (_pod, o) => {
          if (o.annotations?.[STATE] !== 'ready') return;
          readyAttempts++;
          if (failReady) throw apiError(500, 'etcdserver: request timed out');
        },
      });
      h.cocoon.snapshot('acme/agent');
      const pod = clonePod('ip-0');
      await h.provider.createPod(pod);
      await until(
        'bound',
        () => !!h!.provider.getPod('ns', 'ip-0')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
      );
      const vm = [...h.cocoon.vms.values()][0]!;
      h.lease(vm.nics[0]!.mac, '10.0.0.7');
      h.provider.startLoops();
      // The reconcile stages ready; its write fails, so nothing of it lands.
      await until('ready attempted', () => readyAttempts > 0);
      await new Promise((r) => setTimeout(r, 300));
      assert.ok(!states(h, 'ip-0').includes('ready'));
      // The lease goes away before the re-flush; the write would now succeed.
      const { writeFileSync } = await import('node:fs');
      writeFileSync(h.leasesPath, '[]');
      failReady = false;
      const attempts = readyAttempts;
      await h.provider.updatePod(withAnnotations(pod, {}, '9'));
      await new Promise((r) => setTimeout(r, 100));
      assert.ok(!states(h, 'ip-0').includes('ready'), 'ready is not re-sent without an IP');
      assert.equal(readyAttempts, attempts, 'no ready write was even tried');
    });
  });

  describe('a superseded fixup job', () => {
    test('writes no marker once its successor started', async () => {
      const { advanceMonoClockForTests } = await import('../../../src/util/mono-clock.ts');
      h = harness();
      h.cocoon.snapshot('acme/static', { staticIp: '10.0.0.9' });
      const releases: ((ok: boolean) => void)[] = [];
      // Every guest exec hangs, ignoring its abort signal, until the test answers it.
      h.cocoon.on(
        /^vm exec /,
        (argv) =>
          new Promise((resolve, reject) => {
            releases.push((ok) =>
              ok
                ? resolve({ stdout: '', stderr: '' })
                : reject(new CocoonCommandError(argv, 'boom', 'boom', 1)),
            );
          }),
      );
      const pod = clonePod('fix-0', { 'cocoonset.cocoonstack.io/image': 'acme/static' });
      await h.provider.createPod(pod);
      await until('first exec', () => releases.length === 1);
      // The first job outlives its hard deadline (180 s budget + 10 s grace): the next
      // reconcile aborts it and starts a successor for the same VM.
      advanceMonoClockForTests(200_000);
      await h.provider.updatePod(withAnnotations(pod, {}, '20'));
      await until('successor exec', () => releases.length === 2);
      releases[0]!(true); // the superseded job's exec answers late, successfully
      await new Promise((r) => setTimeout(r, 50));
      const markers = h
        .patches('fix-0')
        .flatMap((a) =>
          a['vm.cocoonstack.io/post-clone-state'] !== undefined
            ? [a['vm.cocoonstack.io/post-clone-state']]
            : [],
        );
      assert.ok(
        !markers.includes('done'),
        `markers ${JSON.stringify(markers)}: the superseded job wrote done`,
      );
      releases[1]!(true);
      await until('successor done', () =>
        h!.patches('fix-0').some((a) => a['vm.cocoonstack.io/post-clone-state'] === 'done'),
      );
    });
  });

  describe('restore, fork-from and clone-from-dir', () => {
    test('restore-from-hibernate with no hibernated state anywhere: failed with the reason, never a fresh clone', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('rs-0', { 'vm.cocoonstack.io/restore-from-hibernate': 'true' }));
      await until('failed', () => states(h!, 'rs-0').includes('failed'));
      const msg = h.patches('rs-0').find((a) => a[STATE] === 'failed')?.[
        'vm.cocoonstack.io/lifecycle-state-message'
      ];
      assert.match(String(msg), /no hibernated state for VM vk-rs-0/);
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
      assert.ok(h.events.some((e) => e.type === 'Warning' && e.reason === 'WakePullFailed'));
    });

    test('fork-from a VM no pod of the namespace holds: failed, nothing saved or cloned', async () => {
      h = harness();
      h.cocoon.addVm('vk-other-main');
      await h.provider.createPod(clonePod('fk-0', { 'vm.cocoonstack.io/fork-from': 'vk-other-main' }));
      await until('failed', () => states(h!, 'fk-0').includes('failed'));
      const msg = h.patches('fk-0').find((a) => a[STATE] === 'failed')?.[
        'vm.cocoonstack.io/lifecycle-state-message'
      ];
      assert.match(String(msg), /fork-from: VM vk-other-main is not held by a pod in namespace ns/);
      assert.equal(h.cocoon.callsOf('snapshot save').length, 0);
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
    });

    test('clone-from-dir under <root>/<namespace>/: vm clone --pull --from-dir <resolved dir>', async () => {
      const root = realpathSync(mkdtempSync(join(tmpdir(), 'vk-clone-roots-')));
      mkdirSync(join(root, 'ns', 'vm'), { recursive: true });
      symlinkSync(join(root, 'ns', 'vm'), join(root, 'ns', 'alias'));
      try {
        h = harness({ env: { VK_CLONE_FROM_DIR_ROOTS: root } });
        await h.provider.createPod(
          clonePod('cd-0', { 'vm.cocoonstack.io/clone-from-dir': join(root, 'ns', 'alias') }),
        );
        await until(
          'bound',
          () => !!h!.provider.getPod('ns', 'cd-0')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
        );
        const argv = h.cocoon.callsOf('vm clone')[0]!.argv;
        assert.ok(argv.includes('--pull'));
        // The resolved path, not the link the pod wrote: nothing can re-point it after the check.
        assert.deepEqual(argv.slice(-2), ['--from-dir', join(root, 'ns', 'vm')]);
      } finally {
        rmSync(root, { recursive: true, force: true });
      }
    });

    test('clone-from-dir with VK_CLONE_FROM_DIR_ROOTS unset: failed naming the setting, never a clone', async () => {
      h = harness();
      await h.provider.createPod(clonePod('cd-1', { 'vm.cocoonstack.io/clone-from-dir': '/srv/vm' }));
      await until('failed', () => states(h!, 'cd-1').includes('failed'));
      const msg = h.patches('cd-1').find((a) => a[STATE] === 'failed')?.[
        'vm.cocoonstack.io/lifecycle-state-message'
      ];
      assert.match(String(msg), /clone-from-dir "\/srv\/vm" refused: .*VK_CLONE_FROM_DIR_ROOTS is unset/);
      assert.ok(h.events.some((e) => e.type === 'Warning' && e.reason === 'CloneFromDirRefused'));
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
    });

    test('a network outside the allow-list: failed naming the rule, never a clone', async () => {
      h = harness({ env: { VK_NAMESPACE_NETWORKS: 'ns=net-a' } });
      h.cocoon.snapshot('acme/agent');
      await h.provider.createPod(clonePod('nw-0', { 'cocoonset.cocoonstack.io/network': 'mgmt' }));
      await until('failed', () => states(h!, 'nw-0').includes('failed'));
      const msg = h.patches('nw-0').find((a) => a[STATE] === 'failed')?.[
        'vm.cocoonstack.io/lifecycle-state-message'
      ];
      assert.match(String(msg), /network "mgmt" refused: VK_NAMESPACE_NETWORKS limits namespace ns to net-a/);
      assert.ok(h.events.some((e) => e.type === 'Warning' && e.reason === 'NetworkRefused'));
      assert.equal(h.cocoon.callsOf('vm clone').length, 0);
    });

    test('an explicit snapshot-policy without a registry: Warning SnapshotPolicyNoRegistry, the VM is removed', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      const pod = clonePod('pol-0', { 'cocoonset.cocoonstack.io/snapshot-policy': 'always' });
      await h.provider.createPod(pod);
      await until(
        'bound',
        () => !!h!.provider.getPod('ns', 'pol-0')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
      );
      await h.provider.deletePod(pod);
      assert.ok(
        h.events.some((e) => e.reason === 'SnapshotPolicyNoRegistry' && e.message.includes('always')),
      );
      assert.equal(h.cocoon.vms.size, 0);
      assert.equal(h.cocoon.callsOf('snapshot save').length, 0);
      // No explicit policy: no warning.
      const quiet = clonePod('pol-1');
      await h.provider.createPod(quiet);
      await until(
        'bound',
        () => !!h!.provider.getPod('ns', 'pol-1')?.metadata?.annotations?.['vm.cocoonstack.io/id'],
      );
      await h.provider.deletePod(quiet);
      assert.equal(h.events.filter((e) => e.reason === 'SnapshotPolicyNoRegistry').length, 1);
    });
  });
});
