// `npm run demo -- --check`: the real script (scripts/demo.ts) as a child process with its
// own ground brings all three example pods to `ready`, prints one summary line, exits 0 and
// leaves no process behind. How the demo, the suite runner and the bench end otherwise (errors,
// signals, SIGKILL) is tested in teardown.test.ts.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, test } from 'node:test';
import { assertNothingLeft, exitsWith, start, sweepWorkDirs } from './runs.ts';

const SCENARIO_TIMEOUT = 300_000;
sweepWorkDirs();

describe('npm run demo', () => {
  test('--check: all three example pods reach ready, one summary line, exit 0, nothing left running', {
    timeout: SCENARIO_TIMEOUT,
  }, async (t) => {
    const run = start(t, ['scripts/demo.ts', '--check']);
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    const r = await run.exited;
    exitsWith(r, 0);
    assert.match(r.out, /^demo: check passed: 3\/3 pods ready in \d+\.\d+s$/m);
    assert.equal(r.out.match(/check (passed|FAILED)/g)?.length, 1, r.out);
    for (const pod of ['linux-0', 'firecracker-0', 'windows-0']) {
      assert.match(r.out, new RegExp(`demo: \\[ *[\\d.]+s\\] ${pod} .*lifecycle=ready`), r.out);
    }
    await assertNothingLeft(workDir, r.out);
    assert.equal(existsSync(workDir), false, 'the work dir is removed after a passing run');
  });
});
