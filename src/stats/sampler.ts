// The shared stats sample (docs/metrics.md "The shared sample", docs/metrics.md "The shared sample"): one read of the kernel files
// for every tracked VM and the node, at most every 2 s, shared by /stats/summary,
// /metrics/resource and the `cocoon_vk_vm_*` / `cocoon_vk_node_*` families. Every read is best
// effort: a missing file or dead pid yields zeros; `sample()` never rejects.
import { readFile, stat, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { type Logger, silentLogger } from '../log.ts';
import {
  type DevCounters,
  nodeMemory,
  parseCpuStat,
  parseMeminfo,
  parseNetDev,
  parsePidStatCpuUsec,
  parseProcStatCpuUsec,
  parseStatmRss,
  parseStatusRss,
} from './parse.ts';
import type { CpuSource, NetIface, NodeSample, PrevCpu, Sample, TrackedVm, VmSample } from './types.ts';

export const DEFAULT_MIN_INTERVAL_MS = 2000;

export interface SamplerConfig {
  /** `COCOON_ROOT_DIR` (run dirs; statfs for node storage). */
  rootDir: string;
  /** `COCOON_CGROUP_PARENT`, e.g. `cocoon.slice`. */
  cgroupParent: string;
  /** Default `/sys/fs/cgroup`. */
  cgroupRoot?: string;
  /** Default `/proc`. */
  procRoot?: string;
  /** Default `/sys/class/net`. */
  sysNetRoot?: string;
  /** Minimum age of a sample before a new one is taken (default 2000 ms). */
  minIntervalMs?: number;
  /** Clock (ms since epoch); injectable for tests. */
  now?: () => number;
  log?: Logger;
}

export type ListVms = () => readonly TrackedVm[] | Promise<readonly TrackedVm[]>;

/** `firecracker` ⇒ `firecracker`, anything else ⇒ `cloudhypervisor` (docs/contracts/cocoon-cli.md "Files read under COCOON_ROOT_DIR"). */
export function backendDir(backend: string): string {
  return backend === 'firecracker' ? 'firecracker' : 'cloudhypervisor';
}

async function readText(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch {
    return undefined;
  }
}

/** Bytes allocated on disk (sparse COW files report their apparent size otherwise). */
async function allocatedBytes(path: string): Promise<number | undefined> {
  try {
    const st = await stat(path);
    return Number.isFinite(st.blocks) ? st.blocks * 512 : st.size;
  } catch {
    return undefined;
  }
}

function taps(vm: TrackedVm): readonly string[] {
  if (vm.tap === undefined) return [];
  return typeof vm.tap === 'string' ? [vm.tap] : vm.tap;
}

export class StatsSampler {
  readonly #listVms: ListVms;
  readonly #rootDir: string;
  readonly #cgroupDir: string;
  readonly #procRoot: string;
  readonly #sysNetRoot: string;
  readonly #minIntervalMs: number;
  readonly #now: () => number;
  readonly #log: Logger;
  #last: Sample | undefined;
  #inflight: Promise<Sample> | undefined;
  /** Previous CPU readings keyed by VM ID (only VMs of the last sample are kept). */
  #prevVm = new Map<string, PrevCpu & { pid: number }>();

  constructor(listVms: ListVms, config: SamplerConfig) {
    this.#listVms = listVms;
    this.#rootDir = config.rootDir;
    this.#cgroupDir = join(config.cgroupRoot ?? '/sys/fs/cgroup', config.cgroupParent);
    this.#procRoot = config.procRoot ?? '/proc';
    this.#sysNetRoot = config.sysNetRoot ?? '/sys/class/net';
    this.#minIntervalMs = config.minIntervalMs ?? DEFAULT_MIN_INTERVAL_MS;
    this.#now = config.now ?? Date.now;
    this.#log = config.log ?? silentLogger;
  }

  /** The last sample taken, if any (no I/O). */
  latest(): Sample | undefined {
    return this.#last;
  }

  /**
   * The current sample: the cached one when younger than the minimum interval, else a new one.
   * Concurrent callers share one in-flight read.
   */
  sample(): Promise<Sample> {
    const last = this.#last;
    if (last && this.#now() - last.timeMs < this.#minIntervalMs) return Promise.resolve(last);
    if (!this.#inflight) {
      this.#inflight = this.#take().finally(() => {
        this.#inflight = undefined;
      });
    }
    return this.#inflight;
  }

  async #take(): Promise<Sample> {
    let vms: readonly TrackedVm[] = [];
    try {
      vms = await this.#listVms();
    } catch (err) {
      this.#log.warn({ err: String(err) }, 'stats: listing tracked VMs failed');
    }
    const timeMs = this.#now();
    const [node, vmSamples] = await Promise.all([
      this.#sampleNode(),
      Promise.all(vms.map((vm) => this.#sampleVm(vm))),
    ]);
    const prevNode = this.#last?.node;
    if (prevNode && this.#last && node.cpuUsageUsec >= prevNode.cpuUsageUsec) {
      node.prevCpu = { timeMs: this.#last.timeMs, usageUsec: prevNode.cpuUsageUsec };
    }
    const nextPrev = new Map<string, PrevCpu & { pid: number }>();
    for (const s of vmSamples) {
      const p = this.#prevVm.get(s.vm.vmId);
      // A restarted hypervisor (new pid) or a counter that went backwards has no usable delta.
      if (p && p.pid === s.vm.pid && s.cpuUsageUsec >= p.usageUsec && s.cpuSource !== 'none') {
        s.prevCpu = { timeMs: p.timeMs, usageUsec: p.usageUsec };
      }
      if (s.cpuSource !== 'none')
        nextPrev.set(s.vm.vmId, { timeMs, usageUsec: s.cpuUsageUsec, pid: s.vm.pid });
    }
    this.#prevVm = nextPrev;
    const sample: Sample = { timeMs, node, vms: vmSamples };
    this.#last = sample;
    return sample;
  }

  async #sampleNode(): Promise<NodeSample> {
    const [statText, meminfoText, fs] = await Promise.all([
      readText(join(this.#procRoot, 'stat')),
      readText(join(this.#procRoot, 'meminfo')),
      statfs(this.#rootDir).catch(() => undefined),
    ]);
    const mem = nodeMemory(parseMeminfo(meminfoText ?? ''));
    return {
      cpuUsageUsec: parseProcStatCpuUsec(statText ?? ''),
      memoryTotalBytes: mem.totalBytes,
      memoryAvailableBytes: mem.availableBytes,
      memoryUsedBytes: mem.usedBytes,
      memoryUsageBytes: mem.usageBytes,
      memoryRssBytes: mem.rssBytes,
      storageTotalBytes: fs ? fs.blocks * fs.bsize : 0,
      storageAvailableBytes: fs ? fs.bavail * fs.bsize : 0,
    };
  }

  async #sampleVm(vm: TrackedVm): Promise<VmSample> {
    const alive = Number.isInteger(vm.pid) && vm.pid > 0;
    const pidDir = join(this.#procRoot, String(vm.pid));
    const runDir = join(this.#rootDir, 'run', backendDir(vm.backend), vm.vmId);
    const [cpuStat, status, cow, net] = await Promise.all([
      readText(join(this.#cgroupDir, `vm-${vm.vmId}.scope`, 'cpu.stat')),
      alive ? readText(join(pidDir, 'status')) : undefined,
      allocatedBytes(join(runDir, 'overlay.qcow2')).then((b) => b ?? allocatedBytes(join(runDir, 'cow.raw'))),
      this.#network(vm, alive ? pidDir : undefined),
    ]);

    let cpuSource: CpuSource = 'none';
    let cpuUsageUsec = 0;
    let throttledUsec = 0;
    let throttledPeriods = 0;
    if (cpuStat !== undefined) {
      const c = parseCpuStat(cpuStat);
      cpuSource = 'cgroup';
      cpuUsageUsec = c.usageUsec;
      throttledUsec = c.throttledUsec;
      throttledPeriods = c.throttledPeriods;
    } else if (alive) {
      // No scope (e.g. the simulator, or a cgroup v1 host): the hypervisor process's own times.
      const pidStat = await readText(join(pidDir, 'stat'));
      if (pidStat !== undefined) {
        cpuSource = 'proc';
        cpuUsageUsec = parsePidStatCpuUsec(pidStat);
      }
    }

    let rssBytes = status === undefined ? undefined : parseStatusRss(status);
    if (rssBytes === undefined && alive) {
      const statm = await readText(join(pidDir, 'statm'));
      rssBytes = statm === undefined ? 0 : parseStatmRss(statm);
    }

    return {
      vm,
      cpuSource,
      cpuUsageUsec,
      throttledUsec,
      throttledPeriods,
      rssBytes: rssBytes ?? 0,
      cowBytes: cow ?? 0,
      rxBytes: net.reduce((a, i) => a + i.rxBytes, 0),
      txBytes: net.reduce((a, i) => a + i.txBytes, 0),
      interfaces: net,
    };
  }

  /**
   * TAP counters, best effort. The TAP lives in the VM's CNI netns
   * (`/var/run/netns/cocoon-<vmID>`), whose `/sys/class/net` is not visible from the host
   * namespace, and entering a netns (setns) is not possible from Node without native code. So:
   * 1. `/sys/class/net/<tap>/statistics` when the TAP is in the host namespace;
   * 2. `/proc/<pid>/net/dev`, which shows the namespace of the hypervisor process (it holds the
   *    TAP when cocoon starts the hypervisor inside the netns);
   * 3. otherwise 0.
   * Counters are turned around to the guest's view: the TAP's tx is what the guest received.
   */
  async #network(vm: TrackedVm, pidDir: string | undefined): Promise<NetIface[]> {
    const names = taps(vm);
    if (names.length === 0) return [];
    let netDev: Map<string, DevCounters> | undefined;
    const out: NetIface[] = [];
    for (const name of names) {
      let c: DevCounters | undefined;
      if (!name.includes('/') && name !== '.' && name !== '..') {
        const dir = join(this.#sysNetRoot, name, 'statistics');
        const [rx, tx] = await Promise.all([
          readText(join(dir, 'rx_bytes')),
          readText(join(dir, 'tx_bytes')),
        ]);
        if (rx !== undefined && tx !== undefined)
          c = { rxBytes: Number(rx.trim()) || 0, txBytes: Number(tx.trim()) || 0 };
      }
      if (!c && pidDir) {
        if (netDev === undefined) netDev = parseNetDev((await readText(join(pidDir, 'net', 'dev'))) ?? '');
        c = netDev.get(name);
      }
      out.push({ name, rxBytes: c?.txBytes ?? 0, txBytes: c?.rxBytes ?? 0 });
    }
    return out;
  }
}
