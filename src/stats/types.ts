// Shapes shared by the stats sampler (I/O) and the pure builders (summary, resource metrics,
// Prometheus collect hook).

/** One VM the provider tracks, as the sampler needs it. */
export interface TrackedVm {
  namespace: string;
  pod: string;
  uid: string;
  vmId: string;
  vmName: string;
  /** `cloud-hypervisor` or `firecracker` (anything else maps to the cloudhypervisor run dir). */
  backend: string;
  /** Hypervisor pid; 0 or a dead pid yields zero RSS. */
  pid: number;
  /** When the VM (the pod's single container) started. */
  startTime: Date;
  /** TAP device name(s) from `network_configs[].tap`; missing ⇒ network counters are 0. */
  tap?: string | readonly string[];
  /** Container name reported for the VM (default `agent`, docs/metrics.md "`/metrics/resource`"). */
  container?: string;
}

/** A CPU counter reading from the previous sample, for rates. */
export interface PrevCpu {
  timeMs: number;
  usageUsec: number;
}

/** Where a VM's CPU counter came from. */
export type CpuSource = 'cgroup' | 'proc' | 'none';

export interface NetIface {
  name: string;
  /** Bytes received by the guest (the TAP device's tx counter). */
  rxBytes: number;
  /** Bytes sent by the guest (the TAP device's rx counter). */
  txBytes: number;
}

export interface VmSample {
  vm: TrackedVm;
  cpuSource: CpuSource;
  /** Cumulative CPU time in microseconds. */
  cpuUsageUsec: number;
  /** cpu.stat `throttled_usec` (0 without the cgroup). */
  throttledUsec: number;
  /** cpu.stat `nr_throttled` (0 without the cgroup). */
  throttledPeriods: number;
  rssBytes: number;
  /** Bytes allocated by `overlay.qcow2` (else `cow.raw`). */
  cowBytes: number;
  rxBytes: number;
  txBytes: number;
  interfaces: NetIface[];
  /** The same VM's CPU counter in the previous sample (absent on the first, or after a reset). */
  prevCpu?: PrevCpu;
}

export interface NodeSample {
  /** Busy CPU time from `/proc/stat` (user+nice+system+irq+softirq+steal), microseconds. */
  cpuUsageUsec: number;
  memoryTotalBytes: number;
  memoryAvailableBytes: number;
  /** MemTotal − MemAvailable (the node working set). */
  memoryUsedBytes: number;
  /** MemTotal − MemFree (includes page cache). */
  memoryUsageBytes: number;
  /** AnonPages. */
  memoryRssBytes: number;
  storageTotalBytes: number;
  storageAvailableBytes: number;
  prevCpu?: PrevCpu;
}

export interface Sample {
  /** Wall-clock time of the sample (ms since epoch). */
  timeMs: number;
  node: NodeSample;
  vms: VmSample[];
}
