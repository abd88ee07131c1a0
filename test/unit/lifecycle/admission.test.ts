// Pod admission arithmetic (src/lifecycle/admission.ts): one test per reason, the kubelet's
// message format, what each kind of tracked pod counts, and the VM size estimate.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  admit,
  counted,
  type PodFacts,
  recordFootprint,
  rejectedStatus,
  usage,
  vmEstimate,
} from '../../../src/lifecycle/admission.ts';

const GiB = 1024n ** 3n;
const alloc = { pods: 10, cpuMilli: 8000n, memoryBytes: 16n * GiB };
const small = { cpuMilli: 1000n, memoryBytes: GiB };

describe('admit', () => {
  test('fits: ok', () => {
    assert.deepEqual(admit(small, { pods: 9, cpuMilli: 7000n, memoryBytes: 15n * GiB }, alloc), { ok: true });
  });

  test('OutOfpods when the pod count is reached, with the kubelet message', () => {
    assert.deepEqual(admit(small, { pods: 10, cpuMilli: 0n, memoryBytes: 0n }, alloc), {
      ok: false,
      reason: 'OutOfpods',
      message: "Node didn't have enough resource: pods, requested: 1, used: 10, capacity: 10",
    });
  });

  test('OutOfcpu: requested, used and capacity in millicores', () => {
    const v = admit(
      { cpuMilli: 2000n, memoryBytes: GiB },
      { pods: 3, cpuMilli: 7000n, memoryBytes: 0n },
      alloc,
    );
    assert.deepEqual(v, {
      ok: false,
      reason: 'OutOfcpu',
      message: "Node didn't have enough resource: cpu, requested: 2000, used: 7000, capacity: 8000",
    });
  });

  test('OutOfmemory: in bytes', () => {
    const v = admit(
      { cpuMilli: 0n, memoryBytes: 2n * GiB },
      { pods: 3, cpuMilli: 0n, memoryBytes: 15n * GiB },
      alloc,
    );
    assert.equal(v.ok, false);
    assert.equal(!v.ok && v.reason, 'OutOfmemory');
    assert.equal(
      !v.ok && v.message,
      `Node didn't have enough resource: memory, requested: ${2n * GiB}, used: ${15n * GiB}, capacity: ${16n * GiB}`,
    );
  });

  test('pods are checked before cpu, cpu before memory (the kubelet order)', () => {
    const full = { pods: 10, cpuMilli: 8000n, memoryBytes: 16n * GiB };
    const v = admit(small, full, alloc);
    assert.equal(!v.ok && v.reason, 'OutOfpods');
    const v2 = admit(small, { ...full, pods: 1 }, alloc);
    assert.equal(!v2.ok && v2.reason, 'OutOfcpu');
  });

  test('an exact fit is admitted; a zero request never fails its resource', () => {
    assert.equal(
      admit(
        { cpuMilli: 1000n, memoryBytes: GiB },
        { pods: 0, cpuMilli: 7000n, memoryBytes: 15n * GiB },
        alloc,
      ).ok,
      true,
    );
    assert.equal(
      admit({ cpuMilli: 0n, memoryBytes: 0n }, { pods: 0, cpuMilli: 9000n, memoryBytes: 20n * GiB }, alloc)
        .ok,
      true,
    );
  });

  test('an unknown allocatable cpu or memory is not checked', () => {
    const v = admit(
      { cpuMilli: 10_000n, memoryBytes: 100n * GiB },
      { pods: 0, cpuMilli: 0n, memoryBytes: 0n },
      {
        pods: 1,
        cpuMilli: undefined,
        memoryBytes: undefined,
      },
    );
    assert.equal(v.ok, true);
  });
});

describe('what a tracked pod counts', () => {
  const est = { cpuMilli: 500n, memoryBytes: GiB };
  const facts = (state: PodFacts['state'], vmSize?: PodFacts['vmSize']): PodFacts => ({
    state,
    vmSize,
    estimate: est,
  });

  test('gone (terminal, being deleted): nothing', () => {
    assert.deepEqual(counted(facts('gone', { cpuMilli: 2000n, memoryBytes: GiB })), {
      pods: 0,
      cpuMilli: 0n,
      memoryBytes: 0n,
    });
  });
  test('idle (hibernated, failed without a VM): a pod, no cpu or memory', () => {
    assert.deepEqual(counted(facts('idle')), { pods: 1, cpuMilli: 0n, memoryBytes: 0n });
  });
  test('with a VM: its real size, else the estimate', () => {
    assert.deepEqual(counted(facts('vm', { cpuMilli: 2000n, memoryBytes: 4n * GiB })), {
      pods: 1,
      cpuMilli: 2000n,
      memoryBytes: 4n * GiB,
    });
    assert.deepEqual(counted(facts('vm')), { pods: 1, ...est });
  });
  test('owed (bring-up pending): the estimate', () => {
    assert.deepEqual(counted(facts('owed')), { pods: 1, ...est });
  });
  test('usage sums them', () => {
    assert.deepEqual(
      usage([
        facts('gone'),
        facts('idle'),
        facts('owed'),
        facts('vm', { cpuMilli: 2000n, memoryBytes: GiB }),
      ]),
      {
        pods: 3,
        cpuMilli: 2500n,
        memoryBytes: 2n * GiB,
      },
    );
  });
});

describe('vmEstimate', () => {
  const spec = {
    mode: 'clone' as const,
    forkFrom: '',
    cloneFromDir: '',
    cpuRequestMilli: 250n,
    cpuLimitMilli: 1500n,
    memoryRequestBytes: 512n * 1024n * 1024n,
    memoryLimitBytes: GiB,
  };
  test('run mode: the --cpu whole cores (limit rounded up) and --memory (request)', () => {
    assert.deepEqual(vmEstimate({ ...spec, mode: 'run' }, { cpuMilli: 8000n, memoryBytes: 8n * GiB }), {
      cpuMilli: 2000n,
      memoryBytes: 512n * 1024n * 1024n,
    });
  });
  test('a clone: the source size when known, else the container requests', () => {
    const src = { cpuMilli: 2000n, memoryBytes: 4n * GiB };
    assert.deepEqual(vmEstimate(spec, src), src);
    assert.deepEqual(vmEstimate(spec, undefined), { cpuMilli: 250n, memoryBytes: 512n * 1024n * 1024n });
    assert.deepEqual(
      vmEstimate({ ...spec, cpuRequestMilli: undefined, memoryRequestBytes: undefined }, undefined),
      {
        cpuMilli: 0n,
        memoryBytes: 0n,
      },
    );
  });
  test('recordFootprint needs both figures', () => {
    assert.deepEqual(recordFootprint(2, 1073741824), { cpuMilli: 2000n, memoryBytes: GiB });
    assert.equal(recordFootprint(2, undefined), undefined);
  });
});

test('the rejected status is the kubelet one: Failed, the reason, "Pod was rejected: "', () => {
  const now = new Date(0);
  const s = rejectedStatus(
    'OutOfcpu',
    "Node didn't have enough resource: cpu, requested: 2000, used: 7000, capacity: 8000",
    '10.0.0.1',
    now,
  );
  assert.equal(s.phase, 'Failed');
  assert.equal(s.reason, 'OutOfcpu');
  assert.equal(
    s.message,
    "Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 7000, capacity: 8000",
  );
  assert.equal(s.hostIP, '10.0.0.1');
});
