// The guests' network as the host sees it (docs/simulator.md, "Guest network"): the daemon's
// readiness probe pings each guest's IP (src/net/icmp.ts), so a simulated guest's address
// must answer ICMP echo while the guest runs with its lease and stay silent otherwise, and no
// probe may leave the machine.
//
// As root, each simulator root claims a /21 of 198.18.0.0/15 (RFC 2544's benchmarking range,
// never routed) and a network namespace `vksim<n>` joined to the host by a veth pair: the
// host end `vksim<n>` holds <block>.1/21, the namespace end `g0` holds one /32 per answering
// guest; the lower /22 is the lease pool, the upper one is for static networks. An address in
// the namespace answers (the kernel replies); any other address of the block is on-link and
// unanswered (ARP fails), so a silent guest times out like a hung one.
// Without root the guests get loopback addresses (127.20.0.0/21): they always answer and a
// test that asks for silence fails loudly.
//
// Nothing of the range leaves the machine: the first claim puts an `unreachable` route for
// all of 198.18.0.0/15 on the host (the claimed /21s are more specific and win), removed with
// the last claim. A static address a test gives a guest must be inside the root's guest network
// (checkStaticAddress): `cocoon-sim fixture snapshot --static-ip` refuses any other.
//
// An address is added when the guest gets its lease (guest.ts) and removed when the VM is
// removed, its lease released, or it stops answering on purpose (knob `icmp.silent`); the
// simulator's server re-derives the whole set every SYNC_INTERVAL_MS, which also catches a
// stand-in killed from outside and an expired lease.
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { VmDb } from './db.ts';
import { CliError } from './errors.ts';
import { type GuestNic, liveRecord, readGuest } from './guest.ts';
import { type Knobs, re } from './knobs.ts';
import { expiryMs, LOOPBACK_POOL, readLeases } from './leases.ts';
import { readJson, withLock, writeAtomic } from './lock.ts';
import { isAlive, selfStart } from './proc.ts';

export const SYNC_INTERVAL_MS = 2000;
const BLOCKS = 64; // /21 blocks in 198.18.0.0/15
const BASE = ipToInt('198.18.0.0');
const RANGE = '198.18.0.0/15';
const OWNERS = '/run/vk-cocoon-sim';
/** Claims, releases and sweeps of every root on the host go one at a time. */
const CLAIM_LOCK = path.join(OWNERS, 'claim.lock');
const GUEST_DEV = 'g0';

export interface GuestNet {
  kind: 'netns' | 'loopback';
  /** The namespace and the host end of the veth (netns kind). */
  netns?: string;
  subnet: string;
  poolStart: string;
  poolEnd: string;
  /** The upper half of the block, outside the lease pool: for the `networks` knob's static
   * networks (a test's static NICs answer from here). */
  staticSubnet: string;
}

const file = (root: string) => path.join(root, 'sim', 'guestnet.json');
const lockFile = (root: string) => path.join(root, 'sim', 'guestnet.lock');

export function ipToInt(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}
export function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}
export function inSubnet(addr: string, cidr: string): boolean {
  const [net, bits] = cidr.split('/');
  const size = 2 ** (32 - Number(bits));
  const start = ipToInt(net ?? '');
  return ipToInt(addr) >= start && ipToInt(addr) < start + size;
}

export function readGuestNet(root: string): GuestNet | undefined {
  return readJson<GuestNet | undefined>(file(root), undefined);
}

function ip(args: string[], input?: string): { ok: boolean; out: string } {
  const r = spawnSync('ip', args, { input, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'] });
  return { ok: r.status === 0, out: `${r.stdout ?? ''}${r.stderr ?? ''}`.trim() };
}

function must(args: string[]): void {
  const r = ip(args);
  if (!r.ok) throw new Error(`ip ${args.join(' ')}: ${r.out}`);
}

/** Whether this process can make namespaces: root with iproute2. */
export function canMakeNetns(): boolean {
  return process.getuid?.() === 0 && ip(['-V']).ok;
}

/** The pool of a loopback guest network (no root). */
const LOOPBACK: GuestNet = {
  kind: 'loopback',
  subnet: '127.20.0.0/21',
  poolStart: LOOPBACK_POOL.start,
  poolEnd: LOOPBACK_POOL.end,
  staticSubnet: '127.20.4.0/22',
};

/**
 * Claims a guest network for `root` and records it in <root>/sim/guestnet.json; namespaces of
 * owners that died are removed on the way. `netns: false` (or no root) gives the loopback one.
 */
export function claimGuestNet(root: string, opts: { netns?: boolean } = {}): GuestNet {
  let net = LOOPBACK;
  if ((opts.netns ?? true) && canMakeNetns()) {
    fs.mkdirSync(OWNERS, { recursive: true, mode: 0o700 });
    net = withLock(CLAIM_LOCK, () => claimBlock(root));
  }
  writeAtomic(file(root), JSON.stringify(net, null, 2));
  return net;
}

function claimBlock(root: string): GuestNet {
  sweepUnlocked();
  // The rest of the range goes nowhere (replace: idempotent, whoever put it there first).
  must(['route', 'replace', 'unreachable', RANGE]);
  const taken = new Set(fs.readdirSync(OWNERS).filter((n) => n.endsWith('.json')));
  const start = Math.floor(Math.random() * BLOCKS);
  for (let i = 0; i < BLOCKS; i++) {
    const b = (start + i) % BLOCKS;
    const name = `vksim${b}`;
    if (taken.has(`${name}.json`)) continue;
    if (!ip(['netns', 'add', name]).ok) continue; // made by someone outside this registry
    writeAtomic(
      path.join(OWNERS, `${name}.json`),
      JSON.stringify({ pid: process.pid, start: selfStart(), root }),
    );
    const base = BASE + b * 2048;
    const host = `${intToIp(base + 1)}/21`;
    const subnet = `${intToIp(base)}/21`;
    try {
      must(['link', 'add', name, 'type', 'veth', 'peer', 'name', GUEST_DEV, 'netns', name]);
      must(['addr', 'add', host, 'dev', name]);
      must(['link', 'set', name, 'up']);
      must(['-n', name, 'link', 'set', 'lo', 'up']);
      must(['-n', name, 'link', 'set', GUEST_DEV, 'up']);
      // An anchor outside the pool: the kernel flushes a device's routes when its last IPv4
      // address goes, which would leave every later guest address without a way back.
      must(['-n', name, 'addr', 'add', `${intToIp(base + 2)}/32`, 'dev', GUEST_DEV]);
      must(['-n', name, 'route', 'add', subnet, 'dev', GUEST_DEV]);
    } catch (err) {
      dropNetns(name);
      throw err;
    }
    return {
      kind: 'netns',
      netns: name,
      subnet,
      poolStart: intToIp(base + 10),
      poolEnd: intToIp(base + 1022),
      staticSubnet: `${intToIp(base + 1024)}/22`,
    };
  }
  throw new Error(`no free guest network in 198.18.0.0/15 (${BLOCKS} roots hold one each)`);
}

function dropNetns(name: string): void {
  ip(['netns', 'del', name]); // removes the veth pair with it
  fs.rmSync(path.join(OWNERS, `${name}.json`), { force: true });
  // The last claim gone: the range's unreachable route goes with it.
  if (!fs.readdirSync(OWNERS).some((n) => n.endsWith('.json'))) ip(['route', 'del', 'unreachable', RANGE]);
}

/** Removes the namespaces whose owning process is gone (a run that was killed). */
export function sweepDeadOwners(): void {
  if (fs.existsSync(OWNERS)) withLock(CLAIM_LOCK, sweepUnlocked);
}

function sweepUnlocked(): void {
  let names: string[] = [];
  try {
    names = fs.readdirSync(OWNERS).filter((n) => n.endsWith('.json'));
  } catch {
    return;
  }
  for (const n of names) {
    const owner = readJson<{ pid?: number; start?: number } | undefined>(path.join(OWNERS, n), undefined);
    if (owner?.pid && isAlive(owner.pid, owner.start)) continue;
    dropNetns(n.slice(0, -5));
  }
}

/** Gives back the root's guest network (its namespace and veth pair). */
export function releaseGuestNet(root: string): void {
  const net = readGuestNet(root);
  if (net?.kind === 'netns' && net.netns) {
    const owner = readJson<{ root?: string } | undefined>(path.join(OWNERS, `${net.netns}.json`), undefined);
    if (owner?.root === root) withLock(CLAIM_LOCK, () => dropNetns(net.netns as string));
  }
  fs.rmSync(file(root), { force: true });
}

/** A NIC's address that is not a lease: set through SAC (Windows), or a Linux guest's static
 * address, which it applies itself at boot (guest.ts, guestAddress). */
export function configuredAddress(windows: boolean, nic: GuestNic): string | undefined {
  return nic.sac?.ip ?? (!windows && !nic.dhcp ? nic.staticIp : undefined);
}

/** Refuses a static guest address outside the root's guest network (a fixture's
 * `--static-ip`): the daemon's probe pings what a guest holds, and an address elsewhere would
 * route off the machine. */
export function checkStaticAddress(root: string, addr: string): void {
  const net = readGuestNet(root);
  if (net && !inSubnet(addr, net.subnet))
    throw new CliError(
      `static address ${addr} is outside the guest network ${net.subnet}: use one of ${net.staticSubnet} (the readiness probe pings guest addresses, and no probe may leave the machine)`,
    );
}

/** Refuses guest addresses outside the guest network: the probe would ping them wherever they
 * route, off the machine included. */
export function checkNetworks(net: GuestNet, knobs: Knobs): void {
  const pool = knobs.dhcp?.pool;
  if (pool && !(inSubnet(pool.start, net.subnet) && inSubnet(pool.end, net.subnet)))
    throw new CliError(
      `sim config: dhcp.pool ${pool.start}-${pool.end} is outside the guest network ${net.subnet}`,
    );
  for (const [name, n] of Object.entries(knobs.networks ?? {})) {
    const [addr, bits] = n.subnet.split('/');
    const last = intToIp(ipToInt(addr ?? '') + 2 ** (32 - Number(bits)) - 1);
    if (!inSubnet(addr ?? '', net.subnet) || !inSubnet(last, net.subnet))
      throw new CliError(
        `sim config: networks.${name}.subnet ${n.subnet} is outside the guest network ${net.subnet}`,
      );
  }
}

/** True when the guest named `name` answers ICMP under these knobs. */
export function answers(knobs: Knobs, name: string): boolean {
  const silent = knobs.icmp?.silent;
  return silent === undefined || !re(silent).test(name);
}

/** Refuses `icmp.silent` where it cannot be honoured (loopback guest addresses always answer). */
export function checkIcmpKnobs(root: string, knobs: Knobs): void {
  if (knobs.icmp?.silent !== undefined && readGuestNet(root)?.kind !== 'netns')
    throw new CliError('icmp.silent needs the guest network namespace (run the simulator as root)');
}

function apply(net: GuestNet, add: readonly string[], del: readonly string[]): void {
  if (net.kind !== 'netns' || !net.netns || add.length + del.length === 0) return;
  const lines = [
    ...del.map((a) => `address del ${a}/32 dev ${GUEST_DEV}`),
    ...add.map((a) => `address add ${a}/32 dev ${GUEST_DEV}`),
  ];
  // -force: an address already there (or already gone) does not stop the rest.
  ip(['-n', net.netns, '-force', '-batch', '-'], `${lines.join('\n')}\n`);
}

/** Adds and removes guest addresses now (a lease granted or released, a VM removed). */
export function guestNetChange(
  root: string,
  change: { add?: readonly string[]; del?: readonly string[] },
): void {
  const net = readGuestNet(root);
  if (net?.kind !== 'netns') return;
  withLock(lockFile(root), () => {
    apply(net, change.add ?? [], change.del ?? []);
    // A new stamp: the next sync reads the namespace again.
    fs.writeFileSync(stampFile(root), randomUUID());
  });
}

/** The guest addresses the namespace holds: the pool's and the static ones (the anchor below
 * the pool is not one). */
function present(net: GuestNet): Set<string> {
  const r = ip(['-n', net.netns ?? '', '-4', '-o', 'addr', 'show', 'dev', GUEST_DEV]);
  const lo = ipToInt(net.poolStart);
  const all = [...r.out.matchAll(/inet (\d+\.\d+\.\d+\.\d+)\/32/g)].map((m) => m[1] as string);
  return new Set(all.filter((a) => ipToInt(a) >= lo && inSubnet(a, net.subnet)));
}

/**
 * Re-derives the answering set: every running guest (stand-in alive) that answers under the
 * knobs, for each NIC whose lease is still its own and unexpired in the lease file.
 */
export function guestNetSync(root: string, leasesPath: string, knobs: Knobs): void {
  const net = readGuestNet(root);
  if (net?.kind !== 'netns') return;
  // The lease file's lock first, as a grant takes it (guest.ts adds the address before it
  // writes the lease): the set is never derived between the two.
  withLock(`${leasesPath}.lock`, () =>
    withLock(lockFile(root), () => {
      const now = Date.now();
      const leased = new Map<string, string>();
      for (const l of readLeases(leasesPath))
        if (expiryMs(l.expiry) > now) leased.set(l.mac.toLowerCase(), l.ip);
      const want = new Set<string>();
      let names: string[] = [];
      try {
        names = fs.readdirSync(path.join(root, 'sim', 'guests')).filter((n) => n.endsWith('.json'));
      } catch {
        // no guests yet
      }
      const dbs = new Map<string, VmDb>();
      for (const n of names) {
        const g = readGuest(root, n.slice(0, -5));
        if (!g || !answers(knobs, g.name) || !liveRecord(root, g, dbs)) continue;
        for (const nic of g.nics) {
          const fixed = configuredAddress(g.windows, nic);
          if (fixed) want.add(fixed);
          else if (nic.leaseIp && leased.get(nic.guestMac.toLowerCase()) === nic.leaseIp)
            want.add(nic.leaseIp);
        }
      }
      // The namespace changes only through this module (apply and guestNetChange, which bumps
      // the change stamp): the same set as last time with no change since needs no `ip`.
      const key = [...want].sort().join(',');
      const stamp = changeStamp(root);
      const last = lastSync.get(root);
      if (last && last.key === key && last.stamp === stamp && now - last.at < FULL_SYNC_MS) return;
      const have = present(net);
      apply(
        net,
        [...want].filter((a) => !have.has(a)),
        [...have].filter((a) => !want.has(a)),
      );
      lastSync.set(root, { key, stamp: changeStamp(root), at: now });
    }),
  );
}

/** The last sync of each root this process made: its set, the change stamp it saw, when. */
const lastSync = new Map<string, { key: string; stamp: string; at: number }>();
/** A sync reads the namespace (`ip addr`) at least this often, changed or not. */
const FULL_SYNC_MS = 30_000;
const stampFile = (root: string) => path.join(root, 'sim', 'guestnet.stamp');

/** The change stamp: a fresh value written by every change of the namespace's addresses. Its
 * content, not its mtime: file times move in kernel ticks, so two changes a few milliseconds
 * apart could leave the same mtime and a sync would skip the second. */
function changeStamp(root: string): string {
  try {
    return fs.readFileSync(stampFile(root), 'utf8');
  } catch {
    return '';
  }
}
