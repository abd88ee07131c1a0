// Process liveness from /proc. The machine's pid 1 may not reap orphans and pids wrap quickly
// (pid_max can be 32768), so "alive" means: /proc/<pid>/stat exists, the task is not a zombie,
// and (when known) its start time equals the one recorded when we spawned it.
import fs from 'node:fs';

export interface ProcStat {
  state: string;
  start: number;
  pgid: number;
}

/** Parses /proc/<pid>/stat; null when the process does not exist. */
export function procStat(pid: number): ProcStat | null {
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return null;
  }
  // Fields after the command name, which is parenthesised and may contain spaces.
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { state: rest[0] ?? '?', pgid: Number(rest[2]), start: Number(rest[19]) };
}

let ownStart: number | undefined;
/** The start time (clock ticks since boot) of this process. */
export function selfStart(): number {
  ownStart ??= procStat(process.pid)?.start ?? 0;
  return ownStart;
}

/** True when `pid` is a live (non-zombie) process, started at `start` when that is given. */
export function isAlive(pid: number, start?: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  const st = procStat(pid);
  if (!st || st.state === 'Z' || st.state === 'X') return false;
  if (start !== undefined && start > 0 && Number.isFinite(start) && st.start !== start) return false;
  return true;
}

/** SIGKILLs the process group led by `pid` (and `pid` itself); missing processes are ignored. */
export function killGroup(pid: number, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (!Number.isInteger(pid) || pid <= 1) return;
  for (const target of [-pid, pid]) {
    try {
      process.kill(target, signal);
    } catch {
      // already gone
    }
  }
}
