// The cocoon-net lease file writer (cocoon-cli.md §7.1): a pretty-printed JSON array of
// {mac, ip, expiry} (the literal `null` when empty), lower-case MACs, RFC 3339 second-precision
// expiry, written atomically (temp + rename, mode 0644), in random order.
import fs from 'node:fs';
import type { Knobs } from './knob-schema.ts';
import { withLock, writeAtomic } from './lock.ts';

export interface Lease {
  mac: string;
  ip: string;
  expiry: string;
}

/** How long expired entries linger before a write sweeps them (cocoon-net sweeps every 60 s). */
const LINGER_MS = 60_000;

export function readLeases(file: string): Lease[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  const doc = JSON.parse(text) as Lease[] | null;
  return Array.isArray(doc) ? doc : [];
}

function ipToInt(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}
function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** RFC 3339 with second precision, in UTC (`Z`) or at a fixed numeric offset like `+08:00`. */
export function formatExpiry(ms: number, offset = 'Z'): string {
  if (offset === 'Z') return `${new Date(Math.floor(ms / 1000) * 1000).toISOString().slice(0, 19)}Z`;
  const sign = offset[0] === '-' ? -1 : 1;
  const [h, m] = offset.slice(1).split(':').map(Number);
  const shifted = new Date(Math.floor(ms / 1000) * 1000 + sign * ((h ?? 0) * 60 + (m ?? 0)) * 60_000);
  return `${shifted.toISOString().slice(0, 19)}${offset}`;
}

export function expiryMs(expiry: string): number {
  return Date.parse(expiry);
}

export interface LeaseOptions {
  poolStart: string;
  poolEnd: string;
  ttlMs: number;
  offset: string;
  shuffle: boolean;
}

/** The pool of a root without a guest network of its own: the loopback guest network's
 * (guestnet.ts), whose addresses answer on this machine, so a probe of a lease from it can
 * never leave it. */
export const LOOPBACK_POOL = { start: '127.20.0.10', end: '127.20.3.254' } as const;

export function leaseOptions(knobs: Knobs): LeaseOptions {
  const d = knobs.dhcp ?? {};
  return {
    poolStart: d.pool?.start ?? LOOPBACK_POOL.start,
    poolEnd: d.pool?.end ?? LOOPBACK_POOL.end,
    ttlMs: (d.leaseTTLSeconds ?? 86_400) * 1000,
    offset: d.expiryOffset ?? 'Z',
    shuffle: d.shuffle ?? true,
  };
}

/** A MAC as the lease file and cocoon-net's API write it: six lower-case hex pairs. */
export const LEASE_MAC = /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/;

/** Reads, mutates and rewrites the lease file under its lock; sweeps long-expired entries. */
export function updateLeases<T>(
  file: string,
  opts: LeaseOptions,
  fn: (leases: Lease[], now: number) => T,
): T {
  return withLock(`${file}.lock`, () => {
    const now = Date.now();
    const leases = readLeases(file);
    const result = fn(leases, now);
    const kept = leases.filter((l) => {
      const exp = expiryMs(l.expiry);
      return !Number.isFinite(exp) || exp + LINGER_MS > now;
    });
    if (opts.shuffle) {
      for (let i = kept.length - 1; i > 0; i--) {
        const j = Math.floor(Math.random() * (i + 1));
        [kept[i], kept[j]] = [kept[j] as Lease, kept[i] as Lease];
      }
    }
    writeAtomic(file, kept.length === 0 ? 'null' : JSON.stringify(kept, null, 2), 0o644);
    return result;
  });
}

/**
 * Grants (or renews) a lease for `mac` inside an updateLeases callback. Keeps the MAC's
 * previous IP when it is still free, else takes the lowest free pool address. Returns the IP,
 * or undefined when the pool is exhausted.
 */
export function grantIn(leases: Lease[], mac: string, opts: LeaseOptions, now: number): string | undefined {
  const lower = mac.toLowerCase();
  const live = (l: Lease) => expiryMs(l.expiry) > now;
  const expiry = formatExpiry(now + opts.ttlMs, opts.offset);
  const own = leases.findIndex((l) => l.mac.toLowerCase() === lower);
  const takenByOthers = new Set(
    leases.filter((l) => l.mac.toLowerCase() !== lower && live(l)).map((l) => l.ip),
  );
  if (own >= 0) {
    const prev = leases[own] as Lease;
    leases.splice(own, 1);
    if (!takenByOthers.has(prev.ip)) {
      leases.push({ mac: lower, ip: prev.ip, expiry });
      return prev.ip;
    }
  }
  const present = new Set(leases.map((l) => l.ip));
  const start = ipToInt(opts.poolStart);
  const end = ipToInt(opts.poolEnd);
  let pick: number | undefined;
  for (let n = start; n <= end; n++) {
    if (!present.has(intToIp(n))) {
      pick = n;
      break;
    }
  }
  if (pick === undefined) {
    for (let n = start; n <= end; n++) {
      if (!takenByOthers.has(intToIp(n))) {
        pick = n;
        break;
      }
    }
  }
  if (pick === undefined) return undefined;
  const ip = intToIp(pick);
  // An expired entry of another MAC on this address is superseded.
  for (let i = leases.length - 1; i >= 0; i--) if ((leases[i] as Lease).ip === ip) leases.splice(i, 1);
  leases.push({ mac: lower, ip, expiry });
  return ip;
}

/** Removes the lease(s) of `mac`; returns how many were removed. */
export function releaseIn(leases: Lease[], mac: string): number {
  const lower = mac.toLowerCase();
  let n = 0;
  for (let i = leases.length - 1; i >= 0; i--) {
    if ((leases[i] as Lease).mac.toLowerCase() === lower) {
      leases.splice(i, 1);
      n += 1;
    }
  }
  return n;
}
