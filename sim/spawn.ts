// Starting long-lived detached processes (VM stand-ins, busy holders) through the per-root
// reaper (reaper.sh), with a direct detached spawn as the fallback.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { io } from './io.ts';
import { readJson, sleepSync, withLock, writeAtomic } from './lock.ts';
import { simDir } from './paths.ts';
import { registerPid, type TrackedProc } from './pids.ts';
import { isAlive } from './proc.ts';

const here = import.meta.dirname;
export const REAPER_SCRIPT = path.join(here, 'reaper.sh');
export const STANDIN_NODE = path.join(here, 'standin.ts');
export const DHCPD = path.join(here, 'dhcpd.ts');

/**
 * The environment of everything the simulator starts (the invoking `cocoon`'s environment, as
 * when every call was a process of its own): node children reuse a compile cache.
 */
export function childEnv(): NodeJS.ProcessEnv {
  const env = io().env;
  return {
    ...env,
    NODE_COMPILE_CACHE: env.NODE_COMPILE_CACHE || path.join(os.tmpdir(), 'cocoon-sim-node-cache'),
  };
}

export interface SpawnRequest {
  argv0: string;
  cmd: string;
  args: string[];
  /** stdout and stderr are appended here. */
  log: string;
}

function reaperInfoFile(root: string): string {
  return path.join(simDir(root), 'reaper.pid.json');
}

function reaperAlive(root: string): boolean {
  const info = readJson<TrackedProc | null>(reaperInfoFile(root), null);
  return info !== null && isAlive(info.pid, info.start);
}

function ensureReaper(root: string): boolean {
  if (reaperAlive(root)) return true;
  const dir = simDir(root);
  return withLock(path.join(dir, 'reaper.lock'), () => {
    if (reaperAlive(root)) return true;
    const ready = path.join(dir, 'reaper.ready');
    fs.rmSync(ready, { force: true });
    const log = fs.openSync(path.join(dir, 'reaper.log'), 'a');
    const child = spawn('bash', [REAPER_SCRIPT, dir], {
      detached: true,
      stdio: ['ignore', log, log],
      env: childEnv(),
      cwd: '/',
    });
    fs.closeSync(log);
    child.unref();
    const pid = child.pid;
    if (!pid) return false;
    const deadline = Date.now() + 5000;
    while (Date.now() < deadline) {
      let text = '';
      try {
        text = fs.readFileSync(ready, 'utf8');
      } catch {
        // not yet
      }
      if (text === `${pid}\n`) {
        const entry = registerPid(root, pid, 'reaper');
        writeAtomic(reaperInfoFile(root), JSON.stringify(entry));
        return true;
      }
      sleepSync(2);
    }
    return false;
  });
}

let reqCounter = 0;

function viaReaper(root: string, req: SpawnRequest): number | undefined {
  const words = [req.log, req.argv0, req.cmd, ...req.args];
  // Tab-separated, read by bash: no tabs/newlines, and no empty words (IFS would drop them).
  if (words.some((w) => w === '' || /[\t\n]/.test(w))) return undefined;
  reqCounter += 1;
  const id = `${process.pid}-${Date.now()}-${reqCounter}`;
  const line = `${[id, ...words].join('\t')}\n`;
  if (Buffer.byteLength(line) >= 4096) return undefined; // must be one atomic pipe write
  const fifo = path.join(simDir(root), 'reaper.fifo');
  for (let attempt = 0; attempt < 2; attempt++) {
    if (!ensureReaper(root)) return undefined;
    let fd: number;
    try {
      fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENXIO' || code === 'ENOENT') {
        fs.rmSync(reaperInfoFile(root), { force: true }); // no reader: the reaper is gone
        continue;
      }
      throw e;
    }
    try {
      const deadline = Date.now() + 5000;
      for (;;) {
        try {
          fs.writeSync(fd, line);
          break;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() > deadline) throw e;
          sleepSync(2);
        }
      }
    } finally {
      fs.closeSync(fd);
    }
    const resp = path.join(simDir(root), 'reaper', id);
    const deadline = Date.now() + 10_000;
    let wait = 1;
    while (Date.now() < deadline) {
      let text = '';
      try {
        text = fs.readFileSync(resp, 'utf8');
      } catch {
        // not yet
      }
      if (text.endsWith('\n')) {
        fs.rmSync(resp, { force: true });
        const pid = Number(text.trim());
        return Number.isInteger(pid) && pid > 0 ? pid : undefined;
      }
      sleepSync(wait);
      wait = Math.min(16, wait * 2);
    }
    return undefined;
  }
  return undefined;
}

function direct(req: SpawnRequest): number | undefined {
  const log = fs.openSync(req.log, 'a');
  const child = spawn(req.cmd, req.args, {
    argv0: req.argv0,
    detached: true,
    stdio: ['ignore', log, log],
    env: childEnv(),
    cwd: '/',
  });
  fs.closeSync(log);
  child.unref();
  return child.pid;
}

/**
 * Starts a detached, long-lived process in its own process group and registers it in the pid
 * registry. Returns the pid (0 when nothing could be started).
 */
export function spawnDetached(
  root: string,
  req: SpawnRequest,
  kind: TrackedProc['kind'],
  vm?: string,
): number {
  fs.mkdirSync(path.dirname(req.log), { recursive: true });
  const pid = viaReaper(root, req) ?? direct(req) ?? 0;
  if (pid) registerPid(root, pid, kind, vm);
  return pid;
}

function dhcpdInfoFile(root: string): string {
  return path.join(simDir(root), 'dhcpd.pid.json');
}

/** Starts the root's DHCP server (dhcpd.ts) unless it is running. */
export function ensureDhcpd(root: string, leasesPath: string): void {
  const alive = () => {
    const info = readJson<TrackedProc | null>(dhcpdInfoFile(root), null);
    return info !== null && isAlive(info.pid, info.start);
  };
  if (alive()) return;
  withLock(path.join(simDir(root), 'dhcpd.lock'), () => {
    if (alive()) return;
    const pid = spawnDetached(
      root,
      {
        argv0: 'cocoon-net',
        cmd: process.execPath,
        args: [DHCPD, root, leasesPath],
        log: path.join(simDir(root), 'dhcpd.log'),
      },
      'dhcpd',
    );
    if (pid)
      writeAtomic(dhcpdInfoFile(root), JSON.stringify({ pid, kind: 'dhcpd', start: trackedStartOf(pid) }));
  });
}

function trackedStartOf(pid: number): number {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    return Number(text.slice(text.lastIndexOf(')') + 2).split(' ')[19]);
  } catch {
    return 0;
  }
}
