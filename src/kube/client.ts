// Kubernetes API access of the daemon on the hand-written client of this folder (rest.ts:
// transport and why it is hand-written instead of @kubernetes/client-node; api.ts: the calls;
// informer.ts: list-then-watch caches; kubeconfig.ts: where the apiserver is), with the
// client-side write rate limits of docs/contracts/virtual-node.md "Queues and retries" (token
// buckets; the Go client's 5 QPS default throttled large nodes): pod writes, node heartbeats
// and events each have their own budget, every wait for a token is bounded, and a write can
// carry a per-request timeout that aborts the HTTP request. Also small helpers for the patch
// content types and request signals.

import { delay, withDeadline } from '../util/deadline.ts';
import { type Rank, RankedList, rankNow } from '../util/priority.ts';
import { AuthenticationV1Api, AuthorizationV1Api, CoordinationV1Api, CoreV1Api } from './api.ts';
import { Informer, type KubeObject, type ObjectList, stripManagedFields } from './informer.ts';
import type { ClusterAccess } from './kubeconfig.ts';
import {
  ApiError,
  type CallOptions,
  CONTENT_TYPE_MERGE_PATCH,
  CONTENT_TYPE_STRATEGIC_MERGE_PATCH,
  RestClient,
} from './rest.ts';

// loadKubeConfig: KUBECONFIG (a path or a list), else ~/.kube/config, else in-cluster;
// unsupported settings (exec plugins, auth-provider, …) are an error naming them.
export { type ClusterAccess, KubeConfigError, loadKubeConfig } from './kubeconfig.ts';
export type { CallOptions } from './rest.ts';
export { ApiError } from './rest.ts';

export type WritePriority = 'high' | 'normal';

export interface TakeOptions {
  /** Longest wait for a token; the take rejects with WriteWaitError beyond it (none: unbounded). */
  maxWaitMs?: number;
  /** Aborts the wait (rejects with WriteWaitError, reason `aborted`). */
  signal?: AbortSignal;
  /** `high` waiters are served before every `normal` waiter. Within a level, waiters are
   * ordered by the pod's admission sequence from the async context (src/util/priority.ts):
   * calls without one first, then the oldest pod's; FIFO among equals. */
  priority?: WritePriority;
}

/** A write that did not get a rate-limit token within its bound, or whose wait was aborted. */
export class WriteWaitError extends Error {
  override name = 'WriteWaitError';
  readonly reason: 'bound' | 'aborted';
  constructor(message: string, reason: 'bound' | 'aborted', cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.reason = reason;
  }
}

interface Waiter {
  readonly rank: Rank;
  resolve: () => void;
  reject: (err: Error) => void;
  cleanup: () => void;
}

export interface TokenBucketOptions {
  /** Clock of the refill, in ms (default performance.now: monotonic). Test seam: a clock
   * that moves with mock timers (e.g. `() => Date.now()` with Date mocked). */
  now?: () => number;
}

/** Token bucket: `take()` resolves when a token is available. Time is monotonic
 * (performance.now), so a wall-clock step never stretches or shortens a wait. Waiters are
 * served by rank (src/util/priority.ts): `high` first, then takers without a priority
 * context, then by the pod's admission sequence (oldest first), FIFO among equals. */
export class TokenBucket {
  #tokens: number;
  readonly #now: () => number;
  #last: number;
  readonly #waiters = new RankedList<Waiter>();
  #timer: NodeJS.Timeout | undefined;
  readonly qps: number;
  readonly burst: number;

  constructor(qps: number, burst: number, opts: TokenBucketOptions = {}) {
    this.qps = qps;
    this.burst = burst;
    this.#tokens = burst;
    this.#now = opts.now ?? (() => performance.now());
    this.#last = this.#now();
  }

  #refill(): void {
    const now = this.#now();
    this.#tokens = Math.min(this.burst, this.#tokens + ((now - this.#last) / 1000) * this.qps);
    this.#last = now;
  }

  /** Waiters queued for a token. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /** Estimated wait (ms) of a new taker of this priority (and of the current async
   * context's admission sequence) behind the current waiters; takers of a better rank that
   * arrive later can still overtake it. */
  estimateWaitMs(priority: WritePriority = 'normal'): number {
    return this.#estimate(rankNow(priority === 'high'));
  }

  #estimate(rank: Rank): number {
    this.#refill();
    const ahead = this.#waiters.ahead(rank);
    return (Math.max(0, ahead + 1 - this.#tokens) / this.qps) * 1000;
  }

  take(opts: TakeOptions = {}): Promise<void> {
    this.#refill();
    const rank = rankNow(opts.priority === 'high');
    const ahead = this.#waiters.ahead(rank);
    if (ahead === 0 && this.#tokens >= 1) {
      this.#tokens -= 1;
      return Promise.resolve();
    }
    if (opts.signal?.aborted) {
      return Promise.reject(
        new WriteWaitError(
          'API write aborted while waiting for the rate limiter',
          'aborted',
          opts.signal.reason,
        ),
      );
    }
    const { maxWaitMs, signal } = opts;
    if (maxWaitMs !== undefined) {
      // Fail fast when the queue ahead already needs longer than the bound.
      const estimate = this.#estimate(rank);
      if (estimate > maxWaitMs) {
        return Promise.reject(
          new WriteWaitError(
            `API write not sent: the client-side rate limit (${this.qps}/s) would hold it ~${Math.round(estimate)} ms, ` +
              `beyond its bound of ${maxWaitMs} ms (${this.#waiters.length} writes queued)`,
            'bound',
          ),
        );
      }
    }
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => {
        this.#remove(waiter);
        reject(
          new WriteWaitError(
            'API write aborted while waiting for the rate limiter',
            'aborted',
            signal?.reason,
          ),
        );
      };
      const waiter: Waiter = {
        rank,
        resolve,
        reject,
        cleanup: () => {
          clearTimeout(timer);
          signal?.removeEventListener('abort', onAbort);
        },
      };
      if (maxWaitMs !== undefined && Number.isFinite(maxWaitMs)) {
        // Backstop: takers of a better rank may overtake this waiter after the estimate.
        timer = setTimeout(() => {
          this.#remove(waiter);
          reject(
            new WriteWaitError(
              `API write not sent: no client-side rate-limit token within its bound of ${maxWaitMs} ms`,
              'bound',
            ),
          );
        }, maxWaitMs);
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#waiters.insert(waiter);
      this.#schedule();
    });
  }

  #remove(w: Waiter): void {
    if (this.#waiters.remove(w)) w.cleanup();
  }

  #schedule(): void {
    if (this.#timer) return;
    this.#refill();
    const wait = this.#tokens >= 1 ? 0 : ((1 - this.#tokens) / this.qps) * 1000;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#refill();
      while (this.#waiters.length > 0 && this.#tokens >= 1) {
        this.#tokens -= 1;
        const w = this.#waiters.shift() as Waiter;
        w.cleanup();
        w.resolve();
      }
      if (this.#waiters.length > 0) this.#schedule();
    }, wait);
  }
}

/** HTTP status of an API error, or 0 for transport errors (and timeouts, aborts). */
export function apiStatus(err: unknown): number {
  if (err instanceof ApiError) return err.code;
  // DOMException (AbortError, TimeoutError) carries a legacy numeric `code` that is no HTTP status.
  if (err instanceof DOMException) return 0;
  const code = (err as { code?: unknown; statusCode?: unknown } | null)?.code;
  if (typeof code === 'number') return code;
  const sc = (err as { statusCode?: unknown } | null)?.statusCode;
  return typeof sc === 'number' ? sc : 0;
}

/** A short, single-line description of an API error for logs and events. */
export function apiErrorMessage(err: unknown): string {
  // ApiError's message is `HTTP <code>: <the apiserver's Status message>`.
  return err instanceof Error ? err.message : String(err);
}

/** Call options of a JSON merge patch (`core.patchNamespacedPod(params, mergePatch)`). */
export const mergePatch: CallOptions = Object.freeze({ contentType: CONTENT_TYPE_MERGE_PATCH });
/** Call options of a strategic merge patch (the default of a patch without options). */
export const strategicMergePatch: CallOptions = Object.freeze({
  contentType: CONTENT_TYPE_STRATEGIC_MERGE_PATCH,
});

export interface WriteOptions extends TakeOptions {
  /** Per-request bound, counted after the token: the request's AbortSignal fires and the
   * write rejects with DeadlineError (`API request timed out after <n> ms`). */
  timeoutMs?: number;
}

/** Bound of a pod write's wait for a token unless the caller passes `maxWaitMs`: far above
 * any queue a node makes (200 clones at once queue ~1,460 writes: ~27 s at the default
 * 50 QPS, ~73 s at the former 20), so only a runaway queue hits it, and no write waits
 * without a bound. */
export const DEFAULT_WRITE_MAX_WAIT_MS = 180_000;
/** Bound of a heartbeat write's wait (its own bucket; the Lease renews every 10 s). */
export const DEFAULT_HEARTBEAT_MAX_WAIT_MS = 10_000;
/** Pod writes (lifecycle annotations, pods/status, deletes): kubelet's kubeAPIQPS /
 * kubeAPIBurst defaults (VK_KUBE_QPS / VK_KUBE_BURST; docs/decisions.md "Client rate limits"). */
export const DEFAULT_KUBE_QPS = 50;
export const DEFAULT_KUBE_BURST = 100;
/** Event writes: half the pod-write budget (kubelet gives its recorder eventRecordQPS /
 * eventBurst beside the API budget; VK_KUBE_EVENT_QPS / VK_KUBE_EVENT_BURST). */
export const DEFAULT_EVENT_QPS = 25;
export const DEFAULT_EVENT_BURST = 50;
/** Node heartbeats (Lease every 10 s, node status every 60 s and on change, node re-creates):
 * a few writes a minute, so 5/s never throttles them (VK_KUBE_HEARTBEAT_QPS / _BURST). */
export const DEFAULT_HEARTBEAT_QPS = 5;
export const DEFAULT_HEARTBEAT_BURST = 10;

export interface KubeOptions {
  /** Event write budget, separate from pod writes (VK_KUBE_EVENT_QPS / VK_KUBE_EVENT_BURST). */
  eventQps?: number;
  eventBurst?: number;
  /** Heartbeat write budget (VK_KUBE_HEARTBEAT_QPS / VK_KUBE_HEARTBEAT_BURST). */
  heartbeatQps?: number;
  heartbeatBurst?: number;
}

export interface RetryWriteOptions extends WriteOptions {
  /** Attempts in all (default 3). */
  attempts?: number;
  /** Pause between attempts (default 500 ms). */
  retryDelayMs?: number;
}

/** The pod-write retry policy of lifecycle and status writes: 3 attempts, 500 ms apart,
 * 5 s per request. */
export const POD_WRITE_ATTEMPTS = 3;
export const POD_WRITE_RETRY_DELAY_MS = 500;
export const POD_WRITE_TIMEOUT_MS = 5000;

/** Every attempt of a retried write failed; `code` is the last attempt's HTTP status (0 for
 * a timeout or transport error), so `apiStatus` still reports it. */
export class WriteAttemptsError extends Error {
  override name = 'WriteAttemptsError';
  readonly attempts: number;
  readonly code: number;
  constructor(attempts: number, last: unknown) {
    super(`${apiErrorMessage(last)} (${attempts} attempts)`, { cause: last });
    this.attempts = attempts;
    this.code = apiStatus(last);
  }
}

/** 404 (gone), 409 and 422 (another incarnation, a UID precondition): retrying cannot help. */
export function isFinalWriteError(err: unknown): boolean {
  const code = apiStatus(err);
  return code === 404 || code === 409 || code === 422;
}

/** Call options that also carry `signal` into the HTTP request, e.g.
 * `core.patchNamespacedPod(params, withSignal(signal, mergePatch))`. */
export function withSignal(signal: AbortSignal | undefined, base?: CallOptions): CallOptions | undefined {
  if (!signal) return base;
  return { ...base, signal };
}

/** API clients of the provider identity plus the write limiters: pod writes (lifecycle,
 * status, deletes), node heartbeats and events each have their own token bucket, so a
 * flood of Warning events never delays a lifecycle or status write. */
export class Kube {
  readonly rest: RestClient;
  readonly core: CoreV1Api;
  readonly coordination: CoordinationV1Api;
  readonly authn: AuthenticationV1Api;
  readonly authz: AuthorizationV1Api;
  /** Pod writes: lifecycle annotations, status, deletes. */
  readonly writes: TokenBucket;
  /** Node heartbeat writes (Lease, node status): a burst of pod writes can never starve the
   * heartbeat and turn the node NotReady. */
  readonly heartbeatWrites: TokenBucket;
  /** Event writes (EventRecorder), never taken from the pod-write budget. */
  readonly eventWrites: TokenBucket;
  /** Called once per API write (metrics: cocoon_vk_api_writes_total). */
  onWrite: () => void = () => {};

  constructor(
    access: ClusterAccess | RestClient,
    qps = DEFAULT_KUBE_QPS,
    burst = DEFAULT_KUBE_BURST,
    opts: KubeOptions = {},
  ) {
    this.rest = access instanceof RestClient ? access : new RestClient(access);
    this.core = new CoreV1Api(this.rest);
    this.coordination = new CoordinationV1Api(this.rest);
    this.authn = new AuthenticationV1Api(this.rest);
    this.authz = new AuthorizationV1Api(this.rest);
    this.writes = new TokenBucket(qps, burst);
    this.heartbeatWrites = new TokenBucket(
      opts.heartbeatQps ?? DEFAULT_HEARTBEAT_QPS,
      opts.heartbeatBurst ?? DEFAULT_HEARTBEAT_BURST,
    );
    this.eventWrites = new TokenBucket(
      opts.eventQps ?? DEFAULT_EVENT_QPS,
      opts.eventBurst ?? DEFAULT_EVENT_BURST,
    );
  }

  /** Runs one pod write after taking a token from the pod-write bucket. The wait for the
   * token is bounded (`maxWaitMs`, default DEFAULT_WRITE_MAX_WAIT_MS; WriteWaitError beyond
   * it); `timeoutMs` bounds the request itself. `fn` receives the request's signal: pass it
   * on with `withSignal(signal, ...)` so a timeout cancels the HTTP request. */
  write<T>(fn: (signal?: AbortSignal) => Promise<T>, opts: WriteOptions = {}): Promise<T> {
    return this.#limited(this.writes, fn, {
      ...opts,
      maxWaitMs: opts.maxWaitMs ?? DEFAULT_WRITE_MAX_WAIT_MS,
    });
  }

  /** Like `write`, on the heartbeat bucket. */
  heartbeatWrite<T>(fn: (signal?: AbortSignal) => Promise<T>, opts: WriteOptions = {}): Promise<T> {
    return this.#limited(this.heartbeatWrites, fn, {
      ...opts,
      maxWaitMs: opts.maxWaitMs ?? DEFAULT_HEARTBEAT_MAX_WAIT_MS,
    });
  }

  /** Runs an API request under `timeoutMs`/`signal` without taking a token (the caller took
   * one itself, e.g. the event recorder's pump); counts as one write. */
  send<T>(fn: (signal?: AbortSignal) => Promise<T>, opts: { timeoutMs?: number; signal?: AbortSignal } = {}) {
    this.onWrite();
    return withDeadline(fn, { ...opts, what: 'API request' });
  }

  /** A pod write with the retry policy of lifecycle and status writes: up to `attempts`
   * (3), `retryDelayMs` (500 ms) apart, each bounded by `timeoutMs` (5 s) and by the token
   * wait bound. 404/409/422 are rethrown at once; after the last attempt it rejects with
   * WriteAttemptsError. A black-holed connection therefore holds the caller for at most
   * attempts × (token wait + timeoutMs) + the pauses. */
  async writeRetrying<T>(fn: (signal?: AbortSignal) => Promise<T>, opts: RetryWriteOptions = {}): Promise<T> {
    const attempts = Math.max(1, opts.attempts ?? POD_WRITE_ATTEMPTS);
    const retryDelayMs = opts.retryDelayMs ?? POD_WRITE_RETRY_DELAY_MS;
    const writeOpts: WriteOptions = { ...opts, timeoutMs: opts.timeoutMs ?? POD_WRITE_TIMEOUT_MS };
    let last: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        return await this.write(fn, writeOpts);
      } catch (err) {
        if (isFinalWriteError(err) || opts.signal?.aborted) throw err;
        last = err;
        if (attempt < attempts) await delay(retryDelayMs);
      }
    }
    throw new WriteAttemptsError(attempts, last);
  }

  async #limited<T>(
    bucket: TokenBucket,
    fn: (signal?: AbortSignal) => Promise<T>,
    opts: WriteOptions,
  ): Promise<T> {
    await bucket.take(opts);
    return await this.send(fn, opts);
  }

  /** A list-then-watch cache of the collection at `path` (e.g. `/api/v1/pods`); `list` lists
   * it with the same selectors (through `core`, so tests can serve it). Call start(). Its
   * objects come without `metadata.managedFields` (never read by the daemon). */
  informer<T extends KubeObject>(
    path: string,
    list: () => Promise<ObjectList<T>>,
    selectors: { fieldSelector?: string; labelSelector?: string } = {},
  ): Informer<T> {
    return new Informer<T>({ rest: this.rest, path, list, ...selectors, transform: stripManagedFields });
  }

  /** PEM bundle of the cluster CA from the kubeconfig (the default client CA). */
  clusterCaPem(): string | undefined {
    return this.rest.access.ca;
  }
}
