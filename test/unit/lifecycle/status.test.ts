import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1PodStatus } from '@kubernetes/client-node';
import { computePodStatus, type PodStatusInput } from '../../../src/lifecycle/status.ts';

const NOW = new Date('2026-05-02T09:14:10Z');
const STARTED = new Date('2026-05-02T09:14:03Z');

function input(overrides: Partial<PodStatusInput> = {}): PodStatusInput {
  return {
    vm: { ip: '172.24.1.161' },
    lifecycle: 'ready',
    probeReady: true,
    hostIP: '10.0.0.2',
    startTime: STARTED,
    image: 'acme/agent:v3',
    now: NOW,
    ...overrides,
  };
}

function conditions(status: ReturnType<typeof computePodStatus>): Record<string, string> {
  return Object.fromEntries(status.conditions.map((c) => [c.type, c.status]));
}

describe('computePodStatus (lifecycle.md §5)', () => {
  it('tracked VM, probe ready and lifecycle ready ⇒ Running and Ready', () => {
    const status = computePodStatus(input());
    const asV1: V1PodStatus = status; // assignable to the client type
    assert.equal(asV1.phase, 'Running');
    assert.equal(status.podIP, '172.24.1.161');
    assert.deepEqual(status.podIPs, [{ ip: '172.24.1.161' }]);
    assert.equal(status.hostIP, '10.0.0.2');
    assert.equal(status.startTime, STARTED);
    assert.deepEqual(conditions(status), {
      Initialized: 'True',
      Ready: 'True',
      ContainersReady: 'True',
      PodScheduled: 'True',
    });
    assert.deepEqual(status.containerStatuses, [
      {
        name: 'agent',
        image: 'acme/agent:v3',
        imageID: '',
        ready: true,
        restartCount: 0,
        started: true,
        state: { running: { startedAt: STARTED } },
      },
    ]);
  });

  it('a green probe never makes the pod Ready while lifecycle is creating or failed', () => {
    for (const lifecycle of ['creating', 'failed', ''] as const) {
      const status = computePodStatus(input({ lifecycle }));
      assert.equal(status.phase, 'Running');
      assert.equal(conditions(status).Ready, 'False');
      assert.equal(conditions(status).ContainersReady, 'False');
      assert.equal(status.containerStatuses[0]?.ready, false);
    }
  });

  it('lifecycle ready without a probe ⇒ not Ready', () => {
    assert.equal(conditions(computePodStatus(input({ probeReady: false }))).Ready, 'False');
  });

  it('tracked VM without an IP ⇒ Running, no podIP', () => {
    const status = computePodStatus(input({ vm: { ip: '' }, lifecycle: 'creating' }));
    assert.equal(status.phase, 'Running');
    assert.equal('podIP' in status, false);
    assert.equal('podIPs' in status, false);
  });

  it('no tracked VM ⇒ Pending, start time kept, no container state, no podIP', () => {
    const status = computePodStatus(input({ vm: undefined, lifecycle: 'hibernated' }));
    assert.equal(status.phase, 'Pending');
    assert.equal(status.startTime, STARTED);
    assert.equal('podIP' in status, false);
    assert.deepEqual(status.containerStatuses[0]?.state, {});
    assert.equal(status.containerStatuses[0]?.ready, false);
    assert.equal('started' in status.containerStatuses[0]!, false);
    assert.deepEqual(conditions(status), {
      Initialized: 'False',
      Ready: 'False',
      ContainersReady: 'False',
      PodScheduled: 'True',
    });
  });

  it('no VM with a waiting reason ⇒ waiting state', () => {
    const status = computePodStatus(
      input({ vm: undefined, waitingReason: 'ContainerCreating', startTime: undefined }),
    );
    assert.deepEqual(status.containerStatuses[0]?.state, { waiting: { reason: 'ContainerCreating' } });
    assert.equal('startTime' in status, false);
  });

  it('evicted ⇒ Failed, agent terminated with exit code 1 and the reason', () => {
    const status = computePodStatus(
      input({ termination: { kind: 'evicted', reason: 'VMGone', message: 'vm disappeared' } }),
    );
    assert.equal(status.phase, 'Failed');
    assert.equal('podIP' in status, false);
    assert.deepEqual(status.containerStatuses[0]?.state, {
      terminated: {
        exitCode: 1,
        reason: 'VMGone',
        message: 'vm disappeared',
        startedAt: STARTED,
        finishedAt: NOW,
      },
    });
    assert.equal(conditions(status).Ready, 'False');
  });

  it('deleted ⇒ Succeeded, agent terminated with exit code 0', () => {
    const status = computePodStatus(input({ termination: { kind: 'deleted' } }));
    assert.equal(status.phase, 'Succeeded');
    assert.deepEqual(status.containerStatuses[0]?.state, {
      terminated: { exitCode: 0, reason: 'Completed', startedAt: STARTED, finishedAt: NOW },
    });
  });

  it('keeps transition times of unchanged conditions (stable for de-duplication)', () => {
    const first = computePodStatus(input({ lifecycle: 'creating' }));
    const later = new Date(NOW.getTime() + 30_000);
    const same = computePodStatus(input({ lifecycle: 'creating', previous: first, now: later }));
    assert.deepEqual(same, first);
    const flipped = computePodStatus(input({ previous: first, now: later }));
    const byType = Object.fromEntries(flipped.conditions.map((c) => [c.type, c.lastTransitionTime]));
    assert.equal(byType.Ready, later);
    assert.equal(byType.Initialized, NOW);
    assert.equal(byType.PodScheduled, NOW);
  });

  it('omits hostIP when unknown', () => {
    assert.equal('hostIP' in computePodStatus(input({ hostIP: '' })), false);
  });
});
