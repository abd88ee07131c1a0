// What makes a failed authentication on the kubelet API cheap (docs/contracts/virtual-node.md
// "Authentication and authorization"; docs/security.md). The kubelet port is reachable by
// anyone on the node's network, and every unknown bearer token used to cost the apiserver a
// TokenReview: a loop of garbage tokens turned the daemon into an amplifier against the
// control plane. Three bounds, all pure and clocked by the caller's `now`:
//   - tokens are remembered by a SHA-256 of the token (never the token itself), in bounded
//     LRU tables: an accepted token for 2 min, a rejected one for 1 min;
//   - a per-source token bucket charges every TokenReview of an unknown token before it is
//     sent and refunds it when the token turns out valid, so only failures stay charged;
//   - the table of sources is bounded too (LRU), so spoofed or many sources cost memory
//     only up to a fixed size.
import { createHash } from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';

/** A rejected token is reviewed again at most once a minute (it may have been created since). */
export const REJECTED_TOKEN_TTL_MS = 60_000;
/** An accepted token is trusted for 2 min without a new review (as before this file existed). */
export const ACCEPTED_TOKEN_TTL_MS = 120_000;
/** Entries of each token table (accepted, rejected): 10k hashes, about 1 MiB each at most. */
export const TOKEN_TABLE_ENTRIES = 10_000;
/** Failed authentications a source may make at once: a client retrying a typo or an expired
 * token a few times never meets the limit; a scanner does after 20. */
export const FAILED_AUTH_BURST = 20;
/** Then one more every 3 s (20 a minute), which is one TokenReview per 3 s per source. */
export const FAILED_AUTH_REFILL_MS = 3_000;
/** Sources remembered; the least recently seen is forgotten first (its bucket starts full again). */
export const SOURCE_TABLE_ENTRIES = 10_000;

/** The cache key of a bearer token: its SHA-256 (the token never sits in memory longer than
 * its request, and a heap snapshot holds only digests). */
export function tokenKey(token: string): string {
  return createHash('sha256').update(token).digest('base64url');
}

/** Expands an IPv6 literal to its eight 16-bit groups (undefined when it is not one, or
 * when it embeds an IPv4 tail: such a source is keyed by its whole address). */
function ipv6Groups(address: string): number[] | undefined {
  if (!isIPv6(address) || address.includes('.')) return undefined;
  const [head = '', rest] = address.split('::');
  const parse = (s: string) => (s === '' ? [] : s.split(':').map((g) => Number.parseInt(g, 16)));
  const h = parse(head);
  const r = rest === undefined ? [] : parse(rest);
  return [...h, ...new Array<number>(8 - h.length - r.length).fill(0), ...r];
}

/**
 * The rate-limit key of a remote address: an IPv4 address as it is (an IPv4-mapped IPv6
 * address as its IPv4 form), an IPv6 address by its /64, since one host usually holds a
 * whole /64 and could otherwise rotate through it to dodge the limit.
 */
export function sourceKey(remoteAddress: string | undefined): string {
  const a = (remoteAddress ?? '').toLowerCase();
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(a);
  if (mapped) return mapped[1] as string;
  if (isIPv4(a)) return a;
  const g = ipv6Groups(a);
  if (!g) return a === '' ? '(unknown)' : a;
  return `${g
    .slice(0, 4)
    .map((x) => x.toString(16))
    .join(':')}::/64`;
}

/** A bounded map whose entries expire; when full, the least recently used entry goes first. */
export class ExpiringLru<V> {
  readonly #max: number;
  readonly #map = new Map<string, { value: V; until: number }>();

  constructor(max: number) {
    this.#max = max;
  }

  get size(): number {
    return this.#map.size;
  }

  get(key: string, now: number): V | undefined {
    const e = this.#map.get(key);
    if (!e) return undefined;
    this.#map.delete(key);
    if (e.until <= now) return undefined;
    this.#map.set(key, e); // most recently used goes last
    return e.value;
  }

  set(key: string, value: V, until: number): void {
    this.#map.delete(key);
    while (this.#map.size >= this.#max) {
      const oldest = this.#map.keys().next().value as string;
      this.#map.delete(oldest);
    }
    this.#map.set(key, { value, until });
  }

  delete(key: string): void {
    this.#map.delete(key);
  }
}

export type TakeResult = { ok: true } | { ok: false; retryAfterMs: number; firstRefusal: boolean };

interface Bucket {
  tokens: number;
  at: number;
  refused: boolean;
}

/** Per-source token buckets of failed authentications. */
export class FailedAuthLimiter {
  readonly #burst: number;
  readonly #refillMs: number;
  readonly #max: number;
  readonly #buckets = new Map<string, Bucket>();

  constructor(opts: { burst?: number; refillMs?: number; sources?: number } = {}) {
    this.#burst = opts.burst ?? FAILED_AUTH_BURST;
    this.#refillMs = opts.refillMs ?? FAILED_AUTH_REFILL_MS;
    this.#max = opts.sources ?? SOURCE_TABLE_ENTRIES;
  }

  #bucket(source: string, now: number): Bucket {
    let b = this.#buckets.get(source);
    if (b) {
      this.#buckets.delete(source);
      // A clock that went back refills nothing (and takes nothing away).
      const elapsed = Math.max(0, now - b.at);
      b.tokens = Math.min(this.#burst, b.tokens + elapsed / this.#refillMs);
      b.at = now;
    } else {
      while (this.#buckets.size >= this.#max) {
        this.#buckets.delete(this.#buckets.keys().next().value as string);
      }
      b = { tokens: this.#burst, at: now, refused: false };
    }
    this.#buckets.set(source, b);
    return b;
  }

  /** Charges one failed authentication to `source` ahead of the review that may fail. */
  take(source: string, now: number): TakeResult {
    const b = this.#bucket(source, now);
    if (b.tokens >= 1) {
      b.tokens -= 1;
      b.refused = false;
      return { ok: true };
    }
    const firstRefusal = !b.refused;
    b.refused = true;
    return { ok: false, retryAfterMs: Math.ceil((1 - b.tokens) * this.#refillMs), firstRefusal };
  }

  /** Gives back a charge whose review turned out to authenticate. */
  refund(source: string, now: number): void {
    const b = this.#bucket(source, now);
    b.tokens = Math.min(this.#burst, b.tokens + 1);
  }
}
