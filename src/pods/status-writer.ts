// Pod status publication (the framework's PodStatusSink, docs/architecture.md): UID-fenced
// strategic merge patches of `pods/<name>/status`, de-duplicated per key, retried with
// backoff, kept pending for pods the watch cache does not hold yet, and re-asserted by the
// controller's resync when the API copy drifted. Created before the provider and handed to
// it at construction, so statuses produced during startup are queued and reach the API as
// soon as the pod controller starts. A status the pod's API copy already carries is not
// written (docs/decisions.md, "Writes per bring-up": a restart re-publishes every pod, and
// a pod whose published status is right costs no write).
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import {
  apiErrorMessage,
  apiStatus,
  type Kube,
  POD_WRITE_TIMEOUT_MS,
  strategicMergePatch,
  type WriteOptions,
  withSignal,
} from '../kube/client.ts';
import { keyOf } from '../kube/key.ts';
import type { Logger } from '../log.ts';
import { WorkQueue } from '../util/work-queue.ts';
import type { PodStatusSink, StatusWriteOptions } from './ports.ts';
import { buildStatusPatch, statusSignature } from './status-patch.ts';

function isTerminalPhase(phase: string | undefined): boolean {
  return phase === 'Succeeded' || phase === 'Failed';
}

export class PodStatusWriter implements PodStatusSink {
  readonly #kube: Kube;
  readonly #log: Logger;
  readonly #queue: WorkQueue;
  /** Latest status the provider published, not yet written, per key. */
  readonly #pending = new Map<string, V1Pod>();
  /** Last status written per key (uid + JSON), for de-duplication. */
  readonly #written = new Map<string, { uid: string; json: string }>();
  /** resourceVersion answered to our last status write per key ('' when the answer had
   * none): a watch-cache copy older than it does not show that write yet, so it cannot tell
   * that a status is already there. */
  readonly #writtenRV = new Map<string, string>();
  /** The watch cache; until the controller starts, statuses only accumulate. */
  #live: ((key: string) => V1Pod | undefined) | undefined;
  #stopped = false;

  constructor(opts: { kube: Kube; log: Logger }) {
    this.#kube = opts.kube;
    this.#log = opts.log.child({ module: 'pod-status' });
    this.#queue = new WorkQueue((key) => this.#write(key), {
      concurrency: 16,
      baseDelayMs: 200,
      maxDelayMs: 30_000,
    });
    this.#queue.onError = (key, err) =>
      this.#log.warn({ pod: key, err: errText(err) }, 'status write failed; retrying');
  }

  /** Starts writing against the watch cache (the pod controller calls this once it listed). */
  start(live: (key: string) => V1Pod | undefined): void {
    this.#live = live;
    for (const key of this.#pending.keys()) this.#queue.add(key);
  }

  stop(): void {
    this.#stopped = true;
    this.#queue.stop();
  }

  idle(): Promise<void> {
    return this.#queue.idle();
  }

  notify(pod: V1Pod): void {
    if (this.#stopped) return;
    const key = keyOf(pod);
    this.#pending.set(key, pod);
    if (this.#live) this.#queue.add(key);
  }

  /** The watch brought a newer copy of the pod: a pending status may be writable now. */
  podChanged(key: string): void {
    if (this.#live && this.#pending.has(key)) this.#queue.add(key);
  }

  /** The API copy drifted from what the provider wants (resync): write it again. */
  reassert(pod: V1Pod): void {
    const key = keyOf(pod);
    this.#written.delete(key);
    this.notify(pod);
  }

  forget(key: string): void {
    this.#pending.delete(key);
    this.#written.delete(key);
    this.#writtenRV.delete(key);
  }

  async #write(key: string): Promise<void> {
    const want = this.#pending.get(key);
    if (!want?.status) return;
    const live = this.#live?.(key);
    // Not in the cache yet (startup race): keep it pending; the watch event that brings the
    // pod calls podChanged.
    if (!live) return;
    const done = () => {
      if (this.#pending.get(key) === want) this.#pending.delete(key);
    };
    if (live.metadata?.uid !== want.metadata?.uid || isTerminalPhase(live.status?.phase)) return done();
    const uid = want.metadata?.uid ?? '';
    const json = JSON.stringify(want.status);
    const last = this.#written.get(key);
    if (last && last.uid === uid && last.json === json) return done();
    if (this.#showsOurWrites(key, live) && statusApplied(live.status, want.status)) {
      // The API copy already carries this status (a restart re-publishing a pod whose
      // status is right; the same status computed again): nothing to write.
      this.#written.set(key, { uid, json });
      return done();
    }
    try {
      await this.patch(want, want.status);
    } catch (err) {
      const code = apiStatus(err);
      // Gone or superseded by another incarnation: drop, never retry.
      if (code === 404 || code === 409 || code === 422) return done();
      throw err;
    }
    this.#written.set(key, { uid, json });
    this.#log.debug({ pod: key, phase: want.status.phase, podIP: want.status.podIP }, 'status written');
    done();
  }

  /** One status patch, bounded: the token wait by the write limiter's bound, the request by
   * POD_WRITE_TIMEOUT_MS (a black-holed connection cannot hold the status queue). */
  async patch(pod: V1Pod, status: V1PodStatus, opts: WriteOptions = {}): Promise<void> {
    const res = await this.#kube.write(this.#request(pod, status), {
      timeoutMs: POD_WRITE_TIMEOUT_MS,
      ...opts,
    });
    this.#noteRV(keyOf(pod), res?.metadata?.resourceVersion);
  }

  #noteRV(key: string, rv: string | undefined): void {
    this.#writtenRV.set(key, rv ?? '');
  }

  /** The watch-cache copy is at least as new as our last status write of the key (or we
   * made none in this process). resourceVersions are compared as etcd revisions; when
   * either is not a plain integer the copy is not trusted. */
  #showsOurWrites(key: string, live: V1Pod): boolean {
    const ours = this.#writtenRV.get(key);
    if (ours === undefined) return true;
    const theirs = live.metadata?.resourceVersion ?? '';
    if (!/^\d+$/.test(ours) || !/^\d+$/.test(theirs)) return false;
    return BigInt(theirs) >= BigInt(ours);
  }

  /** Writes a status now, with `opts.annotations` in the same patch (the apiserver takes
   * `metadata.annotations` in a pods/status patch, so the `ready` annotation and the status
   * with podIP and PodReady land in one atomic write): the lifecycle patch's retry policy
   * (3 attempts, 500 ms apart, 5 s each; 404/409/422 are rethrown at once), by default
   * ahead of waiting normal-priority writes. A status notified before this write started
   * is superseded by it and not written any more. Resolves with the new resourceVersion. */
  async writeNow(pod: V1Pod, opts: StatusWriteOptions = {}): Promise<string | undefined> {
    const status = pod.status;
    if (!status) return undefined;
    const key = keyOf(pod);
    const live = this.#live?.(key);
    if (live?.metadata?.uid === pod.metadata?.uid && isTerminalPhase(live?.status?.phase)) {
      // Nothing changes the status of a pod whose API phase is terminal; the annotations
      // still land (same subresource, same UID fence, no status in the body).
      if (!opts.annotations || Object.keys(opts.annotations).length === 0) return undefined;
      const res = await this.#kube.writeRetrying(this.#annotationsOnly(pod, opts.annotations), {
        priority: opts.priority ?? 'high',
      });
      return res?.metadata?.resourceVersion;
    }
    const before = this.#pending.get(key);
    const res = await this.#kube.writeRetrying(this.#request(pod, status, opts.annotations), {
      priority: opts.priority ?? 'high',
    });
    this.#written.set(key, { uid: pod.metadata?.uid ?? '', json: JSON.stringify(status) });
    this.#noteRV(key, res?.metadata?.resourceVersion);
    this.#log.debug(
      {
        pod: key,
        phase: status.phase,
        podIP: status.podIP,
        annotations: Object.keys(opts.annotations ?? {}),
      },
      'status written with annotations',
    );
    if (before !== undefined && this.#pending.get(key) === before) this.#pending.delete(key);
    return res?.metadata?.resourceVersion;
  }

  #annotationsOnly(pod: V1Pod, annotations: Readonly<Record<string, string | null>>) {
    const namespace = pod.metadata?.namespace ?? '';
    const name = pod.metadata?.name ?? '';
    const body = { metadata: { uid: pod.metadata?.uid ?? '', annotations: { ...annotations } } };
    return (signal?: AbortSignal) =>
      this.#kube.core.patchNamespacedPodStatus(
        { name, namespace, body },
        withSignal(signal, strategicMergePatch),
      );
  }

  /** The UID-fenced strategic merge patch of `pods/<name>/status` (with annotation changes
   * when given), cancellable by its signal. */
  #request(pod: V1Pod, status: V1PodStatus, annotations?: Readonly<Record<string, string | null>>) {
    const namespace = pod.metadata?.namespace ?? '';
    const name = pod.metadata?.name ?? '';
    const body = buildStatusPatch(pod.metadata?.uid ?? '', status);
    if (annotations && Object.keys(annotations).length > 0) {
      body.metadata = { ...(body.metadata as Record<string, unknown>), annotations: { ...annotations } };
    }
    return (signal?: AbortSignal) =>
      this.#kube.core.patchNamespacedPodStatus(
        { name, namespace, body },
        withSignal(signal, strategicMergePatch),
      );
  }

  /** True when the API copy's status differs from `want` in what a status write sets. */
  static drifted(api: V1PodStatus | undefined, want: V1PodStatus): boolean {
    return statusSignature(api) !== statusSignature(want);
  }
}

/** Strategic-merge list keys of the pod status lists the provider writes; other lists
 * (containerStatuses) are replaced as a whole. */
const MERGE_KEYS: Readonly<Record<string, string>> = { conditions: 'type', podIPs: 'ip' };

const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/** A time as the apiserver stores it (metav1.Time: RFC 3339, whole seconds, UTC). */
function normTime(v: unknown): unknown {
  const d = v instanceof Date ? v : typeof v === 'string' && RFC3339.test(v) ? new Date(v) : undefined;
  if (!d || Number.isNaN(d.getTime())) return v;
  return `${d.toISOString().slice(0, 19)}Z`;
}

/** A value the API omits (Go `omitempty`): absent, null, '', false, 0 or an empty list. */
function isEmpty(v: unknown): boolean {
  return (
    v === undefined ||
    v === null ||
    v === '' ||
    v === false ||
    v === 0 ||
    (Array.isArray(v) && v.length === 0)
  );
}

/** True when applying the strategic merge patch value `patch` to `live` changes nothing. */
function covers(live: unknown, patch: unknown, field = ''): boolean {
  if (patch === undefined) return true;
  if (isEmpty(patch)) return isEmpty(live);
  if (Array.isArray(patch)) {
    if (!Array.isArray(live)) return false;
    const mergeKey = MERGE_KEYS[field];
    if (!mergeKey) return live.length === patch.length && patch.every((p, i) => covers(live[i], p));
    return patch.every((p) => {
      const id = (p as Record<string, unknown> | null)?.[mergeKey];
      return covers(
        live.find((l) => (l as Record<string, unknown> | null)?.[mergeKey] === id),
        p,
      );
    });
  }
  if (patch instanceof Date || live instanceof Date) return normTime(live) === normTime(patch);
  if (typeof patch === 'object') {
    if (typeof live !== 'object' || live === null) return false;
    const l = live as Record<string, unknown>;
    return Object.entries(patch as Record<string, unknown>).every(([k, v]) => covers(l[k], v, k));
  }
  if (typeof patch === 'string' && typeof live === 'string') return normTime(live) === normTime(patch);
  return live === patch;
}

/** True when the status patch of `want` would leave the API copy's status `live` as it is:
 * every field the patch sets (lists merged by their keys, cleared fields absent, times at
 * the apiserver's whole seconds) already has that value. Fields the patch does not set
 * (qosClass, hostIPs, condition probe times) do not count. */
export function statusApplied(live: V1PodStatus | undefined, want: V1PodStatus): boolean {
  if (!live) return false;
  return covers(live, buildStatusPatch('', want).status);
}

function errText(err: unknown): string {
  return err instanceof Error ? apiErrorMessage(err) : String(err);
}
