import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  buildResourceMetrics,
  escapeLabelValue,
  formatValue,
  RESOURCE_METRICS_CONTENT_TYPE,
} from '../../../src/stats/resource-metrics.ts';
import type { NodeSample, Sample, VmSample } from '../../../src/stats/types.ts';
import { parsePromText } from '../metrics/prom-text.ts';
import { vm } from './fake-host.ts';

const T0 = Date.parse('2026-05-02T10:00:00.123Z');

const NODE: NodeSample = {
  cpuUsageUsec: 41_500_000,
  memoryTotalBytes: 16e9,
  memoryAvailableBytes: 6e9,
  memoryUsedBytes: 10e9,
  memoryUsageBytes: 14e9,
  memoryRssBytes: 7e9,
  storageTotalBytes: 100e9,
  storageAvailableBytes: 40e9,
};

function vmSample(over: Partial<VmSample> = {}): VmSample {
  return {
    vm: vm(),
    cpuSource: 'cgroup',
    cpuUsageUsec: 2_500_000,
    throttledUsec: 300_000,
    throttledPeriods: 7,
    rssBytes: 536_870_912,
    cowBytes: 0,
    rxBytes: 0,
    txBytes: 0,
    interfaces: [],
    ...over,
  };
}

/** virtual-node.md §7.4: family ⇒ [type, label names]. */
const FAMILIES: Record<string, [string, string[]]> = {
  node_cpu_usage_seconds_total: ['counter', []],
  node_memory_working_set_bytes: ['gauge', []],
  container_cpu_usage_seconds_total: ['counter', ['container', 'namespace', 'pod']],
  container_memory_working_set_bytes: ['gauge', ['container', 'namespace', 'pod']],
  container_start_time_seconds: ['gauge', ['container', 'namespace', 'pod']],
  pod_cpu_usage_seconds_total: ['counter', ['namespace', 'pod']],
  pod_memory_working_set_bytes: ['gauge', ['namespace', 'pod']],
  scrape_error: ['gauge', []],
  container_cpu_cfs_throttled_seconds_total: ['counter', ['container', 'namespace', 'pod']],
  container_cpu_cfs_throttled_periods_total: ['counter', ['container', 'namespace', 'pod']],
};

describe('buildResourceMetrics', () => {
  it('uses the content type metrics-server expects', () => {
    assert.equal(RESOURCE_METRICS_CONTENT_TYPE, 'text/plain; version=0.0.4');
  });

  it('emits every family with HELP/TYPE, labels and a millisecond timestamp on every sample', () => {
    const sample: Sample = {
      timeMs: T0,
      node: NODE,
      vms: [
        vmSample(),
        vmSample({
          vm: vm({ pod: 'agent-1', namespace: 'team-b', uid: 'u1' }),
          cpuUsageUsec: 0,
          rssBytes: 0,
        }),
      ],
    };
    const text = buildResourceMetrics(sample);
    assert.ok(text.endsWith('\n'));
    const parsed = parsePromText(text);
    assert.deepEqual([...parsed.families.keys()].sort(), Object.keys(FAMILIES).sort());
    for (const [name, [type]] of Object.entries(FAMILIES)) {
      const f = parsed.families.get(name)!;
      assert.equal(f.type, type, name);
      assert.ok(f.help && f.help.length > 0, name);
    }
    for (const s of parsed.samples) {
      assert.equal(s.timestampMs, T0, `timestamp of ${s.line}`);
      const [, labels] = FAMILIES[s.name]!;
      assert.deepEqual(Object.keys(s.labels).sort(), [...labels].sort(), s.line);
    }
    // Every HELP/TYPE precedes its samples (families are contiguous).
    const lines = text.trimEnd().split('\n');
    let current = '';
    for (const line of lines) {
      if (line.startsWith('# TYPE ')) current = line.split(' ')[2]!;
      else if (!line.startsWith('#')) assert.ok(line.startsWith(current), `${line} under ${current}`);
    }

    const value = (name: string, labels: Record<string, string> = {}) =>
      parsed.samples.find(
        (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
      )?.value;
    assert.equal(value('node_cpu_usage_seconds_total'), 41.5);
    assert.equal(value('node_memory_working_set_bytes'), 10e9);
    assert.equal(value('scrape_error'), 0);
    const a = { container: 'agent', namespace: 'team-a', pod: 'agent-0' };
    assert.equal(value('container_cpu_usage_seconds_total', a), 2.5);
    assert.equal(value('container_memory_working_set_bytes', a), 536_870_912);
    assert.equal(value('container_start_time_seconds', a), Date.parse('2026-05-02T09:14:03.118Z') / 1000);
    assert.equal(value('container_cpu_cfs_throttled_seconds_total', a), 0.3);
    assert.equal(value('container_cpu_cfs_throttled_periods_total', a), 7);
    assert.equal(value('pod_cpu_usage_seconds_total', { namespace: 'team-a', pod: 'agent-0' }), 2.5);
    assert.equal(value('pod_memory_working_set_bytes', { namespace: 'team-a', pod: 'agent-0' }), 536_870_912);
  });

  it('always emits both CPU and memory for every container, zeros included', () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(
          fc.tuple(fc.string({ minLength: 1, maxLength: 12 }), fc.string({ minLength: 1, maxLength: 12 })),
          {
            maxLength: 8,
            selector: ([ns, pod]) => `${ns}/${pod}`,
          },
        ),
        fc.nat(),
        (pods, usec) => {
          const sample: Sample = {
            timeMs: T0,
            node: NODE,
            vms: pods.map(([namespace, pod]) =>
              vmSample({ vm: vm({ namespace, pod }), cpuUsageUsec: usec, rssBytes: 0 }),
            ),
          };
          const parsed = parsePromText(buildResourceMetrics(sample));
          const key = (l: Record<string, string>) => JSON.stringify([l.namespace, l.pod, l.container]);
          const cpu = parsed.samples
            .filter((s) => s.name === 'container_cpu_usage_seconds_total')
            .map((s) => key(s.labels));
          const mem = parsed.samples
            .filter((s) => s.name === 'container_memory_working_set_bytes')
            .map((s) => key(s.labels));
          const expected = pods.map(([ns, pod]) => JSON.stringify([ns, pod, 'agent']));
          assert.deepEqual(cpu.sort(), [...expected].sort());
          assert.deepEqual(mem.sort(), [...expected].sort());
          for (const s of parsed.samples) assert.equal(s.timestampMs, T0);
        },
      ),
      { numRuns: 100 },
    );
  });

  it('escapes odd label values so they parse back unchanged', () => {
    const odd = 'a"b\\c';
    const sample: Sample = {
      timeMs: T0,
      node: NODE,
      vms: [vmSample({ vm: vm({ namespace: odd, pod: 'line\nbreak', container: '{x="y"},' }) })],
    };
    const text = buildResourceMetrics(sample);
    assert.ok(text.includes('namespace="a\\"b\\\\c"'), text);
    const parsed = parsePromText(text);
    const c = parsed.samples.find((s) => s.name === 'container_cpu_usage_seconds_total')!;
    assert.deepEqual(c.labels, { container: '{x="y"},', namespace: odd, pod: 'line\nbreak' });
    fc.assert(
      fc.property(fc.string({ unit: 'grapheme', maxLength: 30 }), (v) => {
        const p = parsePromText(
          buildResourceMetrics({ timeMs: T0, node: NODE, vms: [vmSample({ vm: vm({ pod: v }) })] }),
        );
        for (const s of p.samples.filter((x) => 'pod' in x.labels)) assert.equal(s.labels.pod, v);
      }),
      { numRuns: 200 },
    );
  });

  it('emits node figures, scrape_error and a timestamp even with no VMs', () => {
    const parsed = parsePromText(buildResourceMetrics({ timeMs: T0, node: NODE, vms: [] }));
    assert.deepEqual(parsed.samples.map((s) => [s.name, s.timestampMs]).sort(), [
      ['node_cpu_usage_seconds_total', T0],
      ['node_memory_working_set_bytes', T0],
      ['scrape_error', T0],
    ]);
  });

  it('escapes and formats primitives', () => {
    assert.equal(escapeLabelValue('a"b\\c\nd'), 'a\\"b\\\\c\\nd');
    assert.equal(formatValue(1.5), '1.5');
    assert.equal(formatValue(1e21), '1e+21');
    assert.equal(formatValue(Number.NaN), 'NaN');
    assert.equal(formatValue(Number.POSITIVE_INFINITY), '+Inf');
  });
});
