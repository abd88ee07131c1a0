/**
 * The cocoon-net lease file (docs/contracts/cocoon-cli.md "Lease file"): {@link LeaseFile}, a
 * small cached reader (stat + read) that also tells its listeners when the file changes (a
 * watch on its directory, a slow poll as the safety net), and {@link LeaseWait}, one waiter's
 * view of those changes. The parsers and IP resolution are pure, in lease-parse.ts.
 */
import { type BigIntStats, statSync, watch } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { open } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import type { Logger } from '../log.ts';
import {
  type IpResolution,
  type Lease,
  type LeaseSnapshot,
  type NicAddressing,
  parseLeaseFile,
  resolveIp,
} from './lease-parse.ts';

/** Default lease file path (`VK_LEASES_PATH`). */
export const DEFAULT_LEASES_PATH = '/var/lib/cocoon/net/leases.json';
/** Safety-net poll of the lease file while anyone listens for changes: catches what the
 * directory watch misses (no watch possible, the directory replaced, a lost event). */
export const LEASE_POLL_MS = 1000;
/** Directory events within this window after the first one share one read (cocoon-net's
 * write-temp-then-rename makes several events per update). */
export const LEASE_DEBOUNCE_MS = 2;

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
