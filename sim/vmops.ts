// Shared VM mechanics: NIC and disk layout, run-dir placeholders, booting a stand-in, and
// tearing a VM down. Used by vm clone/run/start/rm, snapshot save and the __sim actions.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { cgroupParent, createScope, removeScopes, scopeDir } from './cgroup.ts';
import {
  type NetworkConfig,
  newMac,
  readVmDb,
  type StaticNetwork,
  type StorageConfig,
  updateVmDb,
  type VmRecord,
} from './db.ts';
import { restoreDisk } from './disk.ts';
import { dhcpSync, type GuestNic, type GuestState, readGuest, removeGuest, writeGuest } from './guest.ts';
import { answers, configuredAddress, guestNetChange } from './guestnet.ts';
import { io } from './io.ts';
import { dhcpPolicy, type Knobs } from './knobs.ts';
import { readJson, updateJson } from './lock.ts';
import {
  type BackendDir,
  consoleLogFile,
  imageBlob,
  ipamFile,
  ipamLock,
  logDir,
  netnsPath,
  ownerFile,
  runDir,
  vmmLogFile,
} from './paths.ts';
import { killTracked, trackedAlive } from './pids.ts';
import { isAlive } from './proc.ts';
import { ensureDhcpd, STANDIN_NODE, spawnDetached } from './spawn.ts';

export const GiB = 1024 ** 3;

function ipToInt(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}
function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** Allocates the lowest free static address at or after `from` inside `from/prefix`. */
export function allocateStatic(root: string, vmId: string, seed: StaticNetwork): StaticNetwork {
  return updateJson<Record<string, string>, StaticNetwork>(
    ipamFile(root),
    ipamLock(root),
    () => ({}),
    (doc) => {
      const size = 2 ** (32 - seed.prefix);
      const base = ipToInt(seed.ip);
      const netStart = base - (base % size);
      for (let n = base; n < netStart + size - 1; n++) {
        const ip = intToIp(n);
        if (ip === seed.gateway || doc[ip]) continue;
        doc[ip] = vmId;
        return { ip, gateway: seed.gateway, prefix: seed.prefix };
      }
      throw new Error(`no free static address in ${seed.ip}/${seed.prefix}`);
    },
  );
}

export function releaseStatic(root: string, vmId: string): void {
  if (!fs.existsSync(ipamFile(root))) return;
  updateJson<Record<string, string>, void>(
    ipamFile(root),
    ipamLock(root),
    () => ({}),
    (doc) => {
      for (const [ip, owner] of Object.entries(doc)) if (owner === vmId) delete doc[ip];
    },
  );
}

/** A static network from the `networks` knob, as the seed for the first address. */
export function knobNetwork(knobs: Knobs, name: string | undefined): StaticNetwork | undefined {
  if (!name) return undefined;
  const n = knobs.networks?.[name];
  if (!n) return undefined;
  const [addr, prefixText] = n.subnet.split('/');
  const prefix = Number(prefixText);
  const start = n.rangeStart ?? intToIp(ipToInt(addr ?? '0.0.0.0') + 10);
  return { ip: start, gateway: n.gateway, prefix };
}

export interface NicPlan {
  count: number;
  network?: string;
  /** Static seeds per NIC index (from the snapshot's config or the networks knob). */
  staticSeeds: (StaticNetwork | undefined)[];
}

export function buildNics(
  root: string,
  vmId: string,
  dir: BackendDir,
  cpu: number,
  plan: NicPlan,
  firstIndex = 0,
): NetworkConfig[] {
  const out: NetworkConfig[] = [];
  for (let i = firstIndex; i < firstIndex + plan.count; i++) {
    const nic: NetworkConfig = {
      tap: `tap${vmId.slice(0, 8)}-${i}`,
      mac: newMac(),
      num_queues: dir === 'firecracker' ? 1 : Math.max(2, cpu * 2),
      queue_size: dir === 'firecracker' ? 0 : 256,
      backend: 'cni',
      netns_path: netnsPath(vmId),
    };
    const seed = plan.staticSeeds[i];
    if (seed) nic.network = allocateStatic(root, vmId, seed);
    out.push(nic);
  }
  return out;
}

export function storageFor(root: string, dir: BackendDir, vm: VmRecord, imageType: string): StorageConfig[] {
  const rd = runDir(root, dir, vm.id);
  if (imageType === 'cloudimg') {
    const out: StorageConfig[] = [
      { path: path.join(rd, 'overlay.qcow2'), ro: false, serial: 'cocoon-overlay', role: 'cow' },
    ];
    if (!vm.config.windows)
      out.push({ path: path.join(rd, 'cidata.img'), ro: true, serial: 'cidata', role: 'cidata' });
    return out;
  }
  const hex = (vm.config.image_digest ?? '').replace(/^sha256:/, '') || '0'.repeat(64);
  return [
    { path: imageBlob(root, 'oci', hex), ro: true, serial: 'layer0', role: 'layer' },
    { path: path.join(rd, 'cow.raw'), ro: false, serial: 'cocoon-cow', role: 'cow' },
  ];
}

function sparse(file: string, size: number): void {
  const fd = fs.openSync(file, 'w');
  try {
    if (size > 0) fs.ftruncateSync(fd, size);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Creates the run dir with the files of cocoon-cli.md §6. The disks (COW disk, cidata) are
 * sparse copies of the same-named files in `source` (the snapshot's data dir of a clone) when
 * it has them with a non-zero size, else empty placeholders (sim/disk.ts).
 */
export function prepareRunDir(
  root: string,
  dir: BackendDir,
  vm: VmRecord,
  imageType: string,
  cloned: boolean,
  source?: string,
): void {
  const rd = runDir(root, dir, vm.id);
  fs.mkdirSync(rd, { recursive: true });
  fs.mkdirSync(logDir(root, dir, vm.id), { recursive: true });
  fs.writeFileSync(path.join(rd, 'api.sock'), '');
  fs.writeFileSync(path.join(rd, 'vsock.uds'), '');
  const disk = (f: string, size: number) =>
    restoreDisk(source === undefined ? undefined : path.join(source, f), path.join(rd, f), size);
  if (imageType === 'cloudimg') {
    disk('overlay.qcow2', 196_608);
    if (!vm.config.windows) disk('cidata.img', 372_736);
  } else {
    disk('cow.raw', vm.config.storage ?? 10 * GiB);
  }
  if (dir === 'firecracker') {
    fs.writeFileSync(path.join(rd, 'console.sock'), '');
  } else {
    fs.writeFileSync(path.join(rd, 'cmdline'), 'console=hvc0 root=/dev/vda rw quiet\n');
    if (cloned) {
      fs.writeFileSync(path.join(rd, 'config.json'), JSON.stringify({ vm: vm.id }));
      fs.writeFileSync(path.join(rd, 'state.json'), JSON.stringify({ restored: true }));
      sparse(path.join(rd, 'memory-range-0'), 0);
      fs.writeFileSync(path.join(rd, 'cocoon.json'), JSON.stringify({ id: vm.id, name: vm.config.name }));
    }
  }
}

export function pidFile(root: string, dir: BackendDir, vmId: string): string {
  return path.join(runDir(root, dir, vmId), dir === 'firecracker' ? 'fc.pid' : 'ch.pid');
}

function bootLines(vm: VmRecord, cloned: boolean): string {
  const t = new Date().toISOString();
  if (vm.config.windows) {
    return [
      `${t} Computer is booting, SAC started and initialized.`,
      `${t} Use the "ch -?" command for information about using channels.`,
      `${t} EVENT: The CMD command is now available.`,
      '',
    ].join('\n');
  }
  return [
    `[    0.000000] Linux version 6.1.0-cocoon (cocoon-sim) #1 SMP PREEMPT_DYNAMIC`,
    `[    0.004000] Command line: console=hvc0 root=/dev/vda rw quiet`,
    cloned
      ? `[    0.000001] cocoon: restored ${vm.config.name} from snapshot`
      : `[    0.812000] Run /sbin/init as init process`,
    `[    1.120000] systemd[1]: Started systemd-networkd.service - Network Configuration.`,
    `[    1.240000] cocoon-agent[211]: listening on vsock port 1024`,
    `[    1.300000] systemd[1]: Reached target multi-user.target - Multi-User System.`,
    `${vm.config.name} login: `,
    '',
  ].join('\n');
}

export interface BootOptions {
  knobs: Knobs;
  leasesPath: string;
  clone: boolean;
  hotNic: boolean;
  imageType: string;
  /** MACs the guest presents before a fixMac (Firecracker clone under dhcp.keyByGuestMac). */
  sourceMacs?: string[];
  /** Keep these guest fields from the previous boot (vm start of a stopped VM). */
  previous?: GuestState;
}

/**
 * Writes the guest state, starts the stand-in and records its pid in the pid file. The caller
 * commits `running` + pid to the DB and then calls finishBoot.
 */
export function startStandin(root: string, dir: BackendDir, vm: VmRecord, opts: BootOptions): number {
  const policy = dhcpPolicy(opts.knobs, vm.config.name);
  const now = Date.now();
  const windows = vm.config.windows === true;
  const nics: GuestNic[] = (vm.network_configs ?? []).map((n, i) => {
    const prev = opts.previous?.nics[i];
    const keyed =
      opts.clone && dir === 'firecracker' && policy.keyByGuestMac ? opts.sourceMacs?.[i] : undefined;
    const g: GuestNic = { mac: n.mac, guestMac: prev?.guestMac ?? keyed ?? n.mac, dhcp: !n.network };
    if (n.network) {
      g.staticIp = n.network.ip;
      g.prefix = n.network.prefix;
      g.gateway = n.network.gateway;
    }
    if (prev?.sac) g.sac = prev.sac;
    return g;
  });
  const guest: GuestState = {
    vmId: vm.id,
    name: vm.config.name,
    dir,
    windows,
    imageType: opts.imageType,
    clone: opts.clone,
    hotNic: opts.hotNic,
    bootedAt: now,
    leaseAt: now + policy.leaseDelayMs,
    wedged: windows && opts.clone && policy.windowsApipaWedge,
    needsPnp: windows && opts.clone && !opts.hotNic && policy.windowsNeedsPnp,
    released: false,
    nics,
  };
  if (opts.previous?.hostname) guest.hostname = opts.previous.hostname;
  writeGuest(root, guest);
  fs.appendFileSync(consoleLogFile(root, dir, vm.id), bootLines(vm, opts.clone));
  const argv0 = dir === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
  const nodeStandin =
    opts.imageType === 'cloudimg' ||
    windows ||
    opts.knobs.guest?.serveVsock === true ||
    opts.knobs.standin !== undefined;
  const log = vmmLogFile(root, dir, vm.id);
  // The VM's cgroup scope (sim/cgroup.ts), under the caller's COCOON_CGROUP_PARENT.
  const scope = scopeDir(root, cgroupParent(io().env), vm.id);
  // A console (or vsock) server, or a load (standin knobs), needs node; everything else is a
  // `sleep` named like the VMM. A node stand-in keeps its scope's cpu.stat current.
  const pid = nodeStandin
    ? spawnDetached(
        root,
        { argv0, cmd: process.execPath, args: [STANDIN_NODE, root, vm.id, scope], log },
        'standin',
        vm.id,
      )
    : spawnDetached(root, { argv0, cmd: 'sleep', args: ['infinity'], log }, 'standin', vm.id);
  if (guest.leaseAt > now && nics.some((n) => n.dhcp)) ensureDhcpd(root, opts.leasesPath);
  if (pid) {
    fs.writeFileSync(pidFile(root, dir, vm.id), `${pid}\n`);
    createScope(root, scope, vm.id, pid, vm.config);
  }
  return pid;
}

/** After the record says running: grant the lease right away when no delay applies (else dhcpd does). */
export function finishBoot(root: string, leasesPath: string, vmId: string, knobs: Knobs): void {
  dhcpSync(root, leasesPath, vmId, knobs);
  // A Linux guest with a static address answers from boot (guestnet.ts; SAC ones on its sync).
  const g = readGuest(root, vmId);
  if (g && answers(knobs, g.name))
    guestNetChange(root, { add: g.nics.flatMap((n) => configuredAddress(g.windows, n) ?? []) });
}

/**
 * Kills the VM's processes and removes its cgroup scope, run dir, logs, guest state and static
 * addresses.
 */
export function destroyVmFiles(root: string, dir: BackendDir, vmId: string, pid: number): void {
  killTracked(root, pid);
  const recorded = Number(readPidFile(root, dir, vmId));
  if (recorded && recorded !== pid) killTracked(root, recorded);
  removeScopes(root, [vmId]);
  fs.rmSync(runDir(root, dir, vmId), { recursive: true, force: true });
  fs.rmSync(logDir(root, dir, vmId), { recursive: true, force: true });
  const leased = readGuest(root, vmId)?.nics.flatMap((n) => (n.leaseIp ? [n.leaseIp] : [])) ?? [];
  guestNetChange(root, { del: leased });
  removeGuest(root, vmId);
  releaseStatic(root, vmId);
  fs.rmSync(ownerFile(root, vmId), { force: true });
}

function readPidFile(root: string, dir: BackendDir, vmId: string): string {
  try {
    return fs.readFileSync(pidFile(root, dir, vmId), 'utf8').trim();
  } catch {
    return '';
  }
}

/** Owner of a `creating` placeholder or pending snapshot: "<pid> <start>" of the creator. */
export function writeOwner(root: string, key: string, pid: number, start: number): void {
  fs.mkdirSync(path.dirname(ownerFile(root, key)), { recursive: true });
  fs.writeFileSync(ownerFile(root, key), `${pid} ${start}\n`);
}

export function ownerAlive(root: string, key: string): boolean {
  let text: string;
  try {
    text = fs.readFileSync(ownerFile(root, key), 'utf8');
  } catch {
    return false;
  }
  const [pid, start] = text.trim().split(' ').map(Number);
  return isAlive(pid ?? 0, start);
}

/** MACs of the snapshot's source VM (config.json in its data dir), else derived from its id. */
export function sourceMacs(dataDir: string, snapshotId: string, count: number): string[] {
  const cfg = readJson<{ network_configs?: { mac?: string }[] } | null>(
    path.join(dataDir, 'config.json'),
    null,
  );
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    const mac = cfg?.network_configs?.[i]?.mac;
    if (mac) {
      out.push(mac.toLowerCase());
      continue;
    }
    const h = crypto.createHash('sha256').update(`${snapshotId}:${i}`).digest();
    out.push(['02', ...[...h.subarray(0, 5)].map((x) => x.toString(16).padStart(2, '0'))].join(':'));
  }
  return out;
}

/** Static seeds per NIC from the snapshot's config.json (`network_configs[i].network`). */
export function staticSeedsFrom(dataDir: string): (StaticNetwork | undefined)[] {
  const cfg = readJson<{ network_configs?: { network?: StaticNetwork | null }[] } | null>(
    path.join(dataDir, 'config.json'),
    null,
  );
  return (cfg?.network_configs ?? []).map((n) => (n.network?.ip ? n.network : undefined));
}

/** Live check used by rm/start: is the VM's stand-in running? */
export function vmProcessAlive(root: string, vm: VmRecord): boolean {
  return trackedAlive(root, vm.pid);
}

export function getVm(root: string, dir: BackendDir, id: string): VmRecord | undefined {
  return readVmDb(root, dir).vms[id];
}

export { updateVmDb };
