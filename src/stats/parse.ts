// Pure parsers of the kernel files the stats sampler reads. Malformed or missing fields yield 0;
// nothing here throws.
import { pidStatFields } from '../util/proc-stat.ts';

/** `USER_HZ`: the unit of /proc/stat and /proc/<pid>/stat times; 100 on every Linux ABI we run on. */
export const USER_HZ = 100;

/** Page size assumed for /proc/<pid>/statm (only used when /proc/<pid>/status has no VmRSS). */
export const PAGE_SIZE = 4096;

function num(s: string | undefined): number {
  if (s === undefined) return 0;
  const n = Number(s);
  return Number.isFinite(n) && n >= 0 ? n : 0;
}

/** `key value` lines (cgroup v2 `cpu.stat`) ⇒ map. */
export function parseKeyValues(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const [k, v] = line.trim().split(/\s+/);
    if (k && v !== undefined) out.set(k, num(v));
  }
  return out;
}

export interface CgroupCpu {
  usageUsec: number;
  throttledUsec: number;
  throttledPeriods: number;
}

/** cgroup v2 `cpu.stat`. */
export function parseCpuStat(text: string): CgroupCpu {
  const kv = parseKeyValues(text);
  return {
    usageUsec: kv.get('usage_usec') ?? 0,
    throttledUsec: kv.get('throttled_usec') ?? 0,
    throttledPeriods: kv.get('nr_throttled') ?? 0,
  };
}

/** `/proc/<pid>/status` `VmRSS:` in bytes; `undefined` when absent (kernel threads, zombies). */
export function parseStatusRss(text: string): number | undefined {
  const m = /^VmRSS:\s+(\d+)\s*kB/m.exec(text);
  return m ? num(m[1]) * 1024 : undefined;
}

/** `/proc/<pid>/statm` resident pages (2nd field) in bytes. */
export function parseStatmRss(text: string, pageSize = PAGE_SIZE): number {
  return num(text.trim().split(/\s+/)[1]) * pageSize;
}

/**
 * `/proc/<pid>/stat` CPU time in microseconds: utime+stime+cutime+cstime (fields 14–17, in
 * USER_HZ ticks). Children are included because a cgroup would account for them too. The
 * command name (field 2) may contain spaces and parentheses, so fields are counted after the
 * last `)`.
 */
export function parsePidStatCpuUsec(text: string): number {
  const f = pidStatFields(text);
  if (f.length === 0) return 0;
  const ticks = num(f[11]) + num(f[12]) + num(f[13]) + num(f[14]);
  return Math.round((ticks * 1e6) / USER_HZ);
}

/**
 * `/proc/stat` first line (`cpu user nice system idle iowait irq softirq steal guest guest_nice`)
 * ⇒ busy time in microseconds. guest/guest_nice are already included in user/nice; idle and
 * iowait are not busy.
 */
export function parseProcStatCpuUsec(text: string): number {
  const line = text.split('\n', 1)[0] ?? '';
  const f = line.trim().split(/\s+/);
  if (f[0] !== 'cpu') return 0;
  const [user, nice, system, , , irq, softirq, steal] = f.slice(1).map(num);
  const ticks = (user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0);
  return Math.round((ticks * 1e6) / USER_HZ);
}

/** `/proc/meminfo` ⇒ bytes per key (`kB` values scaled). */
export function parseMeminfo(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^([^:\s]+):\s+(\d+)(\s+kB)?/.exec(line);
    if (m) out.set(m[1] as string, num(m[2]) * (m[3] ? 1024 : 1));
  }
  return out;
}

export interface NodeMemory {
  totalBytes: number;
  availableBytes: number;
  /** MemTotal − MemAvailable. */
  usedBytes: number;
  /** MemTotal − MemFree. */
  usageBytes: number;
  /** AnonPages. */
  rssBytes: number;
}

export function nodeMemory(meminfo: Map<string, number>): NodeMemory {
  const total = meminfo.get('MemTotal') ?? 0;
  const free = meminfo.get('MemFree') ?? 0;
  // Kernels before 3.14 lack MemAvailable; approximate it like `free` does.
  const available =
    meminfo.get('MemAvailable') ?? free + (meminfo.get('Buffers') ?? 0) + (meminfo.get('Cached') ?? 0);
  return {
    totalBytes: total,
    availableBytes: Math.min(available, total),
    usedBytes: Math.max(0, total - available),
    usageBytes: Math.max(0, total - free),
    rssBytes: meminfo.get('AnonPages') ?? 0,
  };
}

export interface DevCounters {
  rxBytes: number;
  txBytes: number;
}

/**
 * `/proc/<pid>/net/dev` ⇒ per-interface byte counters (as seen by that interface: rx is what
 * the interface received).
 */
export function parseNetDev(text: string): Map<string, DevCounters> {
  const out = new Map<string, DevCounters>();
  for (const line of text.split('\n')) {
    const colon = line.indexOf(':');
    if (colon < 0 || line.includes('|')) continue;
    const name = line.slice(0, colon).trim();
    const f = line
      .slice(colon + 1)
      .trim()
      .split(/\s+/);
    if (!name || f.length < 9) continue;
    out.set(name, { rxBytes: num(f[0]), txBytes: num(f[8]) });
  }
  return out;
}
