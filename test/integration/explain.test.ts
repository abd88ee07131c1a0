// `vk-cocoon explain` against the real apiserver and the simulator (issue 12): real pods
// brought into each state — ready, still creating (in its post-clone fixup), invalid
// annotations, failed on the IP wait, hibernated (saved locally: no registry), failed by
// fixup exhaustion with a hint — then the real `bin/vk-cocoon explain ns/pod -o json` run as
// a child process with the ground's admin kubeconfig, its JSON asserted; once more with the
// daemon stopped. Each kind's text screen is printed as `# ` lines (for the closing note).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { before, test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { repoRoot } from '../../ground/cluster.ts';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import type { ExplainReport } from '../../src/cli/explain/facts.ts';
import {
  annotate,
  fixture,
  guestCalls,
  lifecycle,
  simVm,
  staticSeed,
  strategicMergePatch,
} from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;

const EXHAUST_ERROR = 'boom: networkd refused';

function pod(name: string, annotations: Record<string, string>): V1Pod {
  return vmPod(name, w.nodeName, {
    'cocoonset.cocoonstack.io/managed': 'true',
    'cocoonset.cocoonstack.io/generation': '1',
    ...annotations,
  });
}

before(async () => {
  w = await world();
  await fixture(w, 'ex/dhcp', 'linux');
  await fixture(w, 'ex/static', 'linux', [staticSeed(w, 0, 17, 22).seed]);
  await w.simulator.setKnobs({
    dhcp: { vms: [{ match: '^vk-x-never', never: true }] },
    exec: [{ match: '^vk-x-exhaust', argvRegex: 'systemd-networkd', error: EXHAUST_ERROR }],
  });
  // A shorter fixup budget than the default 180 s (its own contract is tested in
  // lifecycle.test.ts): long enough for "still creating" to see the exhaust pod mid-fixup.
  await w.restart({ VK_FIXUP_BUDGET_SECONDS: '60' });
  const pods: [string, Record<string, string>][] = [
    ['ready', { 'vm.cocoonstack.io/name': 'vk-x-ready', 'cocoonset.cocoonstack.io/image': 'ex/dhcp' }],
    ['exhaust', { 'vm.cocoonstack.io/name': 'vk-x-exhaust', 'cocoonset.cocoonstack.io/image': 'ex/static' }],
    ['never', { 'vm.cocoonstack.io/name': 'vk-x-never', 'cocoonset.cocoonstack.io/image': 'ex/dhcp' }],
    ['hib', { 'vm.cocoonstack.io/name': 'vk-x-hib', 'cocoonset.cocoonstack.io/image': 'ex/dhcp' }],
    [
      'bad',
      {
        'vm.cocoonstack.io/name': 'vk-x-bad',
        'cocoonset.cocoonstack.io/image': 'ex/dhcp',
        'cocoonset.cocoonstack.io/mode': 'teleport',
        'vm.cocoonstack.io/backend': 'qemu',
      },
    ],
  ];
  await Promise.all(
    pods.map(([name, ann]) => w.core.createNamespacedPod({ namespace: w.namespace, body: pod(name, ann) })),
  );
});

/** Runs the real CLI as an operator would on the VM's host (the simulator is its cocoon). */
function explainCli(
  name: string,
  output: 'json' | 'text',
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      join(repoRoot, 'bin', 'vk-cocoon'),
      ['explain', `${w.namespace}/${name}`, '-o', output],
      {
        timeout: 60_000,
        env: {
          PATH: process.env.PATH ?? '/usr/bin:/bin',
          HOME: process.env.HOME ?? '/root',
          KUBECONFIG: w.ground.cluster.kubeconfig,
          VK_COCOON_BIN: w.cocoonBin,
          ...w.simulator.env(),
          ...env,
        },
      },
      (err, stdout, stderr) => resolve({ code: err ? Number(err.code ?? 1) : 0, stdout, stderr }),
    );
  });
}

async function explainJson(name: string, env?: Record<string, string>): Promise<ExplainReport> {
  const r = await explainCli(name, 'json', env);
  assert.equal(r.code, 0, `explain ${name} exit ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as ExplainReport;
}

/** Prints the text screen as `# ` lines (kept by the test runner's output). */
async function showText(kind: string, name: string, env?: Record<string, string>): Promise<string> {
  const r = await explainCli(name, 'text', env);
  assert.equal(r.code, 0, r.stderr);
  console.log(`# ---- explain, ${kind} ----`);
  for (const line of r.stdout.trimEnd().split('\n')) console.log(`# ${line}`);
  return r.stdout;
}

const reasons = (r: ExplainReport) => r.events.map((e) => e.reason);
const get = (name: string) => w.core.readNamespacedPod({ namespace: w.namespace, name });

test('ready: the decoded spec, the triple, Readiness=True, the VM record from cocoon vm inspect, nothing to do', async () => {
  const p = await waitForPod(w.core, w.namespace, 'ready', 'ready', (x) => lifecycle(x) === 'ready', 60_000);
  const r = await explainJson('ready');
  assert.equal(r.kind, 'ready');
  assert.equal(r.pod.found, true);
  assert.equal(r.pod.ready, true);
  assert.equal(r.pod.podIP, p.status?.podIP);
  assert.equal(r.spec.ok, true);
  assert.equal(r.spec.decoded?.vmName, 'vk-x-ready');
  assert.equal(r.spec.decoded?.image, 'ex/dhcp');
  assert.equal(r.spec.decoded?.mode, 'clone');
  assert.equal(r.spec.decoded?.backend, 'cloud-hypervisor');
  assert.deepEqual(r.lifecycle, { state: 'ready', observedGeneration: '1', message: null, generation: '1' });
  assert.equal(r.step?.reason, 'Ready');
  assert.equal(r.step?.status, 'True');
  const vm = await simVm(w, 'vk-x-ready');
  assert.equal(r.vm.id, vm?.id);
  assert.equal(r.vm.inspect.status, 'found');
  if (r.vm.inspect.status === 'found') {
    assert.equal(r.vm.inspect.record.state, 'running');
    assert.equal(r.vm.inspect.record.nics[0]?.mac, vm?.network_configs[0]?.mac);
  }
  assert.equal(r.failure, null);
  assert.ok(reasons(r).includes('ProviderCreateSuccess'), reasons(r).join(','));
  assert.deepEqual(r.recovery.steps, ['Nothing to do']);
  await showText('ready', 'ready');
});

test('still creating: the fixup step, its ready deadline, the failed attempts so far', async () => {
  await waitForPod(
    w.core,
    w.namespace,
    'exhaust',
    'in its fixup with a failed attempt',
    (x) =>
      lifecycle(x) === 'creating' &&
      x.status?.conditions?.some(
        (c) => c.type === 'vm.cocoonstack.io/Readiness' && c.reason === 'PostCloneFixup',
      ) === true,
    60_000,
  );
  await waitFor(
    'a failed fixup attempt event',
    async () => (await explainJson('exhaust')).postClone.failedAttempts > 0,
    30_000,
    500,
  );
  const r = await explainJson('exhaust');
  assert.equal(r.kind, 'creating');
  assert.equal(r.lifecycle.state, 'creating');
  assert.equal(r.step?.reason, 'PostCloneFixup');
  assert.ok(r.step?.deadline, 'the ready deadline');
  assert.equal(r.step?.deadlinePassed, false);
  assert.ok(Date.parse(r.step?.deadline ?? '') > Date.now() + 400_000, 'about 600 s after the bind');
  assert.equal(r.postClone.state, 'running');
  assert.equal(r.postClone.hint, null);
  assert.ok(
    r.events.some((e) => e.reason === 'PostCloneExecAttemptFailed' && e.message.includes(EXHAUST_ERROR)),
  );
  assert.match(r.headline, /^creating: running the guest network fixup/);
  assert.ok(r.recovery.steps.some((s) => /failed fixup attempt/.test(s)));
  assert.ok(r.recovery.steps.some((s) => s.startsWith('Decided by the ready deadline at the latest')));
  await showText('still creating', 'exhaust');
});

test('invalid annotations: each decode error names its key; the recovery says which key to fix', async () => {
  await waitForPod(w.core, w.namespace, 'bad', 'failed', (x) => lifecycle(x) === 'failed');
  const r = await explainJson('bad');
  assert.equal(r.kind, 'invalid-annotations');
  assert.equal(r.spec.ok, false);
  assert.deepEqual(
    r.spec.errors.map((e) => e.key),
    ['cocoonset.cocoonstack.io/mode', 'vm.cocoonstack.io/backend'],
  );
  assert.match(r.spec.errors[1]?.message ?? '', /unsupported backend "qemu"/);
  assert.equal(r.lifecycle.state, 'failed');
  assert.match(r.lifecycle.message ?? '', /^invalid VM annotations: /);
  assert.deepEqual(r.failure, {
    reason: 'CreateBringUpFailed',
    message: r.lifecycle.message,
    source: 'event',
  });
  assert.equal(r.vm.id, null);
  assert.equal(r.vm.inspect.status, 'absent');
  assert.ok(r.recovery.steps[0]?.startsWith('Fix cocoonset.cocoonstack.io/mode: '));
  assert.ok(r.recovery.steps[1]?.startsWith('Fix vm.cocoonstack.io/backend: '));
  await showText('invalid annotations', 'bad');
});

test('failed on the IP wait: PostCloneIPWaitTimeout, the lease file and cocoon-net to check, recreate', async () => {
  await waitForPod(w.core, w.namespace, 'never', 'failed', (x) => lifecycle(x) === 'failed', 90_000);
  const r = await explainJson('never');
  assert.equal(r.kind, 'failed');
  assert.equal(r.lifecycle.message, 'clone vk-x-never: dhcp lease not observed within 45s');
  assert.deepEqual(r.failure, {
    reason: 'PostCloneIPWaitTimeout',
    message: 'clone vk-x-never: dhcp lease not observed within 45s',
    source: 'event',
  });
  assert.equal(r.step?.reason, 'Failed');
  assert.equal(r.pod.ready, false);
  assert.equal(r.vm.inspect.status, 'found');
  const mac = r.vm.inspect.status === 'found' ? (r.vm.inspect.record.nics[0]?.mac ?? '') : '';
  assert.ok(mac !== '');
  assert.ok(r.recovery.steps[0]?.includes(`NIC 0's MAC ${mac}`), r.recovery.steps[0]);
  assert.ok(r.recovery.steps[0]?.includes('/var/lib/cocoon/net/leases.json'));
  assert.match(r.recovery.steps[1] ?? '', /^Recreate the pod/);
  await showText('failed on the IP wait', 'never');
});

test('hibernated (saved locally): no VM, the local snapshot, how to wake', async () => {
  await waitForPod(w.core, w.namespace, 'hib', 'ready', (x) => lifecycle(x) === 'ready', 60_000);
  await annotate(w.core, w.namespace, 'hib', { 'vm.cocoonstack.io/hibernate': 'true' });
  await waitForPod(w.core, w.namespace, 'hib', 'hibernated', (x) => lifecycle(x) === 'hibernated', 60_000);
  const r = await explainJson('hib');
  assert.equal(r.kind, 'hibernated');
  assert.equal(r.spec.decoded?.hibernate, true);
  assert.equal(r.step?.reason, 'Hibernated');
  assert.equal(r.vm.id, null);
  assert.deepEqual(r.vm.inspect, { status: 'absent', ref: 'vk-x-hib' });
  assert.equal(r.vm.savedState?.status, 'found');
  assert.ok(r.events.some((e) => e.reason === 'Hibernated' && /saved locally/.test(e.message)));
  assert.match(r.headline, /saved in the local snapshot vk-x-hib/);
  assert.ok(r.recovery.steps[0]?.includes('vm.cocoonstack.io/hibernate-'), r.recovery.steps[0]);
  await showText('hibernated', 'hib');
});

test('failed by fixup exhaustion: the decoded hint (the exact guest script), every attempt error, recreate', async () => {
  const p = await waitForPod(
    w.core,
    w.namespace,
    'exhaust',
    'failed',
    (x) => lifecycle(x) === 'failed',
    240_000,
  );
  const r = await explainJson('exhaust');
  assert.equal(r.kind, 'failed');
  assert.equal(r.failure?.reason, 'PostCloneExecExhausted');
  assert.equal(r.failure?.source, 'event');
  assert.equal(r.postClone.state, 'failed');
  const script = guestCalls(w, 'vk-x-exhaust').find((c) => c.argv[0] === 'sh')?.argv[2];
  assert.ok(script);
  assert.equal(r.postClone.hint, script, 'the hint is the script the fixup ran');
  const b64 = p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-hint'] ?? '';
  assert.equal(Buffer.from(b64, 'base64').toString('utf8'), r.postClone.hint);
  assert.equal(
    r.postClone.hintCommand,
    `cocoon vm exec ${r.vm.id} -- sh -c '${script.replaceAll("'", `'\\''`)}'`,
  );
  const errors = p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-errors'] ?? '';
  assert.deepEqual(r.postClone.errors, errors.split('\n'));
  assert.ok(r.postClone.errors.length >= 2);
  r.postClone.errors.forEach((e, i) => {
    assert.ok(e.startsWith(`attempt ${i + 1}: `), e);
  });
  assert.ok(r.postClone.errors[0]?.includes(EXHAUST_ERROR));
  assert.match(
    r.recovery.steps[0] ?? '',
    /^Optional, to restore connectivity now: run the hint in the guest/,
  );
  assert.ok(r.recovery.steps.some((s) => s.startsWith('Recreate the pod')));
  await showText('failed by exhaustion', 'exhaust');
});

test('the daemon stopped: the same facts from the apiserver, then the node NotReady (as the node controller marks it) first; without a cocoon CLI the inspect is skipped', async () => {
  const before = await explainJson('exhaust');
  await w.daemon.stop();
  const after = await explainJson('exhaust');
  assert.equal(after.kind, 'failed');
  assert.deepEqual(after.failure, before.failure);
  assert.equal(after.postClone.hint, before.postClone.hint);
  assert.deepEqual(after.lifecycle, before.lifecycle);
  const ready = await explainJson('ready', { VK_COCOON_BIN: join(w.simRoot, 'no-such-cocoon') });
  assert.equal(ready.kind, 'ready');
  assert.equal(ready.vm.inspect.status, 'skipped');
  const gone = await explainCli('no-such-pod', 'json');
  assert.equal(gone.code, 1);
  assert.equal((JSON.parse(gone.stdout) as ExplainReport).kind, 'not-found');
  const p = await get('exhaust');
  assert.equal(lifecycle(p), 'failed');
  // The node lifecycle controller marks the node Unknown once its Lease has stopped for its
  // grace period (50 s on this ground). The test writes that condition as the controller does
  // instead of waiting the 50 s (the controller's own timing is tested in fleet-death.test.ts);
  // nothing rewrites it, the daemon is stopped. explain then says the daemon is down first.
  const since = new Date().toISOString();
  await w.core.patchNodeStatus(
    {
      name: w.nodeName,
      body: {
        status: {
          conditions: [
            {
              type: 'Ready',
              status: 'Unknown',
              reason: 'NodeStatusUnknown',
              message: 'Kubelet stopped posting node status.',
              lastTransitionTime: since,
            },
          ],
        },
      },
    },
    strategicMergePatch,
  );
  const down = await explainJson('exhaust');
  assert.equal(down.node?.ready, 'Unknown');
  assert.match(
    down.recovery.steps[0] ?? '',
    new RegExp(`^Node ${w.nodeName} is NotReady \\(Ready=Unknown\\) since `),
  );
  assert.equal(down.failure?.reason, 'PostCloneExecExhausted');
  assert.equal(down.postClone.hint, before.postClone.hint);
  await showText('failed by exhaustion, daemon stopped, node NotReady', 'exhaust');
});
