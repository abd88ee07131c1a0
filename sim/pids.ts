// Registry of every long-lived process the simulator starts (stand-ins, busy holders, the
// reaper): <root>/sim/pids/<pid>.json = {kind, vm?, start}. It gives liveness checks a start
// time to compare against (pids are reused) and lets test clean-up find everything to kill.
import fs from 'node:fs';
import path from 'node:path';
import { removeScopesOf } from './cgroup.ts';
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

function trackedEntry(root: string, pid: number): TrackedProc | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(pidsDir(root), `${pid}.json`), 'utf8')) as TrackedProc;
  } catch {
    return undefined;
  }
}

export function trackedStart(root: string, pid: number): number | undefined {
  return trackedEntry(root, pid)?.start;
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

/** How long a kill waits for a killed process to die at all (a zombie counts as dead). */
const DEATH_WAIT_MS = 10_000;

/**
 * Kills tracked process groups that are still the processes we started, and waits (≤ 0.5 s,
 * plus 5 ms per process) until they are reaped, or at least dead (≤ 10 s), so that the pids
 * are gone when the caller returns, as after cocoon's own kill-and-wait. Forgets the
 * processes; a stand-in's cgroup scope goes with it (sim/cgroup.ts). The reaper is woken
 * every 20 ms meanwhile: it reaps between two reads of its FIFO, and a wake-up that arrives
 * before a child has died would otherwise leave it to its 0.25 s read timeout.
 */
export function killTrackedAll(root: string, pids: readonly number[]): void {
  const live: { pid: number; start: number | undefined }[] = [];
  const standins: { vm: string; pid: number }[] = [];
  for (const pid of pids) {
    if (!pid) continue;
    const entry = trackedEntry(root, pid);
    if (entry?.kind === 'standin' && entry.vm) standins.push({ vm: entry.vm, pid });
    const start = entry?.start;
    if (isAlive(pid, start)) live.push({ pid, start });
  }
  for (const p of live) killGroup(p.pid);
  if (live.length > 0) {
    const reaped = Date.now() + 500 + 5 * live.length;
    const dead = Date.now() + DEATH_WAIT_MS;
    let waiting = live;
    for (let i = 0; waiting.length > 0; i++) {
      const now = Date.now();
      // After the reaping bound, a zombie will do; a process not yet dead at all (a loaded
      // machine had not run the killed stand-in's exit after 0.5 s, and a `vm start` right
      // after the kill found it alive) is waited for, as cocoon waits for its kill.
      if (now >= reaped) waiting = waiting.filter((p) => isAlive(p.pid, p.start));
      if (waiting.length === 0 || now >= dead) break;
      if (i % 4 === 0) nudgeReaper(root);
      sleepSync(5);
      waiting = waiting.filter((p) => procStat(p.pid)?.start === p.start);
    }
  }
  removeScopesOf(root, standins);
  for (const pid of pids) if (pid) fs.rmSync(path.join(pidsDir(root), `${pid}.json`), { force: true });
}

/** killTrackedAll for one process. */
export function killTracked(root: string, pid: number): void {
  killTrackedAll(root, [pid]);
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
