// The op retry (docs/contracts/pod-to-vm.md, "Op retry"; src/provider/cocoon/ops/retry.ts): a
// failed hibernate is tried again after 15 s, then 30, 60, 120, 240 s and 300 s from then on,
// never sooner. In process, on mock timers and the frozen monotonic clock, so no test waits
// through the minutes it checks.
import assert from 'node:assert/strict';
import { afterEach, describe, mock, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import {
  nextOpRetryDelay,
  OP_RETRY_BASE_MS,
  OP_RETRY_MAX_MS,
} from '../../../src/provider/cocoon/ops/retry.ts';
import { advanceMonoClockForTests, freezeMonoClockForTests } from '../../../src/util/mono-clock.ts';
import { FakeStore } from '../fakes/store.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/op-retry', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const VM_ID = 'vm.cocoonstack.io/id';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
    mock.timers.reset();
    freezeMonoClockForTests(false);
  });

  test('the delays: 15 s doubling to 5 min, then 5 min', () => {
    const seen: number[] = [];
    let d: number | undefined;
    for (let i = 0; i < 8; i++) {
      d = nextOpRetryDelay(d);
      seen.push(d / 1000);
    }
    assert.deepEqual(seen, [15, 30, 60, 120, 240, 300, 300, 300]);
    assert.equal(OP_RETRY_BASE_MS, 15_000);
    assert.equal(OP_RETRY_MAX_MS, 300_000);
  });

  test('a hibernate whose push keeps failing is retried on that schedule, never before a retry is due', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    freezeMonoClockForTests(true);
    let store: FakeStore | undefined;
    h = harness({
      store: (c) => {
        store = new FakeStore(c);
        return store;
      },
    });
    h.cocoon.snapshot('acme/agent');
    const pod = clonePod('or-0');
    await h.provider.createPod(pod);
    await until('bound', () => !!h!.provider.getPod('ns', 'or-0')?.metadata?.annotations?.[VM_ID]);
    const vm = [...h.cocoon.vms.values()][0]!;
    h.lease(vm.nics[0]!.mac, '10.0.0.21');
    const lastState = () =>
      h!
        .patches('or-0')
        .flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []))
        .at(-1);
    await until('ready', () => lastState() === 'ready');
    store!.refusePush = true;
    const api: V1Pod = withAnnotations(
      pod,
      { ...Object.assign({}, ...h.patches('or-0')), 'vm.cocoonstack.io/hibernate': 'true' },
      '900001',
    );
    await h.provider.updatePod(api);
    const pushes = () => store!.calls.filter((c) => c === 'push vk-or-0:hibernate').length;
    await until('the first push failed', () => pushes() === 1 && lastState() === 'failed');
    const settle = async () => {
      for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
    };
    for (const [n, seconds] of [15, 30, 60, 120, 240, 300, 300].entries()) {
      const ms = seconds * 1000;
      // A second before it is due: nothing (timers and the monotonic clock move together).
      advanceMonoClockForTests(ms - 1000);
      mock.timers.tick(ms - 1000);
      await settle();
      assert.equal(pushes(), n + 1, `retry ${n + 1} not before ${seconds} s`);
      advanceMonoClockForTests(1000);
      mock.timers.tick(1000);
      await until(`retry ${n + 1} after ${seconds} s`, () => pushes() === n + 2);
      await until(`retry ${n + 1} failed again`, () => lastState() === 'failed' && pushes() === n + 2);
      await settle();
    }
    // The VM was kept through every failed attempt.
    assert.ok(h.cocoon.vms.has(vm.id));
  });
});
