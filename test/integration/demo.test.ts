// `npm run demo -- --check --hosts 3`: the real script (scripts/demo.ts) as a child process with
// its own ground and a fleet of three hosts (ground/fleet.ts) brings all six example pods to
// `ready`, each on the host it was pinned to, prints one summary line, exits 0 and leaves no
// process behind (every host's daemon, simulator server and VM stand-ins included). A fleet
// adds a few seconds to the single-host demo (measured on 2 cores: 12-16 s → 15-19 s to the
// check), so the suite runs this one; the single-host path (`--hosts 1`, the default) is still
// run by teardown.test.ts's demo scenarios. How the demo, the suite runner and the bench end
// otherwise (errors, signals, SIGKILL) is tested in teardown.test.ts.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, test } from 'node:test';
import { assertNothingLeft, exitsWith, start, sweepWorkDirs } from './runs.ts';

const SCENARIO_TIMEOUT = 300_000;
sweepWorkDirs();

/** Pods 2h and 2h+1 on host h (scripts/demo.ts), the three kinds in turn. */
const PLACED: [string, string][] = [
  ['linux-0', 'cocoon-pool-1'],
  ['firecracker-0', 'cocoon-pool-1'],
  ['windows-0', 'cocoon-pool-2'],
  ['linux-1', 'cocoon-pool-2'],
  ['firecracker-1', 'cocoon-pool-3'],
  ['windows-1', 'cocoon-pool-3'],
];

describe('npm run demo', () => {
  test('--check --hosts 3: six example pods reach ready on their own hosts, one summary line, exit 0, nothing left running', {
    timeout: SCENARIO_TIMEOUT,
  }, async (t) => {
    const run = start(t, ['scripts/demo.ts', '--check', '--hosts', '3']);
    const workDir = (await run.waitOutput(/demo: work dir (\S+)/))[1] as string;
    const r = await run.exited;
    exitsWith(r, 0);
    assert.match(r.out, /^demo: check passed: 6\/6 pods ready on 3 hosts in \d+\.\d+s$/m);
    assert.equal(r.out.match(/check (passed|FAILED)/g)?.length, 1, r.out);
    const ips = new Set<string>();
    for (const host of ['cocoon-pool-1', 'cocoon-pool-2', 'cocoon-pool-3']) {
      const m = r.out.match(new RegExp(`demo: fleet: host ${host} at (127\\.\\d+\\.\\d+\\.\\d+) `));
      assert.ok(m, `${host} started:\n${r.out}`);
      ips.add(m[1] as string);
    }
    assert.equal(ips.size, 3, 'three node IPs');
    for (const [pod, host] of PLACED) {
      assert.match(r.out, new RegExp(`demo: \\[ *[\\d.]+s\\] ${pod} +node=${host} .*lifecycle=ready`), r.out);
    }
    await assertNothingLeft(workDir, r.out);
    assert.equal(existsSync(workDir), false, 'the work dir is removed after a passing run');
  });
});
