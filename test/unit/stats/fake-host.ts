// A fake host tree in a temp dir: cgroup scopes, /proc entries, run dirs and /sys/class/net.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { SamplerConfig } from '../../../src/stats/sampler.ts';
import type { TrackedVm } from '../../../src/stats/types.ts';

export interface FakeHost {
  dir: string;
  config: SamplerConfig;
  write(rel: string, content: string | Buffer): Promise<void>;
  cpuStat(vmId: string, usageUsec: number, nrThrottled?: number, throttledUsec?: number): Promise<void>;
  procStatus(pid: number, rssKb: number): Promise<void>;
  cleanup(): Promise<void>;
}

export async function fakeHost(): Promise<FakeHost> {
  const dir = await mkdtemp(join(tmpdir(), 'vk-stats-'));
  const config: SamplerConfig = {
    rootDir: join(dir, 'root'),
    cgroupParent: 'cocoon.slice',
    cgroupRoot: join(dir, 'cgroup'),
    procRoot: join(dir, 'proc'),
    sysNetRoot: join(dir, 'sysnet'),
  };
  await mkdir(config.rootDir, { recursive: true });
  const write = async (rel: string, content: string | Buffer) => {
    const p = join(dir, rel);
    await mkdir(dirname(p), { recursive: true });
    await writeFile(p, content);
  };
  return {
    dir,
    config,
    write,
    cpuStat: (vmId, usageUsec, nrThrottled = 0, throttledUsec = 0) =>
      write(
        `cgroup/cocoon.slice/vm-${vmId}.scope/cpu.stat`,
        `usage_usec ${usageUsec}\nuser_usec ${Math.floor(usageUsec / 2)}\nsystem_usec ${Math.ceil(usageUsec / 2)}\n` +
          `nr_periods 100\nnr_throttled ${nrThrottled}\nthrottled_usec ${throttledUsec}\nnr_bursts 0\nburst_usec 0\n`,
      ),
    procStatus: (pid, rssKb) =>
      write(
        `proc/${pid}/status`,
        `Name:\tcloud-hyperviso\nState:\tS (sleeping)\nVmRSS:\t  ${rssKb} kB\nThreads:\t4\n`,
      ),
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}

export function vm(over: Partial<TrackedVm> = {}): TrackedVm {
  return {
    namespace: 'team-a',
    pod: 'agent-0',
    uid: 'uid-0',
    vmId: 'J7QX4MZK2N5VBR3TLWD6YHPC2E',
    vmName: 'vk-team-a-agent-0',
    backend: 'cloud-hypervisor',
    pid: 48213,
    startTime: new Date('2026-05-02T09:14:03.118Z'),
    ...over,
  };
}

/** `/proc/stat` with the given busy/idle tick split on the first line. */
export function procStat(user: number, system: number, idle: number, iowait = 0, steal = 0): string {
  return (
    `cpu  ${user} 0 ${system} ${idle} ${iowait} 0 0 ${steal} 0 0\n` +
    `cpu0 ${user} 0 ${system} ${idle} ${iowait} 0 0 ${steal} 0 0\nintr 1\nctxt 2\n`
  );
}

export const MEMINFO =
  'MemTotal:       16000000 kB\nMemFree:         2000000 kB\nMemAvailable:    6000000 kB\n' +
  'Buffers:          100000 kB\nCached:          3000000 kB\nAnonPages:       7000000 kB\nHugePages_Total:       0\n';
