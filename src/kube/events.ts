// Kubernetes events for pods (core/v1 Events, as kubelet's recorder writes them). Events are
// best effort and droppable, and they never compete with lifecycle or status writes:
// - they are written on their own token bucket (`Kube.eventWrites`), never the pod-write one;
// - repeats for one (pod UID, type, reason) are coalesced: at most one write per key is
//   pending, and a repeat within 10 minutes bumps `count`/`lastTimestamp` (and carries the
//   latest message) on the existing event instead of creating a new one, as kubelet's
//   recorder aggregates;
// - the pending buffer is bounded: a new key beyond it is dropped and counted;
// - every request has a timeout, so a black-holed connection cannot pin the buffer.
// `event()` never blocks and never throws.
import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';
import { apiErrorMessage, apiStatus, type Kube, mergePatch, withSignal } from './client.ts';
import { keyOf } from './key.ts';

export type EventType = 'Normal' | 'Warning';

export interface EventSink {
  event(pod: V1Pod, type: EventType, reason: string, message: string): void;
}

export interface EventRecorderOptions {
  /** Most (pod, type, reason) keys with a write pending (default 1024); beyond it new keys drop. */
  maxPending?: number;
  /** Timeout of one event request (default 10 s). */
  requestTimeoutMs?: number;
  /** Repeats within this window update the existing event (default 10 minutes). */
  aggregateWindowMs?: number;
}

interface Pending {
  count: number;
  message: string;
  first: Date;
  last: Date;
}

interface Entry {
  namespace: string;
  podName: string;
  uid: string;
  type: EventType;
  reason: string;
  /** Name of the API event once created. */
  name?: string;
  /** `count` as last written to the API. */
  count: number;
  /** Occurrences not yet written. */
  pending?: Pending;
  queued: boolean;
  inflight: boolean;
  /** performance.now() of the last occurrence (monotonic: the window never stretches). */
  seenAt: number;
}

export const DEFAULT_EVENT_MAX_PENDING = 1024;
const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;
const AGGREGATE_WINDOW_MS = 10 * 60_000;
const PRUNE_ABOVE = 10_000;

export class EventRecorder implements EventSink {
  readonly #kube: Kube;
  readonly #host: string;
  readonly #log: Logger;
  readonly #maxPending: number;
  readonly #timeoutMs: number;
  readonly #windowMs: number;
  readonly #entries = new Map<string, Entry>();
  readonly #fifo: Entry[] = [];
  readonly #stop = new AbortController();
  #pending = 0;
  #pumping = false;
  #dropped = 0;
  #idleWaiters: (() => void)[] = [];
  /** Called once per dropped event (metrics). */
  onDrop: (type: EventType, reason: string) => void = () => {};

  constructor(kube: Kube, host: string, log: Logger, opts: EventRecorderOptions = {}) {
    this.#kube = kube;
    this.#host = host;
    this.#log = log;
    this.#maxPending = opts.maxPending ?? DEFAULT_EVENT_MAX_PENDING;
    this.#timeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.#windowMs = opts.aggregateWindowMs ?? AGGREGATE_WINDOW_MS;
  }

  /** Events dropped because the pending buffer was full. */
  get dropped(): number {
    return this.#dropped;
  }

  /** Keys with occurrences not yet written. */
  get pending(): number {
    return this.#pending;
  }

  event(pod: V1Pod, type: EventType, reason: string, message: string): void {
    if (this.#stop.signal.aborted) return;
    const uid = pod.metadata?.uid ?? '';
    const key = `${uid}\0${type}\0${reason}`;
    const nowMono = performance.now();
    const now = new Date();
    let e = this.#entries.get(key);
    if (e && !e.pending && !e.inflight && nowMono - e.seenAt >= this.#windowMs) {
      this.#entries.delete(key); // outside the window: a new event
      e = undefined;
    }
    if (!e?.pending) {
      if (this.#pending >= this.#maxPending) {
        this.#dropped++;
        this.#log.debug(
          { pod: keyOf(pod), type, reason, pendingKeys: this.#pending, dropped: this.#dropped },
          'event dropped: pending event buffer is full',
        );
        this.onDrop(type, reason);
        return;
      }
    }
    if (!e) {
      if (this.#entries.size >= PRUNE_ABOVE) this.#prune(nowMono);
      e = {
        namespace: pod.metadata?.namespace ?? 'default',
        podName: pod.metadata?.name ?? '',
        uid,
        type,
        reason,
        count: 0,
        queued: false,
        inflight: false,
        seenAt: nowMono,
      };
      this.#entries.set(key, e);
    }
    e.seenAt = nowMono;
    if (e.pending) {
      e.pending.count++;
      e.pending.message = message;
      e.pending.last = now;
      return;
    }
    e.pending = { count: 1, message, first: now, last: now };
    this.#pending++;
    if (!e.inflight) this.#enqueue(e);
  }

  /** Resolves when nothing is pending or being written (tests). */
  idle(): Promise<void> {
    if (this.#isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /** Drops everything pending and stops writing (shutdown, tests). */
  stop(): void {
    this.#stop.abort();
    this.#fifo.length = 0;
    for (const e of this.#entries.values()) e.pending = undefined;
    this.#pending = 0;
    this.#notifyIdle();
  }

  #isIdle(): boolean {
    if (this.#pending > 0) return false;
    for (const e of this.#entries.values()) if (e.inflight) return false;
    return true;
  }

  #notifyIdle(): void {
    if (this.#idleWaiters.length > 0 && this.#isIdle()) for (const w of this.#idleWaiters.splice(0)) w();
  }

  #enqueue(e: Entry): void {
    if (e.queued) return;
    e.queued = true;
    this.#fifo.push(e);
    void this.#pump();
  }

  /** One write per token of the event bucket, oldest key first; the write itself runs
   * concurrently so a slow request does not hold the budget. */
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#fifo.length > 0 && !this.#stop.signal.aborted) {
        await this.#kube.eventWrites.take({ signal: this.#stop.signal });
        const e = this.#fifo.shift();
        if (!e) break;
        e.queued = false;
        void this.#flush(e);
      }
    } catch {
      // stopped while waiting for a token
    } finally {
      this.#pumping = false;
    }
  }

  async #flush(e: Entry): Promise<void> {
    const p = e.pending;
    if (!p) return;
    e.pending = undefined;
    this.#pending--;
    e.inflight = true;
    try {
      if (e.name) {
        try {
          await this.#patch(e, p);
        } catch (err) {
          // Expired (event TTL) or deleted: start a new event with the running count.
          if (apiStatus(err) !== 404) throw err;
          e.name = undefined;
          await this.#create(e, { ...p, count: e.count + p.count });
        }
      } else {
        await this.#create(e, p);
      }
    } catch (err) {
      this.#log.warn(
        { pod: `${e.namespace}/${e.podName}`, reason: e.reason, err: apiErrorMessage(err) },
        'event write failed',
      );
    } finally {
      e.inflight = false;
      if (e.pending && !this.#stop.signal.aborted) this.#enqueue(e);
      this.#notifyIdle();
    }
  }

  async #patch(e: Entry, p: Pending): Promise<void> {
    const count = e.count + p.count;
    await this.#kube.send(
      (signal) =>
        this.#kube.core.patchNamespacedEvent(
          {
            name: e.name as string,
            namespace: e.namespace,
            body: { count, lastTimestamp: p.last.toISOString(), message: p.message },
          },
          withSignal(signal, mergePatch),
        ),
      { timeoutMs: this.#timeoutMs },
    );
    e.count = count;
  }

  async #create(e: Entry, p: Pending): Promise<void> {
    const body: CoreV1Event = {
      metadata: { generateName: `${e.podName || 'pod'}.`, namespace: e.namespace },
      involvedObject: {
        apiVersion: 'v1',
        kind: 'Pod',
        namespace: e.namespace,
        name: e.podName,
        uid: e.uid,
        fieldPath: 'spec.containers{agent}',
      },
      reason: e.reason,
      message: p.message,
      type: e.type,
      source: { component: 'vk-cocoon', host: this.#host },
      reportingComponent: 'vk-cocoon',
      reportingInstance: this.#host,
      firstTimestamp: p.first,
      lastTimestamp: p.last,
      count: p.count,
    };
    const created = await this.#kube.send(
      (signal) => this.#kube.core.createNamespacedEvent({ namespace: e.namespace, body }, withSignal(signal)),
      { timeoutMs: this.#timeoutMs },
    );
    e.name = created.metadata?.name;
    e.count = p.count;
  }

  /** Forgets idle keys outside the window; above the cap, also the oldest idle keys (their
   * next occurrence simply starts a new event). */
  #prune(now: number): void {
    const idle = (v: Entry) => !v.pending && !v.inflight && !v.queued;
    for (const [k, v] of this.#entries) {
      if (idle(v) && now - v.seenAt >= this.#windowMs) this.#entries.delete(k);
    }
    for (const [k, v] of this.#entries) {
      if (this.#entries.size < PRUNE_ABOVE / 2) break;
      if (idle(v)) this.#entries.delete(k);
    }
  }
}
