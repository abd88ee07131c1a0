/**
 * cocoon-net lease file (docs/contracts/cocoon-cli.md "Lease file") and VM IP resolution (docs/contracts/lifecycle.md "IP resolution").
 *
 * Everything here is pure except {@link LeaseFile}, a small cached reader (stat + read) that
 * also tells its listeners when the file changes (a watch on its directory, a slow poll as
 * the safety net), and {@link LeaseWait}, one waiter's view of those changes.
 */
import { type BigIntStats, statSync, watch } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { open } from 'node:fs/promises';
import { isIP } from 'node:net';
import { basename, dirname } from 'node:path';
import type { Logger } from '../log.ts';

/** Default lease file path (`VK_LEASES_PATH`). */
export const DEFAULT_LEASES_PATH = '/var/lib/cocoon/net/leases.json';
/** Safety-net poll of the lease file while anyone listens for changes: catches what the
 * directory watch misses (no watch possible, the directory replaced, a lost event). */
export const LEASE_POLL_MS = 1000;
/** Directory events within this window after the first one share one read (cocoon-net's
 * write-temp-then-rename makes several events per update). */
export const LEASE_DEBOUNCE_MS = 2;

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

/** A missing lease file: "no lease" (one object, so an unchanged absence is no change). */
const NO_LEASES: LeaseSnapshot = Object.freeze({ ok: true, leases: Object.freeze([]) as readonly Lease[] });

/** Same content for change detection: the cached reader returns the same object while the
 * file is unchanged; read errors compare by message. */
function sameSnapshot(a: LeaseSnapshot | undefined, b: LeaseSnapshot): boolean {
  if (a === b) return true;
  return a !== undefined && !a.ok && !b.ok && a.error === b.error;
}

export type LeaseListener = (snapshot: LeaseSnapshot) => void;

/** The part of `fs.FSWatcher` the lease file uses. */
export interface DirWatcher {
  close(): void;
  on(event: 'error', listener: (err: Error) => void): unknown;
}

/** Starts watching a directory (`fs.watch`, non-persistent, by default); throws like it. */
export type WatchDir = (dir: string, onEvent: (event: string, file: string | null) => void) => DirWatcher;

const watchDir: WatchDir = (dir, onEvent) =>
  watch(dir, { persistent: false }, (event, file) => onEvent(event, file === null ? null : String(file)));

export interface LeaseFileOptions {
  /** Safety-net poll interval while anyone listens (default LEASE_POLL_MS). */
  pollMs?: number;
  /** Coalescing window after a directory event (default LEASE_DEBOUNCE_MS). */
  debounceMs?: number;
  /** Where "cannot watch, polling only" is reported (once). */
  log?: Logger;
  /** Replaces `fs.watch` (tests). */
  watchDir?: WatchDir;
}

function statKey(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.mtimeNs}:${st.size}`;
}

/**
 * Cached reader of the lease file (docs/contracts/cocoon-cli.md "Reader rules"): re-stats on every {@link read} and
 * re-parses only when the file's inode, mtime or size changed. Stat and read go through one file
 * handle, so the cache key always describes the bytes parsed (the writer renames atomically).
 * A missing file is "no lease"; any other failure is a read error and is not cached.
 *
 * Change notification ({@link onChange}, {@link subscribe}): while at least one listener
 * exists, the file's DIRECTORY is watched (cocoon-net replaces the file by rename, so a watch
 * on the file's inode would die with the first update) and a slow poll runs as the safety
 * net. Each change costs one read, whose snapshot every listener receives. A directory that
 * does not exist yet, or a watch that fails, leaves the poll alone (logged once); every poll
 * tick tries to (re-)establish the watch, also when the directory was replaced. The watch
 * and the poll stop when the last listener leaves, and at {@link close}: nothing is leaked.
 */
export class LeaseFile {
  readonly path: string;
  #key = '';
  #cached: LeaseSnapshot | undefined;
  /** The read through a file handle in progress (one at a time). */
  #handleRead: Promise<LeaseSnapshot> | undefined;
  readonly #pollMs: number;
  readonly #debounceMs: number;
  readonly #log: Logger | undefined;
  readonly #watchDir: WatchDir;
  readonly #listeners = new Set<LeaseListener>();
  #watcher: DirWatcher | undefined;
  /** `dev:ino` of the watched directory: a replaced directory needs a new watch. */
  #watchedDir = '';
  #poll: NodeJS.Timeout | undefined;
  #debounce: NodeJS.Timeout | undefined;
  #reading = false;
  #again = false;
  /** The last snapshot delivered to the listeners (while watching). */
  #current: LeaseSnapshot | undefined;
  readonly #logged = new Set<string>();
  #closed = false;

  constructor(path: string = DEFAULT_LEASES_PATH, opts: LeaseFileOptions = {}) {
    this.path = path;
    this.#pollMs = opts.pollMs ?? LEASE_POLL_MS;
    this.#debounceMs = opts.debounceMs ?? LEASE_DEBOUNCE_MS;
    this.#log = opts.log?.child({ module: 'leases', path });
    this.#watchDir = opts.watchDir ?? watchDir;
  }

  async read(): Promise<LeaseSnapshot> {
    // A read that finds another one going on waits for it and checks the cache again: that
    // read started before this call, so only a check made after it says what the file holds
    // now. N reconciles woken by one change thus read and parse the file once, not N times.
    for (;;) {
      const hit = this.#cacheHit();
      if (hit !== undefined) return hit;
      const running = this.#handleRead;
      if (running === undefined) break;
      await running.then(
        () => {},
        () => {},
      );
    }
    const read = this.#readThroughHandle();
    this.#handleRead = read;
    try {
      return await read;
    } finally {
      if (this.#handleRead === read) this.#handleRead = undefined;
    }
  }

  /** The cached snapshot when the path still holds the bytes it was parsed from. Checked
   * with one synchronous stat of the path: every probe (each pod every 5 s) and every
   * reconcile reads the file, and open + fstat + close cost ~160 µs of CPU (three thread-pool
   * round trips, a FileHandle) where a stat costs ~3 µs, which made the reads the largest
   * cost of an idle node (docs/decisions.md "Daemon memory"). Anything else (changed,
   * missing, an error) is left to the handle read, where stat and read describe the same
   * bytes. */
  #cacheHit(): LeaseSnapshot | undefined {
    if (this.#cached === undefined) return undefined;
    let st: BigIntStats | undefined;
    try {
      st = statSync(this.path, { bigint: true, throwIfNoEntry: false });
    } catch {
      return undefined;
    }
    return st !== undefined && statKey(st) === this.#key ? this.#cached : undefined;
  }

  async #readThroughHandle(): Promise<LeaseSnapshot> {
    let handle: FileHandle | undefined;
    try {
      handle = await open(this.path, 'r');
      const key = statKey(await handle.stat({ bigint: true }));
      if (this.#cached !== undefined && key === this.#key) return this.#cached;
      const snapshot = parseLeaseFile(await handle.readFile('utf8'));
      if (snapshot.ok) {
        this.#key = key;
        this.#cached = snapshot;
      }
      return snapshot;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') {
        this.#key = '';
        this.#cached = undefined;
        return NO_LEASES;
      }
      return { ok: false, error: `lease file ${this.path}: ${(error as Error).message}` };
    } finally {
      await handle?.close();
    }
  }

  /** Reads (cached) and resolves the VM IP in one step (docs/contracts/lifecycle.md "IP resolution"). */
  async resolve(
    vm: { readonly nics: readonly NicAddressing[] },
    nowMs: number,
    cachedIp = '',
  ): Promise<IpResolution> {
    const nic0 = vm.nics[0];
    if (nic0?.static !== undefined && nic0.static.ip !== '') return { ip: nic0.static.ip, source: 'static' };
    return resolveIp(vm, await this.read(), nowMs, cachedIp);
  }

  /** The snapshot last delivered to the listeners; undefined while nobody listens or before
   * the first read after the first listener came. */
  get current(): LeaseSnapshot | undefined {
    return this.#current;
  }

  /** True while the directory watch is established (polling alone otherwise). */
  get watching(): boolean {
    return this.#watcher !== undefined;
  }

  /** Calls `listener` with the new snapshot whenever the file's content changes (a read
   * error counts as a change; the first delivery after the watch starts may repeat what the
   * caller saw). Returns the unsubscribe function. After {@link close} nothing is delivered. */
  onChange(listener: LeaseListener): () => void {
    if (this.#closed) return () => {};
    this.#listeners.add(listener);
    if (this.#listeners.size === 1) this.#start();
    return () => {
      if (!this.#listeners.delete(listener)) return;
      if (this.#listeners.size === 0) this.#stop();
    };
  }

  /** One waiter's view of the file's changes; close it (or `using`) when done. */
  subscribe(): LeaseWait {
    return new LeaseWait(this);
  }

  /** Stops watching and polling for good and drops every listener (shutdown). */
  close(): void {
    this.#closed = true;
    this.#listeners.clear();
    this.#stop();
  }

  #start(): void {
    this.#tryWatch();
    this.#poll = setInterval(() => this.#tick(), this.#pollMs);
    this.#poll.unref();
    this.#refresh();
  }

  #stop(): void {
    clearInterval(this.#poll);
    this.#poll = undefined;
    clearTimeout(this.#debounce);
    this.#debounce = undefined;
    this.#unwatch();
    this.#current = undefined;
  }

  #tick(): void {
    if (this.#watcher !== undefined && this.#dirId() !== this.#watchedDir) this.#unwatch();
    if (this.#watcher === undefined) this.#tryWatch();
    this.#refresh();
  }

  #dirId(): string {
    try {
      const st = statSync(dirname(this.path));
      return `${st.dev}:${st.ino}`;
    } catch {
      return '';
    }
  }

  #tryWatch(): void {
    const dir = dirname(this.path);
    const name = basename(this.path);
    try {
      const id = this.#dirId();
      const watcher = this.#watchDir(dir, (_event, file) => {
        // Events for other files of the directory (cocoon-net's temp file) do not count;
        // platforms that report no name count every event.
        if (file !== null && file !== name) return;
        this.#changed();
      });
      watcher.on('error', (err) => {
        if (this.#watcher !== watcher) return;
        this.#unwatch();
        this.#once('watch-error', err);
        this.#refresh();
      });
      this.#watcher = watcher;
      this.#watchedDir = id;
    } catch (err) {
      this.#once((err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no-dir' : 'watch-error', err);
    }
  }

  #unwatch(): void {
    const w = this.#watcher;
    this.#watcher = undefined;
    this.#watchedDir = '';
    try {
      w?.close();
    } catch {
      // already closed
    }
  }

  #once(kind: 'no-dir' | 'watch-error', err: unknown): void {
    if (this.#logged.has(kind)) return;
    this.#logged.add(kind);
    const fields = { err: err instanceof Error ? err.message : String(err), pollMs: this.#pollMs };
    if (kind === 'no-dir')
      this.#log?.info(fields, 'lease file directory does not exist yet; polling until it does');
    else this.#log?.warn(fields, 'cannot watch the lease file directory; polling instead');
  }

  #changed(): void {
    if (this.#debounce !== undefined || this.#listeners.size === 0) return;
    this.#debounce = setTimeout(() => {
      this.#debounce = undefined;
      this.#refresh();
    }, this.#debounceMs);
    this.#debounce.unref();
  }

  /** One read at a time; a trigger during a read costs exactly one more read after it (so
   * the last change is always read after it happened), shared by every listener. */
  #refresh(): void {
    if (this.#reading) {
      this.#again = true;
      return;
    }
    this.#reading = true;
    void (async () => {
      try {
        do {
          this.#again = false;
          const snapshot = await this.read();
          if (this.#listeners.size === 0) break;
          if (sameSnapshot(this.#current, snapshot)) continue;
          this.#current = snapshot;
          for (const listener of [...this.#listeners]) {
            try {
              listener(snapshot);
            } catch (err) {
              this.#log?.warn({ err: String(err) }, 'lease change listener threw');
            }
          }
        } while (this.#again && this.#listeners.size > 0);
      } finally {
        this.#reading = false;
      }
    })();
  }
}

/**
 * One waiter's view of the lease file (the IP wait): {@link snapshot} gives the content to
 * check, {@link wait} sleeps until the next change. Subscribed from construction, so a change
 * between a snapshot and the next wait is never lost. Waiters share the file's reads: a
 * change wakes all of them with the one snapshot the file read.
 */
export class LeaseWait implements Disposable {
  readonly #file: LeaseFile;
  readonly #unsubscribe: () => void;
  #dirty = false;
  #wake: (() => void) | undefined;

  constructor(file: LeaseFile) {
    this.#file = file;
    this.#unsubscribe = file.onChange(() => {
      this.#dirty = true;
      this.#wake?.();
    });
  }

  /** The content to check now: the snapshot the watch last delivered (no read of its own),
   * or a cached read before the first delivery. Clears the "changed" mark. */
  async snapshot(): Promise<LeaseSnapshot> {
    this.#dirty = false;
    return this.#file.current ?? (await this.#file.read());
  }

  /** Resolves at the first change since the last {@link snapshot}, after `ms`, or when
   * `signal` aborts, whichever comes first; never rejects. */
  wait(ms: number, signal?: AbortSignal): Promise<void> {
    if (this.#dirty || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        if (this.#wake === done) this.#wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener('abort', done, { once: true });
      this.#wake = done;
    });
  }

  close(): void {
    this.#unsubscribe();
    this.#wake?.();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
