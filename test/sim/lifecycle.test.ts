// VM state machine of the simulator (cocoon-cli.md §4, §8.1, §8.2, §8.5): stand-in processes,
// stopped (stale), crash/set-state/delete-behind-back, kill debris, stale-create reconcile,
// Firecracker override rejections, run start failures, vm start and vm net.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';

const IMAGE = 'ghcr.io/acme/agent:2';

function alive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

describe('simulator VM lifecycle', { concurrency: 1 }, () => {
  let sim: SimRoot;

  before(async () => {
    sim = await newSimRoot();
    await Promise.all([
      sim.fixtureSnapshot('ch-base', {
        backend: 'cloud-hypervisor',
        os: 'linux',
        image: IMAGE,
        pulled: true,
      }),
      sim.fixtureSnapshot('fc-base', { backend: 'firecracker', os: 'linux', image: IMAGE, pulled: true }),
    ]);
  });
  after(async () => {
    await sim.cleanup();
  });

  const clone = (name: string, snap = 'ch-base', extra: string[] = []) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, ...extra, snap]);

  test('each running VM has a live detached stand-in in its own process group, pid in ch.pid', async () => {
    const vm = await clone('vk-a');
    assert.ok(alive(vm.pid));
    const pidFile = fs.readFileSync(`${sim.root}/run/cloudhypervisor/${vm.id}/ch.pid`, 'utf8').trim();
    assert.equal(Number(pidFile), vm.pid);
    const stat = fs.readFileSync(`/proc/${vm.pid}/stat`, 'latin1');
    const pgid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
    assert.equal(pgid, vm.pid, 'the stand-in leads its own process group');
    const rss = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${vm.pid}/status`, 'utf8'))?.[1]);
    assert.ok(rss < 10 * 1024, `an OCI stand-in stays under 10 MB RSS (got ${rss} kB)`);
  });

  test('a crashed stand-in shows as "stopped (stale)"; vm start brings it back with a new pid', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-a']);
    assert.equal((await sim.run(['__sim', 'crash', 'vk-a'])).code, 0);
    const stale = await sim.json<VmRecord>(['vm', 'inspect', 'vk-a']);
    assert.equal(stale.state, 'stopped (stale)');
    assert.equal(stale.pid, vm.pid, 'the record still carries the dead pid');
    const listed = await sim.json<VmRecord[]>(['vm', 'list', '-o', 'json']);
    assert.equal(listed.find((v) => v.id === vm.id)?.state, 'stopped (stale)');
    const start = await sim.run(['vm', 'start', vm.id]);
    assert.equal(start.code, 0, start.stderr);
    const back = await sim.json<VmRecord>(['vm', 'inspect', vm.id]);
    assert.equal(back.state, 'running');
    assert.notEqual(back.pid, vm.pid);
    assert.ok(alive(back.pid));
    assert.deepEqual(back.network_configs, vm.network_configs, 'NICs survive a restart');
    assert.equal((await sim.run(['vm', 'start', vm.id])).code, 0, 'start of a running VM is a no-op');
  });

  test('set-state and delete-behind-back', async () => {
    const vm = await clone('vk-b');
    await sim.run(['__sim', 'set-state', 'vk-b', 'error']);
    assert.equal((await sim.json<VmRecord>(['vm', 'inspect', vm.id])).state, 'error');
    assert.equal(alive(vm.pid), false);
    await sim.run(['__sim', 'delete-behind-back', vm.id]);
    const r = await sim.run(['vm', 'inspect', vm.id]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /vm not found/);
    assert.equal(fs.existsSync(`${sim.root}/run/cloudhypervisor/${vm.id}`), false);
  });

  test('SIGKILL of a clone during its latency leaves a creating placeholder holding the name', async () => {
    await sim.mergeKnobs({ latency: { 'vm clone': 30_000 } });
    const child = sim.spawn(['vm', 'clone', '--output', 'json', '--name', 'vk-killed', 'ch-base']);
    let placeholder: VmRecord | undefined;
    for (let i = 0; i < 100 && !placeholder; i++) {
      await sleep(100);
      const list = await sim.run(['vm', 'list', '-o', 'json']);
      if (list.stdout.startsWith('[')) {
        placeholder = (JSON.parse(list.stdout) as VmRecord[]).find((v) => v.config.name === 'vk-killed');
      }
    }
    assert.ok(placeholder, 'the placeholder appears before the latency ends');
    assert.equal(placeholder.state, 'creating');
    assert.equal(placeholder.pid, 0);
    assert.equal(placeholder.network_configs, undefined);
    const busy = await sim.run(['vm', 'reconcile-stale-create', placeholder.id, '-o', 'json']);
    assert.deepEqual(JSON.parse(busy.stdout), { id: placeholder.id, outcome: 'busy' });
    process.kill(-(child.pid as number), 'SIGKILL');
    await new Promise((r) => child.once('close', r));
    await sim.mergeKnobs({ latency: null });
    const taken = await sim.run(['vm', 'clone', '--output', 'json', '--name', 'vk-killed', 'ch-base']);
    assert.equal(taken.stderr, 'Error: vm name "vk-killed" already exists\n');
    const collected = await sim.run(['vm', 'reconcile-stale-create', placeholder.id, '-o', 'json']);
    assert.deepEqual(JSON.parse(collected.stdout), { id: placeholder.id, outcome: 'collected' });
    const notFound = await sim.run(['vm', 'reconcile-stale-create', placeholder.id, '-o', 'json']);
    assert.deepEqual(JSON.parse(notFound.stdout), { outcome: 'not-found' });
    assert.equal((await clone('vk-killed')).state, 'running', 'the name is free again');
    const notCreating = await sim.run(['vm', 'reconcile-stale-create', 'vk-killed', '-o', 'json']);
    assert.equal(JSON.parse(notCreating.stdout).outcome, 'not-creating');
  });

  test('__sim stale-create leaves a placeholder, --busy holds it with a live process', async () => {
    const free = JSON.parse((await sim.run(['__sim', 'stale-create', 'vk-stale'])).stdout) as { id: string };
    const busy = JSON.parse((await sim.run(['__sim', 'stale-create', 'vk-busy', '--busy'])).stdout) as {
      id: string;
      holderPid: number;
    };
    assert.ok(alive(busy.holderPid));
    const [a, b] = await Promise.all([
      sim.run(['vm', 'reconcile-stale-create', free.id, '-o', 'json']),
      sim.run(['vm', 'reconcile-stale-create', busy.id, '-o', 'json']),
    ]);
    assert.equal(JSON.parse(a.stdout).outcome, 'collected');
    assert.equal(JSON.parse(b.stdout).outcome, 'busy');
  });

  test('Firecracker clones reject --restore-mode and --nics; keep hypervisor and fc.pid', async () => {
    const rm = await sim.run([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-fc',
      '--restore-mode',
      'copy',
      'fc-base',
    ]);
    assert.equal(rm.code, 1);
    assert.match(rm.stderr, /^Error: --restore-mode is not supported for firecracker/);
    const nics = await sim.run([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-fc',
      '--nics',
      '1',
      'fc-base',
    ]);
    assert.equal(nics.code, 1);
    assert.match(nics.stderr, /--nics is not supported for firecracker/);
    const vm = await clone('vk-fc', 'fc-base');
    assert.equal(vm.hypervisor, 'firecracker');
    assert.ok(fs.existsSync(`${sim.root}/run/firecracker/${vm.id}/fc.pid`));
    assert.ok(fs.existsSync(`${sim.root}/firecracker/db/vms.json`));
    const net = await sim.run(['vm', 'net', '--nics', '0', vm.id]);
    assert.equal(net.code, 1, 'vm net is CH only');
  });

  test('vm run start failure leaves an error record holding the name until rm --force', async () => {
    await sim.mergeKnobs({
      faults: [
        {
          argvRegex: '^vm run ',
          match: '^vk-broken$',
          phase: 'start',
          error: 'start vm: boot timeout',
          times: 1,
        },
      ],
    });
    const r = await sim.run(['vm', 'run', '--output', 'json', '--name', 'vk-broken', IMAGE]);
    assert.equal(r.code, 1);
    assert.equal(r.stderr, 'Error: start vm: boot timeout\n');
    const rec = await sim.json<VmRecord>(['vm', 'inspect', 'vk-broken']);
    assert.equal(rec.state, 'error');
    const again = await sim.run(['vm', 'run', '--output', 'json', '--name', 'vk-broken', IMAGE]);
    assert.match(again.stderr, /vm name "vk-broken" already exists/);
    assert.equal((await sim.run(['vm', 'rm', '--force', rec.id])).code, 0);
    const ok = await sim.json<VmRecord>(['vm', 'run', '--output', 'json', '--name', 'vk-broken', IMAGE]);
    assert.equal(ok.state, 'running', 'the fault fired once (times: 1)');
    await sim.mergeKnobs({ faults: null });
  });

  test('a clone start fault rolls the record back', async () => {
    await sim.mergeKnobs({
      faults: [{ argvRegex: '^vm clone ', phase: 'start', error: 'restore failed', times: 1 }],
    });
    const r = await sim.run(['vm', 'clone', '--output', 'json', '--name', 'vk-rollback', 'ch-base']);
    assert.equal(r.stderr, 'Error: restore failed\n');
    assert.match((await sim.run(['vm', 'inspect', 'vk-rollback'])).stderr, /vm not found/);
    await sim.mergeKnobs({ faults: null });
  });

  test('vm net --nics resizes CH NICs (0 drops all, 1 hot-adds a new MAC)', async () => {
    const vm = await clone('vk-net');
    assert.equal((await sim.run(['vm', 'net', '--nics', '0', vm.id])).code, 0);
    assert.deepEqual((await sim.json<VmRecord>(['vm', 'inspect', vm.id])).network_configs, []);
    assert.equal((await sim.run(['vm', 'net', '--nics', '1', vm.id])).code, 0);
    const nics = (await sim.json<VmRecord>(['vm', 'inspect', vm.id])).network_configs ?? [];
    assert.equal(nics.length, 1);
    assert.notEqual(nics[0]?.mac, vm.network_configs?.[0]?.mac);
  });

  test('static NICs: fixture --static-ip gives the clone a network object; next clone the next address', async () => {
    // In the guest network's static range: the simulator refuses a static address elsewhere.
    const [o1, o2, o3] = (sim.guestNet?.staticSubnet ?? '').split('.');
    const net = `${o1}.${o2}.${o3}`;
    await assert.rejects(
      sim.fixtureSnapshot('static-off', {
        backend: 'cloud-hypervisor',
        image: IMAGE,
        staticIps: ['10.88.3.17/16,10.88.0.1'],
      }),
      /static address 10\.88\.3\.17 is outside the guest network/,
    );
    await sim.fixtureSnapshot('static-base', {
      backend: 'cloud-hypervisor',
      image: IMAGE,
      staticIps: [`${net}.17/22,${net}.1`],
      pulled: true,
    });
    const a = await clone('vk-static-a', 'static-base');
    const b = await clone('vk-static-b', 'static-base');
    assert.deepEqual(a.network_configs?.[0]?.network, { ip: `${net}.17`, gateway: `${net}.1`, prefix: 22 });
    assert.deepEqual(b.network_configs?.[0]?.network, { ip: `${net}.18`, gateway: `${net}.1`, prefix: 22 });
  });
});
