// Small process and network helpers shared by the test ground (control plane, registry,
// provider), plus the PID registry that lets `npm test`, the demo and the bench stop everything
// they started however they end. Everything is stopped by PID, never by name.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, openSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';

/** Every port freePort() handed out in this process: it never hands one out twice. */
const handedOut = new Set<number>();

/**
 * A TCP port that was free on 127.0.0.1 a moment ago (callers retry on bind races), never one
 * this process was given before: the kernel may give a port just closed to the next bind, and two
 * daemons of a fleet started in parallel once drew the same one.
 */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = await unusedPort();
    if (handedOut.has(port)) continue;
    handedOut.add(port);
    return port;
  }
}

async function unusedPort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => {
        if (addr && typeof addr === 'object') resolve(addr.port);
        else reject(new Error('freePort: no address'));
      });
    });
  });
}

export interface StartOptions {
  logFile: string;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Detached children survive the parent (used by `npm run cluster -- up`). */
  detached?: boolean;
}

/**
 * Spawns a long-lived component with stdout and stderr appended to its log file. Inside a run
 * with a PID registry (openPidRegistry) the process is recorded there and carries the
 * registry's marker in its environment, so the run's teardown stops it even when it was started
 * by another process of the run (e.g. a test file restarting the apiserver).
 */
export function startProcess(cmd: string, args: string[], opts: StartOptions): ChildProcess {
  const fd = openSync(opts.logFile, 'a');
  const child = spawn(cmd, args, {
    stdio: ['ignore', fd, fd],
    env: { ...(opts.env ?? process.env), ...registryEnv() },
    cwd: opts.cwd,
    detached: opts.detached ?? false,
  });
  if (child.pid) recordPid(child.pid, cmd, args);
  // Never hold the caller's event loop open: components are stopped explicitly by PID, and a
  // test file that restarted the apiserver must still be able to exit.
  child.unref();
  return child;
}

/** True while the process exists and is not a zombie. (This machine's pid 1 does not reap
 * orphans, so a component re-parented to it stays a zombie after it exits.) */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true;
  }
}

/** Sends SIGTERM, waits up to `graceMs`, then SIGKILL. Resolves once the PID is gone. */
export async function stopPid(pid: number, graceMs = 5000): Promise<void> {
  if (!isAlive(pid)) return;
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    return;
  }
  const until = Date.now() + graceMs;
  while (Date.now() < until) {
    if (!isAlive(pid)) return;
    await sleep(50);
  }
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  const killedAt = Date.now();
  while (isAlive(pid) && Date.now() - killedAt < 10_000) await sleep(20);
}

/** Polls `check` until it returns true or the deadline passes; the error names `what`. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  timeoutMs: number,
  intervalMs = 100,
): Promise<void> {
  const until = Date.now() + timeoutMs;
  let lastErr: unknown;
  while (Date.now() < until) {
    try {
      if (await check()) return;
    } catch (err) {
      lastErr = err;
    }
    await sleep(intervalMs);
  }
  const detail = lastErr instanceof Error ? `: ${lastErr.message}` : '';
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
}

/** Runs a command to completion and returns its stdout; rejects with stderr on failure. */
export async function run(
  cmd: string,
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; input?: string | Buffer; cwd?: string } = {},
): Promise<{ stdout: string; stderr: string }> {
  return await new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: opts.env ?? process.env, cwd: opts.cwd });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    child.on('error', reject);
    // A command that exits without reading its stdin (bash scripts/testbin.sh) makes this write
    // fail with EPIPE; unhandled, that error would be an uncaught exception of the caller.
    child.stdin.on('error', () => {});
    child.on('close', (code) => {
      const stdout = Buffer.concat(out).toString();
      const stderr = Buffer.concat(err).toString();
      if (code === 0) resolve({ stdout, stderr });
      else reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${stderr.trim() || stdout.trim()}`));
    });
    child.stdin.end(opts.input ?? '');
  });
}

/** GET over HTTPS without verifying the server (loopback readiness polling only). */
export function httpsGet(url: string, token?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolvePromise, reject) => {
    const req = request(
      url,
      {
        method: 'GET',
        rejectUnauthorized: false,
        headers: token ? { authorization: `Bearer ${token}` } : {},
        timeout: 5000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolvePromise({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }),
        );
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

// ---------------------------------------------------------------------------------------------
// PID registry. A run (`npm test`, the demo, the bench) opens a registry directory and exports
// it as VK_GROUND_PIDS; every process of the run inherits it. A process is the run's when
//  - it was recorded as <registry>/<pid>.json by startProcess/startDaemon (any process of the
//    run, e.g. a test file that restarted the apiserver) and its start time (field 22 of
//    /proc/<pid>/stat) still matches the record (pids are reused quickly here), or
//  - its environment carries the marker: VK_GROUND_PIDS=<registry>, or <registry> in
//    VK_GROUND_PIDS_OUTER (a nested run, e.g. the demo started by a test, keeps its parent
//    run's registries there). That covers what the recorded processes start themselves: the
//    daemon's cocoon calls, the simulator's reaper, stand-ins and DHCP server, kubectl...
// The teardown stops all of them (SIGTERM, SIGKILL after a grace) until none is left.

export const PIDS_ENV = 'VK_GROUND_PIDS';
export const OUTER_PIDS_ENV = 'VK_GROUND_PIDS_OUTER';

export interface PidRecord {
  pid: number;
  /** Start time in clock ticks since boot (field 22 of /proc/<pid>/stat). */
  start: number;
  cmd: string;
  args: string[];
  startedAt: string;
  recordedBy: number;
}

interface ProcInfo {
  state: string;
  ppid: number;
  start: number;
}

function procInfo(pid: number): ProcInfo | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined;
  }
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { state: f[0] ?? '', ppid: Number(f[1]), start: Number(f[19]) };
}

/** The start time of a live (non-zombie) process, undefined when it is gone. */
export function procStart(pid: number): number | undefined {
  const info = procInfo(pid);
  return info && info.state !== 'Z' && info.state !== 'X' ? info.start : undefined;
}

/**
 * Makes `dir` the PID registry of this process (created if needed): processes started from now
 * on through startProcess/startDaemon are recorded in it, and everything started from this
 * process inherits the marker. A registry already open (an outer run) is kept as an outer one.
 */
export function openPidRegistry(dir: string): string {
  mkdirSync(dir, { recursive: true });
  const current = process.env[PIDS_ENV];
  if (current && current !== dir) {
    process.env[OUTER_PIDS_ENV] = [process.env[OUTER_PIDS_ENV], current].filter(Boolean).join(':');
  }
  process.env[PIDS_ENV] = dir;
  return dir;
}

/** The marker variables of the current registry, for children started with an explicit env. */
export function registryEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  const dir = process.env[PIDS_ENV];
  const outer = process.env[OUTER_PIDS_ENV];
  if (dir) env[PIDS_ENV] = dir;
  if (outer) env[OUTER_PIDS_ENV] = outer;
  return env;
}

/** Records a long-lived process in the current registry (no-op outside a run with one). */
export function recordPid(pid: number, cmd: string, args: readonly string[]): void {
  const dir = process.env[PIDS_ENV];
  const start = procStart(pid);
  if (!dir || start === undefined) return;
  const rec: PidRecord = {
    pid,
    start,
    cmd,
    args: [...args],
    startedAt: new Date().toISOString(),
    recordedBy: process.pid,
  };
  const file = join(dir, `${pid}.json`);
  try {
    writeFileSync(`${file}.tmp`, JSON.stringify(rec));
    renameSync(`${file}.tmp`, file);
  } catch {
    // The registry is gone (its run is tearing down): the environment marker still finds it.
  }
}

function readRecords(dir: string): PidRecord[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const out: PidRecord[] = [];
  for (const n of names) {
    if (!n.endsWith('.json')) continue;
    try {
      out.push(JSON.parse(readFileSync(join(dir, n), 'utf8')) as PidRecord);
    } catch {
      // half-written or removed meanwhile
    }
  }
  return out;
}

function carriesMarker(pid: number, dir: string): boolean {
  let env: string;
  try {
    env = readFileSync(`/proc/${pid}/environ`, 'utf8');
  } catch {
    return false;
  }
  for (const kv of env.split('\0')) {
    if (kv === `${PIDS_ENV}=${dir}`) return true;
    if (
      kv.startsWith(`${OUTER_PIDS_ENV}=`) &&
      kv
        .slice(OUTER_PIDS_ENV.length + 1)
        .split(':')
        .includes(dir)
    )
      return true;
  }
  return false;
}

function selfAndAncestors(): Set<number> {
  const out = new Set<number>();
  let pid = process.pid;
  while (pid > 1 && !out.has(pid)) {
    out.add(pid);
    pid = procInfo(pid)?.ppid ?? 0;
  }
  return out;
}

function cmdlineOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
  } catch {
    return '';
  }
}

export interface RunProcess {
  pid: number;
  start: number;
  cmdline: string;
}

/**
 * The live (non-zombie) processes of a registry: recorded ones whose start time still matches
 * and every process carrying the registry's marker. Never this process or its ancestors.
 */
export function registeredProcesses(dir: string): RunProcess[] {
  const skip = selfAndAncestors();
  const found = new Map<number, number>();
  for (const r of readRecords(dir)) {
    if (!skip.has(r.pid) && procStart(r.pid) === r.start) found.set(r.pid, r.start);
  }
  let pids: string[] = [];
  try {
    pids = readdirSync('/proc').filter((n) => /^\d+$/.test(n));
  } catch {
    // no /proc: recorded processes only
  }
  for (const name of pids) {
    const pid = Number(name);
    if (skip.has(pid) || found.has(pid)) continue;
    const start = procStart(pid);
    if (start === undefined || !carriesMarker(pid, dir)) continue;
    // Same process before and after reading its environment (not a pid reused meanwhile).
    if (procStart(pid) === start) found.set(pid, start);
  }
  return [...found].map(([pid, start]) => ({ pid, start, cmdline: cmdlineOf(pid) }));
}

function signalIfSame(p: RunProcess, sig: NodeJS.Signals): void {
  if (procStart(p.pid) !== p.start) return;
  try {
    process.kill(p.pid, sig);
  } catch {
    // gone
  }
}

/**
 * Stops every process of the registry: SIGTERM, then SIGKILL to whatever is still there after
 * `graceMs` (a process ignoring SIGTERM dies too). Repeats while new ones appear (something
 * may have been starting a child meanwhile). Resolves with what it found.
 */
export async function stopRegistered(dir: string, opts: { graceMs?: number } = {}): Promise<RunProcess[]> {
  const all: RunProcess[] = [];
  for (let round = 0; round < 5; round++) {
    const procs = registeredProcesses(dir);
    if (procs.length === 0) break;
    all.push(...procs);
    for (const p of procs) signalIfSame(p, 'SIGTERM');
    const alive = () => procs.filter((p) => procStart(p.pid) === p.start);
    const graceUntil = Date.now() + (round === 0 ? (opts.graceMs ?? 5000) : 1000);
    while (alive().length > 0 && Date.now() < graceUntil) await sleep(50);
    for (const p of alive()) signalIfSame(p, 'SIGKILL');
    const killUntil = Date.now() + 5000;
    while (alive().length > 0 && Date.now() < killUntil) await sleep(20);
  }
  return all;
}

/** Synchronous last resort (process 'exit'): SIGKILL every process of the registry. */
export function killRegisteredSync(dir: string): number {
  const procs = registeredProcesses(dir);
  for (const p of procs) signalIfSame(p, 'SIGKILL');
  return procs.length;
}

export type EndReason =
  | { kind: 'done'; code: number }
  | { kind: 'signal'; signal: NodeJS.Signals }
  | { kind: 'error'; error: unknown };

const signalNumbers: Partial<Record<NodeJS.Signals, number>> = { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 };

/**
 * Makes `teardown` run exactly once however this process ends: the returned `end(reason)`, a
 * SIGINT/SIGTERM/SIGHUP, an uncaught exception or an unhandled rejection. The process then exits
 * with the code `teardown` returns (default: the `done` code, 128+signal, or 1 for an error).
 * `registry`'s processes are stopped after `teardown` in any case (and SIGKILLed synchronously
 * on 'exit', should anything call process.exit() first). A teardown that hangs is cut off after
 * `timeoutMs`.
 */
export function installTeardown(
  teardown: (why: EndReason) => Promise<number | undefined>,
  opts: { registry?: string; graceMs?: number; timeoutMs?: number; log?: (line: string) => void } = {},
): (why: EndReason) => Promise<never> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  let running: Promise<never> | undefined;
  const end = (why: EndReason): Promise<never> => {
    if (running) {
      if (why.kind === 'error') {
        const msg = why.error instanceof Error ? why.error.message : String(why.error);
        log(`(while stopping: ${msg.split('\n')[0]})`);
      }
      return running;
    }
    if (why.kind === 'error') log(`error: ${describeError(why.error)}`);
    running = (async (): Promise<never> => {
      let code =
        why.kind === 'done' ? why.code : why.kind === 'signal' ? 128 + (signalNumbers[why.signal] ?? 0) : 1;
      const cutoff = setTimeout(() => {
        log(`teardown still running after ${(opts.timeoutMs ?? 120_000) / 1000} s: killing what is left`);
        if (opts.registry) killRegisteredSync(opts.registry);
        process.exit(code === 0 ? 1 : code);
      }, opts.timeoutMs ?? 120_000);
      try {
        code = (await teardown(why)) ?? code;
      } catch (err) {
        log(`teardown failed: ${describeError(err)}`);
        if (code === 0) code = 1;
      }
      if (opts.registry) await stopRegistered(opts.registry, { graceMs: opts.graceMs }).catch(() => []);
      clearTimeout(cutoff);
      process.exit(code);
    })();
    return running;
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.on(signal, () => void end({ kind: 'signal', signal }));
  }
  process.on('uncaughtException', (error) => void end({ kind: 'error', error }));
  process.on('unhandledRejection', (error) => void end({ kind: 'error', error }));
  if (opts.registry) {
    const registry = opts.registry;
    process.on('exit', () => {
      killRegisteredSync(registry);
    });
    startWatchdog(registry);
  }
  return end;
}

/**
 * SIGKILL (or the OOM killer) leaves no chance to a teardown: a small detached watchdog waits
 * for this process to disappear and then stops the registry's processes. It carries the
 * marker, so a normal teardown stops it with the rest.
 */
function startWatchdog(registry: string): void {
  const start = procStart(process.pid);
  if (start === undefined) return;
  const code = [
    `import { procStart, stopRegistered } from ${JSON.stringify(pathToFileURL(import.meta.filename).href)};`,
    'const [pid, start, dir] = [Number(process.argv[1]), Number(process.argv[2]), process.argv[3]];',
    'const tick = () => {',
    '  if (procStart(pid) === start) return void setTimeout(tick, 500);',
    '  void stopRegistered(dir).finally(() => process.exit(0));',
    '};',
    'tick();',
  ].join('\n');
  const child = spawn(
    process.execPath,
    ['--input-type=module', '-e', code, String(process.pid), String(start), registry],
    { detached: true, stdio: 'ignore', env: { ...process.env, ...registryEnv() } },
  );
  child.on('error', () => {});
  child.unref();
}

export function describeError(err: unknown): string {
  return err instanceof Error ? (err.stack ?? err.message) : String(err);
}
