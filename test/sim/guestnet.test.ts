// The simulator's guest network (sim/guestnet.ts; docs/simulator.md "Guest network"): as root,
// a leased guest's address answers ICMP echo from its own network namespace, `icmp.silent`
// stops it answering, a removed VM's address is gone, and the rest of the guest range is
// unreachable while any root holds a claim, so no probe leaves the machine. Sent with Debian's
// fping, as the daemon does (src/net/icmp.ts); every address is in 198.18.0.0/15 and routed
// into the root's namespace, never off the machine.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';

const OCI = 'ghcr.io/acme/agent:3';

/** One echo each, 1 s to answer: the addresses that answered. */
function answering(ips: string[]): Set<string> {
  const r = spawnSync('fping', ['-4', '-r', '0', '-t', '1000', '-a', ...ips], { encoding: 'utf8' });
  return new Set(r.stdout.split('\n').filter(Boolean));
}

async function until<T>(what: string, fn: () => T | undefined, ms = 15_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const root = process.getuid?.() === 0;
const tools = spawnSync('ip', ['-V']).status === 0 && spawnSync('fping', ['-v']).status === 0;

describe('simulated guest network', { concurrency: 1 }, () => {
  if (!root || !tools) {
    // The suite runs as root with iproute2 and fping (README prerequisites); elsewhere the
    // guests get loopback addresses, which always answer, and this file has nothing to show.
    test('needs root, iproute2 and fping', (t) => t.skip(`root=${root} ip+fping=${tools}`));
    return;
  }
  let sim: SimRoot;
  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('ch-base', { backend: 'cloud-hypervisor', image: OCI, pulled: true });
  });
  after(async () => {
    await sim.cleanup();
  });

  const clone = (name: string) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, '--pull', 'ch-base']);
  const leaseIp = (vm: VmRecord) =>
    until(`${vm.id}'s lease`, () => sim.leaseFor(vm.network_configs?.[0]?.mac as string)?.ip);

  test('a namespace of its own, a /21 of 198.18.0.0/15, and the rest of that range unreachable', () => {
    const net = sim.guestNet;
    assert.equal(net?.kind, 'netns');
    assert.match(net?.subnet ?? '', /^198\.(18|19)\.\d+\.0\/21$/);
    const routes = spawnSync('ip', ['-4', 'route', 'show', 'type', 'unreachable'], { encoding: 'utf8' });
    assert.match(
      routes.stdout,
      /^unreachable 198\.18\.0\.0\/15\b/m,
      'no guest address routes off the machine',
    );
    const own = spawnSync('ip', ['-4', 'route', 'get', net?.poolStart ?? ''], { encoding: 'utf8' });
    assert.doesNotMatch(
      own.stdout,
      /unreachable/,
      `the root's own range routes to its namespace: ${own.stdout}`,
    );
  });

  test('a leased guest answers, a silent one does not, and a removed one is gone', async () => {
    await sim.mergeKnobs({ icmp: { silent: '^vk-quiet$' } });
    const [a, b] = await Promise.all([clone('vk-loud'), clone('vk-quiet')]);
    const [ipA, ipB] = await Promise.all([leaseIp(a), leaseIp(b)]);
    assert.deepEqual(answering([ipA, ipB]), new Set([ipA]));
    // Silence is a knob: lifted, the guest answers (the namespace follows within a sync).
    await sim.mergeKnobs({ icmp: null });
    await until('the quiet guest to answer', () => (answering([ipB]).has(ipB) ? true : undefined));
    await sim.run(['vm', 'rm', '--force', a.id]);
    assert.deepEqual(answering([ipA, ipB]), new Set([ipB]), 'the removed VM no longer answers');
    await sim.run(['vm', 'rm', '--force', b.id]);
    assert.deepEqual(answering([ipB]), new Set(), 'nor does the second');
  });
});
