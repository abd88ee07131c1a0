// The pure half of the cocoon-net lease file (docs/contracts/cocoon-cli.md "Lease file") and
// VM IP resolution (docs/contracts/lifecycle.md "IP resolution"): the row and file parsers
// (rows cached by their text), RFC 3339 times, MAC normalisation, the lease of a NIC and the IP
// of a VM. The reader and its change notification are in leases.ts.
import { isIP } from 'node:net';

/** One live-or-expired DHCP lease. */
export interface Lease {
  /** Lower-case colon form, e.g. `82:f7:df:93:90:f3`. */
  readonly mac: string;
  readonly ip: string;
  /** Expiry in epoch milliseconds. */
  readonly expiresAtMs: number;
}

/**
 * The outcome of reading the lease file. `ok: true` with no matching lease means "no lease"
 * (clears a cached IP); `ok: false` is any other read error (keep the cached IP, docs/contracts/lifecycle.md "IP resolution").
 */
export type LeaseSnapshot =
  | { readonly ok: true; readonly leases: readonly Lease[] }
  | { readonly ok: false; readonly error: string };

/**
 * Normalises a MAC to lower-case colon form. Accepts the 6-byte forms Go's `net.ParseMAC`
 * accepts (`aa:bb:..`, `aa-bb-..`, `aabb.ccdd.eeff`), any case; `undefined` otherwise.
 */
export function normalizeMac(mac: string): string | undefined {
  let hex: string | undefined;
  if (/^[0-9a-f]{2}([:-])[0-9a-f]{2}(\1[0-9a-f]{2}){4}$/i.test(mac)) hex = mac.replace(/[:-]/g, '');
  else if (/^[0-9a-f]{4}\.[0-9a-f]{4}\.[0-9a-f]{4}$/i.test(mac)) hex = mac.replaceAll('.', '');
  if (hex === undefined) return undefined;
  return hex.toLowerCase().match(/../g)!.join(':');
}

const RFC3339 =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))$/;

const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

function daysInMonth(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  return month === 2 && leap ? 29 : DAYS_IN_MONTH[month - 1]!;
}

/**
 * Parses an RFC 3339 timestamp (`2026-08-12T09:30:00Z`, `2026-08-12T08:02:11+08:00`, optional
 * fractional seconds) to epoch milliseconds; `undefined` when malformed or out of range
 * (Go's `time.Parse(time.RFC3339, …)` rules: no leap second, offset hours < 24).
 *
 * Hand-written because `Date.parse` is both too lenient (it accepts non-RFC 3339 forms such as
 * `2026-08-12`, and implementation-defined ones) and rolls invalid dates over; a malformed
 * expiry must make the row unparsable (skipped), not silently mean another instant.
 */
export function parseRfc3339(text: string): number | undefined {
  const m = RFC3339.exec(text);
  if (m === null) return undefined;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  if (month < 1 || month > 12 || day < 1 || day > daysInMonth(year, month)) return undefined;
  if (hour > 23 || minute > 59 || second > 59) return undefined;
  let offsetMinutes = 0;
  if (m[8] === undefined) {
    const offsetHour = Number(m[10]);
    const offsetMinute = Number(m[11]);
    if (offsetHour > 23 || offsetMinute > 59) return undefined;
    offsetMinutes = (m[9] === '-' ? -1 : 1) * (offsetHour * 60 + offsetMinute);
  }
  const millis = m[7] === undefined ? 0 : Math.floor(Number(`0${m[7]}`) * 1000);
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  date.setUTCHours(hour, minute, second, millis);
  return date.getTime() - offsetMinutes * 60_000;
}

/** Parsed rows by their text. Every lease change rewrites the whole file, so a node of N VMs
 * re-reads N rows per change; nearly all are unchanged, and parsing them again made the
 * reading O(N²) over a burst (the third cost in the 200-pod profile, docs/benchmarks.md).
 * Bounded: cleared when it grows past ROW_CACHE_MAX (a few rows per live VM). */
const rowCache = new Map<string, Lease | null>();
const ROW_CACHE_MAX = 16_384;

/** A row is an object with string `mac`, `ip` and `expiry` (other keys ignored). Checked by
 * hand, not with a schema: every lease change re-reads every row of the file, and a schema's
 * result objects per row were a tenth of what a 300-pod burst allocated (docs/decisions.md
 * "Daemon memory"). */
function parseRow(row: unknown): Lease | null {
  if (typeof row !== 'object' || row === null || Array.isArray(row)) return null;
  const { mac: rawMac, ip, expiry } = row as { mac?: unknown; ip?: unknown; expiry?: unknown };
  if (typeof rawMac !== 'string' || typeof ip !== 'string' || typeof expiry !== 'string') return null;
  const key = `${rawMac}\n${ip}\n${expiry}`;
  const hit = rowCache.get(key);
  if (hit !== undefined) return hit;
  const mac = normalizeMac(rawMac);
  const expiresAtMs = parseRfc3339(expiry);
  const lease =
    mac === undefined || expiresAtMs === undefined || isIP(ip) === 0
      ? null
      : Object.freeze({ mac, ip, expiresAtMs });
  if (rowCache.size >= ROW_CACHE_MAX) rowCache.clear();
  rowCache.set(key, lease);
  return lease;
}

/**
 * Parses the lease file text (docs/contracts/cocoon-cli.md "Format"–docs/contracts/cocoon-cli.md "Reader rules"). Empty text, `null` and `[]` mean no
 * lease. Rows with a malformed MAC, IP or expiry are skipped. Text that is not JSON, or JSON
 * that is not an array or `null`, is a read error.
 */
export function parseLeaseFile(text: string): LeaseSnapshot {
  if (text.trim() === '') return { ok: true, leases: [] };
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    return { ok: false, error: `lease file: invalid JSON: ${(error as Error).message}` };
  }
  if (json === null) return { ok: true, leases: [] };
  if (!Array.isArray(json)) return { ok: false, error: 'lease file: expected a JSON array or null' };
  const leases: Lease[] = [];
  for (const row of json) {
    const lease = parseRow(row);
    if (lease) leases.push(lease);
  }
  return { ok: true, leases };
}

/**
 * The live lease of `mac` at `nowMs`, matched case-insensitively after normalising to colon
 * form. Expired means `nowMs > expiry` (Go's `now.After(expiry)`). Should several live rows
 * exist for one MAC (the file promises at most one), the one expiring last wins.
 */
export function findLease(leases: readonly Lease[], mac: string, nowMs: number): Lease | undefined {
  const wanted = normalizeMac(mac);
  if (wanted === undefined) return undefined;
  let best: Lease | undefined;
  for (const lease of leases) {
    if (lease.mac !== wanted || nowMs > lease.expiresAtMs) continue;
    if (best === undefined || lease.expiresAtMs > best.expiresAtMs) best = lease;
  }
  return best;
}

/** The NIC facts IP resolution needs (a `VmNic` from `records.ts` fits). */
export interface NicAddressing {
  readonly mac: string;
  readonly static?: { readonly ip: string } | undefined;
}

export interface IpResolution {
  /** The resolved IP; `''` when none. */
  readonly ip: string;
  /** Where it came from; `cached` means the lease file could not be read (docs/contracts/lifecycle.md "IP resolution"). */
  readonly source: 'static' | 'lease' | 'none' | 'cached';
}

/**
 * Resolves the VM IP (docs/contracts/lifecycle.md "IP resolution"): NIC 0 static ⇒ its static IP (never overridden by a
 * lease); otherwise NIC 0's MAC in the lease file: found ⇒ the lease IP; no lease ⇒ `''`
 * (which clears a cached IP: cocoon-net can rebind a MAC); a read error ⇒ `cachedIp`.
 */
export function resolveIp(
  vm: { readonly nics: readonly NicAddressing[] },
  leases: LeaseSnapshot,
  nowMs: number,
  cachedIp = '',
): IpResolution {
  const nic0 = vm.nics[0];
  if (nic0 === undefined) return { ip: '', source: 'none' };
  if (nic0.static !== undefined && nic0.static.ip !== '') return { ip: nic0.static.ip, source: 'static' };
  if (!leases.ok) return { ip: cachedIp, source: 'cached' };
  const lease = findLease(leases.leases, nic0.mac, nowMs);
  return lease === undefined ? { ip: '', source: 'none' } : { ip: lease.ip, source: 'lease' };
}
