import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  DEFAULT_READY_DEADLINE_SECONDS,
  deriveOwedStep,
  ipWaitTimeoutMessage,
  type OwedStep,
  type ReadinessFacts,
  sacOwed,
} from '../../../src/lifecycle/owed.ts';

const VM_ID = 'J7QX4MZK2N5VBR3TLWD6YHPC2E';
const OTHER_VM_ID = 'D2M6QK7ZP4X3NWB5RT2YHCL7VA';
const T0 = 1_000_000;
const NOW = T0 + 60_000;
const DHCP_NIC = { mac: '02:4e:9a:11:c3:7d' };
const STATIC_NIC = {
  mac: '02:4e:9a:11:c3:7e',
  static: { ip: '10.88.3.17', gateway: '10.88.0.1', prefix: 16 },
};

/** A managed CH Linux clone with one DHCP NIC, fixup not needed, no IP yet. */
function facts(overrides: Partial<ReadinessFacts> = {}): ReadinessFacts {
  return {
    tracked: true,
    uid: 'uid-1',
    vmName: 'vk-team-a-agent-0',
    deleting: false,
    managed: true,
    os: 'linux',
    hibernateRequested: false,
    vm: { id: VM_ID, backend: 'cloud-hypervisor', nics: [DHCP_NIC] },
    intent: 'creating',
    intentUnflushed: false,
    postCloneState: '',
    postCloneErrors: '',
    job: undefined,
    clonedBoot: true,
    chWindowsRestore: false,
    bootOp: 'create',
    progress: undefined,
    ip: '',
    t0: T0,
    readyDeadlineSeconds: DEFAULT_READY_DEADLINE_SECONDS,
    ...overrides,
  };
}

const windowsVm = (nics = [DHCP_NIC]) => ({ id: VM_ID, backend: 'cloud-hypervisor' as const, nics });

describe('deriveOwedStep row 1: another flow owns the lifecycle', () => {
  const cases: [Partial<ReadinessFacts>, string][] = [
    [{ tracked: false }, 'not_tracked'],
    [{ deleting: true }, 'deleting'],
    [{ managed: false }, 'unmanaged'],
    [{ os: 'macos' }, 'unsupported_guest'],
    [{ hibernateRequested: true }, 'hibernate_requested'],
  ];
  for (const [override, reason] of cases) {
    it(reason, () => {
      assert.deepEqual(deriveOwedStep(facts(override), NOW), { kind: 'none', row: 1, reason });
    });
  }

  it('wins even past the ready deadline', () => {
    const step = deriveOwedStep(facts({ hibernateRequested: true }), T0 + 10_000_000);
    assert.equal(step.kind, 'none');
  });
});

describe('deriveOwedStep row 2: no VM bound', () => {
  it('returns none', () => {
    assert.deepEqual(deriveOwedStep(facts({ vm: undefined }), NOW), {
      kind: 'none',
      row: 2,
      reason: 'no_vm',
    });
  });
});

describe('deriveOwedStep row 3: terminal or hibernating intent', () => {
  for (const intent of ['ready', 'hibernating', 'hibernated', 'failed'] as const) {
    it(`${intent}: none when flushed, reflush when not`, () => {
      assert.deepEqual(deriveOwedStep(facts({ intent }), NOW), {
        kind: 'none',
        row: 3,
        reason: 'terminal_intent',
      });
      assert.deepEqual(deriveOwedStep(facts({ intent, intentUnflushed: true }), NOW), {
        kind: 'reflush',
        row: 3,
      });
    });
  }

  it('a failed intent is parked even with an IP (sticky, §8)', () => {
    const step = deriveOwedStep(facts({ intent: 'failed', ip: '10.0.0.5' }), T0 + 10_000_000);
    assert.equal(step.kind, 'none');
  });
});

describe('deriveOwedStep row 4: job in flight', () => {
  const job = { uid: 'uid-1', vmId: VM_ID, hardDeadline: NOW + 1000 };

  it('waits for a job of the same (UID, VM ID) within its hard deadline', () => {
    assert.deepEqual(deriveOwedStep(facts({ job, ip: '10.0.0.5' }), NOW), {
      kind: 'none',
      row: 4,
      reason: 'job_in_flight',
    });
    assert.equal(deriveOwedStep(facts({ job }), job.hardDeadline).kind, 'none');
  });

  it('a job past its hard deadline no longer blocks, and must be aborted', () => {
    const step = deriveOwedStep(facts({ job, ip: '10.0.0.5' }), job.hardDeadline + 1);
    assert.equal(step.kind, 'publishReady');
    assert.equal(step.kind === 'publishReady' && step.abortJob, true);
  });

  it('a job for another VM ID or UID does not block, and must be aborted', () => {
    for (const stale of [
      { ...job, vmId: OTHER_VM_ID },
      { ...job, uid: 'uid-0' },
    ]) {
      const step = deriveOwedStep(facts({ job: stale }), NOW);
      assert.equal(step.kind, 'startIpWait');
      assert.equal(step.kind === 'startIpWait' && step.abortJob, true);
    }
  });
});

describe('deriveOwedStep row 5: post-clone-state=failed (TS addition)', () => {
  it('decides failed with the recorded errors', () => {
    const step = deriveOwedStep(facts({ postCloneState: 'failed', postCloneErrors: 'attempt 1: boom' }), NOW);
    assert.deepEqual(step, {
      kind: 'decideFailed',
      row: 5,
      vmId: VM_ID,
      reason: 'PostCloneExecExhausted',
      message: 'attempt 1: boom',
      abortJob: false,
    });
  });

  it('uses "post-clone setup failed" without recorded errors, and a recorded reason', () => {
    const step = deriveOwedStep(
      facts({ postCloneState: 'failed', postCloneFailureReason: 'WindowsStaticIPFailed' }),
      NOW,
    );
    assert.equal(step.kind === 'decideFailed' && step.message, 'post-clone setup failed');
    assert.equal(step.kind === 'decideFailed' && step.reason, 'WindowsStaticIPFailed');
  });

  it('applies with an empty lifecycle (lost creating patch) too', () => {
    assert.equal(deriveOwedStep(facts({ intent: '', postCloneState: 'failed' }), NOW).kind, 'decideFailed');
  });

  it('wins over an IP being available', () => {
    assert.equal(
      deriveOwedStep(facts({ postCloneState: 'failed', ip: '10.0.0.5' }), NOW).kind,
      'decideFailed',
    );
  });
});

describe('deriveOwedStep row 6: fixup', () => {
  it('starts the Windows fixup on a fresh clone (marker absent or running)', () => {
    for (const postCloneState of ['', 'running'] as const) {
      assert.deepEqual(deriveOwedStep(facts({ os: 'windows', vm: windowsVm(), postCloneState }), NOW), {
        kind: 'startFixup',
        row: 6,
        vmId: VM_ID,
        fixupKind: 'windows',
        abortJob: false,
      });
    }
  });

  it('starts linux_fc for Firecracker and linux_static for CH with a static NIC', () => {
    const fc1 = deriveOwedStep(facts({ vm: { id: VM_ID, backend: 'firecracker', nics: [DHCP_NIC] } }), NOW);
    assert.equal(fc1.kind === 'startFixup' && fc1.fixupKind, 'linux_fc');
    const st = deriveOwedStep(
      facts({ vm: { id: VM_ID, backend: 'cloud-hypervisor', nics: [STATIC_NIC] } }),
      NOW,
    );
    assert.equal(st.kind === 'startFixup' && st.fixupKind, 'linux_static');
  });

  it('skips the fixup for CH all-DHCP', () => {
    assert.equal(deriveOwedStep(facts(), NOW).kind, 'startIpWait');
  });

  it('skips the fixup with a done marker (restart resume) or a success for this VM ID', () => {
    const base = { os: 'windows' as const, vm: windowsVm() };
    assert.equal(deriveOwedStep(facts({ ...base, postCloneState: 'done' }), NOW).kind, 'startIpWait');
    assert.equal(
      deriveOwedStep(facts({ ...base, progress: { vmId: VM_ID, fixupSucceeded: true } }), NOW).kind,
      'startIpWait',
    );
  });

  it('ignores a fixup success recorded for another VM ID (§10.8)', () => {
    const step = deriveOwedStep(
      facts({ os: 'windows', vm: windowsVm(), progress: { vmId: OTHER_VM_ID, fixupSucceeded: true } }),
      NOW,
    );
    assert.equal(step.kind, 'startFixup');
  });

  it('a CH+Windows restore skips the PnP fixup and goes to the IP wait (§6.8)', () => {
    const step = deriveOwedStep(
      facts({ os: 'windows', vm: windowsVm(), chWindowsRestore: true, bootOp: 'wake' }),
      NOW,
    );
    assert.equal(step.kind, 'startIpWait');
  });

  it('run mode (not a cloned boot) gets no fixup', () => {
    const step = deriveOwedStep(
      facts({ clonedBoot: false, vm: { id: VM_ID, backend: 'firecracker', nics: [] } }),
      NOW,
    );
    assert.equal(step.kind, 'publishReady');
  });
});

describe('deriveOwedStep row 7: SAC', () => {
  it('is owed for Windows with a static NIC once the fixup succeeded', () => {
    const step = deriveOwedStep(
      facts({ os: 'windows', vm: windowsVm([STATIC_NIC]), progress: { vmId: VM_ID, fixupSucceeded: true } }),
      NOW,
    );
    assert.deepEqual(step, { kind: 'startSac', row: 7, vmId: VM_ID, abortJob: false });
  });

  it('runs before ready in run mode too, and not again once done for this VM ID', () => {
    const runMode = facts({ os: 'windows', vm: windowsVm([STATIC_NIC]), clonedBoot: false });
    assert.equal(deriveOwedStep(runMode, NOW).kind, 'startSac');
    const done = { ...runMode, progress: { vmId: VM_ID, sacDone: true } };
    assert.equal(deriveOwedStep(done, NOW).kind, 'publishReady');
  });

  it('run mode: ready only after a pass for this VM ID, even with an IP resolved; a failed pass is decided failed', () => {
    const runMode = facts({
      os: 'windows',
      vm: windowsVm([STATIC_NIC, DHCP_NIC]),
      clonedBoot: false,
      ip: '10.88.3.17',
    });
    assert.deepEqual(deriveOwedStep(runMode, NOW), {
      kind: 'startSac',
      row: 7,
      vmId: VM_ID,
      abortJob: false,
    });
    const otherVm = { ...runMode, progress: { vmId: OTHER_VM_ID, sacDone: true } };
    assert.equal(deriveOwedStep(otherVm, NOW).kind, 'startSac', 'a pass for another VM ID does not count');
    const running = { ...runMode, job: { uid: runMode.uid, vmId: VM_ID, hardDeadline: NOW + 1 } };
    assert.equal(deriveOwedStep(running, NOW).kind, 'none', 'the sac job in flight owns the decision');
    const failed = {
      ...runMode,
      postCloneState: 'failed' as const,
      postCloneErrors: 'sac dial: no SAC> prompt',
      postCloneFailureReason: 'WindowsStaticIPFailed',
    };
    assert.deepEqual(deriveOwedStep(failed, NOW), {
      kind: 'decideFailed',
      row: 5,
      vmId: VM_ID,
      reason: 'WindowsStaticIPFailed',
      message: 'sac dial: no SAC> prompt',
      abortJob: false,
    });
    const done = { ...runMode, progress: { vmId: VM_ID, sacDone: true } };
    assert.deepEqual(deriveOwedStep(done, NOW), {
      kind: 'publishReady',
      row: 8,
      vmId: VM_ID,
      ip: '10.88.3.17',
      abortJob: false,
    });
  });

  it('sacOwed needs Windows and a static NIC', () => {
    assert.equal(sacOwed('windows', [STATIC_NIC]), true);
    assert.equal(sacOwed('windows', [DHCP_NIC]), false);
    assert.equal(sacOwed('linux', [STATIC_NIC]), false);
    assert.equal(sacOwed('windows', [{ mac: 'x', static: { ip: '', gateway: '', prefix: 0 } }]), false);
  });
});

describe('deriveOwedStep rows 8–9: ready publication', () => {
  it('row 8: a non-cloned boot publishes ready without waiting for an IP', () => {
    assert.deepEqual(deriveOwedStep(facts({ clonedBoot: false }), NOW), {
      kind: 'publishReady',
      row: 8,
      vmId: VM_ID,
      ip: '',
      abortJob: false,
    });
  });

  it('row 9: a cloned boot with an IP publishes ready', () => {
    assert.deepEqual(deriveOwedStep(facts({ ip: '172.24.1.161' }), NOW), {
      kind: 'publishReady',
      row: 9,
      vmId: VM_ID,
      ip: '172.24.1.161',
      abortJob: false,
    });
  });

  it('the seed bug: a Windows clone whose fixup is done and whose lease exists is published ready', () => {
    const step = deriveOwedStep(
      facts({
        os: 'windows',
        vm: windowsVm(),
        postCloneState: 'done',
        ip: '172.24.1.161',
        intent: 'creating',
      }),
      T0 + 14 * 60_000,
    );
    assert.equal(step.kind, 'publishReady');
  });
});

describe('deriveOwedStep rows 10–11: IP wait', () => {
  it('row 11: records the start and ensures the job (Windows gets a renew nudge at 30 s)', () => {
    assert.deepEqual(deriveOwedStep(facts(), NOW), {
      kind: 'startIpWait',
      row: 11,
      vmId: VM_ID,
      startedAt: NOW,
      deadline: NOW + 45_000,
      renewNudgeAt: undefined,
      abortJob: false,
    });
    const started = NOW - 10_000;
    const windows = facts({
      os: 'windows',
      vm: windowsVm(),
      progress: { vmId: VM_ID, fixupSucceeded: true, ipWaitStartedAt: started },
    });
    assert.deepEqual(deriveOwedStep(windows, NOW), {
      kind: 'ensureIpWait',
      row: 11,
      vmId: VM_ID,
      startedAt: started,
      deadline: started + 45_000,
      renewNudgeAt: started + 30_000,
      abortJob: false,
    });
  });

  it('row 10: more than 45 s after the start ⇒ failed with the exact message', () => {
    const progress = { vmId: VM_ID, ipWaitStartedAt: NOW - 45_001 };
    assert.deepEqual(deriveOwedStep(facts({ progress }), NOW), {
      kind: 'decideFailed',
      row: 10,
      vmId: VM_ID,
      reason: 'PostCloneIPWaitTimeout',
      message: 'clone vk-team-a-agent-0: dhcp lease not observed within 45s',
      abortJob: false,
    });
    const exactly = deriveOwedStep(facts({ progress: { vmId: VM_ID, ipWaitStartedAt: NOW - 45_000 } }), NOW);
    assert.equal(exactly.kind, 'ensureIpWait');
  });

  it('row 10 for a wake uses WakeIPWaitTimeout and "wake <vm>"', () => {
    const step = deriveOwedStep(
      facts({ bootOp: 'wake', progress: { vmId: VM_ID, ipWaitStartedAt: NOW - 50_000 } }),
      NOW,
    );
    assert.equal(step.kind === 'decideFailed' && step.reason, 'WakeIPWaitTimeout');
    assert.equal(
      step.kind === 'decideFailed' && step.message,
      'wake vk-team-a-agent-0: dhcp lease not observed within 45s',
    );
    assert.equal(ipWaitTimeoutMessage('create', 'v'), 'clone v: dhcp lease not observed within 45s');
  });

  it('an IP-wait start of a replaced VM is ignored (§10.8)', () => {
    const step = deriveOwedStep(
      facts({ progress: { vmId: OTHER_VM_ID, ipWaitStartedAt: NOW - 100_000 } }),
      NOW,
    );
    assert.equal(step.kind, 'startIpWait');
  });
});

describe('ready deadline (§10.5)', () => {
  const deadline = T0 + DEFAULT_READY_DEADLINE_SECONDS * 1000;
  const job = { uid: 'uid-1', vmId: VM_ID, hardDeadline: deadline + 60_000 };

  it('decides failed at t0 + N with the exact message and aborts the job', () => {
    assert.deepEqual(deriveOwedStep(facts({ job, intent: '' }), deadline), {
      kind: 'decideFailed',
      row: 'deadline',
      vmId: VM_ID,
      reason: 'ReadyDeadlineExceeded',
      message: 'creating vk-team-a-agent-0: no ready decision within 600s',
      abortJob: true,
    });
  });

  it('one millisecond earlier the job still owns the step', () => {
    assert.equal(deriveOwedStep(facts({ job }), deadline - 1).kind, 'none');
  });

  it('a ready or failed decision derivable at the deadline is taken instead', () => {
    const ready = deriveOwedStep(facts({ job, ip: '10.1.2.3' }), deadline);
    assert.equal(ready.kind, 'publishReady');
    assert.equal(ready.kind === 'publishReady' && ready.abortJob, true);
    const failed = deriveOwedStep(facts({ job, postCloneState: 'failed', postCloneErrors: 'e' }), deadline);
    assert.equal(failed.kind === 'decideFailed' && failed.row, 5);
  });

  it('uses the configured N in the message', () => {
    const step = deriveOwedStep(facts({ readyDeadlineSeconds: 900 }), T0 + 900_000);
    assert.equal(
      step.kind === 'decideFailed' && step.message,
      'creating vk-team-a-agent-0: no ready decision within 900s',
    );
  });
});

describe('deriveOwedStep properties', () => {
  const nic = fc.oneof(
    fc.constant(DHCP_NIC),
    fc.constant(STATIC_NIC),
    fc.constant({ mac: '02:00:00:00:00:01', static: { ip: '', gateway: '', prefix: 0 } }),
  );
  const arbitraryFacts = fc.record<ReadinessFacts>({
    tracked: fc.boolean(),
    uid: fc.constantFrom('uid-1', 'uid-2'),
    vmName: fc.constant('vk-ns-set-0'),
    deleting: fc.boolean(),
    managed: fc.boolean(),
    os: fc.constantFrom('linux', 'windows', 'android', 'macos'),
    hibernateRequested: fc.boolean(),
    vm: fc.option(
      fc.record({
        id: fc.constantFrom(VM_ID, OTHER_VM_ID),
        backend: fc.constantFrom('cloud-hypervisor', 'firecracker'),
        nics: fc.array(nic, { maxLength: 3 }),
      }),
      { nil: undefined },
    ),
    intent: fc.constantFrom('', 'creating', 'ready', 'hibernating', 'hibernated', 'failed'),
    intentUnflushed: fc.boolean(),
    postCloneState: fc.constantFrom('', 'running', 'done', 'failed'),
    postCloneErrors: fc.constantFrom('', 'attempt 1: boom'),
    job: fc.option(
      fc.record({
        uid: fc.constantFrom('uid-1', 'uid-2'),
        vmId: fc.constantFrom(VM_ID, OTHER_VM_ID),
        hardDeadline: fc.integer({ min: 0, max: 2_000_000 }),
      }),
      { nil: undefined },
    ),
    clonedBoot: fc.boolean(),
    chWindowsRestore: fc.boolean(),
    bootOp: fc.constantFrom('create', 'wake'),
    progress: fc.option(
      fc.record({
        vmId: fc.constantFrom(VM_ID, OTHER_VM_ID),
        fixupSucceeded: fc.boolean(),
        sacDone: fc.boolean(),
        ipWaitStartedAt: fc.option(fc.integer({ min: 0, max: 2_000_000 }), { nil: undefined }),
      }),
      { nil: undefined },
    ),
    ip: fc.constantFrom('', '10.0.0.9'),
    t0: fc.integer({ min: 0, max: 1_000_000 }),
    readyDeadlineSeconds: fc.constantFrom(480, 600),
  });
  const now = fc.integer({ min: 0, max: 2_500_000 });

  it('never publishes ready without an IP for a cloned boot', () => {
    fc.assert(
      fc.property(arbitraryFacts, now, (f, t) => {
        const step = deriveOwedStep(f, t);
        if (step.kind === 'publishReady' && f.clonedBoot) assert.notEqual(step.ip, '');
      }),
      { numRuns: 2000 },
    );
  });

  it('every VM step is derived for the bound VM ID', () => {
    fc.assert(
      fc.property(arbitraryFacts, now, (f, t) => {
        const step: OwedStep = deriveOwedStep(f, t);
        if ('vmId' in step) assert.equal(step.vmId, f.vm?.id);
      }),
      { numRuns: 1000 },
    );
  });

  it('never stranded: an eligible creating pod past the deadline gets a terminal decision', () => {
    fc.assert(
      fc.property(arbitraryFacts, fc.integer({ min: 0, max: 100_000 }), (f, extra) => {
        const eligible =
          f.tracked &&
          !f.deleting &&
          f.managed &&
          f.os !== 'macos' &&
          !f.hibernateRequested &&
          f.vm !== undefined &&
          (f.intent === '' || f.intent === 'creating');
        const step = deriveOwedStep(f, f.t0 + f.readyDeadlineSeconds * 1000 + extra);
        if (eligible) assert.ok(step.kind === 'publishReady' || step.kind === 'decideFailed', step.kind);
      }),
      { numRuns: 2000 },
    );
  });

  it('decisions for a parked failed pod are never made (sticky across restarts, §8)', () => {
    fc.assert(
      fc.property(arbitraryFacts, now, (f, t) => {
        const step = deriveOwedStep({ ...f, intent: 'failed' }, t);
        assert.ok(step.kind === 'none' || step.kind === 'reflush');
      }),
    );
  });
});
