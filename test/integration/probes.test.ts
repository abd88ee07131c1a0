// Readiness probes against real packets (docs/decisions.md, "ICMP probes"): the daemon pings
// each guest through fping, and the simulator's guests answer from addresses in a network
// namespace of this world's own (sim/guestnet.ts), so nothing leaves the machine. A guest
// that stops answering takes its pod to NotReady after the probe's 3 failures, and back when
// it answers again; the lifecycle stays `ready` throughout. A pod with a probe port is probed
// by TCP against a real listener inside that namespace.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { fixture, isReady, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
const listeners: ChildProcess[] = [];

before(async () => {
  w = await world();
  assert.equal(w.simulator.guestNet?.kind, 'netns', 'the guests live in a namespace of their own (root)');
  await fixture(w, 'pr/base', 'linux');
  await w.restart();
});
after(() => {
  for (const l of listeners) l.kill('SIGKILL');
});

async function readyPod(name: string, annotations: Record<string, string> = {}): Promise<V1Pod> {
  await w.core.createNamespacedPod({
    namespace: w.namespace,
    body: vmPod(name, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${name}`,
      'cocoonset.cocoonstack.io/image': 'pr/base',
      'cocoonset.cocoonstack.io/managed': 'true',
      ...annotations,
    }),
  });
  return await waitForPod(
    w.core,
    w.namespace,
    name,
    'ready',
    (p) => lifecycle(p) === 'ready' && isReady(p),
    90_000,
  );
}

const notReady = (p: V1Pod) => lifecycle(p) === 'ready' && !isReady(p);

// Ready probes run every 5 s; 3 failures in a row (each a 3 s echo timeout) flip the pod:
// at most 3 × (5 + 3) s after the guest went silent, plus the status write.
const FLIP_MS = 3 * 8_000 + 10_000;
// Not ready, the probe retries within 1 s; one answer flips it back.
const BACK_MS = 15_000;

// The two pods are independent: their waits overlap.
describe('probes', { concurrency: true }, () => {
  test('ICMP: the daemon pings; a silent guest goes NotReady within the failure threshold and back when it answers', async () => {
    const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
    assert.match(text, /^cocoon_vk_probe_icmp_available 1$/m, 'fping works on this host');
    const pod = await readyPod('pr-icmp');
    const ip = pod.status?.podIP ?? '';
    assert.ok(
      w.simulator.guestNet && ip.startsWith(w.simulator.guestNet.subnet.split('.').slice(0, 2).join('.')),
    );

    await w.simulator.mergeKnobs({ icmp: { silent: '^vk-pr-icmp$' } });
    const silentAt = Date.now();
    await waitForPod(w.core, w.namespace, 'pr-icmp', 'NotReady', notReady, FLIP_MS);
    const flipped = Date.now() - silentAt;
    // Two failures are not enough: the first two probes after the silence take at least 5 s + 3 s.
    assert.ok(flipped >= 10_000, `NotReady only after 3 failed probes (${flipped} ms)`);

    await w.simulator.mergeKnobs({ icmp: null } as never);
    await waitForPod(
      w.core,
      w.namespace,
      'pr-icmp',
      'Ready again',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      BACK_MS,
    );
  });

  test('TCP: a probe port is probed against a real listener in the guest network', async () => {
    // The listener is up before the pod, as a service in the guest would be.
    const net = w.simulator.guestNet;
    assert.ok(net?.netns);
    await w.core.createNamespacedPod({
      namespace: w.namespace,
      body: vmPod('pr-tcp', w.nodeName, {
        'vm.cocoonstack.io/name': 'vk-pr-tcp',
        'cocoonset.cocoonstack.io/image': 'pr/base',
        'cocoonset.cocoonstack.io/managed': 'true',
        'vm.cocoonstack.io/probe-port': '18080',
      }),
    });
    // No listener yet: the VM comes up (lifecycle ready) but the pod stays NotReady.
    const up = await waitForPod(w.core, w.namespace, 'pr-tcp', 'lifecycle ready', notReady, 90_000);
    const ip = up.status?.podIP ?? '';
    assert.ok(ip, 'the pod has its IP');
    const listen = () => {
      const l = spawn(
        'ip',
        [
          'netns',
          'exec',
          net.netns as string,
          process.execPath,
          '-e',
          `require('node:net').createServer((s) => s.end()).listen(18080, ${JSON.stringify(ip)}, () => console.log('listening'))`,
        ],
        { stdio: ['ignore', 'pipe', 'inherit'] },
      );
      listeners.push(l);
      return new Promise<ChildProcess>((resolve, reject) => {
        l.stdout?.once('data', () => resolve(l));
        l.once('exit', (code) => reject(new Error(`listener exited ${code}`)));
      });
    };
    const l = await listen();
    await waitForPod(
      w.core,
      w.namespace,
      'pr-tcp',
      'Ready',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      BACK_MS,
    );
    l.kill('SIGKILL');
    // A closed port is refused at once: 3 probes 5 s apart.
    await waitForPod(w.core, w.namespace, 'pr-tcp', 'NotReady', notReady, FLIP_MS);
    await listen();
    await waitForPod(
      w.core,
      w.namespace,
      'pr-tcp',
      'Ready again',
      (p) => lifecycle(p) === 'ready' && isReady(p),
      BACK_MS,
    );
  });
});
