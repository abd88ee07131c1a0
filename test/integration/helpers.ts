// Shared helpers of the lifecycle integration tests: simulator logs, knobs, pod patches.
import type { CoreV1Api, V1Pod } from '@kubernetes/client-node';
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { World } from '../../ground/world.ts';
import { ipToInt } from '../../sim/guestnet.ts';

export type { CallRecord as CliCall, GuestCommand as GuestCall } from '../../sim/client.ts';

/** Guest commands (`vm exec`) the simulator recorded, optionally for one VM name. */
export function guestCalls(w: World, vmName?: string) {
  return w.simulator.guestCommands().filter((c) => vmName === undefined || c.name === vmName);
}

export function cliCalls(w: World) {
  return w.simulator.calls();
}

export function leaseFor(w: World, mac: string) {
  return w.simulator.leaseFor(mac);
}

export async function simVm(
  w: World,
  name: string,
): Promise<
  | {
      id: string;
      network_configs: { mac: string; network?: { ip: string; prefix: number; gateway: string } | null }[];
      hypervisor: string;
    }
  | undefined
> {
  try {
    return JSON.parse(await w.sim(['vm', 'inspect', name]));
  } catch {
    return undefined;
  }
}

export const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
export const strategicMergePatch = setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch);

export async function annotate(
  core: CoreV1Api,
  ns: string,
  name: string,
  annotations: Record<string, string | null>,
): Promise<void> {
  await core.patchNamespacedPod({ namespace: ns, name, body: { metadata: { annotations } } }, mergePatch);
}

export const lifecycle = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state'] ?? '';
export const postClone = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'] ?? '';
export const isReady = (p: V1Pod) =>
  p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;

export const OCI_IMAGE = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';

export type FixtureKind = 'linux' | 'linux-cloud' | 'firecracker' | 'windows';

const FIXTURE_KINDS: Record<
  FixtureKind,
  { backend: 'cloud-hypervisor' | 'firecracker'; os: 'linux' | 'windows'; image: string }
> = {
  linux: { backend: 'cloud-hypervisor', os: 'linux', image: OCI_IMAGE },
  'linux-cloud': {
    backend: 'cloud-hypervisor',
    os: 'linux',
    image: 'https://cloud-images.ubuntu.com/jammy.img',
  },
  firecracker: { backend: 'firecracker', os: 'linux', image: OCI_IMAGE },
  windows: { backend: 'cloud-hypervisor', os: 'windows', image: 'https://images.example/win11.qcow2' },
};

/** True for an address of the lease pool of the world's guest network (sim/guestnet.ts). */
export function inGuestPool(w: World, ip: string): boolean {
  const net = w.simulator.guestNet;
  return !!net && ipToInt(ip) >= ipToInt(net.poolStart) && ipToInt(ip) <= ipToInt(net.poolEnd);
}

/** The first three octets of the /24 `i` (0–3) of the guest network's static range: static
 * guests answer the daemon's ICMP probe only there, and the simulator refuses a static address
 * outside it (docs/simulator.md, "Guest network"). */
export function staticNet(w: World, i: number): string {
  const [a, b, c] = (w.simulator.guestNet?.staticSubnet ?? '').split('.');
  return `${a}.${b}.${Number(c) + i}`;
}

/** A static NIC seed for `fixture` in the /24 `i` of the guest network's static range: host
 * `host`, gateway `.1`, prefix `prefix` (at most 24). */
export function staticSeed(
  w: World,
  i: number,
  host: number,
  prefix = 24,
): { seed: string; ip: string; gateway: string } {
  const net = staticNet(w, i);
  return { seed: `${net}.${host}/${prefix},${net}.1`, ip: `${net}.${host}`, gateway: `${net}.1` };
}

/** Creates a clonable snapshot in the world's simulator (optionally with static NICs). */
export async function fixture(
  w: World,
  name: string,
  kind: FixtureKind,
  staticIps?: string[],
): Promise<void> {
  await w.simulator.fixtureSnapshot(name, { ...FIXTURE_KINDS[kind], ...(staticIps ? { staticIps } : {}) });
}

// ---- hibernate, wake and the registry (hibernate-faults, hibernate-operator) ----------

export const vmIdOf = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/id'] ?? '';
export const lifecycleMessage = (p: V1Pod) =>
  p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state-message'] ?? '';
export const observedGeneration = (p: V1Pod) =>
  Number(p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-observed-generation'] ?? '0');
export const containerRunning = (p: V1Pod) => p.status?.containerStatuses?.[0]?.state?.running !== undefined;

export interface PodEvent {
  type: string;
  reason: string;
  message: string;
}

/** The events of a pod (by name), oldest first. */
export async function podEvents(core: CoreV1Api, ns: string, name: string): Promise<PodEvent[]> {
  const list = await core.listNamespacedEvent({
    namespace: ns,
    fieldSelector: `involvedObject.name=${name}`,
  });
  return list.items.map((e) => ({ type: e.type ?? '', reason: e.reason ?? '', message: e.message ?? '' }));
}

/** The simulator's calls from index `from` on, each as its argv joined with spaces and its exit. */
export function callsSince(w: World, from: number): { cmd: string; argv: string[]; exit: number }[] {
  return w.simulator
    .calls()
    .slice(from)
    .map((c) => ({ cmd: c.argv.join(' '), argv: c.argv, exit: c.exit }));
}

/** The simulator's record of a VM by name or id (any state, `creating` placeholders too). */
export async function simVmRecord(
  w: World,
  ref: string,
): Promise<{ id: string; name: string; state: string } | undefined> {
  const r = await w.simulator.run(['vm', 'list', '-o', 'json']);
  if (r.code !== 0) throw new Error(`vm list: ${r.stderr.trim()}`);
  const text = r.stdout.trim();
  type Listed = { id: string; state: string; config?: { name?: string } };
  const list = text.startsWith('[') ? (JSON.parse(text) as Listed[]) : [];
  const vm = list.find((v) => v.config?.name === ref || v.id === ref);
  return vm ? { id: vm.id, name: vm.config?.name ?? '', state: vm.state } : undefined;
}

/** The simulator's committed local snapshot of that name, if any (its id). */
export async function simSnapshotId(w: World, name: string): Promise<string | undefined> {
  const r = await w.simulator.run(['snapshot', 'inspect', name]);
  if (r.code !== 0) return undefined;
  return (JSON.parse(r.stdout) as { id: string }).id;
}

/** The annotations of a managed clone pod as cocoon-operator writes them. */
export const managedAnnotations = (vm: string, image = 'acme/agent', extra: Record<string, string> = {}) => ({
  'vm.cocoonstack.io/name': vm,
  'cocoonset.cocoonstack.io/image': image,
  'cocoonset.cocoonstack.io/managed': 'true',
  ...extra,
});
