// `npm run demo`: vk-cocoon on embedded defaults. Brings up the local control plane
// (kube-apiserver + etcd + registry), a cocoon simulator root with example snapshots, runs the
// daemon against them, creates three example VM pods (Linux clone, Firecracker clone, Windows
// clone) and shows their state live until Ctrl-C, then cleans up everything it started.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type V1Pod, Watch } from '@kubernetes/client-node';
import { repoRoot } from '../test/ground/cluster.ts';
import { startDaemon } from '../test/ground/daemon.ts';
import { startGround, stopGround } from '../test/ground/ground.ts';
import { adminClients, vmPod } from '../test/ground/kube.ts';
import { run } from '../test/ground/proc.ts';

const dir = mkdtempSync(join(tmpdir(), 'vk-demo-'));
const say = (s: string) => process.stdout.write(`demo: ${s}\n`);
const sim = join(repoRoot, 'bin', 'cocoon-sim');
const simRoot = join(dir, 'cocoon');
const leasesPath = join(simRoot, 'net', 'leases.json');
const simEnv = {
  ...process.env,
  COCOON_SIM_ROOT: simRoot,
  COCOON_ROOT_DIR: simRoot,
  COCOON_SIM_LEASES: leasesPath,
};

say('starting the local control plane (first run builds kube-apiserver, etcd and kubectl: minutes)');
const ground = await startGround(join(dir, 'ground'), { log: (l) => say(l) });
mkdirSync(join(simRoot, 'net'), { recursive: true });
const cocoonBin = join(dir, 'cocoon');
symlinkSync(sim, cocoonBin);
const fixtures: [string, string[]][] = [
  [
    'demo/ubuntu',
    ['--backend', 'cloud-hypervisor', '--os', 'linux', '--image', 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04'],
  ],
  [
    'demo/ubuntu-fc',
    ['--backend', 'firecracker', '--os', 'linux', '--image', 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04'],
  ],
  [
    'demo/win11',
    ['--backend', 'cloud-hypervisor', '--os', 'windows', '--image', 'https://images.example/win11.qcow2'],
  ],
];
for (const [name, args] of fixtures) await run(sim, ['fixture', 'snapshot', name, ...args], { env: simEnv });
// Windows guests take a few seconds to get their DHCP lease, like the real thing.
await run(
  sim,
  [
    'knobs',
    'set',
    JSON.stringify({ latency: { 'vm clone': 800 }, dhcp: { vms: [{ match: 'win', leaseDelayMs: 6000 }] } }),
  ],
  { env: simEnv },
).catch(() => {});

const logFile = join(dir, 'vk-cocoon.log');
const daemon = await startDaemon({
  cluster: ground.cluster,
  nodeName: 'cocoon-pool',
  cocoonBin,
  rootDir: simRoot,
  leasesPath,
  logFile,
  env: { VK_LOG_LEVEL: 'info' },
});
say(`vk-cocoon running (pid ${daemon.pid}, kubelet API :${daemon.kubeletPort}); log: ${logFile}`);
const { core, kc } = adminClients(ground.cluster);
await core.createNamespace({ body: { metadata: { name: 'demo' } } });
const pods: [string, Record<string, string>][] = [
  ['linux-0', { 'cocoonset.cocoonstack.io/image': 'demo/ubuntu' }],
  [
    'firecracker-0',
    { 'cocoonset.cocoonstack.io/image': 'demo/ubuntu-fc', 'vm.cocoonstack.io/backend': 'firecracker' },
  ],
  ['windows-0', { 'cocoonset.cocoonstack.io/image': 'demo/win11', 'cocoonset.cocoonstack.io/os': 'windows' }],
];
for (const [name, ann] of pods) {
  await core.createNamespacedPod({
    namespace: 'demo',
    body: vmPod(name, 'cocoon-pool', {
      'vm.cocoonstack.io/name': `vk-demo-${name}`,
      'cocoonset.cocoonstack.io/managed': 'true',
      ...ann,
    }),
  });
}

const state = new Map<string, V1Pod>();
const watch = new Watch(kc);
const req = await watch.watch(
  '/api/v1/namespaces/demo/pods',
  {},
  (t: string, p: V1Pod) => {
    if (t === 'DELETED') state.delete(p.metadata?.name ?? '');
    else state.set(p.metadata?.name ?? '', p);
  },
  () => {},
);

function render(): void {
  const rows = [...state.values()].map((p) => {
    const a = p.metadata?.annotations ?? {};
    const ready = p.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
    const step = p.status?.conditions?.find((c) => c.type === 'vm.cocoonstack.io/Readiness')?.reason ?? '';
    return [
      p.metadata?.name ?? '',
      p.status?.phase ?? '',
      ready ? 'yes' : 'no',
      a['vm.cocoonstack.io/lifecycle-state'] ?? '',
      step,
      a['vm.cocoonstack.io/post-clone-state'] ?? '',
      p.status?.podIP ?? '',
      (a['vm.cocoonstack.io/id'] ?? '').slice(0, 10),
    ];
  });
  const head = ['POD', 'PHASE', 'READY', 'LIFECYCLE', 'STEP', 'POST-CLONE', 'IP', 'VM ID'];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ');
  process.stdout.write('\x1b[2J\x1b[H');
  process.stdout.write(
    `vk-cocoon demo — node cocoon-pool, ${new Date().toISOString()}\n\n${line(head)}\n${rows.map(line).join('\n')}\n\n`,
  );
  process.stdout.write(
    `KUBECONFIG=${ground.cluster.kubeconfig}\nkubectl: ${join(ground.cluster.binDir, 'kubectl')}  (try: -n demo exec linux-0 -- hostname)\nCtrl-C to stop and clean up.\n`,
  );
}
const timer = setInterval(render, 500);

let stopping = false;
async function cleanup(): Promise<void> {
  if (stopping) return;
  stopping = true;
  clearInterval(timer);
  req.abort();
  say('cleaning up');
  await daemon.stop().catch(() => {});
  const list = await run(cocoonBin, ['vm', 'list', '-o', 'json'], { env: simEnv }).catch(() => ({
    stdout: '[]',
  }));
  const text = list.stdout.trim();
  for (const vm of text.startsWith('[') ? (JSON.parse(text) as { id: string }[]) : []) {
    await run(cocoonBin, ['vm', 'rm', '--force', vm.id], { env: simEnv }).catch(() => {});
  }
  await stopGround(ground);
  rmSync(dir, { recursive: true, force: true });
  say('done');
  process.exit(0);
}
process.on('SIGINT', () => void cleanup());
process.on('SIGTERM', () => void cleanup());
if (process.env.VK_DEMO_SECONDS) setTimeout(() => void cleanup(), Number(process.env.VK_DEMO_SECONDS) * 1000);
