// Each hibernate phase's deadline (src/provider/cocoon/ops/hibernate.ts PHASE_BUDGET_MS): a
// phase that does not end within its budget is aborted, the hibernate rolls back (VM kept,
// `failed` with the phase's Warning) and the message says the phase passed its deadline. In
// process, on mock timers and the frozen monotonic clock: the minutes are ticked, not waited.
import assert from 'node:assert/strict';
import { afterEach, describe, mock, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { CliCallOptions } from '../../../src/cocoon/runner.ts';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { PHASE_BUDGET_MS } from '../../../src/provider/cocoon/ops/hibernate.ts';
import { advanceMonoClockForTests, freezeMonoClockForTests } from '../../../src/util/mono-clock.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/hibernate-deadlines', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
  const VM_ID = 'vm.cocoonstack.io/id';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    mock.timers.reset();
    freezeMonoClockForTests(false);
  });

  const last = (hh: Harness, name: string, key: string) =>
    hh.patches(name).findLast((a) => a[key] !== undefined)?.[key];

  /** A cocoon call that never answers on its own: it ends only when its signal aborts. */
  const hang = (argv: string[], opts: CliCallOptions) =>
    new Promise<never>((_, reject) => {
      const fail = () => reject(new CocoonCommandError(argv, 'aborted', '', null));
      if (opts.signal?.aborted) fail();
      opts.signal?.addEventListener('abort', fail, { once: true });
    });

  async function hibernating(name: string, extra: Record<string, string> = {}) {
    mock.timers.enable({ apis: ['setTimeout'] });
    freezeMonoClockForTests(true);
    let store: FakeStore | undefined;
    const hh = harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
    });
    h = hh;
    hh.cocoon.snapshot('acme/agent');
    const pod = clonePod(name, extra);
    await hh.provider.createPod(pod);
    await until('bound', () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    const vm = [...hh.cocoon.vms.values()][0]!;
    hh.lease(vm.nics[0]!.mac, '10.0.0.31');
    await until('ready', () => last(hh, name, STATE) === 'ready');
    const ask = (): Promise<void> => {
      const api: V1Pod = withAnnotations(
        pod,
        { ...Object.assign({}, ...hh.patches(name)), 'vm.cocoonstack.io/hibernate': 'true' },
        '900001',
      );
      return hh.provider.updatePod(api);
    };
    return { hh, vm, store: store!, ask };
  }

  /** Ticks the phase's budget (timers and the monotonic clock together) and expects the
   * rollback with the phase named. */
  async function expectDeadline(hh: Harness, name: string, phaseMs: number, reason: string, text: RegExp) {
    await until('hibernating', () => last(hh, name, STATE) === 'hibernating');
    advanceMonoClockForTests(phaseMs - 1000);
    mock.timers.tick(phaseMs - 1000);
    for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
    assert.equal(last(hh, name, STATE), 'hibernating', 'not before the deadline');
    advanceMonoClockForTests(1000);
    mock.timers.tick(1000);
    await until('failed', () => last(hh, name, STATE) === 'failed');
    const message = String(last(hh, name, MESSAGE));
    assert.match(message, text);
    assert.match(message, /passed its deadline\)$/);
    assert.ok(
      hh.events.some((e) => e.type === 'Warning' && e.reason === reason),
      reason,
    );
  }

  describe('a phase past its deadline is aborted and rolled back, the message says so', () => {
    test('snapshot (5 min)', async () => {
      const { hh, vm, ask } = await hibernating('dl-snap');
      hh.cocoon.on(/^snapshot save /, hang);
      await ask();
      await expectDeadline(
        hh,
        'dl-snap',
        PHASE_BUDGET_MS.snapshot,
        'HibernateSnapshotFailed',
        /^hibernate: snapshot save vk-dl-snap: .*\(phase snapshot passed its deadline\)$/,
      );
      assert.ok(hh.cocoon.vms.has(vm.id), 'the VM is kept');
    });

    test('push (15 min)', async () => {
      const { hh, vm, store, ask } = await hibernating('dl-push');
      store.hold = new Promise<void>(() => {}); // a registry that never answers the upload
      await ask();
      await until('pushing', () => store.calls.includes('push vk-dl-push:hibernate'));
      await expectDeadline(
        hh,
        'dl-push',
        PHASE_BUDGET_MS.snapshot + PHASE_BUDGET_MS.push,
        'HibernatePushFailed',
        /^hibernate: push vk-dl-push:hibernate: .*\(phase push passed its deadline\)$/,
      );
      assert.ok(hh.cocoon.vms.has(vm.id), 'the VM is kept');
    });

    test('netresize (1 min after the 20 s DHCP release), a Cloud Hypervisor Windows guest', async () => {
      const { hh, vm, ask } = await hibernating('dl-net', { 'cocoonset.cocoonstack.io/os': 'windows' });
      hh.cocoon.on(/^vm net /, hang);
      await ask();
      await expectDeadline(
        hh,
        'dl-net',
        PHASE_BUDGET_MS.dhcp_release + PHASE_BUDGET_MS.netresize,
        'HibernateNetResizeFailed',
        /^hibernate: dropping the NIC of VM vk-dl-net: .*\(phase netresize passed its deadline\)$/,
      );
      assert.ok(hh.cocoon.vms.has(vm.id), 'the VM is kept');
    });
  });
});
