// Timing worlds (docs/simulator.md "Timing worlds"): per VM delays drawn from a seed, explicit
// knobs winning over the world, and a clone in a slow world that really has no lease and no
// agent yet (checked at once after the clone: no wall-clock bound).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';
import { validateKnobs } from '../../sim/knob-schema.ts';
import { agentReadyAfterMs, dhcpPolicy, latencyMs, REALISTIC_WORLD, worldDelayMs } from '../../sim/knobs.ts';
import { AGENT_NOT_READY } from '../../sim/verbs/exec.ts';

const realistic = (seed: number) => validateKnobs({ world: { seed, ...structuredClone(REALISTIC_WORLD) } });

describe('timing world: the draws', () => {
  test('each delay is inside its range, the same for the same seed and VM, and spread across VMs', () => {
    const k = realistic(7);
    const leases = new Set<number>();
    for (let i = 0; i < 200; i++) {
      const vm = `vk-ns-${i}`;
      const lease = worldDelayMs(k, 'leaseMs', vm) ?? -1;
      const agent = worldDelayMs(k, 'agentMs', vm) ?? -1;
      const clone = worldDelayMs(k, 'cloneMs', vm) ?? -1;
      assert.ok(lease >= 1000 && lease <= 8000, `lease ${lease}`);
      assert.ok(agent >= 2000 && agent <= 20_000, `agent ${agent}`);
      assert.ok(clone >= 300 && clone <= 3000, `clone ${clone}`);
      assert.equal(worldDelayMs(realistic(7), 'leaseMs', vm), lease, 'reproducible from the seed');
      leases.add(lease);
    }
    assert.ok(leases.size > 150, `${leases.size} distinct lease delays of 200`);
    const other = realistic(8);
    const differ = [...Array(20).keys()].filter(
      (i) => worldDelayMs(other, 'leaseMs', `vk-ns-${i}`) !== worldDelayMs(k, 'leaseMs', `vk-ns-${i}`),
    );
    assert.ok(differ.length > 15, 'another seed is another world');
  });

  test('without a world nothing is delayed; an explicit knob wins over the world', () => {
    assert.equal(worldDelayMs({}, 'leaseMs', 'vm'), undefined);
    assert.equal(dhcpPolicy({}, 'vm').leaseDelayMs, 0);
    assert.equal(agentReadyAfterMs({}, 'vm'), 0);
    assert.equal(latencyMs({}, 'vm clone', 'vm'), 0);
    const k = realistic(1);
    assert.equal(dhcpPolicy(k, 'vm').leaseDelayMs, worldDelayMs(k, 'leaseMs', 'vm'));
    assert.equal(agentReadyAfterMs(k, 'vm'), worldDelayMs(k, 'agentMs', 'vm'));
    assert.equal(latencyMs(k, 'vm clone', 'vm'), worldDelayMs(k, 'cloneMs', 'vm'));
    assert.equal(latencyMs(k, 'vm list', 'vm'), 0, 'only a clone takes the world clone delay');
    const explicit = validateKnobs({
      ...k,
      dhcp: { leaseDelayMs: 5, vms: [{ match: '^fast$', leaseDelayMs: 1 }] },
      guest: { agentReadyAfterMs: 6 },
      latency: { 'vm clone': 7 },
    });
    assert.equal(dhcpPolicy(explicit, 'vm').leaseDelayMs, 5);
    assert.equal(dhcpPolicy(explicit, 'fast').leaseDelayMs, 1);
    assert.equal(agentReadyAfterMs(explicit, 'vm'), 6);
    assert.equal(latencyMs(explicit, 'vm clone', 'vm'), 7);
  });

  test('a range whose min is above its max, or an unknown field, is refused', () => {
    assert.throws(
      () => validateKnobs({ world: { leaseMs: [9, 1] } }),
      /world\.leaseMs: the range's min is above its max/,
    );
    assert.throws(() => validateKnobs({ world: { bootMs: [1, 2] } }), /world/);
  });
});

describe('timing world: a slow guest', { concurrency: 1 }, () => {
  let sim: SimRoot;
  before(async () => {
    // A world whose lease and agent come a minute after boot, the clone itself at once.
    sim = await newSimRoot({
      knobs: { world: { seed: 3, leaseMs: [60_000, 60_000], agentMs: [60_000, 60_000] } },
    });
    await sim.fixtureSnapshot('w-base', {
      backend: 'cloud-hypervisor',
      image: 'ghcr.io/acme/agent:3',
      pulled: true,
    });
  });
  after(() => sim?.cleanup());

  test('right after the clone: no lease yet, and the agent answers not ready', async () => {
    const vm = sim.json<VmRecord>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'w-slow',
      '--pull',
      'w-base',
    ]);
    const cloned = await vm;
    assert.equal(sim.leases().length, 0, 'no lease before its drawn delay');
    const r = await sim.run(['vm', 'exec', cloned.id, '--', 'hostname']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, new RegExp(AGENT_NOT_READY.slice(0, 20).replace(/[.*+?^${}()|[\]\\]/g, '\\$&')));
  });
});
