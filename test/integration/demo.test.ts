// `npm run demo` and process hygiene: the demo (scripts/demo.ts), the suite runner
// (ground/run-tests.ts) and the bench (bench/clones.ts) leave no process behind, however
// they end. Each scenario runs the real script as a child process with its own ground, then
// looks for survivors two ways: the script's PID registry (recorded PIDs whose start time still
// matches, plus every process carrying the registry's environment marker), and any live process
// whose command line names the script's work directory.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { repoRoot } from '../../ground/cluster.ts';
import {
  type PidRecord,
  procStart,
  registeredProcesses,
  stopRegistered,
  waitFor,
} from '../../ground/proc.ts';

const node = process.execPath;
const SCENARIO_TIMEOUT = 300_000;

interface Run {
  child: ChildProcess;
  /** Everything written so far (stdout and stderr, in arrival order). */
  out(): string;
  /** Resolves with the exit once the process has ended. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }>;
  /** Resolves with the first match of `re` in the output so far or later. */
  waitOutput(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
}

/** Work directories of every scenario: their registries are swept after each test, whatever
 * happened; the directories are removed unless the test failed (they hold the logs then). */
const workDirs = new Set<string>();
afterEach(async (t) => {
  // `passed` exists at runtime (Node 24) but not yet in @types/node.
  const passed = (t as { passed?: boolean }).passed !== false;
  for (const d of workDirs) {
    await stopRegistered(join(d, 'pids'), { graceMs: 1000 });
    if (passed) rmSync(d, { recursive: true, force: true });
    else if (existsSync(d)) console.log(`# kept ${d} (logs of the failed test)`);
  }
  workDirs.clear();
});

function start(args: string[], env: NodeJS.ProcessEnv = {}): Run {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...env };
  // Inherited from this test's runner, it would make a nested `node --test` skip its files.
  delete childEnv.NODE_TEST_CONTEXT;
  const child = spawn(node, args, {
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
      if (m[1]) workDirs.add(m[1]);
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
function survivors(workDir: string): string[] {
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
function records(workDir: string): PidRecord[] {
  const dir = join(workDir, 'pids');
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((n) => n.endsWith('.json'))
    .map((n) => JSON.parse(readFileSync(join(dir, n), 'utf8')) as PidRecord);
}

function recordedNames(workDir: string): string[] {
  return records(workDir).map((r) => r.cmd.split('/').pop() ?? r.cmd);
}

/** Asserts nothing of the run is alive; waits a moment for processes still exiting. */
async function assertNothingLeft(workDir: string, out: string, waitMs = 2000): Promise<void> {
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

const ok = (r: { code: number | null; out: string }, code: number) =>
  assert.equal(r.code, code, `exit ${r.code}, expected ${code}:\n${r.out}`);

describe('npm run demo', () => {
  test('--check: all three example pods reach ready, one summary line, exit 0, nothing left running', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const run = start(['scripts/demo.ts', '--check']);
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    const r = await run.exited;
    ok(r, 0);
    assert.match(r.out, /^demo: check passed: 3\/3 pods ready in \d+\.\d+s$/m);
    assert.equal(r.out.match(/check (passed|FAILED)/g)?.length, 1, r.out);
    for (const pod of ['linux-0', 'firecracker-0', 'windows-0']) {
      assert.match(r.out, new RegExp(`demo: \\[ *[\\d.]+s\\] ${pod} .*lifecycle=ready`), r.out);
    }
    await assertNothingLeft(workDir, r.out);
    assert.equal(existsSync(workDir), false, 'the work dir is removed after a passing run');
  });

  test('an error thrown right after the ground started stops the ground and the registry (exit 1)', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const run = start(['scripts/demo.ts', '--check'], { VK_DEMO_FAIL_AT: 'ground' });
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    const r = await run.exited;
    ok(r, 1);
    assert.match(r.out, /control plane ready/);
    assert.match(r.out, /^demo: check FAILED: VK_DEMO_FAIL_AT=ground: failing on purpose/m);
    const names = recordedNames(workDir);
    for (const want of ['etcd', 'kube-apiserver', 'docker-registry']) {
      assert.ok(names.includes(want), `${want} was started: ${names.join(', ')}`);
    }
    await assertNothingLeft(workDir, r.out);
  });

  test('SIGINT while the control plane is half up stops etcd and kube-apiserver', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const run = start(['scripts/demo.ts', '--check']);
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    await run.waitOutput(/starting kube-apiserver/);
    // The apiserver is spawned (recorded) but not ready yet: interrupt now.
    await waitFor(
      'kube-apiserver recorded',
      () => recordedNames(workDir).includes('kube-apiserver'),
      30_000,
      20,
    );
    run.child.kill('SIGINT');
    const r = await run.exited;
    assert.notEqual(r.code, 0, r.out);
    assert.match(r.out, /^demo: check FAILED: interrupted by SIGINT/m);
    assert.doesNotMatch(r.out, /control plane ready/, 'the signal arrived half-way');
    assert.ok(recordedNames(workDir).includes('etcd'));
    await assertNothingLeft(workDir, r.out);
  });

  test('SIGKILL of the demo (no teardown possible): its watchdog stops everything it started', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const run = start(['scripts/demo.ts', '--check']);
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    await run.waitOutput(/demo: created linux-0/);
    assert.ok(survivors(workDir).length >= 4, 'the ground, the daemon and more are running');
    run.child.kill('SIGKILL');
    const r = await run.exited;
    assert.equal(r.signal, 'SIGKILL');
    // The watchdog notices within 0.5 s, then SIGTERM, up to 5 s of grace, SIGKILL.
    await assertNothingLeft(workDir, r.out, 30_000);
  });
});

/** Writes test files into a temp dir for a nested `run-tests.ts` (absolute imports of the ground). */
function fixtureDir(files: Record<string, string>): string {
  const d = mkdtempSync(join(tmpdir(), 'vk-runner-fixture-'));
  workDirs.add(d);
  for (const [name, body] of Object.entries(files)) writeFileSync(join(d, name), body);
  return d;
}
const ground = (f: string) => JSON.stringify(pathToFileURL(join(repoRoot, 'ground', f)).href);
// A process that ignores SIGTERM (like the stranded apiserver of the issue).
const STUBBORN = JSON.stringify("process.on('SIGTERM', () => {}); setInterval(() => {}, 60_000);");

interface FixtureReport {
  dir: string;
  registry: string;
  self: number;
  stubborn: number;
  apiserver?: number;
}

describe('npm test (ground/run-tests.ts)', () => {
  test('stops an apiserver a test restarted in its own process and a process that ignores SIGTERM', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const fx = fixtureDir({
      'restart.test.mts': `
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startApiserver, stopApiserver } from ${ground('cluster.ts')};
import { readGround } from ${ground('ground.ts')};
import { startProcess } from ${ground('proc.ts')};
test('restart the apiserver (its new PID stays in this process) and fail', async () => {
  const dir = process.env.VK_TEST_GROUND_DIR ?? '';
  const g = readGround(dir);
  assert.ok(g);
  await stopApiserver(g.cluster);
  const apiserver = await startApiserver(g.cluster);
  const stubborn = startProcess(process.execPath, ['-e', ${STUBBORN}], { logFile: join(dir, 'stubborn.log') }).pid;
  writeFileSync(process.env.FIXTURE_OUT ?? '', JSON.stringify({
    dir, registry: process.env.VK_GROUND_PIDS, self: process.pid, stubborn, apiserver,
  }));
  assert.fail('failing on purpose: the runner must still stop everything');
});
`,
    });
    const outFile = join(fx, 'report.json');
    const run = start(['ground/run-tests.ts', join(fx, 'restart.test.mts')], { FIXTURE_OUT: outFile });
    const r = await run.exited;
    ok(r, 1);
    const rep = JSON.parse(readFileSync(outFile, 'utf8')) as FixtureReport;
    workDirs.add(rep.dir);
    assert.equal(rep.registry, join(rep.dir, 'pids'));
    assert.match(r.out, /logs kept in/);
    const apiservers = records(rep.dir).filter((x) => x.cmd.endsWith('kube-apiserver'));
    assert.equal(apiservers.length, 2, 'the first apiserver and the one the test restarted are recorded');
    assert.ok(apiservers.some((x) => x.pid === rep.apiserver && x.recordedBy === rep.self));
    await assertNothingLeft(rep.dir, r.out);
  });

  test('SIGTERM while a test runs stops the test processes, what they started and the ground', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const fx = fixtureDir({
      'hang.test.mts': `
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startProcess } from ${ground('proc.ts')};
test('start something, then hang', async () => {
  const dir = process.env.VK_TEST_GROUND_DIR ?? '';
  const stubborn = startProcess(process.execPath, ['-e', ${STUBBORN}], { logFile: join(dir, 'stubborn.log') }).pid;
  writeFileSync(process.env.FIXTURE_OUT ?? '', JSON.stringify({
    dir, registry: process.env.VK_GROUND_PIDS, self: process.pid, stubborn,
  }));
  await new Promise(() => setInterval(() => {}, 60_000));
});
`,
    });
    const outFile = join(fx, 'report.json');
    const run = start(['ground/run-tests.ts', join(fx, 'hang.test.mts')], { FIXTURE_OUT: outFile });
    await Promise.race([
      waitFor('the hanging test to report', () => existsSync(outFile), 180_000, 100),
      run.exited.then((r) => {
        throw new Error(`run-tests ended before the test reported:\n${r.out}`);
      }),
    ]).catch(async (err: unknown) => {
      run.child.kill('SIGTERM');
      await run.exited;
      throw err;
    });
    const rep = JSON.parse(readFileSync(outFile, 'utf8')) as FixtureReport;
    workDirs.add(rep.dir);
    assert.ok(procStart(rep.self) !== undefined && procStart(rep.stubborn) !== undefined);
    run.child.kill('SIGTERM');
    const r = await run.exited;
    assert.equal(r.code, 143, r.out);
    assert.match(r.out, /SIGTERM: stopping/);
    assert.equal(procStart(rep.self), undefined, 'the test file process is gone');
    for (const want of ['etcd', 'kube-apiserver', 'docker-registry']) {
      assert.ok(recordedNames(rep.dir).includes(want), `${want} recorded`);
    }
    await assertNothingLeft(rep.dir, r.out);
  });
});

describe('teardown of a run (ground/proc.ts installTeardown)', () => {
  for (const mode of ['uncaught exception', 'unhandled rejection'] as const) {
    test(`the teardown runs on an ${mode} and kills what ignores SIGTERM`, { timeout: 60_000 }, async () => {
      const fx = fixtureDir({
        'crash.mts': `
import { spawn } from 'node:child_process';
import { installTeardown, openPidRegistry, startProcess } from ${ground('proc.ts')};
const registry = openPidRegistry(process.argv[2] ?? '');
installTeardown(async () => undefined, { registry, graceMs: 500 });
const stubborn = startProcess(process.execPath, ['-e', ${STUBBORN}], { logFile: '/dev/null' }).pid;
// Not recorded: found through the environment marker it inherited.
const inherited = spawn('sleep', ['600'], { stdio: 'ignore' }).pid;
console.log(JSON.stringify({ stubborn, inherited }));
setTimeout(() => {
  if (process.argv[3] === 'throw') throw new Error('boom (uncaught)');
  void Promise.reject(new Error('boom (unhandled)'));
}, 300);
`,
      });
      const workDir = join(fx, 'run');
      const run = start([
        join(fx, 'crash.mts'),
        join(workDir, 'pids'),
        mode === 'uncaught exception' ? 'throw' : 'reject',
      ]);
      const m = await run.waitOutput(/\{"stubborn":(\d+),"inherited":(\d+)\}/, 30_000);
      const r = await run.exited;
      ok(r, 1);
      assert.match(r.out, /boom/);
      assert.equal(procStart(Number(m[1])), undefined, 'the SIGTERM-ignoring process was killed');
      assert.equal(procStart(Number(m[2])), undefined, 'the unrecorded child was found by its marker');
      await assertNothingLeft(workDir, r.out);
    });
  }
});

describe('npm run bench', () => {
  test('SIGINT while pods are coming up stops the daemon, the simulator processes and the ground', {
    timeout: SCENARIO_TIMEOUT,
  }, async () => {
    const run = start(['bench/clones.ts', '3']);
    const workDir = (await run.waitOutput(/bench: work dir (\S+)/))[1] as string;
    await run.waitOutput(/bench: creating 3 pods/);
    // Wait for a VM stand-in of the simulator (started by cocoon calls of the daemon).
    const standins = () => {
      const simDir = readdirSync(workDir).find((n) => n.startsWith('cocoon-sim-'));
      if (!simDir) return [];
      const pids = join(workDir, simDir, 'root', 'sim', 'pids');
      return existsSync(pids)
        ? readdirSync(pids).filter((n) => readFileSync(join(pids, n), 'utf8').includes('"standin"'))
        : [];
    };
    await waitFor('a VM stand-in', () => standins().length > 0, 120_000, 100);
    run.child.kill('SIGINT');
    const r = await run.exited;
    assert.equal(r.code, 130, r.out);
    assert.ok(recordedNames(workDir).includes('vk-cocoon'), 'the daemon was recorded');
    await assertNothingLeft(workDir, r.out);
  });
});
