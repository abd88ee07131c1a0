// The daemon's own cost from /proc: CPU time (utime+stime of /proc/<pid>/stat, which excludes
// its children, i.e. the `cocoon` invocations) and memory (VmRSS, VmHWM of /proc/<pid>/status).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

let clkTck: number | undefined;

/** Clock ticks per second of /proc/<pid>/stat times (getconf CLK_TCK; 100 on Linux). */
export function clockTicks(): number {
  if (clkTck === undefined) {
    try {
      clkTck = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      clkTck = 100;
    }
  }
  return clkTck;
}

export interface CpuTimes {
  /** utime+stime of the process itself, ms. */
  selfMs: number;
  /** cutime+cstime: children it waited for (its `cocoon` invocations), ms. */
  childrenMs: number;
}

/** Parses the text of /proc/<pid>/stat (the command may contain spaces and parentheses). */
export function parseStatTimes(stat: string, ticksPerS: number): CpuTimes {
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
  const t = (i: number) => Number(f[i - 3] ?? Number.NaN);
  const ms = (ticks: number) => (ticks * 1000) / ticksPerS;
  return { selfMs: ms(t(14) + t(15)), childrenMs: ms(t(16) + t(17)) };
}

/** CPU times of a live process; throws when it is gone. */
export function cpuTimes(pid: number): CpuTimes {
  return parseStatTimes(readFileSync(`/proc/${pid}/stat`, 'latin1'), clockTicks());
}

export interface Mem {
  rssKiB: number;
  hwmKiB: number;
  /** VmRSS's anonymous part (heaps, stacks) and its file-backed part (the binary's and the
   * libraries' pages). */
  anonKiB: number;
  fileKiB: number;
}

/** Parses VmRSS, VmHWM, RssAnon and RssFile (kB) out of /proc/<pid>/status. */
export function parseStatusMem(status: string): Mem {
  const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+)\\s+kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rssKiB: kib('VmRSS'), hwmKiB: kib('VmHWM'), anonKiB: kib('RssAnon'), fileKiB: kib('RssFile') };
}

export function memOf(pid: number): Mem {
  return parseStatusMem(readFileSync(`/proc/${pid}/status`, 'latin1'));
}

/** Samples VmRSS of one process every `intervalMs` (default 100 ms) and keeps the maximum
 * (with its anonymous and file-backed parts). */
export class RssSampler {
  #timer: NodeJS.Timeout | undefined;
  maxKiB = 0;
  lastKiB = 0;
  /** The sample that held the maximum. */
  atMax: Mem | undefined;
  /** The first sample. */
  first: Mem | undefined;
  samples = 0;
  readonly pid: number;

  constructor(pid: number, intervalMs = 100) {
    this.pid = pid;
    const tick = () => {
      try {
        const mem = memOf(pid);
        const { rssKiB } = mem;
        if (Number.isFinite(rssKiB)) {
          this.lastKiB = rssKiB;
          this.first ??= mem;
          this.samples++;
          if (rssKiB > this.maxKiB) {
            this.maxKiB = rssKiB;
            this.atMax = mem;
          }
        }
      } catch {
        // gone (killed on purpose by the restart bench, or crashed: the bench notices)
      }
    };
    tick();
    this.#timer = setInterval(tick, intervalMs);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
