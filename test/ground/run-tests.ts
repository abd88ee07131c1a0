// Runs the whole suite (or the given files) with one shared test ground: starts the
// control plane and the registry, runs `node --test`, stops everything by PID. The
// ground's logs are kept when a test fails.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './cluster.ts';
import { startGround, stopGround } from './ground.ts';

const files = process.argv.slice(2);
const patterns =
  files.length > 0
    ? files
    : ['test/unit/**/*.test.ts', 'test/sim/**/*.test.ts', 'test/integration/**/*.test.ts'];
const dir = mkdtempSync(join(tmpdir(), 'vk-ground-'));
const t0 = Date.now();
const log = (line: string) => console.log(`ground: [${((Date.now() - t0) / 1000).toFixed(1)}s] ${line}`);
const ground = await startGround(dir, { log });
console.log(
  `ground: kube-apiserver ${ground.cluster.version} at ${ground.cluster.url}; registry ${ground.registry.url}`,
);

let stopping = false;
const teardown = async (keepLogs: boolean) => {
  if (stopping) return;
  stopping = true;
  await stopGround(ground);
  if (keepLogs) console.log(`ground: logs kept in ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
};
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    void teardown(true).then(() => process.exit(130));
  });
}

const child = spawn(
  process.execPath,
  ['--test', '--test-concurrency=1', '--test-reporter=spec', ...patterns],
  {
    cwd: repoRoot,
    stdio: 'inherit',
    env: {
      ...process.env,
      VK_TEST_GROUND_DIR: dir,
      PATH: `${join(repoRoot, 'node_modules', '.bin')}:${process.env.PATH}`,
    },
  },
);
const code: number = await new Promise((resolve) => child.on('close', (c) => resolve(c ?? 1)));
await teardown(code !== 0);
process.exit(code);
