// Concurrency and crash safety of the simulator's databases (cocoon-cli.md §8.1): parallel
// clones, a name race, a stale lock left by a dead process, and SIGKILLs at random points.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';

interface Db {
  vms: Record<string, VmRecord>;
  names: Record<string, string>;
}

function assertConsistent(sim: SimRoot): Db {
  const db = JSON.parse(fs.readFileSync(`${sim.root}/cloudhypervisor/db/vms.json`, 'utf8')) as Db;
  for (const [id, vm] of Object.entries(db.vms)) {
    assert.equal(vm.id, id);
    assert.equal(db.names[vm.config.name], id, `names index covers ${vm.config.name}`);
  }
  for (const [name, id] of Object.entries(db.names)) assert.equal(db.vms[id]?.config.name, name);
  return db;
}

describe('simulator concurrency and crash safety', { concurrency: 1 }, () => {
  let sim: SimRoot;

  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('base', {
      backend: 'cloud-hypervisor',
      image: 'ghcr.io/acme/agent:4',
      pulled: true,
    });
  });
  after(async () => {
    await sim.cleanup();
  });

  test('24 parallel clones with distinct names all succeed; ids, MACs and IPs are distinct', async () => {
    const names = Array.from({ length: 24 }, (_, i) => `vk-par-${i}`);
    const results = await Promise.all(
      names.map((n) => sim.run(['vm', 'clone', '--output', 'json', '--name', n, 'base'])),
    );
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const vms = results.map((r) => JSON.parse(r.stdout) as VmRecord);
    assert.equal(new Set(vms.map((v) => v.id)).size, 24);
    const macs = vms.map((v) => v.network_configs?.[0]?.mac as string);
    assert.equal(new Set(macs).size, 24);
    const db = assertConsistent(sim);
    assert.equal(Object.keys(db.vms).length, 24);
    assert.ok(Object.values(db.vms).every((v) => v.state === 'running' && v.pid > 0));
    const ips = macs.map((m) => sim.leaseFor(m)?.ip);
    assert.ok(ips.every((ip) => ip !== undefined));
    assert.equal(new Set(ips).size, 24, 'no address handed out twice');
  });

  test('8 parallel clones racing for one name: exactly one wins', async () => {
    const results = await Promise.all(
      Array.from({ length: 8 }, () =>
        sim.run(['vm', 'clone', '--output', 'json', '--name', 'vk-race', 'base']),
      ),
    );
    assert.equal(results.filter((r) => r.code === 0).length, 1);
    for (const r of results.filter((x) => x.code !== 0)) {
      assert.equal(r.stderr, 'Error: vm name "vk-race" already exists\n');
    }
    assertConsistent(sim);
  });

  test('a lock file left by a dead process is broken', async () => {
    const lock = `${sim.root}/cloudhypervisor/db/vms.lock`;
    fs.writeFileSync(lock, '99999 12345\n'); // pid_max is at most 4194304; 99999 with that start time is not alive
    const r = await sim.run(['vm', 'clone', '--output', 'json', '--name', 'vk-after-stale-lock', 'base']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(fs.existsSync(lock), false);
  });

  test('SIGKILL at random points never corrupts the DB', async () => {
    await sim.mergeKnobs({
      latency: { 'vm clone': { ms: 0, jitterMs: 300 }, 'vm rm': { ms: 0, jitterMs: 300 } },
    });
    const victims = (await sim.json<VmRecord[]>(['vm', 'list', '-o', 'json'])).slice(0, 6);
    const children = [
      ...Array.from({ length: 8 }, (_, i) =>
        sim.spawn(['vm', 'clone', '--output', 'json', '--name', `vk-kill-${i}`, 'base']),
      ),
      ...victims.map((v) => sim.spawn(['vm', 'rm', '--force', v.id])),
    ];
    await Promise.all(
      children.map(async (c) => {
        await sleep(Math.random() * 600);
        try {
          process.kill(-(c.pid as number), 'SIGKILL');
        } catch {
          // finished already
        }
        if (c.exitCode === null && c.signalCode === null) await new Promise((r) => c.once('close', r));
      }),
    );
    await sim.mergeKnobs({ latency: null });
    const db = assertConsistent(sim);
    for (const vm of Object.values(db.vms)) assert.ok(['creating', 'running'].includes(vm.state), vm.state);
    const list = await sim.run(['vm', 'list', '-o', 'json']);
    assert.equal(list.code, 0);
    assert.ok(Array.isArray(JSON.parse(list.stdout)));
    // Debris is collectable: every placeholder left by a killed clone is reconciled. A clone
    // whose last wait ended before the root's server saw its client die still finishes, as if
    // the kill came a moment later (docs/simulator.md "Killed callers"; more likely while a
    // `vm rm` holds the server's loop waiting for a slow kill): then it is a running VM.
    for (const vm of Object.values(db.vms).filter((v) => v.state === 'creating')) {
      const r = await sim.run(['vm', 'reconcile-stale-create', vm.id, '-o', 'json']);
      const outcome = JSON.parse(r.stdout).outcome;
      if (outcome === 'not-creating') {
        const now = await sim.json<VmRecord>(['vm', 'inspect', vm.id]);
        assert.equal(now.state, 'running', `${vm.id} left creating for ${now.state}`);
      } else assert.equal(outcome, 'collected');
    }
    assertConsistent(sim);
  });
});
