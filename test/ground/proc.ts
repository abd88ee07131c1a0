// Small process and network helpers shared by the test ground (control plane, registry,
// provider). Everything the ground starts is recorded by PID and stopped by PID.
import { type ChildProcess, spawn } from 'node:child_process';
import { openSync, readFileSync } from 'node:fs';
import { request } from 'node:https';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** Returns a TCP port that was free on 127.0.0.1 a moment ago (callers retry on bind races). */
export async function freePort(): Promise<number> {
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

/** Spawns a long-lived component with stdout and stderr appended to its log file. */
export function startProcess(cmd: string, args: string[], opts: StartOptions): ChildProcess {
  const fd = openSync(opts.logFile, 'a');
  const child = spawn(cmd, args, {
    stdio: ['ignore', fd, fd],
    env: opts.env ?? process.env,
    cwd: opts.cwd,
    detached: opts.detached ?? false,
  });
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
