import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { buildSummary, nanoCores } from '../../../src/stats/summary.ts';
import type { NodeSample, Sample, VmSample } from '../../../src/stats/types.ts';
import { vm } from './fake-host.ts';

const T0 = Date.parse('2026-05-02T10:00:00.000Z');

function node(over: Partial<NodeSample> = {}): NodeSample {
  return {
    cpuUsageUsec: 41_000_000,
    memoryTotalBytes: 16e9,
    memoryAvailableBytes: 6e9,
    memoryUsedBytes: 10e9,
    memoryUsageBytes: 14e9,
    memoryRssBytes: 7e9,
    storageTotalBytes: 100e9,
    storageAvailableBytes: 40e9,
    ...over,
  };
}

function vmSample(over: Partial<VmSample> = {}): VmSample {
  return {
    vm: vm({ tap: 'tap0' }),
    cpuSource: 'cgroup',
    cpuUsageUsec: 2_500_000,
    throttledUsec: 0,
    throttledPeriods: 0,
    rssBytes: 512 * 1024 * 1024,
    cowBytes: 3e9,
    rxBytes: 5000,
    txBytes: 1000,
    interfaces: [{ name: 'tap0', rxBytes: 5000, txBytes: 1000 }],
    ...over,
  };
}

describe('nanoCores', () => {
  it('is the CPU rate between two readings', () => {
    // 1.5 CPU-seconds over 2 s = 0.75 cores.
    assert.equal(nanoCores({ timeMs: T0, usageUsec: 1_000_000 }, T0 + 2000, 2_500_000), 750_000_000);
    assert.equal(nanoCores({ timeMs: T0, usageUsec: 0 }, T0 + 1000, 4_000_000), 4_000_000_000);
  });

  it('is undefined without a previous reading, without elapsed time, or after a reset', () => {
    assert.equal(nanoCores(undefined, T0, 5), undefined);
    assert.equal(nanoCores({ timeMs: T0, usageUsec: 5 }, T0, 10), undefined);
    assert.equal(nanoCores({ timeMs: T0, usageUsec: 50 }, T0 + 1000, 10), undefined);
  });
});

describe('buildSummary', () => {
  it('has the stats/v1alpha1 shape with one agent container per VM', () => {
    const sample: Sample = { timeMs: T0, node: node(), vms: [vmSample()] };
    const s = buildSummary(sample, 'cocoon-pool', new Date('2026-05-01T00:00:00Z'));
    const time = '2026-05-02T10:00:00.000Z';
    assert.deepEqual(s.node, {
      nodeName: 'cocoon-pool',
      startTime: '2026-05-01T00:00:00.000Z',
      cpu: { time, usageCoreNanoSeconds: 41_000_000_000 },
      memory: { time, availableBytes: 6e9, usageBytes: 14e9, workingSetBytes: 10e9, rssBytes: 7e9 },
      fs: { time, availableBytes: 40e9, capacityBytes: 100e9, usedBytes: 60e9 },
    });
    assert.equal(s.pods.length, 1);
    const p = s.pods[0]!;
    assert.deepEqual(p.podRef, { name: 'agent-0', namespace: 'team-a', uid: 'uid-0' });
    assert.equal(p.startTime, '2026-05-02T09:14:03.118Z');
    assert.equal(p.containers.length, 1);
    const c = p.containers[0]!;
    assert.equal(c.name, 'agent');
    assert.equal(c.startTime, p.startTime);
    const mem = {
      time,
      usageBytes: 512 * 1024 * 1024,
      workingSetBytes: 512 * 1024 * 1024,
      rssBytes: 512 * 1024 * 1024,
    };
    assert.deepEqual(c.cpu, { time, usageCoreNanoSeconds: 2_500_000_000 });
    assert.deepEqual(c.memory, mem);
    assert.deepEqual(p.cpu, c.cpu);
    assert.deepEqual(p.memory, mem);
    assert.deepEqual(p.network, {
      time,
      name: 'tap0',
      rxBytes: 5000,
      txBytes: 1000,
      interfaces: [{ name: 'tap0', rxBytes: 5000, txBytes: 1000 }],
    });
    assert.deepEqual(p['ephemeral-storage'], { time, usedBytes: 3e9 });
    // JSON round trip keeps integers integral (Go decodes these into uint64).
    const json = JSON.parse(JSON.stringify(s));
    for (const v of [json.node.cpu.usageCoreNanoSeconds, json.pods[0].cpu.usageCoreNanoSeconds]) {
      assert.ok(Number.isInteger(v));
    }
  });

  it('computes usageNanoCores from the previous reading of two samples', () => {
    const prevTime = T0 - 10_000;
    const sample: Sample = {
      timeMs: T0,
      node: node({ cpuUsageUsec: 41_000_000, prevCpu: { timeMs: prevTime, usageUsec: 21_000_000 } }),
      vms: [
        vmSample({ cpuUsageUsec: 2_500_000, prevCpu: { timeMs: prevTime, usageUsec: 2_000_000 } }),
        vmSample({ vm: vm({ pod: 'agent-1', uid: 'uid-1', container: 'main' }), cpuUsageUsec: 333 }),
      ],
    };
    const s = buildSummary(sample, 'n', new Date(0));
    // Node: 20 CPU-s over 10 s = 2 cores.
    assert.equal(s.node.cpu.usageNanoCores, 2_000_000_000);
    // VM: 0.5 CPU-s over 10 s = 0.05 cores.
    assert.equal(s.pods[0]!.cpu.usageNanoCores, 50_000_000);
    assert.equal(s.pods[0]!.containers[0]!.cpu.usageNanoCores, 50_000_000);
    // No previous reading: omitted, never a made-up 0.
    assert.equal('usageNanoCores' in s.pods[1]!.cpu, false);
    assert.equal(s.pods[1]!.containers[0]!.name, 'main');
    assert.equal(s.pods[1]!.cpu.usageCoreNanoSeconds, 333_000);
  });

  it('names the default interface eth0 when the VM has no TAP', () => {
    const s = buildSummary(
      { timeMs: T0, node: node(), vms: [vmSample({ interfaces: [], rxBytes: 0, txBytes: 0 })] },
      'n',
      new Date(0),
    );
    assert.equal(s.pods[0]!.network.name, 'eth0');
    assert.deepEqual(s.pods[0]!.network.interfaces, []);
  });

  it('lists no pods when nothing is tracked', () => {
    assert.deepEqual(buildSummary({ timeMs: T0, node: node(), vms: [] }, 'n', new Date(0)).pods, []);
  });
});
