// Counting API writes from the kube-apiserver's audit log (ground option `audit: true`: writes
// at level Metadata, one JSON line per request at stage ResponseComplete). The log is written
// by the apiserver, so the count does not depend on the daemon counting itself: a write the
// daemon forgets to count, a retry inside a client library, a write made by a code path
// without the counter all show up here.
import { closeSync, openSync, readSync, statSync } from 'node:fs';

/** The provider identity of the ground (ground/cluster.ts tokens.csv), which a daemon started
 * with `identity: 'provider'` uses. */
export const DAEMON_USER = 'vk-cocoon';

/** A daemon's writes: the ground's daemons run as their node identity `system:node:<name>`
 * (ground/node-identity.ts) unless started with the provider identity. */
export function isDaemonUser(user: string): boolean {
  return user === DAEMON_USER || user.startsWith('system:node:');
}

/** One write request as the audit log records it. */
export interface AuditWrite {
  verb: string;
  user: string;
  /** `resource` or `resource/subresource` ("pods", "pods/status", "events", "leases"...). */
  kind: string;
  namespace: string;
  name: string;
  code: number;
  /** requestReceivedTimestamp, epoch ms. */
  at: number;
}

interface RawAuditEvent {
  kind?: string;
  stage?: string;
  verb?: string;
  user?: { username?: string };
  objectRef?: { resource?: string; subresource?: string; namespace?: string; name?: string };
  responseStatus?: { code?: number };
  requestReceivedTimestamp?: string;
}

const WRITE_VERBS = new Set(['create', 'update', 'patch', 'delete', 'deletecollection']);

/** Parses one audit log line; undefined for anything that is not a completed write request. */
export function parseAuditLine(line: string): AuditWrite | undefined {
  if (line.trim() === '') return undefined;
  let e: RawAuditEvent;
  try {
    e = JSON.parse(line) as RawAuditEvent;
  } catch {
    return undefined;
  }
  // One event per request: ResponseComplete (or Panic); RequestReceived is omitted by the
  // policy, ResponseStarted exists for long-running requests (watches) only.
  if (e.kind !== 'Event' || (e.stage !== 'ResponseComplete' && e.stage !== 'Panic')) return undefined;
  const verb = e.verb ?? '';
  if (!WRITE_VERBS.has(verb)) return undefined;
  const resource = e.objectRef?.resource ?? '';
  const sub = e.objectRef?.subresource;
  return {
    verb,
    user: e.user?.username ?? '',
    kind: sub ? `${resource}/${sub}` : resource,
    namespace: e.objectRef?.namespace ?? '',
    name: e.objectRef?.name ?? '',
    code: e.responseStatus?.code ?? 0,
    // Date.parse takes the RFC 3339 microseconds and keeps the milliseconds.
    at: Date.parse(e.requestReceivedTimestamp ?? ''),
  };
}

export function parseAuditLog(text: string): AuditWrite[] {
  const out: AuditWrite[] = [];
  for (const line of text.split('\n')) {
    const w = parseAuditLine(line);
    if (w) out.push(w);
  }
  return out;
}

export interface WriteFilter {
  /** The username, or a predicate on it (isDaemonUser). */
  user?: string | ((user: string) => boolean);
  /** Inclusive epoch-ms window on requestReceivedTimestamp. */
  from?: number;
  to?: number;
  /** Only writes to objects in this namespace (cluster-scoped objects have none). */
  namespace?: string;
}

export function selectWrites(writes: readonly AuditWrite[], f: WriteFilter): AuditWrite[] {
  return writes.filter(
    (w) =>
      (f.user === undefined || (typeof f.user === 'string' ? w.user === f.user : f.user(w.user))) &&
      (f.from === undefined || w.at >= f.from) &&
      (f.to === undefined || w.at <= f.to) &&
      (f.namespace === undefined || w.namespace === f.namespace),
  );
}

/** The four kinds the reports name; everything else is summed as `other`. */
export const MAIN_KINDS = ['pods', 'pods/status', 'events', 'leases'] as const;

export interface WriteCount {
  total: number;
  /** By `resource[/subresource]`. */
  byKind: Record<string, number>;
  /** By `resource[/subresource] verb`. */
  byKindVerb: Record<string, number>;
  /** Requests answered with a status >= 400 (conflicts, rejections). */
  failed: number;
  /** Distinct pods (namespace/name) with a pods or pods/status write. */
  podsWritten: number;
}

export function countWrites(writes: readonly AuditWrite[]): WriteCount {
  const byKind: Record<string, number> = {};
  const byKindVerb: Record<string, number> = {};
  const pods = new Set<string>();
  let failed = 0;
  for (const w of writes) {
    byKind[w.kind] = (byKind[w.kind] ?? 0) + 1;
    const kv = `${w.kind} ${w.verb}`;
    byKindVerb[kv] = (byKindVerb[kv] ?? 0) + 1;
    if (w.code >= 400) failed++;
    if (w.kind === 'pods' || w.kind.startsWith('pods/')) pods.add(`${w.namespace}/${w.name}`);
  }
  return { total: writes.length, byKind, byKindVerb, failed, podsWritten: pods.size };
}

/** Writes of the kinds outside MAIN_KINDS. */
export function otherWrites(c: WriteCount): number {
  return Object.entries(c.byKind)
    .filter(([k]) => !(MAIN_KINDS as readonly string[]).includes(k))
    .reduce((a, [, v]) => a + v, 0);
}

/**
 * Follows a growing audit log: every poll() parses the complete lines appended since the last
 * one (a line being written is kept for the next poll) and keeps the write requests.
 */
export class AuditTail {
  readonly path: string;
  readonly writes: AuditWrite[] = [];
  #offset = 0;
  #partial = Buffer.alloc(0);

  constructor(path: string) {
    this.path = path;
  }

  /** Reads what was appended; returns the number of new write requests. */
  poll(): number {
    let size: number;
    try {
      size = statSync(this.path).size;
    } catch {
      return 0; // not created yet
    }
    if (size < this.#offset) {
      // Truncated or replaced (never with the ground's flags): start over.
      this.#offset = 0;
      this.#partial = Buffer.alloc(0);
    }
    if (size === this.#offset) return 0;
    const fd = openSync(this.path, 'r');
    let data: Buffer;
    try {
      const buf = Buffer.alloc(size - this.#offset);
      let got = 0;
      while (got < buf.length) {
        const n = readSync(fd, buf, got, buf.length - got, this.#offset + got);
        if (n === 0) break;
        got += n;
      }
      this.#offset += got;
      data = Buffer.concat([this.#partial, buf.subarray(0, got)]);
    } finally {
      closeSync(fd);
    }
    // Split on the last newline byte, so neither a line nor a UTF-8 sequence is cut.
    const cut = data.lastIndexOf(0x0a);
    this.#partial = Buffer.from(data.subarray(cut + 1));
    const before = this.writes.length;
    for (const w of parseAuditLog(data.subarray(0, cut + 1).toString('utf8'))) this.writes.push(w);
    return this.writes.length - before;
  }

  /** Polls, then counts the writes matching `f`. */
  count(f: WriteFilter): WriteCount {
    this.poll();
    return countWrites(selectWrites(this.writes, f));
  }

  /** requestReceivedTimestamp of the last write matching `f` (after a poll), or undefined. */
  lastAt(f: WriteFilter, kinds?: readonly string[]): number | undefined {
    this.poll();
    let last: number | undefined;
    for (const w of selectWrites(this.writes, f)) {
      if (kinds && !kinds.includes(w.kind)) continue;
      if (last === undefined || w.at > last) last = w.at;
    }
    return last;
  }
}
