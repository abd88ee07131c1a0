// Deadlines run on the monotonic clock (docs/decisions.md, "Bounded waiting"): a wall-clock
// step forward or back neither cuts short nor stretches the ready deadline or the IP wait.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../../src/cocoon/records.ts';
import { deriveOwedStep } from '../../../src/lifecycle/owed.ts';
import type { ProviderContext } from '../../../src/provider/cocoon/context.ts';
import { readinessFacts } from '../../../src/provider/cocoon/readiness/facts.ts';
import { bindVm, newRecord, recordProgress } from '../../../src/provider/cocoon/state.ts';
import { monoNow, wallAt } from '../../../src/util/mono-clock.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/mono-deadline', () => {
  const realNow = Date.now;
  afterEach(() => {
    Date.now = realNow;
  });

  function boundRecord() {
    const pod: V1Pod = { metadata: { namespace: 'ns', name: 'p', uid: 'u1' } };
    const rec = newRecord('ns/p', pod, {
      vmName: 'vk-p',
      managed: true,
      os: 'linux',
      hibernate: false,
    } as never);
    const vm = {
      id: 'AAAAAAAAAAAAAAAAAAAAAAAAAA',
      hypervisor: 'cloud-hypervisor',
      name: 'vk-p',
      nics: [{ mac: 'aa:bb:cc:dd:ee:ff' }],
    } as unknown as VmRecord;
    const ctx = {
      pods: new Map([[rec.key, rec]]),
      startupDoneAt: monoNow(),
      config: { readyDeadlineSeconds: 600 },
    } as unknown as ProviderContext;
    bindVm(rec, vm, { owns: true, clonedBoot: true });
    return { ctx, rec };
  }

  test('a wall clock stepped one hour forward does not fire the ready deadline', () => {
    const { ctx, rec } = boundRecord();
    Date.now = () => realNow() + 3_600_000;
    const step = deriveOwedStep(readinessFacts(ctx, rec), monoNow());
    assert.notEqual(step.kind, 'decideFailed');
    assert.equal(step.kind, 'startIpWait');
  });

  test('a wall clock stepped one hour back does not stretch the IP wait', () => {
    const { ctx, rec } = boundRecord();
    const started = monoNow() - 46_000; // the IP wait began 46 s ago (monotonic)
    recordProgress(rec, rec.vm!.id, { ipWaitStartedAt: started });
    Date.now = () => realNow() - 3_600_000;
    const step = deriveOwedStep(readinessFacts(ctx, rec), monoNow());
    assert.equal(step.kind, 'decideFailed');
    assert.equal(step.kind === 'decideFailed' && step.reason, 'PostCloneIPWaitTimeout');
  });

  test('deadlines are shown in wall time that follows the wall clock', () => {
    const at = monoNow() + 60_000;
    const before = wallAt(at).getTime();
    Date.now = () => realNow() + 3_600_000;
    assert.ok(Math.abs(wallAt(at).getTime() - before - 3_600_000) < 1000);
  });
});
