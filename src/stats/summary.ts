// kubelet `/stats/summary` (stats/v1alpha1 Summary, docs/metrics.md "`/stats/summary`") built from one sample.
// Pure. Each VM is one pod with one container (`agent` unless the tracked VM names another).
import type { PrevCpu, Sample, VmSample } from './types.ts';

export const DEFAULT_CONTAINER = 'agent';

export interface CpuStats {
  time: string;
  usageNanoCores?: number;
  usageCoreNanoSeconds: number;
}

export interface MemoryStats {
  time: string;
  availableBytes?: number;
  usageBytes: number;
  workingSetBytes: number;
  rssBytes: number;
}

export interface InterfaceStats {
  name: string;
  rxBytes: number;
  txBytes: number;
}

export interface NetworkStats extends InterfaceStats {
  time: string;
  interfaces: InterfaceStats[];
}

export interface FsStats {
  time: string;
  availableBytes: number;
  capacityBytes: number;
  usedBytes: number;
}

export interface ContainerStats {
  name: string;
  startTime: string;
  cpu: CpuStats;
  memory: MemoryStats;
}

export interface PodStats {
  podRef: { name: string; namespace: string; uid: string };
  startTime: string;
  containers: ContainerStats[];
  cpu: CpuStats;
  memory: MemoryStats;
  network: NetworkStats;
  'ephemeral-storage': { time: string; usedBytes: number };
}

export interface Summary {
  node: {
    nodeName: string;
    startTime: string;
    cpu: CpuStats;
    memory: MemoryStats;
    fs: FsStats;
  };
  pods: PodStats[];
}

/**
 * CPU rate in nano-cores from two cumulative readings (µs), or `undefined` without a usable
 * previous reading (first sample, counter reset, no elapsed time).
 */
export function nanoCores(prev: PrevCpu | undefined, timeMs: number, usageUsec: number): number | undefined {
  if (!prev) return undefined;
  const dtMs = timeMs - prev.timeMs;
  const du = usageUsec - prev.usageUsec;
  if (dtMs <= 0 || du < 0) return undefined;
  // (du µs × 1000 ns/µs) / (dtMs / 1000 s) = du × 1e6 / dtMs ns per second.
  return Math.round((du * 1e6) / dtMs);
}

function cpu(time: string, timeMs: number, usageUsec: number, prev: PrevCpu | undefined): CpuStats {
  const rate = nanoCores(prev, timeMs, usageUsec);
  const out: CpuStats = { time, usageCoreNanoSeconds: Math.round(usageUsec * 1000) };
  if (rate !== undefined) out.usageNanoCores = rate;
  return out;
}

function vmMemory(time: string, s: VmSample): MemoryStats {
  // The hypervisor's RSS is the guest memory actually backed on the host: usage, working set
  // and RSS are all that figure.
  return { time, usageBytes: s.rssBytes, workingSetBytes: s.rssBytes, rssBytes: s.rssBytes };
}

function podStats(time: string, timeMs: number, s: VmSample): PodStats {
  const start = s.vm.startTime.toISOString();
  const c = cpu(time, timeMs, s.cpuUsageUsec, s.prevCpu);
  const m = vmMemory(time, s);
  return {
    podRef: { name: s.vm.pod, namespace: s.vm.namespace, uid: s.vm.uid },
    startTime: start,
    containers: [
      { name: s.vm.container ?? DEFAULT_CONTAINER, startTime: start, cpu: { ...c }, memory: { ...m } },
    ],
    cpu: c,
    memory: m,
    network: {
      time,
      name: s.interfaces[0]?.name ?? 'eth0',
      rxBytes: s.rxBytes,
      txBytes: s.txBytes,
      interfaces: s.interfaces.map((i) => ({ name: i.name, rxBytes: i.rxBytes, txBytes: i.txBytes })),
    },
    'ephemeral-storage': { time, usedBytes: s.cowBytes },
  };
}

export function buildSummary(sample: Sample, nodeName: string, nodeStartTime: Date): Summary {
  const time = new Date(sample.timeMs).toISOString();
  const n = sample.node;
  return {
    node: {
      nodeName,
      startTime: nodeStartTime.toISOString(),
      cpu: cpu(time, sample.timeMs, n.cpuUsageUsec, n.prevCpu),
      memory: {
        time,
        availableBytes: n.memoryAvailableBytes,
        usageBytes: n.memoryUsageBytes,
        workingSetBytes: n.memoryUsedBytes,
        rssBytes: n.memoryRssBytes,
      },
      fs: {
        time,
        availableBytes: n.storageAvailableBytes,
        capacityBytes: n.storageTotalBytes,
        usedBytes: Math.max(0, n.storageTotalBytes - n.storageAvailableBytes),
      },
    },
    pods: sample.vms.map((s) => podStats(time, sample.timeMs, s)),
  };
}
