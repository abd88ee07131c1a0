// The level-triggered readiness reconcile, in process (docs/architecture.md "Never stranded",
// docs/contracts/lifecycle.md "Owed steps", "IP wait", "Ready deadline"): driven through
// CreatePod, the provider's loops, lease-file writes and UpdatePod, with budgets and
// deadlines expired on the monotonic clock seam instead of waited for.
//
// advanceMonoClockForTests moves this file's clock forward for good: every test builds its
// own provider and measures from its own bind, so only forward jumps are used.
import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { CliCallOptions } from '../../../src/cocoon/runner.ts';
import { CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { advanceMonoClockForTests } from '../../../src/util/mono-clock.ts';
import { type FakeVm, hangUntilAborted } from '../fakes/cocoon.ts';
import { clonePod, type Harness, harness, until, withAnnotations } from './harness.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('provider/reconcile', () => {
  const STATE = 'vm.cocoonstack.io/lifecycle-state';
  const OBSERVED = 'vm.cocoonstack.io/lifecycle-observed-generation';
  const MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
  const POST_CLONE = 'vm.cocoonstack.io/post-clone-state';
  const HINT = 'vm.cocoonstack.io/post-clone-hint';
  const ERRORS = 'vm.cocoonstack.io/post-clone-errors';
  const VM_ID = 'vm.cocoonstack.io/id';
  const VM_IP = 'vm.cocoonstack.io/ip';
  const READINESS = 'vm.cocoonstack.io/Readiness';

  let h: Harness | undefined;
  afterEach(() => {
    h?.close();
    h = undefined;
  });

  const states = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (a[STATE] !== undefined ? [a[STATE]] : []));
  /** post-clone-state values written (the bind's clearing `null` left out). */
  const markers = (hh: Harness, name: string) =>
    hh.patches(name).flatMap((a) => (typeof a[POST_CLONE] === 'string' ? [a[POST_CLONE]] : []));
  /** The readiness condition's reason of the provider's current status of its (latest) pod:
   * what it publishes, whether written already or held for the next write. */
  const step = (hh: Harness) =>
    hh.provider
      .getPods()
      .at(-1)
      ?.status?.conditions?.find((c) => c.type === READINESS)?.reason;

  async function sleep(ms: number): Promise<void> {
    await new Promise((r) => setTimeout(r, ms));
  }

  /** One IP-wait poll (200 ms) and a margin. */
  const POLL = 260;

  async function cloned(hh: Harness, pod: V1Pod): Promise<FakeVm> {
    const name = pod.metadata!.name!;
    await hh.provider.createPod(pod);
    // The tracked copy has the id at once (the API gets it with the next write).
    await until(`${name} bound`, () => !!hh.provider.getPod('ns', name)?.metadata?.annotations?.[VM_ID]);
    return [...hh.cocoon.vms.values()].find((v) => v.name === `vk-${name}`)!;
  }

  function apiCopy(hh: Harness, pod: V1Pod, rv: string, changes: Record<string, string | null> = {}): V1Pod {
    return withAnnotations(pod, { ...Object.assign({}, ...hh.patches(pod.metadata!.name!)), ...changes }, rv);
  }

  describe('DHCP clone', () => {
    test('waits for the lease, then writes the status (podIP, Ready) and the ready annotation in one write', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      h.provider.startLoops();
      const vm = await cloned(h, clonePod('dhcp-0'));
      await until('waiting for the lease', () => step(h!) === 'WaitingForLease');
      assert.deepEqual(states(h, 'dhcp-0'), ['creating']);
      assert.equal(h.writes('dhcp-0').length, 1, 'the claim only: the bind is held for the next write');
      assert.equal(h.cocoon.callsOf('vm exec').length, 0, 'an all-DHCP CH clone needs no fixup');

      h.lease(vm.nics[0]!.mac, '10.0.0.42');
      await until('ready', () => states(h!, 'dhcp-0').includes('ready'));
      // Changed with issue 9: R8's status write, then annotation patch, is now ONE write.
      const writes = h.writes('dhcp-0');
      assert.equal(writes.length, 2, JSON.stringify(writes));
      const [claim, ready] = writes;
      assert.equal(claim!.kind, 'status');
      assert.equal(claim!.annotations?.[STATE], 'creating');
      assert.equal(claim!.status?.phase, 'Pending');
      assert.equal(ready!.kind, 'status');
      assert.equal(ready!.annotations?.[STATE], 'ready');
      assert.equal(ready!.annotations?.[VM_IP], '10.0.0.42');
      assert.equal(ready!.annotations?.[VM_ID], vm.id);
      assert.equal(ready!.annotations?.[OBSERVED], '0');
      assert.equal(ready!.status?.podIP, '10.0.0.42');
      assert.equal(ready!.status?.phase, 'Running');
      assert.equal(ready!.status?.conditions?.find((c) => c.type === 'Ready')?.status, 'True');
      assert.equal(ready!.status?.conditions?.find((c) => c.type === READINESS)?.reason, 'Ready');
      assert.deepEqual(states(h, 'dhcp-0'), ['creating', 'ready']);
    });

    test('without a probe port the ready write carries the ICMP echo: answered ⇒ PodReady True, silent ⇒ lifecycle ready, PodReady False', async () => {
      const answers = new Map([
        ['10.0.0.50', true],
        ['10.0.0.51', false],
      ]);
      const asked: string[] = [];
      h = harness({
        icmp: async (ip) => {
          asked.push(ip);
          return answers.get(ip) ?? false;
        },
      });
      h.cocoon.snapshot('acme/agent');
      h.provider.startLoops();
      for (const [i, name] of ['echo-0', 'echo-1'].entries()) {
        const vm = await cloned(h, clonePod(name));
        h.lease(vm.nics[0]!.mac, `10.0.0.5${i}`);
        await until(`${name} ready`, () => states(h!, name).includes('ready'));
      }
      const podReady = (name: string) =>
        h!
          .writes(name)
          .at(-1)
          ?.status?.conditions?.find((c) => c.type === 'Ready')?.status;
      assert.equal(podReady('echo-0'), 'True');
      assert.equal(podReady('echo-1'), 'False', 'a guest that does not answer is not Ready yet');
      // The probe agent pings too (the ready pod's periodic probe): each address at least once.
      assert.deepEqual([...new Set(asked)].sort(), ['10.0.0.50', '10.0.0.51']);
    });

    test('an update that arrives during the ICMP echo waits for it (the pod queue): ready, then the hibernate', async () => {
      let answer: ((ok: boolean) => void) | undefined;
      h = harness({
        icmp: () =>
          new Promise<boolean>((resolve) => {
            answer = resolve;
          }),
      });
      h.cocoon.snapshot('acme/agent');
      h.provider.startLoops();
      const pod = clonePod('echo-h');
      const vm = await cloned(h, pod);
      h.lease(vm.nics[0]!.mac, '10.0.0.60');
      await until('the echo asked', () => answer !== undefined);
      let applied = false;
      const update = h.provider
        .updatePod(apiCopy(h, pod, '900000', { 'vm.cocoonstack.io/hibernate': 'true' }))
        .then(() => {
          applied = true;
        });
      for (let i = 0; i < 50; i++) await new Promise((r) => setImmediate(r));
      assert.equal(applied, false, 'the update waits while the echo holds the pod');
      assert.ok(!states(h, 'echo-h').includes('ready'), 'nothing staged before the echo answered');
      answer?.(true);
      await update;
      await until('hibernate decided', () => states(h!, 'echo-h').some((s) => s?.startsWith('hibernat')));
      const seq = states(h, 'echo-h');
      assert.ok(
        seq.indexOf('ready') >= 0 && seq.indexOf('ready') < seq.findIndex((s) => s?.startsWith('hibernat')),
        JSON.stringify(seq),
      );
    });

    test('the IP wait times out after 45 s: failed with PostCloneIPWaitTimeout', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      await cloned(h, clonePod('nolease-0'));
      await until('waiting for the lease', () => step(h!) === 'WaitingForLease');
      advanceMonoClockForTests(44_000);
      await sleep(POLL);
      assert.deepEqual(states(h, 'nolease-0'), ['creating'], 'not before 45 s');
      advanceMonoClockForTests(2_000);
      await until('failed', () => states(h!, 'nolease-0').includes('failed'));
      const failed = h.patches('nolease-0').find((a) => a[STATE] === 'failed')!;
      assert.equal(failed[MESSAGE], 'clone vk-nolease-0: dhcp lease not observed within 45s');
      const warn = h.events.filter((e) => e.reason === 'PostCloneIPWaitTimeout');
      assert.equal(warn.length, 1);
      assert.equal(warn[0]!.type, 'Warning');
      assert.equal(warn[0]!.message, 'create: clone vk-nolease-0: dhcp lease not observed within 45s');
      assert.equal(step(h), 'Failed');
    });
  });

  describe('static-NIC clone (post-clone fixup)', () => {
    test('runs the networkd fixup, marks running then done, then publishes ready with the static IP', async () => {
      h = harness();
      h.cocoon.snapshot('acme/static', { staticIp: '10.0.0.9' });
      const vm = await cloned(h, clonePod('fix-0', { 'cocoonset.cocoonstack.io/image': 'acme/static' }));
      await until('ready', () => states(h!, 'fix-0').includes('ready'));
      const execs = h.cocoon.callsOf('vm exec');
      assert.equal(execs.length, 1);
      const argv = execs[0]!.argv;
      assert.deepEqual(argv.slice(0, 6), ['vm', 'exec', vm.id, '--', 'sh', '-c']);
      const script = argv[6]!;
      assert.match(script, /echo vk-fix-0 > \/etc\/hostname/);
      assert.match(script, new RegExp(`MACAddress=${vm.nics[0]!.mac}`));
      assert.match(script, /Address=10\.0\.0\.9\/24/);
      assert.match(script, /systemctl restart systemd-networkd$/);
      assert.deepEqual(markers(h, 'fix-0'), ['running', 'done']);
      // The order of the writes: marker running, marker done, then ready.
      const seq = h
        .patches('fix-0')
        .flatMap((a) => [
          ...(a[POST_CLONE] ? [`marker:${a[POST_CLONE]}`] : []),
          ...(a[STATE] ? [`state:${a[STATE]}`] : []),
        ]);
      assert.deepEqual(seq, ['state:creating', 'marker:running', 'marker:done', 'state:ready']);
      assert.equal(h.patches('fix-0').find((a) => a[STATE] === 'ready')![VM_IP], '10.0.0.9');
      assert.ok(h.events.some((e) => e.reason === 'PostCloneSucceeded' && e.message.includes('attempts=1')));
    });

    test('fixup exhaustion: post-clone-state failed with hint and errors, lifecycle failed PostCloneExecExhausted', async () => {
      h = harness();
      h.cocoon.snapshot('acme/static', { staticIp: '10.0.0.9' });
      let n = 0;
      h.cocoon.on(/^vm exec /, (argv) => {
        n++;
        // The first attempt fails ~100 ms before the 180 s budget ends (so the retry pause is
        // short), every later one past it.
        advanceMonoClockForTests(n === 1 ? 179_900 : 200);
        throw new CocoonCommandError(argv, `guest agent not reachable (${n})`, '', 1);
      });
      await cloned(h, clonePod('exh-0', { 'cocoonset.cocoonstack.io/image': 'acme/static' }));
      await until('failed', () => states(h!, 'exh-0').includes('failed'));
      assert.ok(n >= 1 && n <= 2, `${n} attempts`);
      const errors = Array.from(
        { length: n },
        (_, i) => `attempt ${i + 1}: guest agent not reachable (${i + 1})`,
      ).join('\n');
      const exhausted = h.patches('exh-0').find((a) => a[POST_CLONE] === 'failed')!;
      assert.equal(exhausted[ERRORS], errors);
      const hint = Buffer.from(String(exhausted[HINT]), 'base64').toString();
      assert.match(hint, /systemctl restart systemd-networkd/);
      const failed = h.patches('exh-0').find((a) => a[STATE] === 'failed')!;
      assert.equal(failed[MESSAGE], errors);
      assert.equal(h.events.filter((e) => e.reason === 'PostCloneExecAttemptFailed').length, n);
      const warn = h.events.filter((e) => e.reason === 'PostCloneExecExhausted');
      assert.equal(warn.length, 1);
      assert.equal(warn[0]!.message, `create: ${errors}`);
      assert.ok(!states(h, 'exh-0').includes('ready'));
      assert.ok(!markers(h, 'exh-0').includes('done'));
    });
  });

  describe('the ready deadline', () => {
    test('a fixup still running at 600 s: ReadyDeadlineExceeded, and the job is aborted', async () => {
      h = harness();
      h.cocoon.snapshot('acme/static', { staticIp: '10.0.0.9' });
      const signals: (AbortSignal | undefined)[] = [];
      h.cocoon.on(/^vm exec /, (argv, opts: CliCallOptions) => {
        signals.push(opts.signal);
        return hangUntilAborted(argv, opts);
      });
      const pod = clonePod('slow-0', { 'cocoonset.cocoonstack.io/image': 'acme/static' });
      await cloned(h, pod);
      await until('fixup running', () => signals.length === 1 && markers(h!, 'slow-0').includes('running'));
      // Past the fixup's hard deadline (180 s budget + 10 s grace) a reconcile supersedes the
      // hanging job with a successor; still no decision before the ready deadline.
      advanceMonoClockForTests(599_000);
      await h.provider.updatePod(apiCopy(h, pod, '900000'));
      await until('successor fixup', () => signals.length === 2);
      assert.equal(signals[0]?.aborted, true, 'the first job was aborted at its hard deadline');
      assert.deepEqual(states(h, 'slow-0'), ['creating'], 'not failed before the deadline');
      advanceMonoClockForTests(1_000);
      await h.provider.updatePod(apiCopy(h, pod, '900001'));
      await until('failed', () => states(h!, 'slow-0').includes('failed'));
      const failed = h.patches('slow-0').find((a) => a[STATE] === 'failed')!;
      assert.equal(failed[MESSAGE], 'creating vk-slow-0: no ready decision within 600s');
      const warn = h.events.filter((e) => e.reason === 'ReadyDeadlineExceeded');
      assert.equal(warn.length, 1);
      assert.equal(warn[0]!.message, 'create: creating vk-slow-0: no ready decision within 600s');
      assert.equal(signals[1]?.aborted, true, 'the running fixup was aborted by the decision');
      await sleep(30);
      assert.equal(signals.length, 2, 'no new fixup after the decision');
      assert.equal(step(h), 'Failed');
    });

    test('an IP wait still running at 600 s: the IP-wait timeout the table can still decide wins over the deadline', async () => {
      h = harness();
      h.cocoon.snapshot('acme/agent');
      const pod = clonePod('late-0');
      await cloned(h, pod);
      await until('waiting for the lease', () => step(h!) === 'WaitingForLease');
      advanceMonoClockForTests(600_000);
      await h.provider.updatePod(apiCopy(h, pod, '900000'));
      await until('failed', () => states(h!, 'late-0').includes('failed'));
      assert.ok(h.events.some((e) => e.reason === 'PostCloneIPWaitTimeout'));
      assert.ok(!h.events.some((e) => e.reason === 'ReadyDeadlineExceeded'));
    });
  });

  describe('failed is sticky', () => {
    test('a lease after the decision never makes it ready (and sends no echo); a generation bump re-stamps failed and re-runs nothing', async () => {
      const asked: string[] = [];
      h = harness({
        icmp: async (ip) => {
          asked.push(ip);
          return true;
        },
      });
      h.cocoon.snapshot('acme/agent');
      h.provider.startLoops();
      const pod = clonePod('sticky-0');
      const vm = await cloned(h, pod);
      await until('waiting for the lease', () => step(h!) === 'WaitingForLease');
      advanceMonoClockForTests(46_000);
      await until('failed', () => states(h!, 'sticky-0').includes('failed'));
      const message = 'clone vk-sticky-0: dhcp lease not observed within 45s';
      // The lease shows up late; updates at the same generation come in.
      h.lease(vm.nics[0]!.mac, '10.0.0.50');
      await sleep(60);
      await h.provider.updatePod(apiCopy(h, pod, '900000'));
      await h.provider.updatePod(apiCopy(h, pod, '900001', { 'vm.cocoonstack.io/probe-port': '22' }));
      await sleep(60);
      assert.deepEqual(states(h, 'sticky-0'), ['creating', 'failed']);
      assert.deepEqual(asked, [], 'a ready stage that would be refused pings nobody');
      // A generation bump: one patch re-stamping failed at the new generation, nothing re-run.
      const before = h.patches('sticky-0').length;
      await h.provider.updatePod(apiCopy(h, pod, '900002', { 'cocoonset.cocoonstack.io/generation': '2' }));
      await sleep(60);
      const added = h.patches('sticky-0').slice(before);
      assert.equal(added.length, 1, JSON.stringify(added));
      assert.equal(added[0]![STATE], 'failed');
      assert.equal(added[0]![OBSERVED], '2');
      assert.equal(added[0]![MESSAGE], message);
      assert.ok(!states(h, 'sticky-0').includes('ready'));
      assert.equal(h.cocoon.callsOf('vm clone').length, 1, 'no new clone');
      assert.equal(h.cocoon.callsOf('vm exec').length, 0);
      assert.equal(h.cocoon.callsOf('vm rm').length, 0, 'the VM stays');
      assert.ok(h.cocoon.vms.has(vm.id));
      assert.equal(step(h), 'Failed');
      assert.deepEqual(asked, []);
    });
  });

  describe('Windows clone', () => {
    test('PnP fixup, then the IP wait sends one ipconfig /renew nudge at 30 s', async () => {
      h = harness();
      h.cocoon.snapshot('acme/win');
      const pod = clonePod('win-0', {
        'cocoonset.cocoonstack.io/image': 'acme/win',
        'cocoonset.cocoonstack.io/os': 'windows',
      });
      const vm = await cloned(h, pod);
      await until('waiting for the lease', () => step(h!) === 'WaitingForLease');
      const execs = () => h!.cocoon.callsOf('vm exec').map((c) => c.argv.slice(4).join(' '));
      assert.equal(execs().length, 1);
      assert.match(execs()[0]!, /^powershell -nop -c \$x=Get-PnpDevice -Class Net -PresentOnly/);
      assert.deepEqual(markers(h, 'win-0'), ['running', 'done']);
      advanceMonoClockForTests(29_000);
      await sleep(POLL);
      assert.equal(execs().length, 1, 'no nudge before 30 s');
      advanceMonoClockForTests(1_500);
      await until('nudge', () => execs().length === 2);
      assert.deepEqual(h.cocoon.callsOf('vm exec')[1]!.argv, [
        'vm',
        'exec',
        vm.id,
        '--',
        'cmd',
        '/c',
        'ipconfig',
        '/renew',
      ]);
      await sleep(POLL);
      assert.equal(execs().length, 2, 'a single nudge');
      h.lease(vm.nics[0]!.mac, '10.0.0.77');
      await until('ready', () => states(h!, 'win-0').includes('ready'));
      assert.equal(h.patches('win-0').find((a) => a[STATE] === 'ready')![VM_IP], '10.0.0.77');
    });
  });
});
