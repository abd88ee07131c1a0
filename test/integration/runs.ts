// Shared by demo.test.ts and teardown.test.ts: runs a script of the repository (the demo, the
// suite runner, the bench, a fixture) as a child process, then looks for survivors two ways:
// the script's PID registry (recorded PIDs whose start time still matches, plus every process
// carrying the registry's environment marker), and any live process whose command line names
// the script's work directory.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, type TestContext } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { repoRoot } from '../../ground/cluster.ts';
import { type PidRecord, procStart, registeredProcesses, stopRegistered } from '../../ground/proc.ts';

export interface Run {
  child: ChildProcess;
  /** Everything written so far (stdout and stderr, in arrival order). */
  out(): string;
  /** Resolves with the exit once the process has ended. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }>;
  /** Resolves with the first match of `re` in the output so far or later. */
  waitOutput(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
}

/**
 * Work directories per test (tests of a file may run concurrently): swept after each test,
 * whatever happened (every process of their registries stopped); removed unless the test
 * failed (they hold the logs then).
 */
const workDirs = new Map<string, Set<string>>();
const dirsOf = (t: TestContext) => {
  const s = workDirs.get(t.fullName) ?? new Set<string>();
  workDirs.set(t.fullName, s);
  return s;
};

/** Call at the top level of a test file that uses {@link start} or {@link fixtureDir}. */
export function sweepWorkDirs(): void {
  afterEach(async (t) => {
    // `passed` exists at runtime (Node 24) but not yet in @types/node.
    const passed = (t as { passed?: boolean }).passed !== false;
    for (const d of workDirs.get(t.fullName) ?? []) {
      await stopRegistered(join(d, 'pids'), { graceMs: 1000 });
      if (passed) rmSync(d, { recursive: true, force: true });
      else if (existsSync(d)) console.log(`# kept ${d} (logs of the failed test)`);
    }
    workDirs.delete(t.fullName);
  });
}

/** Remembers a work directory of the test for the sweep after it. */
export function trackWorkDir(t: TestContext, dir: string): void {
  dirsOf(t).add(dir);
}

/** Starts `node <args>` from the repository root; its work directory is swept after the test. */
export function start(t: TestContext, args: string[], env: NodeJS.ProcessEnv = {}): Run {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...env };
  // Inherited from this test's runner, it would make a nested `node --test` skip its files.
  delete childEnv.NODE_TEST_CONTEXT;
  const child = spawn(process.execPath, args, {
    cwd: repoRoot,
    env: childEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let text = '';
  const waiters: (() => void)[] = [];
  const onData = (b: Buffer) => {
    text += b.toString();
    for (const w of waiters) w();
    // Remember work directories as soon as they are printed (for the after-hook sweep).
    for (const m of text.matchAll(/(?:demo: work dir|ground: \[[\d.]+s\] dir|bench: work dir) (\S+)/g)) {
      if (m[1]) trackWorkDir(t, m[1]);
    }
  };
  child.stdout?.on('data', onData);
  child.stderr?.on('data', onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }>((resolve) =>
    child.on('close', (code, signal) => resolve({ code, signal, out: text })),
  );
  return {
    child,
    out: () => text,
    exited,
    waitOutput: (re, timeoutMs = 240_000) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no ${re} in:\n${text}`)), timeoutMs);
        const check = () => {
          const m = text.match(re);
          if (m) {
            clearTimeout(timer);
            resolve(m);
          }
        };
        waiters.push(check);
        void exited.then(() => {
          check();
          clearTimeout(timer);
          reject(new Error(`exited without ${re}:\n${text}`));
        });
        check();
      }),
  };
}

/** Live processes of a run: its registry's, plus any whose command line names its work dir. */
export function survivors(workDir: string): string[] {
  const found = new Map<number, string>();
  for (const p of registeredProcesses(join(workDir, 'pids'))) found.set(p.pid, p.cmdline);
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    let cmdline = '';
    try {
      cmdline = readFileSync(`/proc/${name}/cmdline`, 'utf8').split('\0').join(' ');
    } catch {
      continue;
    }
    if (cmdline.includes(workDir) && procStart(Number(name)) !== undefined) found.set(Number(name), cmdline);
  }
  return [...found].map(([pid, cmd]) => `${pid} ${cmd.slice(0, 160)}`);
}

/** The processes a run recorded (its registry is kept with the logs when the run failed). */
export function records(workDir: string): PidRecord[] {
  const dir = join(workDir, 'pids');
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((n) => n.endsWith('.json'))
    .map((n) => JSON.parse(readFileSync(join(dir, n), 'utf8')) as PidRecord);
}

export function recordedNames(workDir: string): string[] {
  return records(workDir).map((r) => r.cmd.split('/').pop() ?? r.cmd);
}

/** Asserts nothing of the run is alive; waits a moment for processes still exiting. */
export async function assertNothingLeft(workDir: string, out: string, waitMs = 2000): Promise<void> {
  let left: string[] = [];
  const until = Date.now() + waitMs;
  for (;;) {
    left = survivors(workDir);
    if (left.length === 0 || Date.now() > until) break;
    await sleep(100);
  }
  assert.deepEqual(left, [], `still running after the run ended:\n${left.join('\n')}\n--- output:\n${out}`);
  for (const r of records(workDir)) {
    assert.notEqual(procStart(r.pid), r.start, `${r.cmd} (pid ${r.pid}) still running`);
  }
}

export const exitsWith = (r: { code: number | null; out: string }, code: number) =>
  assert.equal(r.code, code, `exit ${r.code}, expected ${code}:\n${r.out}`);

/** Writes test files into a temp dir for a nested `run-tests.ts` (absolute imports of the ground). */
export function fixtureDir(t: TestContext, files: Record<string, string>): string {
  const d = mkdtempSync(join(tmpdir(), 'vk-runner-fixture-'));
  trackWorkDir(t, d);
  for (const [name, body] of Object.entries(files)) writeFileSync(join(d, name), body);
  return d;
}

/** The import specifier of a ground module, for fixture files outside the repository. */
export const groundModule = (f: string) => JSON.stringify(pathToFileURL(join(repoRoot, 'ground', f)).href);
