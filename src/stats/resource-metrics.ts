// kubelet `/metrics/resource` (docs/metrics.md "`/metrics/resource`"): the Prometheus text metrics-server ≥ 0.6
// scrapes, built from one sample. Pure.
//
// Hand-written rather than through prom-client because every sample needs an explicit
// millisecond timestamp (the sample time), which prom-client's text exposition cannot emit.
// metrics-server drops a node whose samples lack a timestamp and a pod whose container lacks
// CPU or memory, so both are written for every VM, zeros included.
import { DEFAULT_CONTAINER } from './summary.ts';
import type { Sample } from './types.ts';

export const RESOURCE_METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4';

/** Label value escaping of the text format: backslash, double quote, line feed. */
export function escapeLabelValue(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/** HELP text escaping: backslash and line feed. */
export function escapeHelp(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

/** A sample value in the text format (Go `ParseFloat` syntax). */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Number.POSITIVE_INFINITY) return '+Inf';
  if (v === Number.NEGATIVE_INFINITY) return '-Inf';
  return String(v);
}

type Labels = ReadonlyArray<readonly [string, string]>;

interface Family {
  name: string;
  help: string;
  type: 'counter' | 'gauge';
  samples: Array<{ labels: Labels; value: number }>;
}

function render(families: Family[], timestampMs: number): string {
  const ts = String(Math.trunc(timestampMs));
  const lines: string[] = [];
  for (const f of families) {
    lines.push(`# HELP ${f.name} ${escapeHelp(f.help)}`, `# TYPE ${f.name} ${f.type}`);
    for (const s of f.samples) {
      const labels =
        s.labels.length === 0
          ? ''
          : `{${s.labels.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(',')}}`;
      lines.push(`${f.name}${labels} ${formatValue(s.value)} ${ts}`);
    }
  }
  return lines.join('\n') + '\n';
}

export function buildResourceMetrics(sample: Sample): string {
  const fam = (name: string, help: string, type: 'counter' | 'gauge'): Family => ({
    name,
    help,
    type,
    samples: [],
  });
  const containerCpu = fam(
    'container_cpu_usage_seconds_total',
    '[STABLE] Cumulative cpu time consumed by the container in core-seconds',
    'counter',
  );
  const containerMem = fam(
    'container_memory_working_set_bytes',
    '[STABLE] Current working set of the container in bytes',
    'gauge',
  );
  const containerStart = fam(
    'container_start_time_seconds',
    '[STABLE] Start time of the container since unix epoch in seconds',
    'gauge',
  );
  const throttledSeconds = fam(
    'container_cpu_cfs_throttled_seconds_total',
    'Total time duration the container has been throttled',
    'counter',
  );
  const throttledPeriods = fam(
    'container_cpu_cfs_throttled_periods_total',
    'Number of throttled period intervals',
    'counter',
  );
  const nodeCpu = fam(
    'node_cpu_usage_seconds_total',
    '[STABLE] Cumulative cpu time consumed by the node in core-seconds',
    'counter',
  );
  const nodeMem = fam(
    'node_memory_working_set_bytes',
    '[STABLE] Current working set of the node in bytes',
    'gauge',
  );
  const podCpu = fam(
    'pod_cpu_usage_seconds_total',
    '[STABLE] Cumulative cpu time consumed by the pod in core-seconds',
    'counter',
  );
  const podMem = fam(
    'pod_memory_working_set_bytes',
    '[STABLE] Current working set of the pod in bytes',
    'gauge',
  );
  const scrapeError = fam(
    'scrape_error',
    '[STABLE] 1 if there was an error while getting container metrics, 0 otherwise',
    'gauge',
  );

  nodeCpu.samples.push({ labels: [], value: sample.node.cpuUsageUsec / 1e6 });
  nodeMem.samples.push({ labels: [], value: sample.node.memoryUsedBytes });
  for (const s of sample.vms) {
    const c: Labels = [
      ['container', s.vm.container ?? DEFAULT_CONTAINER],
      ['namespace', s.vm.namespace],
      ['pod', s.vm.pod],
    ];
    const p: Labels = [
      ['namespace', s.vm.namespace],
      ['pod', s.vm.pod],
    ];
    const cpuSeconds = s.cpuUsageUsec / 1e6;
    containerCpu.samples.push({ labels: c, value: cpuSeconds });
    containerMem.samples.push({ labels: c, value: s.rssBytes });
    containerStart.samples.push({ labels: c, value: s.vm.startTime.getTime() / 1000 });
    throttledSeconds.samples.push({ labels: c, value: s.throttledUsec / 1e6 });
    throttledPeriods.samples.push({ labels: c, value: s.throttledPeriods });
    podCpu.samples.push({ labels: p, value: cpuSeconds });
    podMem.samples.push({ labels: p, value: s.rssBytes });
  }
  scrapeError.samples.push({ labels: [], value: 0 });

  // Same family order as the kubelet (alphabetical).
  return render(
    [
      throttledPeriods,
      throttledSeconds,
      containerCpu,
      containerMem,
      containerStart,
      nodeCpu,
      nodeMem,
      podCpu,
      podMem,
      scrapeError,
    ],
    sample.timeMs,
  );
}
