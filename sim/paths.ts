// The on-disk layout of cocoon-cli.md §6 under the simulator root, plus the simulator's own
// private files under <root>/sim/.
import path from 'node:path';

export type Hypervisor = 'cloud-hypervisor' | 'firecracker';
export type BackendDir = 'cloudhypervisor' | 'firecracker';
export const BACKENDS: readonly BackendDir[] = ['cloudhypervisor', 'firecracker'];

/** `firecracker` → `firecracker`, anything else → `cloudhypervisor` (cocoon-cli.md §6). */
export function backendDir(hypervisor: string): BackendDir {
  return hypervisor === 'firecracker' ? 'firecracker' : 'cloudhypervisor';
}

export function hypervisorOf(dir: BackendDir): Hypervisor {
  return dir === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
}

/** `COCOON_SIM_ROOT`, else `COCOON_ROOT_DIR`, else `/var/lib/cocoon`. */
export function resolveRoot(env: NodeJS.ProcessEnv = process.env): string {
  return path.resolve(env.COCOON_SIM_ROOT || env.COCOON_ROOT_DIR || '/var/lib/cocoon');
}

export const vmDbFile = (root: string, dir: BackendDir) => path.join(root, dir, 'db', 'vms.json');
export const vmDbLock = (root: string, dir: BackendDir) => path.join(root, dir, 'db', 'vms.lock');
export const snapDbFile = (root: string) => path.join(root, 'snapshot', 'db', 'snapshots.json');
export const snapDbLock = (root: string) => path.join(root, 'snapshot', 'db', 'snapshots.lock');
export const snapDataDir = (root: string, id: string) => path.join(root, 'snapshot', 'localfile', id);
export const imageDbFile = (root: string, kind: 'oci' | 'cloudimg') =>
  path.join(root, kind, 'db', 'images.json');
export const imageDbLock = (root: string, kind: 'oci' | 'cloudimg') =>
  path.join(root, kind, 'db', 'images.lock');
export const imageBlob = (root: string, kind: 'oci' | 'cloudimg', hex: string) =>
  path.join(root, kind, 'blobs', kind === 'oci' ? `${hex}.erofs` : `${hex}.qcow2`);
export const runDir = (root: string, dir: BackendDir, id: string) => path.join(root, 'run', dir, id);
export const logDir = (root: string, dir: BackendDir, id: string) => path.join(root, 'log', dir, id);
export const vmmLogFile = (root: string, dir: BackendDir, id: string) =>
  path.join(logDir(root, dir, id), dir === 'firecracker' ? 'firecracker.log' : 'cloud-hypervisor.log');
export const consoleLogFile = (root: string, dir: BackendDir, id: string) =>
  path.join(logDir(root, dir, id), 'console.log');
export const netnsPath = (id: string) => `/var/run/netns/cocoon-${id}`;

// Simulator-private state.
export const simDir = (root: string) => path.join(root, 'sim');
export const knobsFile = (root: string) => path.join(root, 'sim', 'config.json');
export const callsFile = (root: string) => path.join(root, 'sim', 'calls.jsonl');
export const guestLogFile = (root: string) => path.join(root, 'sim', 'guest.jsonl');
export const countersFile = (root: string) => path.join(root, 'sim', 'counters.json');
export const countersLock = (root: string) => path.join(root, 'sim', 'counters.lock');
export const guestFile = (root: string, id: string) => path.join(root, 'sim', 'guests', `${id}.json`);
export const guestLock = (root: string, id: string) => path.join(root, 'sim', 'guests', `${id}.lock`);
export const ownerFile = (root: string, key: string) => path.join(root, 'sim', 'owners', key);
export const pidsDir = (root: string) => path.join(root, 'sim', 'pids');
export const ipamFile = (root: string) => path.join(root, 'sim', 'ipam.json');
export const ipamLock = (root: string) => path.join(root, 'sim', 'ipam.lock');
/** The simulator's cgroup v2 tree, standing in for /sys/fs/cgroup (sim/cgroup.ts). */
export const cgroupRootDir = (root: string) => path.join(root, 'sim', 'cgroup');
export const snapUsersDir = (root: string, snapId: string) => path.join(root, 'sim', 'snapuse', snapId);

/** `COCOON_SIM_LEASES`, else `<root>/net/leases.json`. */
export function leasesFile(root: string, env: NodeJS.ProcessEnv = process.env): string {
  return env.COCOON_SIM_LEASES ? path.resolve(env.COCOON_SIM_LEASES) : path.join(root, 'net', 'leases.json');
}
