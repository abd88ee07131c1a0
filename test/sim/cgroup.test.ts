// The simulator's cgroup v2 tree (docs/simulator.md, "cgroup tree"): every running VM has a
// scope `<root>/sim/cgroup/<COCOON_CGROUP_PARENT>/vm-<id>.scope/` whose cpu.stat follows the CPU
// of its stand-in's process tree, created with the VM and removed with its process (rm, crash,
// set-state, kill-all). The daemon's stats sampler (src/stats/sampler.ts) pointed at the tree
// reads it as its `cgroup` CPU source.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';
import { StatsSampler } from '../../src/stats/sampler.ts';
import type { TrackedVm } from '../../src/stats/types.ts';

const IMAGE = 'ghcr.io/acme/agent:3';
const CPU_STAT_KEYS = [
  'usage_usec',
  'user_usec',
  'system_usec',
  'nr_periods',
  'nr_throttled',
  'throttled_usec',
  'nr_bursts',
  'burst_usec',
];

function cpuStat(file: string): Map<string, number> {
  return new Map(
    fs
      .readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((l) => {
        const [k, v] = l.split(' ');
        return [k as string, Number(v)];
      }),
  );
}

/** utime+stime+cutime+cstime of a process in microseconds (USER_HZ 100). */
function procUsec(pid: number): number {
  const text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 10_000;
}

function scopes(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      if (!e.isDirectory()) continue;
      if (e.name.includes('.scope')) out.push(path.relative(root, path.join(dir, e.name)));
      else walk(path.join(dir, e.name));
    }
  };
  if (fs.existsSync(root)) walk(root);
  return out.sort();
}

async function until(what: string, check: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

describe('simulator cgroup tree', { concurrency: 1 }, () => {
  let sim: SimRoot;

  before(async () => {
    sim = await newSimRoot({ knobs: { standin: { vms: [{ match: '^vk-cg-hot$', cpuMillicores: 400 }] } } });
    await sim.fixtureSnapshot('cg-base', {
      backend: 'cloud-hypervisor',
      os: 'linux',
      image: IMAGE,
      pulled: true,
    });
  });
  after(async () => {
    await sim.cleanup();
  });

  const clone = (name: string, extra: string[] = [], env?: NodeJS.ProcessEnv) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, ...extra, 'cg-base'], { env });

  test('a running VM has a scope: cpu.stat with the cgroup v2 keys, cgroup.procs, cpu.max and cpu.weight', async () => {
    // The standin knob is set, so this is a node stand-in too, idle.
    const vm = await clone('vk-cg-a', [
      '--cpu-weight',
      '20',
      '--cpu-quota-us',
      '50000',
      '--cpu-period-us',
      '100000',
    ]);
    const scope = sim.cgroupScope(vm.id);
    assert.equal(scope, path.join(sim.root, 'sim', 'cgroup', 'cocoon.slice', `vm-${vm.id}.scope`));
    // There as soon as the clone returns.
    const stat = cpuStat(path.join(scope, 'cpu.stat'));
    assert.deepEqual([...stat.keys()], CPU_STAT_KEYS);
    assert.equal(stat.get('usage_usec'), (stat.get('user_usec') ?? 0) + (stat.get('system_usec') ?? 0));
    for (const k of ['nr_periods', 'nr_throttled', 'throttled_usec', 'nr_bursts', 'burst_usec'])
      assert.equal(stat.get(k), 0);
    assert.equal(fs.readFileSync(path.join(scope, 'cgroup.procs'), 'utf8'), `${vm.pid}\n`);
    assert.equal(fs.readFileSync(path.join(scope, 'cpu.max'), 'utf8'), '50000 100000\n');
    assert.equal(fs.readFileSync(path.join(scope, 'cpu.weight'), 'utf8'), '20\n');
    // Without CPU flags: no quota, the default weight.
    await sim.setKnobs({});
    const plain = await clone('vk-cg-plain');
    const plainScope = sim.cgroupScope(plain.id);
    assert.equal(fs.readFileSync(path.join(plainScope, 'cpu.max'), 'utf8'), 'max 100000\n');
    assert.equal(fs.readFileSync(path.join(plainScope, 'cpu.weight'), 'utf8'), '100\n');
    // A `sleep` stand-in (no knob): its first reading stays (a sleeping process uses no CPU).
    assert.equal(fs.readFileSync(path.join(plainScope, 'cgroup.procs'), 'utf8'), `${plain.pid}\n`);
    assert.ok((cpuStat(path.join(plainScope, 'cpu.stat')).get('usage_usec') ?? -1) <= procUsec(plain.pid));
    await sim.setKnobs({ standin: { vms: [{ match: '^vk-cg-hot$', cpuMillicores: 400 }] } });
  });

  test('cpu.stat grows while the stand-in burns CPU and follows its /proc times', async () => {
    const vm = await clone('vk-cg-hot');
    const file = path.join(sim.cgroupScope(vm.id), 'cpu.stat');
    const first = cpuStat(file).get('usage_usec') ?? 0;
    // 400m of one core: at least 0.3 s of CPU well within 20 s even on a loaded host.
    await until(
      'the hot scope to gain 300 ms of CPU',
      () => (cpuStat(file).get('usage_usec') ?? 0) >= first + 300_000,
    );
    const before = procUsec(vm.pid);
    const cg = cpuStat(file).get('usage_usec') ?? 0;
    const after = procUsec(vm.pid);
    // Refreshed every 500 ms from the same /proc times: never ahead of them, never far behind.
    assert.ok(cg <= after, `cpu.stat ${cg} µs ahead of /proc ${after} µs`);
    assert.ok(before - cg <= 1_000_000, `cpu.stat ${cg} µs lags /proc ${before} µs by more than 1 s`);
    const stat = cpuStat(file);
    assert.equal(stat.get('usage_usec'), (stat.get('user_usec') ?? 0) + (stat.get('system_usec') ?? 0));
    assert.ok((stat.get('user_usec') ?? 0) > 0, 'a busy loop is user time');
  });

  test("the daemon's stats sampler pointed at the tree reads the scope: CPU source cgroup", async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-cg-hot']);
    const tracked: TrackedVm = {
      namespace: 'ns',
      pod: 'hot',
      uid: 'uid-hot',
      vmId: vm.id,
      vmName: vm.config.name,
      backend: vm.hypervisor,
      pid: vm.pid,
      startTime: new Date(),
    };
    const sampler = new StatsSampler(() => [tracked], {
      rootDir: sim.root,
      cgroupRoot: sim.cgroupRoot,
      cgroupParent: 'cocoon.slice',
      minIntervalMs: 0,
    });
    const file = path.join(sim.cgroupScope(vm.id), 'cpu.stat');
    const lo = cpuStat(file).get('usage_usec') ?? 0;
    const s1 = (await sampler.sample()).vms[0];
    const hi = cpuStat(file).get('usage_usec') ?? 0;
    assert.ok(s1);
    assert.equal(s1.cpuSource, 'cgroup');
    assert.ok(s1.cpuUsageUsec >= lo && s1.cpuUsageUsec <= hi, `${s1.cpuUsageUsec} outside [${lo}, ${hi}]`);
    assert.equal(s1.throttledUsec, 0);
    await until(
      'the scope to move on',
      () => (cpuStat(file).get('usage_usec') ?? 0) >= s1.cpuUsageUsec + 100_000,
    );
    const s2 = (await sampler.sample()).vms[0];
    assert.ok(s2);
    assert.equal(s2.cpuSource, 'cgroup');
    assert.ok(s2.cpuUsageUsec > s1.cpuUsageUsec);
    assert.deepEqual(s2.prevCpu?.usageUsec, s1.cpuUsageUsec, 'a rate over the two samples');
    // Another parent than the daemon's: no scope there, so the sampler falls back to /proc.
    const elsewhere = new StatsSampler(() => [tracked], {
      rootDir: sim.root,
      cgroupRoot: sim.cgroupRoot,
      cgroupParent: 'other.slice',
    });
    assert.equal((await elsewhere.sample()).vms[0]?.cpuSource, 'proc');
  });

  test('a crash removes the scope; vm start makes a new one for the new process', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-cg-a']);
    const scope = sim.cgroupScope(vm.id);
    assert.ok(fs.existsSync(scope));
    assert.equal((await sim.run(['__sim', 'crash', 'vk-cg-a'])).code, 0);
    assert.equal(fs.existsSync(scope), false, 'gone with its last process');
    assert.equal((await sim.run(['vm', 'start', vm.id])).code, 0);
    const back = await sim.json<VmRecord>(['vm', 'inspect', vm.id]);
    assert.notEqual(back.pid, vm.pid);
    assert.equal(fs.readFileSync(path.join(scope, 'cgroup.procs'), 'utf8'), `${back.pid}\n`);
    assert.equal(fs.readFileSync(path.join(scope, 'cpu.max'), 'utf8'), '50000 100000\n', 'flags kept');
    await sim.run(['__sim', 'set-state', vm.id, 'stopped']);
    assert.equal(fs.existsSync(scope), false, 'set-state stops the process and its scope');
  });

  test('vm rm removes the scope; the sampler then has nothing to read', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-cg-hot']);
    const scope = sim.cgroupScope(vm.id);
    assert.ok(fs.existsSync(path.join(scope, 'cpu.stat')));
    const rm = await sim.run(['vm', 'rm', '--force', vm.id]);
    assert.equal(rm.code, 0, rm.stderr);
    assert.equal(fs.existsSync(scope), false);
    // The stand-in wrote every 500 ms until killed: nothing of it comes back.
    await sleep(1200);
    assert.equal(fs.existsSync(scope), false, 'a killed stand-in never recreates its scope');
    const sampler = new StatsSampler(
      () => [
        {
          namespace: 'ns',
          pod: 'hot',
          uid: 'uid-hot',
          vmId: vm.id,
          vmName: vm.config.name,
          backend: vm.hypervisor,
          pid: vm.pid,
          startTime: new Date(),
        },
      ],
      { rootDir: sim.root, cgroupRoot: sim.cgroupRoot, cgroupParent: 'cocoon.slice' },
    );
    const s = (await sampler.sample()).vms[0];
    assert.equal(s?.cpuSource, 'none');
    assert.equal(s?.cpuUsageUsec, 0);
  });

  test('COCOON_CGROUP_PARENT of the caller places the scope; one leaving the tree is ignored', async () => {
    const nested = await clone('vk-cg-nested', [], { COCOON_CGROUP_PARENT: 'machine.slice/vk-test.slice' });
    const scope = sim.cgroupScope(nested.id, 'machine.slice/vk-test.slice');
    assert.ok(fs.existsSync(path.join(scope, 'cpu.stat')), scope);
    const escaping = await clone('vk-cg-escape', [], { COCOON_CGROUP_PARENT: '../../outside.slice' });
    assert.ok(fs.existsSync(path.join(sim.cgroupScope(escaping.id), 'cpu.stat')), 'the default parent');
    assert.equal(fs.existsSync(path.join(sim.root, 'outside.slice')), false);
    assert.equal((await sim.run(['vm', 'rm', '--force', nested.id])).code, 0);
    assert.equal(fs.existsSync(scope), false);
  });

  test('kill-all takes every scope with the stand-ins', async () => {
    assert.ok(scopes(sim.cgroupRoot).length > 0);
    assert.equal((await sim.run(['__sim', 'kill-all'])).code, 0);
    assert.deepEqual(scopes(sim.cgroupRoot), []);
  });
});
