// A list-then-watch cache of one resource (client-go's reflector + store, client-node's
// ListWatch), on the hand-written REST client (src/kube/rest.ts says why):
// - list (the caller's list function, so tests can serve it), then watch from the list's
//   resourceVersion with allowWatchBookmarks=true and a server-side timeout of 5–10 min;
// - 410 Gone (at connect or as an ERROR event) and any other ERROR event → list again; the
//   objects missing from the new list are reported deleted;
// - a stream that ends is re-opened from the last resourceVersion; a failed list or watch is
//   retried with backoff (1 s doubling to 30 s, reset by the next event), forever, until
//   stop(); every failure is reported to the `error` callbacks (for logs), none stops it;
// - a stream silent for 90 s (bookmarks come every minute) is re-opened: a black-holed
//   connection is found without waiting for TCP;
// - a watch line longer than 16 MiB ends the stream and lists again (the event is lost).
// Callbacks: `add`/`update` (only when the resourceVersion changed)/`delete` with the object,
// `error` with the failure, `connect` when a watch stream opened. Objects are the apiserver's
// JSON as parsed (timestamps are strings).
import type { IncomingMessage } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { keyOf, podKey } from './key.ts';
import { ApiError, type ApiStatusBody, type QueryValue, type RestClient } from './rest.ts';

export interface KubeObject {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string };
}

export interface ObjectList<T> {
  items?: T[];
  metadata?: { resourceVersion?: string };
}

export const DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024;
export const DEFAULT_WATCH_IDLE_MS = 90_000;
export const BASE_BACKOFF_MS = 1000;
export const MAX_BACKOFF_MS = 30_000;

export interface InformerOptions<T> {
  rest: Pick<RestClient, 'watch'>;
  /** Collection path, e.g. `/api/v1/pods` or `/api/v1/namespaces/ns/configmaps`. */
  path: string;
  /** Lists the collection with the same selectors as the watch. */
  list: () => Promise<ObjectList<T>>;
  fieldSelector?: string;
  labelSelector?: string;
  maxLineBytes?: number;
  /** A stream that delivers nothing (not even a bookmark) for this long is re-opened. */
  idleTimeoutMs?: number;
  baseBackoffMs?: number;
  maxBackoffMs?: number;
  /** The server-side timeout of one watch request (default: random 300–600 s, as client-go). */
  watchTimeoutSeconds?: () => number;
  /** Applied to every object as it arrives (list and watch), before it is cached or handed
   * to a callback (client-go's SetTransform), e.g. {@link stripManagedFields}. */
  transform?: (obj: T) => T;
}

/** Drops `metadata.managedFields` (server-side apply bookkeeping, ~45 % of a pod's JSON),
 * which the daemon never reads, so the cache does not hold it (docs/decisions.md "Daemon
 * memory"). Mutates and returns the object, freshly parsed and not shared yet. */
export function stripManagedFields<T extends KubeObject>(obj: T): T {
  const meta = obj.metadata as { managedFields?: unknown } | undefined;
  if (meta && 'managedFields' in meta) delete meta.managedFields;
  return obj;
}

export class LineTooLongError extends Error {
  override name = 'LineTooLongError';
}

/** Splits a byte stream into `\n`-terminated lines, holding at most `max` bytes of an
 * unfinished line (LineTooLongError beyond it). */
export class LineSplitter {
  readonly max: number;
  #parts: Buffer[] = [];
  #size = 0;

  constructor(max: number) {
    this.max = max;
  }

  /** The complete lines the chunk finishes (without the `\n`). */
  push(chunk: Buffer): Buffer[] {
    const lines: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      if (this.#size + piece.length > this.max) throw this.#tooLong(this.#size + piece.length);
      lines.push(this.#parts.length > 0 ? Buffer.concat([...this.#parts, piece]) : piece);
      this.#parts = [];
      this.#size = 0;
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.#size += rest.length;
      if (this.#size > this.max) throw this.#tooLong(this.#size);
      this.#parts.push(rest);
    }
    return lines;
  }

  #tooLong(n: number): LineTooLongError {
    this.#parts = [];
    this.#size = 0;
    return new LineTooLongError(`watch event longer than ${this.max} bytes (${n} so far)`);
  }
}

type ObjectVerb = 'add' | 'update' | 'delete';

type Outcome =
  | { kind: 'gone' }
  | { kind: 'closed' }
  | { kind: 'idle' }
  | { kind: 'error'; err: unknown; relist?: boolean };

export class Informer<T extends KubeObject> {
  readonly #o: InformerOptions<T>;
  /** By `namespace/name`. */
  #objects = new Map<string, T>();
  readonly #cb = {
    add: [] as ((obj: T) => void)[],
    update: [] as ((obj: T) => void)[],
    delete: [] as ((obj: T) => void)[],
    error: [] as ((err: unknown) => void)[],
    connect: [] as (() => void)[],
  };
  #rv = '';
  #needList = true;
  #abort: AbortController | undefined;
  #running: Promise<void> | undefined;
  #synced = false;
  #syncWaiters: { resolve: () => void; reject: (err: Error) => void }[] = [];

  constructor(opts: InformerOptions<T>) {
    this.#o = opts;
  }

  on(verb: ObjectVerb, cb: (obj: T) => void): void;
  on(verb: 'error', cb: (err: unknown) => void): void;
  on(verb: 'connect', cb: () => void): void;
  on(verb: ObjectVerb | 'error' | 'connect', cb: (arg: never) => void): void {
    (this.#cb[verb] as unknown[]).push(cb);
  }

  off(verb: ObjectVerb | 'error' | 'connect', cb: (arg: never) => void): void {
    const list = this.#cb[verb] as unknown[];
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  }

  get(name: string, namespace?: string): T | undefined {
    return this.#objects.get(podKey(namespace ?? '', name));
  }

  list(namespace?: string): T[] {
    const all = [...this.#objects.values()];
    return namespace === undefined ? all : all.filter((o) => (o.metadata?.namespace ?? '') === namespace);
  }

  /** The resourceVersion the next watch starts from. */
  latestResourceVersion(): string {
    return this.#rv;
  }

  /** True once the first list has filled the cache. */
  get synced(): boolean {
    return this.#synced;
  }

  /** Starts listing and watching (once; a second call waits for the same first list).
   * Resolves when the first list has filled the cache; a failing list is retried with
   * backoff (reported to `error`), so this waits as long as the API fails. Rejects only when
   * stop() comes first. */
  start(): Promise<void> {
    const synced = new Promise<void>((resolve, reject) => {
      if (this.#synced && this.#running) resolve();
      else this.#syncWaiters.push({ resolve, reject });
    });
    if (!this.#running) {
      const ac = new AbortController();
      this.#abort = ac;
      this.#running = this.#run(ac.signal).finally(() => {
        if (this.#abort === ac) this.#running = undefined;
      });
    }
    return synced;
  }

  /** Stops the watch (and any retry wait); resolves once the loop has ended. The cache is
   * kept; a later start() lists again. */
  async stop(): Promise<void> {
    this.#abort?.abort();
    this.#abort = undefined;
    const running = this.#running;
    this.#running = undefined;
    this.#synced = false;
    this.#needList = true;
    for (const w of this.#syncWaiters.splice(0))
      w.reject(new Error('informer stopped before its first list'));
    await running;
  }

  async #run(signal: AbortSignal): Promise<void> {
    const base = this.#o.baseBackoffMs ?? BASE_BACKOFF_MS;
    const max = this.#o.maxBackoffMs ?? MAX_BACKOFF_MS;
    let failures = 0;
    let immediate = false;
    while (!signal.aborted) {
      if (failures > 0 && !immediate) {
        try {
          await sleep(Math.min(max, base * 2 ** Math.min(failures - 1, 20)), undefined, {
            signal,
            ref: false,
          });
        } catch {
          return;
        }
      }
      immediate = false;
      if (this.#needList) {
        try {
          await this.#relist(signal);
        } catch (err) {
          if (signal.aborted) return;
          failures++;
          this.#emitError(err);
          continue;
        }
        if (signal.aborted) return;
        this.#synced = true;
        for (const w of this.#syncWaiters.splice(0)) w.resolve();
      }
      const { outcome, events, ms } = await this.#watchOnce(signal);
      if (signal.aborted) return;
      if (events > 0) failures = 0;
      switch (outcome.kind) {
        case 'gone':
          // The resourceVersion is too old: list again, at once the first time.
          this.#needList = true;
          failures++;
          immediate = failures === 1;
          break;
        case 'closed':
          // The server ended the stream (its timeout): re-open from the last resourceVersion,
          // with backoff only when streams keep ending at once.
          if (events === 0 && ms < 1000) failures++;
          break;
        case 'idle':
          break;
        case 'error':
          if (outcome.relist) this.#needList = true;
          failures++;
          this.#emitError(outcome.err);
          break;
      }
    }
  }

  async #relist(signal: AbortSignal): Promise<void> {
    // stop() does not wait for a list that hangs.
    let onAbort = () => {};
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => reject(new Error('informer stopped'));
      signal.addEventListener('abort', onAbort, { once: true });
    });
    aborted.catch(() => {});
    let list: ObjectList<T>;
    try {
      list = await Promise.race([this.#o.list(), aborted]);
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
    if (signal.aborted) return;
    const transform = this.#o.transform;
    let items = (list?.items ?? []).filter((o) => o?.metadata?.name !== undefined);
    if (transform) items = items.map(transform);
    const fresh = new Set(items.map(keyOf));
    for (const [k, old] of [...this.#objects]) {
      if (fresh.has(k)) continue;
      this.#objects.delete(k);
      this.#emit('delete', old);
    }
    for (const obj of items) this.#addOrUpdate(obj);
    this.#rv = list?.metadata?.resourceVersion ?? '';
    this.#needList = false;
  }

  #addOrUpdate(obj: T): void {
    const k = keyOf(obj);
    const old = this.#objects.get(k);
    if (!old) {
      this.#objects.set(k, obj);
      this.#emit('add', obj);
      return;
    }
    const rv = old.metadata?.resourceVersion;
    if (rv !== undefined && rv === obj.metadata?.resourceVersion) return;
    this.#objects.set(k, obj);
    this.#emit('update', obj);
  }

  #delete(obj: T): void {
    const k = keyOf(obj);
    if (!this.#objects.delete(k)) return;
    this.#emit('delete', obj);
  }

  #emit(verb: ObjectVerb, obj: T): void {
    for (const cb of [...this.#cb[verb]]) {
      try {
        cb(obj);
      } catch (err) {
        this.#emitError(err);
      }
    }
  }

  #emitError(err: unknown): void {
    for (const cb of [...this.#cb.error]) {
      try {
        cb(err);
      } catch {
        // an error callback that throws has nobody to report to
      }
    }
  }

  /** One watch request, to its end. */
  async #watchOnce(signal: AbortSignal): Promise<{ outcome: Outcome; events: number; ms: number }> {
    const started = performance.now();
    const timeoutSeconds = this.#o.watchTimeoutSeconds?.() ?? 300 + Math.floor(Math.random() * 300);
    const query: Record<string, QueryValue> = {
      resourceVersion: this.#rv || undefined,
      allowWatchBookmarks: true,
      timeoutSeconds,
      fieldSelector: this.#o.fieldSelector,
      labelSelector: this.#o.labelSelector,
    };
    let res: IncomingMessage;
    try {
      res = await this.#o.rest.watch(this.#o.path, query, signal);
    } catch (err) {
      const outcome: Outcome =
        err instanceof ApiError && err.code === 410 ? { kind: 'gone' } : { kind: 'error', err };
      return { outcome, events: 0, ms: performance.now() - started };
    }
    for (const cb of [...this.#cb.connect]) {
      try {
        cb();
      } catch (err) {
        this.#emitError(err);
      }
    }
    const idleMs = this.#o.idleTimeoutMs ?? DEFAULT_WATCH_IDLE_MS;
    const splitter = new LineSplitter(this.#o.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES);
    let events = 0;
    return await new Promise((resolve) => {
      let done = false;
      let idle: NodeJS.Timeout | undefined;
      const finish = (outcome: Outcome) => {
        if (done) return;
        done = true;
        clearTimeout(idle);
        signal.removeEventListener('abort', onAbort);
        res.destroy();
        resolve({ outcome, events, ms: performance.now() - started });
      };
      const onAbort = () => finish({ kind: 'closed' });
      const arm = () => {
        clearTimeout(idle);
        idle = setTimeout(() => finish({ kind: 'idle' }), idleMs);
        idle.unref();
      };
      signal.addEventListener('abort', onAbort, { once: true });
      arm();
      res.on('data', (chunk: Buffer) => {
        if (done) return;
        arm();
        let lines: Buffer[];
        try {
          lines = splitter.push(chunk);
        } catch (err) {
          finish({ kind: 'error', err, relist: true });
          return;
        }
        for (const line of lines) {
          const r = this.#handleLine(line);
          if (r === true) events++;
          else if (r) {
            finish(r);
            return;
          }
        }
      });
      res.on('end', () => finish({ kind: 'closed' }));
      res.on('error', (err) => finish({ kind: 'error', err }));
      res.on('close', () => finish({ kind: 'closed' }));
    });
  }

  /** Applies one watch event: true for an event, an Outcome that ends the stream, or
   * undefined for nothing (an empty line, an unknown type). */
  #handleLine(line: Buffer): true | Outcome | undefined {
    const text = line.toString('utf8').trim();
    if (text === '') return undefined;
    let ev: { type?: string; object?: T & { code?: number } };
    try {
      ev = JSON.parse(text);
    } catch {
      return { kind: 'error', err: new Error('watch: an event is not JSON'), relist: true };
    }
    let obj = ev?.object;
    if (obj?.metadata?.name !== undefined && this.#o.transform && ev?.type !== 'ERROR')
      obj = this.#o.transform(obj) as T & { code?: number };
    switch (ev?.type) {
      case 'ADDED':
      case 'MODIFIED':
        if (obj?.metadata?.name === undefined) return undefined;
        this.#addOrUpdate(obj);
        break;
      case 'DELETED':
        if (obj?.metadata?.name === undefined) return undefined;
        this.#delete(obj);
        break;
      case 'BOOKMARK':
        break;
      case 'ERROR': {
        const code = typeof obj?.code === 'number' ? obj.code : 500;
        if (code === 410) return { kind: 'gone' };
        return { kind: 'error', err: new ApiError(code, (obj ?? {}) as ApiStatusBody), relist: true };
      }
      default:
        return undefined;
    }
    const rv = obj?.metadata?.resourceVersion;
    if (rv) this.#rv = rv;
    return true;
  }
}
