// Runs the whole suite (or the given files) with one shared test ground: starts the
// control plane and the registry, runs `node --test`, then stops everything the run started.
// The ground's logs are kept when a test fails.
//
// Every process of the run is in its PID registry (<ground dir>/pids, exported to the tests as
// VK_GROUND_PIDS; see ground/proc.ts): the shared ground, an apiserver a test restarted
// in its own process, private grounds, daemons, simulator stand-ins, the test processes
// themselves. However the run ends (tests pass or fail, SIGINT/SIGTERM/SIGHUP, an uncaught
// exception or rejection here, the ground failing half-way) they are all stopped: SIGTERM,
// then SIGKILL after a grace.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './cluster.ts';
import { type Ground, startGround, stopGround } from './ground.ts';
import { installTeardown, openPidRegistry } from './proc.ts';

const files = process.argv.slice(2);
const patterns =
  files.length > 0
    ? files
    : ['test/unit/**/*.test.ts', 'test/sim/**/*.test.ts', 'test/integration/**/*.test.ts'];
const dir = mkdtempSync(join(tmpdir(), 'vk-ground-'));
const registry = openPidRegistry(join(dir, 'pids'));
const t0 = Date.now();
const log = (line: string) => console.log(`ground: [${((Date.now() - t0) / 1000).toFixed(1)}s] ${line}`);
log(`dir ${dir}`);

let ground: Ground | undefined;
let child: ReturnType<typeof spawn> | undefined;
const end = installTeardown(
  async (why) => {
    if (why.kind === 'signal') log(`${why.signal}: stopping the tests and the ground`);
    // The test processes first (they may be restarting things), then the ground in order
    // (apiserver before etcd), then whatever else is left in the registry.
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    if (ground) await stopGround(ground).catch(() => {});
    const keepLogs = !(why.kind === 'done' && why.code === 0);
    if (keepLogs) {
      log(`logs kept in ${dir}`);
      return undefined;
    }
    // Remove the directory only after the registry's processes are gone (installTeardown
    // stops them after this function returns).
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    return undefined;
  },
  { registry, log },
);

try {
  ground = await startGround(dir, { log });
} catch (err) {
  await end({ kind: 'error', error: err });
}
const g = ground as Ground;
console.log(`ground: kube-apiserver ${g.cluster.version} at ${g.cluster.url}; registry ${g.registry.url}`);

child = spawn(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...patterns], {
  cwd: repoRoot,
  stdio: 'inherit',
  env: {
    ...process.env,
    VK_TEST_GROUND_DIR: dir,
    PATH: `${join(repoRoot, 'node_modules', '.bin')}:${process.env.PATH}`,
  },
});
const code: number = await new Promise((resolve) => child?.on('close', (c) => resolve(c ?? 1)));
await end({ kind: 'done', code });
