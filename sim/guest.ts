// The simulated guest: what MAC each NIC presents, whether its DHCP client is wedged, and the
// lease it holds. Kept per VM in <root>/sim/guests/<vmID>.json (never in cocoon's own DBs).
//
// A DHCP NIC's lease is granted at max(leaseAt, the moment the last blocker is lifted), where
// leaseAt = boot time + dhcp.leaseDelayMs: by the per-root DHCP server (dhcpd.ts) at leaseAt, or
// right away by the CLI process whose action lifted the last blocker. Blockers: dhcp.never; a Windows clone wedged on
// APIPA (until an `ipconfig /renew` effect); a Windows clone whose NIC needs a PnP rebind; an
// explicit release (until a renew). The lease is keyed by the MAC the guest presents, which for
// a Firecracker clone under dhcp.keyByGuestMac is the snapshot's MAC until a fixMac effect.
import fs from 'node:fs';
import { readVmDb, type VmDb } from './db.ts';
import { answers, guestNetChange } from './guestnet.ts';
import { dhcpPolicy, type Knobs } from './knobs.ts';
import { grantIn, type LeaseOptions, leaseOptions, releaseIn, updateLeases } from './leases.ts';
import { readJson, withLock, writeAtomic } from './lock.ts';
import type { BackendDir } from './paths.ts';
import { guestFile, guestLock } from './paths.ts';
import { trackedAlive } from './pids.ts';

export interface GuestNic {
  /** The MAC cocoon configured (the record's network_configs[i].mac). */
  mac: string;
  /** The MAC the guest OS presents on the wire. */
  guestMac: string;
  dhcp: boolean;
  staticIp?: string;
  prefix?: number;
  gateway?: string;
  /** The IP of the lease this NIC currently holds. */
  leaseIp?: string;
  /** Address set through the SAC console (`i <n> <ip> <mask> <gw>`). */
  sac?: { ip: string; mask: string; gateway: string };
}

export interface GuestState {
  vmId: string;
  name: string;
  dir: BackendDir;
  windows: boolean;
  imageType: string;
  clone: boolean;
  /** The NIC was hot-added by `vm clone --nics` (no PnP rebind needed). */
  hotNic: boolean;
  bootedAt: number;
  leaseAt: number;
  wedged: boolean;
  needsPnp: boolean;
  released: boolean;
  /** Set once every DHCP NIC got its lease for this boot (the DHCP server stops looking). */
  dhcpDone?: boolean;
  hostname?: string;
  nics: GuestNic[];
}

export function readGuest(root: string, vmId: string): GuestState | undefined {
  return readJson<GuestState | undefined>(guestFile(root, vmId), undefined);
}

export function writeGuest(root: string, g: GuestState): void {
  writeAtomic(guestFile(root, g.vmId), JSON.stringify(g, null, 2));
}

export function updateGuest<T>(root: string, vmId: string, fn: (g: GuestState) => T): T | undefined {
  return withLock(guestLock(root, vmId), () => {
    const g = readGuest(root, vmId);
    if (!g) return undefined;
    const out = fn(g);
    writeGuest(root, g);
    return out;
  });
}

export function removeGuest(root: string, vmId: string): void {
  fs.rmSync(guestFile(root, vmId), { force: true });
  fs.rmSync(guestLock(root, vmId), { force: true });
}

export interface GrantResult {
  granted: { mac: string; ip: string }[];
  blocked?: string;
}

/** Why the guest's DHCP client cannot get a lease right now (undefined: it can). */
export function blocker(g: GuestState, knobs: Knobs, now: number): string | undefined {
  const policy = dhcpPolicy(knobs, g.name);
  if (policy.never) return 'dhcp.never';
  if (g.released) return 'released';
  if (g.wedged) return 'windows APIPA wedge';
  if (g.needsPnp) return 'windows NIC needs PnP rebind';
  if (now < g.leaseAt) return `lease delay (${g.leaseAt - now} ms left)`;
  return undefined;
}

/** The running VM's record, or undefined when it is gone or its stand-in is dead. `dbs`
 * caches each backend's VM DB across the calls of one pass over many guests (one read each
 * instead of one per guest). */
export function liveRecord(root: string, g: GuestState, dbs?: Map<string, VmDb>) {
  let db = dbs?.get(g.dir);
  if (!db) {
    db = readVmDb(root, g.dir);
    dbs?.set(g.dir, db);
  }
  const vm = db.vms[g.vmId];
  if (vm?.state !== 'running' || !trackedAlive(root, vm.pid)) return undefined;
  return vm;
}

/**
 * Lets the guest's DHCP client act now: grants or renews a lease for every DHCP NIC unless
 * something blocks it. Idempotent; called by the stand-in at leaseAt and after guest effects.
 */
export function dhcpSync(root: string, leasesPath: string, vmId: string, knobs: Knobs): GrantResult {
  const opts = leaseOptions(knobs);
  const result = withLock(guestLock(root, vmId), (): GrantResult => {
    const g = readGuest(root, vmId);
    if (!g) return { granted: [], blocked: 'no guest' };
    if (!liveRecord(root, g)) return { granted: [], blocked: 'vm not running' };
    const why = blocker(g, knobs, Date.now());
    if (why) return { granted: [], blocked: why };
    // The guest answers ICMP from the moment it holds its address (guestnet.ts): the address
    // is up before the lease file shows the lease, so a probe sent on seeing it gets its echo.
    const granted = grantAll(leasesPath, opts, g, (ips) => {
      if (answers(knobs, g.name)) guestNetChange(root, { add: ips });
    });
    if (granted.length === g.nics.filter((n) => n.dhcp).length) g.dhcpDone = true;
    writeGuest(root, g);
    return { granted };
  });
  return result;
}

/** Grants the guest's DHCP NICs their leases; `beforeWrite` runs with the granted addresses
 * before the lease file is written. */
function grantAll(
  leasesPath: string,
  opts: LeaseOptions,
  g: GuestState,
  beforeWrite: (ips: string[]) => void,
): { mac: string; ip: string }[] {
  return updateLeases(leasesPath, opts, (leases, now) => {
    const out: { mac: string; ip: string }[] = [];
    for (const nic of g.nics) {
      if (!nic.dhcp) continue;
      const ip = grantIn(leases, nic.guestMac, opts, now);
      if (ip) {
        nic.leaseIp = ip;
        out.push({ mac: nic.guestMac, ip });
      }
    }
    if (out.length > 0) beforeWrite(out.map((x) => x.ip));
    return out;
  });
}

/** Releases every DHCP NIC's lease; the guest stays without an address until a renew. */
export function dhcpRelease(root: string, leasesPath: string, vmId: string, knobs: Knobs): void {
  const opts = leaseOptions(knobs);
  updateGuest(root, vmId, (g) => {
    const gone: string[] = [];
    updateLeases(leasesPath, opts, (leases) => {
      for (const nic of g.nics) {
        if (!nic.dhcp) continue;
        releaseIn(leases, nic.guestMac);
        if (nic.leaseIp) gone.push(nic.leaseIp);
        delete nic.leaseIp;
      }
    });
    g.released = true;
    guestNetChange(root, { del: gone });
  });
}

/** The address the guest shows for NIC i (SAC `i`, ipconfig output). */
export function guestAddress(
  nic: GuestNic,
  index: number,
  windows: boolean,
): { ip: string; mask: string; gateway: string } {
  if (nic.sac) return nic.sac;
  if (nic.leaseIp) return { ip: nic.leaseIp, mask: '255.255.0.0', gateway: '172.20.0.1' };
  // A Linux guest applies its static config itself; Windows needs SAC (APIPA until then).
  if (!windows && !nic.dhcp && nic.staticIp && nic.prefix !== undefined) {
    return { ip: nic.staticIp, mask: prefixToMask(nic.prefix), gateway: nic.gateway ?? '0.0.0.0' };
  }
  const tail = nic.mac.split(':').map((h) => Number.parseInt(h, 16));
  return {
    ip: `169.254.${tail[4] ?? index}.${Math.max(1, tail[5] ?? 1)}`,
    mask: '255.255.0.0',
    gateway: '0.0.0.0',
  };
}

export function prefixToMask(prefix: number): string {
  const bits = prefix <= 0 ? 0 : prefix >= 32 ? 0xffffffff : (0xffffffff << (32 - prefix)) >>> 0;
  return [bits >>> 24, (bits >>> 16) & 255, (bits >>> 8) & 255, bits & 255].join('.');
}
