// Windows static IP over the serial console (lifecycle.md §6.6; docs/contracts/post-clone.md,
// "Windows static IP") end to end against the real apiserver and the simulator's SAC emulator:
// a clone with two static NICs set and verified over SAC, each failure mode (no prompt, fewer
// NICs listed, a refused set, a set that does not take) with its Warning and `failed`, and
// run-mode Windows pods that are `ready` only after a SAC pass that ran and succeeded. All
// scenario pods start together, so the enumeration failure (60 tries, 2 s apart) bounds the
// file's run time.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import type { Knobs } from '../../sim/client.ts';
import { isReady, lifecycle, postClone, simVm, staticNet } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
const seen: { name: string; lifecycle: string; podIP: string; at: number }[] = [];
let stopWatch: (() => void) | undefined;

const WIN_IMAGE = 'https://images.example/win11.qcow2';
const RUN_IMAGE = 'https://cloud-images.example/win2022.qcow2';
const WINDOWS = { 'cocoonset.cocoonstack.io/os': 'windows' };
const RUN = {
  ...WINDOWS,
  'cocoonset.cocoonstack.io/mode': 'Run',
  'cocoonset.cocoonstack.io/network': 'static-net',
};

function pod(name: string, vmName: string, image: string, extra: Record<string, string>): V1Pod {
  return vmPod(name, w.nodeName, {
    'vm.cocoonstack.io/name': vmName,
    'cocoonset.cocoonstack.io/image': image,
    'cocoonset.cocoonstack.io/managed': 'true',
    'cocoonset.cocoonstack.io/generation': '1',
    ...extra,
  });
}

const SCENARIOS: [string, string, string, Record<string, string>][] = [
  ['ok', 'vk-sac-ok', 'win/two', WINDOWS],
  ['dial', 'vk-sac-dial', 'win/two', WINDOWS],
  ['enum', 'vk-sac-enum', 'win/two', WINDOWS],
  ['set', 'vk-sac-set', 'win/two', WINDOWS],
  ['verify', 'vk-sac-verify', 'win/two', WINDOWS],
  ['run-ok', 'vk-sac-run', RUN_IMAGE, RUN],
  ['run-dial', 'vk-sac-run-silent', RUN_IMAGE, RUN],
];

/** The world's knobs; `okHidden`: vk-sac-ok lists only its first NIC (until the test lifts it). */
function knobs(okHidden: boolean): Knobs {
  return {
    latency: { 'vm clone': 500 },
    networks: {
      'static-net': {
        subnet: `${staticNet(w, 2)}.0/24`,
        gateway: `${staticNet(w, 2)}.1`,
        rangeStart: `${staticNet(w, 2)}.10`,
      },
    },
    guest: {
      sac: {
        vms: [
          ...(okHidden ? [{ match: '^vk-sac-ok$', nicsVisibleAfterMs: 3_600_000 }] : []),
          { match: '^vk-sac-dial$', noPrompt: true },
          { match: '^vk-sac-enum$', nicsVisibleAfterMs: 3_600_000 },
          { match: '^vk-sac-set$', setFails: true },
          { match: '^vk-sac-verify$', setIgnored: true },
          { match: '^vk-sac-run$', readyAfterMs: 4000 },
          { match: '^vk-sac-run-silent$', noPrompt: true },
        ],
      },
    },
  };
}

before(async () => {
  w = await world();
  await w.simulator.fixtureSnapshot('win/two', {
    backend: 'cloud-hypervisor',
    os: 'windows',
    image: WIN_IMAGE,
    nics: 2,
    staticIps: [
      `${staticNet(w, 0)}.17/22,${staticNet(w, 0)}.1`,
      `${staticNet(w, 1)}.5/24,${staticNet(w, 1)}.1`,
    ],
  });
  await w.simulator.setKnobs(knobs(true));
  await w.restart();
  const watch = new Watch(w.kc);
  const req = await watch.watch(
    `/api/v1/namespaces/${w.namespace}/pods`,
    {},
    (_t: string, p: V1Pod) =>
      seen.push({
        name: p.metadata?.name ?? '',
        lifecycle: lifecycle(p),
        podIP: p.status?.podIP ?? '',
        at: Date.now(),
      }),
    () => {},
  );
  stopWatch = () => req.abort();
  await Promise.all(
    SCENARIOS.map(([name, vm, image, extra]) =>
      w.core.createNamespacedPod({ namespace: w.namespace, body: pod(name, vm, image, extra) }),
    ),
  );
});

after(() => stopWatch?.());

const settled = (name: string, timeoutMs: number) =>
  waitForPod(
    w.core,
    w.namespace,
    name,
    'lifecycle ready or failed',
    (p) => lifecycle(p) === 'ready' || lifecycle(p) === 'failed',
    timeoutMs,
  );

async function events(name: string): Promise<{ type: string; reason: string; message: string }[]> {
  const list = await w.core.listNamespacedEvent({
    namespace: w.namespace,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => ({ type: e.type ?? '', reason: e.reason ?? '', message: e.message ?? '' }));
}

/** What the VM's console was sent (the simulator's sac.jsonl), with the wall time of each line. */
function consoleLines(vmName: string): { line: string; at: number }[] {
  const file = path.join(w.simulator.root, 'sim', 'sac.jsonl');
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { vm: string; line: string; at: string })
    .filter((e) => e.vm === vmName)
    .map((e) => ({ line: e.line, at: Date.parse(e.at) }));
}

const listings = (vmName: string) => consoleLines(vmName).filter((l) => l.line === 'i').length;

async function guest(
  vmName: string,
): Promise<{ nics: { sac?: { ip: string; mask: string; gateway: string } }[] }> {
  return JSON.parse(await w.sim(['__sim', 'guest', vmName]));
}

async function postcloneMetric(result: 'ok' | 'failed'): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
  const line = text
    .split('\n')
    .find(
      (l) =>
        l.startsWith('cocoon_vk_postclone_total{') &&
        l.includes('kind="sac"') &&
        l.includes(`result="${result}"`),
    );
  return line ? Number(line.split(' ').at(-1)) : 0;
}

/** Waits for `failed` and checks the phase Warning, WindowsStaticIPFailed and the post-clone keys. */
async function assertFailed(
  name: string,
  phaseReason: string,
  phase: string,
  timeoutMs: number,
): Promise<V1Pod> {
  const p = await settled(name, timeoutMs);
  assert.equal(lifecycle(p), 'failed');
  assert.equal(isReady(p), false);
  assert.equal(postClone(p), 'failed');
  const ann = p.metadata?.annotations ?? {};
  const errors = ann['vm.cocoonstack.io/post-clone-errors'] ?? '';
  assert.match(errors, new RegExp(`^sac ${phase}: `));
  assert.equal(ann['vm.cocoonstack.io/lifecycle-state-message'], errors);
  const ev = await events(name);
  const warnings = ev.filter((e) => e.type === 'Warning').map((e) => e.reason);
  assert.ok(warnings.includes(phaseReason), `${phaseReason} in ${warnings.join(', ')}`);
  const final = ev.find((e) => e.reason === 'WindowsStaticIPFailed');
  assert.equal(final?.type, 'Warning');
  assert.equal(final?.message, `create: ${errors}`.slice(0, 512));
  for (const other of [
    'PostCloneSACDialFailed',
    'PostCloneSACEnumFailed',
    'PostCloneSACSetFailed',
    'PostCloneSACVerifyFailed',
  ]) {
    if (other !== phaseReason) assert.ok(!warnings.includes(other), `no ${other}`);
  }
  return p;
}

test('two static NICs: enumeration waits for both, each is set (NIC i on the i-th net) and verified; then ready', async () => {
  // The second NIC shows only once the console answered `i` with one NIC twice.
  await waitFor('two listings with one NIC', () => listings('vk-sac-ok') >= 2, 60_000, 100);
  const during = await w.core.readNamespacedPod({ namespace: w.namespace, name: 'ok' });
  assert.notEqual(lifecycle(during), 'ready', 'not ready while enumerating');
  await w.simulator.setKnobs(knobs(false));
  const p = await settled('ok', 60_000);
  assert.equal(lifecycle(p), 'ready', p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message']);
  const vm = await simVm(w, 'vk-sac-ok');
  const [n0, n1] = [vm?.network_configs[0]?.network, vm?.network_configs[1]?.network];
  assert.ok(n0 && n1, 'the clone has two static NICs');
  const sets = consoleLines('vk-sac-ok')
    .map((l) => l.line)
    .filter((l) => l.startsWith('i '));
  assert.deepEqual(sets, [
    `i 10 ${n0.ip} 255.255.252.0 ${n0.gateway}`,
    `i 11 ${n1.ip} 255.255.255.0 ${n1.gateway}`,
  ]);
  const firstSet = consoleLines('vk-sac-ok').findIndex((l) => l.line.startsWith('i '));
  const enumeration = consoleLines('vk-sac-ok')
    .slice(0, firstSet)
    .filter((l) => l.line === 'i');
  assert.ok(
    enumeration.length >= 2,
    `enumeration retried while one NIC showed (${enumeration.length} listings)`,
  );
  const g = await guest('vk-sac-ok');
  assert.deepEqual(
    g.nics.map((n) => n.sac),
    [
      { ip: n0.ip, mask: '255.255.252.0', gateway: n0.gateway },
      { ip: n1.ip, mask: '255.255.255.0', gateway: n1.gateway },
    ],
  );
  assert.equal(p.status?.podIP, n0.ip);
  assert.equal(postClone(p), 'done');
  const lastSet = Math.max(...consoleLines('vk-sac-ok').map((l) => l.at));
  const readyAt = seen.find((e) => e.name === 'ok' && e.lifecycle === 'ready')?.at ?? 0;
  assert.ok(readyAt >= lastSet, 'ready only after the SAC pass');
  assert.ok(!(await events('ok')).some((e) => e.type === 'Warning'), 'no Warning');
  await waitForPod(w.core, w.namespace, 'ok', 'Ready', isReady, 15_000);
});

test('a console that never shows SAC>: PostCloneSACDialFailed after 60 s, then WindowsStaticIPFailed and failed', async () => {
  await assertFailed('dial', 'PostCloneSACDialFailed', 'dial', 150_000);
  const lines = consoleLines('vk-sac-dial');
  assert.ok(lines.length >= 20, `CR LF sent until the budget ended (${lines.length})`);
  assert.ok(
    lines.every((l) => l.line === ''),
    'only CR LF: no command without a prompt',
  );
  const span = (lines.at(-1)?.at ?? 0) - (lines[0]?.at ?? 0);
  assert.ok(span >= 50_000 && span <= 62_000, `prompt hunted for ${span} ms`);
});

test('a set that is refused: PostCloneSACSetFailed, failed', async () => {
  await assertFailed('set', 'PostCloneSACSetFailed', 'set', 90_000);
  const sets = consoleLines('vk-sac-set').filter((l) => l.line.startsWith('i '));
  assert.equal(sets.length, 1, 'the set is sent once');
});

test('a set that does not take: verified 10 times, 2 s apart, then PostCloneSACVerifyFailed, failed', async () => {
  const p = await assertFailed('verify', 'PostCloneSACVerifyFailed', 'verify', 120_000);
  assert.match(p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-errors'] ?? '', /after 10 tries$/);
  const lines = consoleLines('vk-sac-verify');
  const setAt = lines.findIndex((l) => l.line.startsWith('i '));
  const verifies = lines.slice(setAt + 1).filter((l) => l.line === 'i');
  assert.equal(verifies.length, 10);
  const span = (verifies.at(-1)?.at ?? 0) - (verifies[0]?.at ?? 0);
  assert.ok(span >= 17_000 && span <= 30_000, `verification over ${span} ms`);
});

test('fewer NICs listed than the VM has: 60 tries, then PostCloneSACEnumFailed, failed', async () => {
  const p = await assertFailed('enum', 'PostCloneSACEnumFailed', 'enum', 240_000);
  assert.match(
    p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-errors'] ?? '',
    /listed 1 of 2 NICs after 60 tries/,
  );
  const lines = consoleLines('vk-sac-enum');
  assert.equal(lines.filter((l) => l.line === 'i').length, 60);
  assert.equal(lines.filter((l) => l.line.startsWith('i ')).length, 0, 'no set before every NIC is listed');
});

test('run mode, static NIC: ready only after the SAC pass ran and succeeded', async () => {
  const p = await settled('run-ok', 60_000);
  assert.equal(lifecycle(p), 'ready', p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message']);
  const vm = await simVm(w, 'vk-sac-run');
  const n0 = vm?.network_configs[0]?.network;
  assert.ok(n0, 'vm run on static-net gives a static NIC');
  const lines = consoleLines('vk-sac-run');
  const set = lines.find((l) => l.line.startsWith('i '));
  assert.equal(set?.line, `i 10 ${n0.ip} 255.255.255.0 ${staticNet(w, 2)}.1`);
  const verified = lines.at(-1);
  assert.equal(verified?.line, 'i');
  const readyAt = seen.find((e) => e.name === 'run-ok' && e.lifecycle === 'ready')?.at ?? 0;
  assert.ok(
    readyAt > 0 && readyAt >= (verified?.at ?? Number.POSITIVE_INFINITY),
    'ready after the verifying listing',
  );
  assert.ok(
    seen.filter((e) => e.name === 'run-ok' && e.at < (set?.at ?? 0)).every((e) => e.lifecycle !== 'ready'),
    'never ready before the set',
  );
  assert.equal((await guest('vk-sac-run')).nics[0]?.sac?.ip, n0.ip);
  assert.equal(p.status?.podIP, n0.ip);
  assert.equal(postClone(p), '', 'run mode has no fixup marker');
});

test('run mode, console never answers: failed with WindowsStaticIPFailed, never ready', async () => {
  await assertFailed('run-dial', 'PostCloneSACDialFailed', 'dial', 150_000);
  assert.ok(!seen.some((e) => e.name === 'run-dial' && e.lifecycle === 'ready'), 'never ready');
});

test('metrics: cocoon_vk_postclone_total{kind="sac"} counts each pass once', async () => {
  await settled('enum', 240_000);
  assert.equal(await postcloneMetric('ok'), 2);
  assert.equal(await postcloneMetric('failed'), 5);
});
