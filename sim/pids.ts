// Registry of every long-lived process the simulator starts (stand-ins, busy holders, the
// reaper): <root>/sim/pids/<pid>.json = {kind, vm?, start}. It gives liveness checks a start
// time to compare against (pids are reused) and lets test clean-up find everything to kill.
import fs from 'node:fs';
import path from 'node:path';
import { sleepSync, writeAtomic } from './lock.ts';
import { pidsDir, simDir } from './paths.ts';
import { isAlive, killGroup, procStat } from './proc.ts';

export interface TrackedProc {
  pid: number;
  kind: 'standin' | 'holder' | 'reaper' | 'dhcpd';
  vm?: string;
  start: number;
}

export function registerPid(root: string, pid: number, kind: TrackedProc['kind'], vm?: string): TrackedProc {
  const entry: TrackedProc = { pid, kind, start: procStat(pid)?.start ?? 0, ...(vm ? { vm } : {}) };
  writeAtomic(path.join(pidsDir(root), `${pid}.json`), JSON.stringify(entry));
  return entry;
}

export function trackedStart(root: string, pid: number): number | undefined {
  try {
    return (JSON.parse(fs.readFileSync(path.join(pidsDir(root), `${pid}.json`), 'utf8')) as TrackedProc)
      .start;
  } catch {
    return undefined;
  }
}

/** Liveness of a simulator-started process: alive and (if registered) the same incarnation. */
export function trackedAlive(root: string, pid: number): boolean {
  if (!pid) return false;
  return isAlive(pid, trackedStart(root, pid));
}

/** Wakes the reaper (reaper.sh) so that it reaps a killed child now rather than at its next tick. */
function nudgeReaper(root: string): void {
  try {
    const fd = fs.openSync(
      path.join(simDir(root), 'reaper.fifo'),
      fs.constants.O_WRONLY | fs.constants.O_NONBLOCK,
    );
    try {
      fs.writeSync(fd, '\n');
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    // no reaper: nothing to wake
  }
}

/**
 * Kills a tracked process group if it is still the process we started, and waits (≤ 0.5 s)
 * until it is reaped, so that the pid is gone when the caller returns, as after cocoon's own
 * kill-and-wait. Forgets the process.
 */
export function killTracked(root: string, pid: number): void {
  if (!pid) return;
  const start = trackedStart(root, pid);
  if (isAlive(pid, start)) {
    killGroup(pid);
    nudgeReaper(root);
    const deadline = Date.now() + 500;
    while (procStat(pid)?.start === start && Date.now() < deadline) sleepSync(5);
  }
  fs.rmSync(path.join(pidsDir(root), `${pid}.json`), { force: true });
}

export function listTracked(root: string): TrackedProc[] {
  let names: string[];
  try {
    names = fs.readdirSync(pidsDir(root));
  } catch {
    return [];
  }
  const out: TrackedProc[] = [];
  for (const n of names) {
    if (!n.endsWith('.json')) continue;
    try {
      out.push(JSON.parse(fs.readFileSync(path.join(pidsDir(root), n), 'utf8')) as TrackedProc);
    } catch {
      // a half-written entry of a killed process; ignore
    }
  }
  return out;
}
