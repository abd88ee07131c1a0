// Process hygiene: the demo (scripts/demo.ts), the suite runner (ground/run-tests.ts) and the
// bench (bench/clones.ts) leave no process behind, however they end: an error half-way, SIGINT,
// SIGTERM, SIGKILL, a failing test that restarted the apiserver, an uncaught exception. Each
// scenario runs the real script as a child process with its own PID registry and ground, then
// looks for survivors (test/integration/runs.ts). The scenarios are independent, so they run
// two at a time (most of their time is spent waiting for grounds to come up and go down).
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { procStart, waitFor } from '../../ground/proc.ts';
import { registryCommandName } from '../../ground/registry.ts';
import {
  assertNothingLeft,
  exitsWith,
  fixtureDir,
  groundModule,
  recordedNames,
  records,
  start,
  survivors,
  sweepWorkDirs,
  trackWorkDir,
} from './runs.ts';

const SCENARIO_TIMEOUT = 300_000;
sweepWorkDirs();

// A process that ignores SIGTERM (like the stranded apiserver of the issue).
const STUBBORN = JSON.stringify("process.on('SIGTERM', () => {}); setInterval(() => {}, 60_000);");

// A test that starts a SIGTERM-ignoring process, reports, then never ends.
const HANG_FIXTURE = `
import { renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startProcess } from ${groundModule('proc.ts')};
test('start something, then hang', async () => {
  const dir = process.env.VK_TEST_GROUND_DIR ?? '';
  const stubborn = startProcess(process.execPath, ['-e', ${STUBBORN}], { logFile: join(dir, 'stubborn.log') }).pid;
  // Written whole, then renamed: the test polls for the file and parses it at once.
  writeFileSync(process.env.FIXTURE_OUT + '.tmp', JSON.stringify({
    dir, registry: process.env.VK_GROUND_PIDS, self: process.pid, stubborn,
  }));
  renameSync(process.env.FIXTURE_OUT + '.tmp', process.env.FIXTURE_OUT ?? '');
  await new Promise(() => setInterval(() => {}, 60_000));
});
`;

interface FixtureReport {
  dir: string;
  registry: string;
  self: number;
  stubborn: number;
  apiserver?: number;
}

describe('teardown', { concurrency: 2 }, () => {
  describe('npm run demo', () => {
    test('an error thrown right after the ground started stops the ground and the registry (exit 1)', {
      timeout: SCENARIO_TIMEOUT,
    }, async (t) => {
      const run = start(t, ['scripts/demo.ts', '--check'], { VK_DEMO_FAIL_AT: 'ground' });
      const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
      const r = await run.exited;
      exitsWith(r, 1);
      assert.match(r.out, /control plane ready/);
      assert.match(r.out, /^demo: check FAILED: VK_DEMO_FAIL_AT=ground: failing on purpose/m);
      const names = recordedNames(workDir);
      for (const want of ['etcd', 'kube-apiserver', registryCommandName()]) {
        assert.ok(names.includes(want), `${want} was started: ${names.join(', ')}`);
      }
      await assertNothingLeft(workDir, r.out);
    });

    test('SIGINT while the control plane is half up stops etcd and kube-apiserver', {
      timeout: SCENARIO_TIMEOUT,
    }, async (t) => {
      const run = start(t, ['scripts/demo.ts', '--check']);
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
    }, async (t) => {
      const run = start(t, ['scripts/demo.ts', '--check']);
      const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
      await run.waitOutput(/demo: created linux-0/);
      assert.ok(survivors(workDir).length >= 4, 'the ground, the daemon and more are running');
      run.child.kill('SIGKILL');
      const r = await run.exited;
      assert.equal(r.signal, 'SIGKILL');
      // The watchdog notices within 0.5 s, then SIGTERM, up to 5 s of grace, SIGKILL, and
      // again while new processes appear (stopRegistered: up to 5 rounds, ~34 s at worst on a
      // loaded machine; a CI run once took longer than the 30 s this waited before).
      await assertNothingLeft(workDir, r.out, 60_000);
    });
  });

  describe('npm test (ground/run-tests.ts)', () => {
    test('stops an apiserver a test restarted in its own process and a process that ignores SIGTERM', {
      timeout: SCENARIO_TIMEOUT,
    }, async (t) => {
      const fx = fixtureDir(t, {
        'restart.test.mts': `
import assert from 'node:assert/strict';
import { renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startApiserver, stopApiserver } from ${groundModule('cluster.ts')};
import { readGround } from ${groundModule('ground.ts')};
import { startProcess } from ${groundModule('proc.ts')};
test('restart the apiserver (its new PID stays in this process) and fail', async () => {
  const dir = process.env.VK_TEST_GROUND_DIR ?? '';
  const g = readGround(dir);
  assert.ok(g);
  await stopApiserver(g.cluster);
  const apiserver = await startApiserver(g.cluster);
  const stubborn = startProcess(process.execPath, ['-e', ${STUBBORN}], { logFile: join(dir, 'stubborn.log') }).pid;
  // Written whole, then renamed: the test polls for the file and parses it at once.
  writeFileSync(process.env.FIXTURE_OUT + '.tmp', JSON.stringify({
    dir, registry: process.env.VK_GROUND_PIDS, self: process.pid, stubborn, apiserver,
  }));
  renameSync(process.env.FIXTURE_OUT + '.tmp', process.env.FIXTURE_OUT ?? '');
  assert.fail('failing on purpose: the runner must still stop everything');
});
`,
      });
      const outFile = join(fx, 'report.json');
      const run = start(t, ['ground/run-tests.ts', join(fx, 'restart.test.mts')], { FIXTURE_OUT: outFile });
      const r = await run.exited;
      exitsWith(r, 1);
      const rep = JSON.parse(readFileSync(outFile, 'utf8')) as FixtureReport;
      trackWorkDir(t, rep.dir);
      assert.equal(rep.registry, join(rep.dir, 'pids'));
      assert.match(r.out, /logs kept in/);
      const apiservers = records(rep.dir).filter((x) => x.cmd.endsWith('kube-apiserver'));
      assert.equal(apiservers.length, 2, 'the first apiserver and the one the test restarted are recorded');
      assert.ok(apiservers.some((x) => x.pid === rep.apiserver && x.recordedBy === rep.self));
      await assertNothingLeft(rep.dir, r.out);
    });

    test('SIGTERM while a test runs stops the test processes, what they started and the ground', {
      timeout: SCENARIO_TIMEOUT,
    }, async (t) => {
      const fx = fixtureDir(t, {
        'hang.test.mts': HANG_FIXTURE,
      });
      const outFile = join(fx, 'report.json');
      const run = start(t, ['ground/run-tests.ts', join(fx, 'hang.test.mts')], { FIXTURE_OUT: outFile });
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
      trackWorkDir(t, rep.dir);
      assert.ok(procStart(rep.self) !== undefined && procStart(rep.stubborn) !== undefined);
      run.child.kill('SIGTERM');
      const r = await run.exited;
      assert.equal(r.code, 143, r.out);
      assert.match(r.out, /SIGTERM: stopping/);
      assert.equal(procStart(rep.self), undefined, 'the test file process is gone');
      for (const want of ['etcd', 'kube-apiserver', registryCommandName()]) {
        assert.ok(recordedNames(rep.dir).includes(want), `${want} recorded`);
      }
      await assertNothingLeft(rep.dir, r.out);
    });
  });

  describe('npm test: jobs past their limit', () => {
    test('a hang and a test whose output a leftover process holds: interrupted, counted failed, the holder named, all stopped', {
      timeout: SCENARIO_TIMEOUT,
    }, async (t) => {
      const fx = fixtureDir(t, {
        'hang.test.mts': HANG_FIXTURE,
        // Passes, leaving behind a process that holds the job's output pipe.
        'leak.test.mts': `
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { test } from 'node:test';
test('leave a holder of stdout behind', () => {
  const holder = spawn('sleep', ['600'], { stdio: ['ignore', 'inherit', 'inherit'], detached: true });
  holder.unref();
  writeFileSync(process.env.FIXTURE_OUT + '.holder', String(holder.pid));
});
`,
      });
      const outFile = join(fx, 'report.json');
      const run = start(t, ['ground/run-tests.ts', join(fx, 'hang.test.mts'), join(fx, 'leak.test.mts')], {
        FIXTURE_OUT: outFile,
        VK_TEST_JOB_TIMEOUT: '20',
      });
      const r = await run.exited;
      assert.equal(r.code, 1, r.out);
      const rep = JSON.parse(readFileSync(outFile, 'utf8')) as FixtureReport;
      trackWorkDir(t, rep.dir);
      const holder = Number(readFileSync(`${outFile}.holder`, 'utf8'));
      assert.match(r.out, /^suite: \[\d+:\d\d\] TIMED OUT \S*hang\.test\.mts after 0:2\d: interrupting it/m);
      // node --test's own account of the interrupted file, then the runner's verdict.
      assert.match(r.out, /Interrupted while running/);
      assert.match(r.out, /FAILED \S*hang\.test\.mts: 1 tests, 1 failing, \d:\d\d \(timed out at 0:20\)/);
      // The leak's test passed, but node --test waits for its output, which `sleep` holds.
      assert.match(
        r.out,
        new RegExp(
          `TIMED OUT \\S*leak\\.test\\.mts after 0:2\\d: interrupting it; its test output is held open by ${holder} sleep 600`,
        ),
      );
      assert.match(r.out, /FAILED \S*leak\.test\.mts: \d+ tests?, 1 failing, \d:\d\d \(timed out at 0:20\)/);
      assert.match(r.out, /^suite: \d+ passed, 2 failed in /m);
      assert.equal(procStart(rep.self), undefined, 'the test file process is gone');
      assert.equal(procStart(rep.stubborn), undefined, 'what it started (ignoring SIGTERM) is gone');
      assert.equal(procStart(holder), undefined, 'the pipe holder is gone');
      await assertNothingLeft(rep.dir, r.out);
    });
  });

  describe('teardown of a run (ground/proc.ts installTeardown)', () => {
    for (const mode of ['uncaught exception', 'unhandled rejection'] as const) {
      test(`the teardown runs on an ${mode} and kills what ignores SIGTERM`, {
        timeout: 60_000,
      }, async (t) => {
        const fx = fixtureDir(t, {
          'crash.mts': `
import { spawn } from 'node:child_process';
import { installTeardown, openPidRegistry, startProcess } from ${groundModule('proc.ts')};
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
        const run = start(t, [
          join(fx, 'crash.mts'),
          join(workDir, 'pids'),
          mode === 'uncaught exception' ? 'throw' : 'reject',
        ]);
        const m = await run.waitOutput(/\{"stubborn":(\d+),"inherited":(\d+)\}/, 30_000);
        const r = await run.exited;
        exitsWith(r, 1);
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
    }, async (t) => {
      const run = start(t, ['bench/clones.ts', '3']);
      const workDir = (await run.waitOutput(/bench: work dir (\S+)/))[1] as string;
      await run.waitOutput(/bench: (\[\S+\] )?creating 3 pods/);
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
});
