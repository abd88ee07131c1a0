// Feeds the per-VM `cocoon_vk_vm_*` and node `cocoon_vk_node_*` families from the shared stats
// sample at scrape time (docs/metrics.md "The shared sample").
import type { Metrics, NodeMetrics, VmLabel, VmMetrics } from '../metrics/registry.ts';
import type { Sample } from './types.ts';

/**
 * Replaces the sampled families' values with those of `sample`. Families are reset first, so
 * VMs that are no longer tracked disappear from the next scrape. The cumulative families are
 * Prometheus counters whose value is the kernel's counter (a restarted VM resets it, which
 * Prometheus handles as a counter reset). Without per-VM labels (VK_METRICS_VM_LABELS=false)
 * every series is the sum over the VMs of one namespace and backend, so gauges are added
 * (`inc` after the reset) rather than set; a VM that goes away lowers such a counter, which
 * Prometheus also reads as a reset.
 */
export function applySample(m: { vm: VmMetrics; node: NodeMetrics }, sample: Sample): void {
  const v = m.vm;
  for (const c of [
    v.cpuSeconds,
    v.cpuThrottledSeconds,
    v.cpuThrottledPeriods,
    v.networkRxBytes,
    v.networkTxBytes,
  ]) {
    c.reset();
  }
  v.memoryRssBytes.reset();
  v.diskCowBytes.reset();
  // Every source shows, 0 included: a node whose VMs all read /proc says so.
  for (const source of ['cgroup', 'proc', 'none'] as const)
    v.cpuSource.set({ source }, sample.vms.filter((s) => s.cpuSource === source).length);
  for (const s of sample.vms) {
    const labels: Partial<Record<VmLabel, string>> = v.perVm
      ? { vm: s.vm.vmName, pod: s.vm.pod, namespace: s.vm.namespace, backend: s.vm.backend }
      : { namespace: s.vm.namespace, backend: s.vm.backend };
    v.cpuSeconds.inc(labels, s.cpuUsageUsec / 1e6);
    v.cpuThrottledSeconds.inc(labels, s.throttledUsec / 1e6);
    v.cpuThrottledPeriods.inc(labels, s.throttledPeriods);
    v.memoryRssBytes.inc(labels, s.rssBytes);
    v.diskCowBytes.inc(labels, s.cowBytes);
    v.networkRxBytes.inc(labels, s.rxBytes);
    v.networkTxBytes.inc(labels, s.txBytes);
  }
  const n = m.node;
  n.cpuSeconds.reset();
  n.cpuSeconds.inc(sample.node.cpuUsageUsec / 1e6);
  n.memoryUsedBytes.set(sample.node.memoryUsedBytes);
  n.storageAvailableBytes.set(sample.node.storageAvailableBytes);
  n.storageTotalBytes.set(sample.node.storageTotalBytes);
}

/** Installs the collect hook: every scrape of `metrics` uses `sampler`'s shared sample. */
export function attachSampler(metrics: Metrics, sampler: { sample(): Promise<Sample> }): void {
  metrics.setCollectHook(async () => {
    applySample(metrics, await sampler.sample());
  });
}
