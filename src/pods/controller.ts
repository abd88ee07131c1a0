// The pod controller: the framework half that watches this node's pods and calls the
// provider (docs/contracts/virtual-node.md "Pod controller"–docs/contracts/virtual-node.md "Environment resolution"). It is level-triggered: every sync re-reads the pod
// from the watch cache and the provider's copy and decides from those, never from what an
// earlier callback remembered. Per key, at most one sync runs; a newer event never
// cancels a sync in flight, it only schedules one more run.
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { apiErrorMessage, apiStatus, type Kube } from '../kube/client.ts';
import type { EventSink } from '../kube/events.ts';
import type { Informer } from '../kube/informer.ts';
import { keyOf, podKey, splitKey } from '../kube/key.ts';
import type { Logger } from '../log.ts';
import { monoNow } from '../util/mono-clock.ts';
import { WorkQueue } from '../util/work-queue.ts';
import { type Dependency, type EnvSources, resolvePodEnv } from './env.ts';
import { handledFingerprint, providerRelevant } from './fingerprint.ts';
import { NotFoundError, type PodLifecycleHandler } from './ports.ts';
import { PodStatusWriter } from './status-writer.ts';

export interface PodControllerOptions {
  kube: Kube;
  nodeName: string;
  provider: PodLifecycleHandler;
  /** The status writer the provider was constructed with (one per process). */
  status: PodStatusWriter;
  events: EventSink;
  log: Logger;
  /** Concurrent syncs of different pods. */
  workers?: number;
  resyncMs?: number;
}

function isTerminalPhase(phase: string | undefined): boolean {
  return phase === 'Succeeded' || phase === 'Failed';
}

function depKey(d: Dependency): string {
  return `${d.kind}/${d.namespace}/${d.name}`;
}

export class PodController {
  readonly #o: Required<PodControllerOptions>;
  readonly #log: Logger;
  readonly #informer: Informer<V1Pod>;
  readonly #queue: WorkQueue;
  readonly #status: PodStatusWriter;
  /** Pod version whose sync failed, and when its backoff retry is due, per key. */
  // The failure count lives here, not in the WorkQueue: an early return during a backoff
  // resolves the queue's sync and so resets the queue's own count.
  readonly #failedSync = new Map<string, { fp: string; retryAt: number; attempts: number }>();
  /** Fingerprint of the pod version the last successful sync handled, per key. */
  readonly #handled = new Map<string, string>();
  /** Pods held back by a missing (or unreadable) mandatory ConfigMap/Secret: how many
   * re-gets found it still missing, per pod key (sets the next re-get's delay). */
  readonly #heldBack = new Map<string, number>();
  #resyncTimer: NodeJS.Timeout | undefined;
  #stopped = false;
  #synced = false;

  constructor(opts: PodControllerOptions) {
    this.#o = { workers: 64, resyncMs: 60_000, ...opts };
    this.#log = opts.log.child({ module: 'pod-controller' });
    this.#status = opts.status;
    const fieldSelector = `spec.nodeName=${opts.nodeName}`;
    // The informer relists on 410 and re-opens the watch with backoff by itself
    // (src/kube/informer.ts); its errors are only logged here.
    this.#informer = opts.kube.informer<V1Pod>(
      '/api/v1/pods',
      () => opts.kube.core.listPodForAllNamespaces({ fieldSelector }),
      { fieldSelector },
    );
    const enqueue = (pod: V1Pod) => {
      const key = keyOf(pod);
      this.#queue.add(key);
      this.#status.podChanged(key);
    };
    this.#informer.on('add', enqueue);
    this.#informer.on('update', enqueue);
    this.#informer.on('delete', enqueue);
    this.#informer.on('error', (err: unknown) => {
      if (this.#stopped) return;
      this.#log.warn({ err: apiErrorMessage(err) }, 'pod list or watch failed; retrying with backoff');
    });
    this.#queue = new WorkQueue((key) => this.#sync(key), { concurrency: this.#o.workers });
    this.#queue.onError = (key, err, attempt) =>
      this.#log.warn({ pod: key, attempt, err: errText(err) }, 'pod sync failed; retrying with backoff');
  }

  /** Lists pods (waiting, with retries, until a list succeeds), sweeps dangling provider
   * pods, starts the workers and the resync timer. */
  async start(): Promise<void> {
    await this.#informer.start();
    this.#synced = true;
    // Statuses the provider published before now (startup reconcile) are written from here.
    this.#status.start((key) => this.cached(key));
    // Dangling sweep (docs/contracts/virtual-node.md "Dangling-pod sweep"): the list is node-scoped, so only this node's pods count.
    for (const pod of this.#o.provider.getPods()) {
      const key = keyOf(pod);
      if (this.cached(key)) continue;
      this.#log.info({ pod: key }, 'provider pod is not on this node any more; deleting it in the provider');
      this.#queue.add(key);
    }
    for (const pod of this.#informer.list()) this.#queue.add(keyOf(pod));
    this.#resyncTimer = setInterval(() => this.#resync(), this.#o.resyncMs);
    this.#resyncTimer.unref();
  }

  get synced(): boolean {
    return this.#synced;
  }

  /** The pod from the watch cache. */
  cached(key: string): V1Pod | undefined {
    const [namespace, name] = splitKey(key);
    return this.#informer.get(name, namespace);
  }

  /** Every pod of this node from the watch cache (kubelet `/pods`). */
  list(): V1Pod[] {
    return [...this.#informer.list()];
  }

  /** Re-drives a pod's sync (used by the provider). */
  enqueue(key: string): void {
    this.#queue.add(key);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearInterval(this.#resyncTimer);
    this.#queue.stop();
    this.#status.stop();
    await this.#informer.stop();
  }

  /** Resolves when no sync is queued or running (tests and shutdown). */
  async idle(): Promise<void> {
    await this.#queue.idle();
    await this.#status.idle();
  }

  #resync(): void {
    for (const pod of this.#informer.list()) {
      const key = keyOf(pod);
      this.#queue.add(key);
      // Re-assert the provider's status when the API copy drifted (pitfall 4).
      const [ns, name] = splitKey(key);
      const want = this.#o.provider.getPodStatus(ns, name);
      const tracked = this.#o.provider.getPod(ns, name);
      if (
        !want ||
        !tracked ||
        tracked.metadata?.uid !== pod.metadata?.uid ||
        isTerminalPhase(pod.status?.phase)
      )
        continue;
      if (PodStatusWriter.drifted(pod.status, want)) this.#status.reassert({ ...tracked, status: want });
    }
  }

  // ---- sync -------------------------------------------------------------------------

  async #sync(key: string): Promise<void> {
    if (this.#stopped) return;
    const [namespace, name] = splitKey(key);
    const pod = this.cached(key);
    const provider = this.#o.provider;
    if (!pod) {
      // Deleted from the API (docs/contracts/virtual-node.md "Sync decisions" step 1): delete in the provider with its own copy.
      const tracked = provider.getPod(namespace, name);
      if (tracked) await this.#providerDelete(tracked);
      this.#forget(key);
      return;
    }
    if (pod.metadata?.deletionTimestamp) {
      await this.#syncDeletion(key, pod);
      return;
    }
    if (isTerminalPhase(pod.status?.phase)) return;
    const fp = handledFingerprint(pod);
    // A sync that failed is retried on its backoff schedule, not by the watch events our
    // own writes cause: an unchanged pod waits for the timer (docs/decisions.md).
    const failed = this.#failedSync.get(key);
    if (failed && failed.fp === fp && monoNow() < failed.retryAt) {
      // The retry stays owed: re-arm the timer (a no-op when one is already pending).
      this.#queue.addAfter(key, failed.retryAt - monoNow());
      return;
    }
    try {
      await this.#syncPod(key, pod, fp);
      this.#failedSync.delete(key);
    } catch (err) {
      const attempts = (failed?.attempts ?? 0) + 1;
      this.#failedSync.set(key, { fp, retryAt: monoNow() + syncBackoffMs(attempts), attempts });
      throw err;
    }
  }

  async #syncPod(key: string, pod: V1Pod, fp: string): Promise<void> {
    const [namespace, name] = splitKey(key);
    const provider = this.#o.provider;
    const tracked = provider.getPod(namespace, name);
    if (tracked && tracked.metadata?.uid === pod.metadata?.uid && this.#handled.get(key) === fp) return;

    const resolution = await resolvePodEnv(pod, this.#envSources());
    for (const ev of resolution.events) this.#o.events.event(pod, ev.type, ev.reason, ev.message);
    if (resolution.blockedOn.length > 0) {
      this.#holdBack(key, resolution.blockedOn);
      return;
    }
    this.#heldBack.delete(key);

    if (!tracked) {
      try {
        await provider.createPod(pod);
      } catch (err) {
        await this.#reportCreateFailure(pod, err);
        throw err;
      }
      this.#o.events.event(pod, 'Normal', 'ProviderCreateSuccess', 'Create pod in provider successfully');
    } else if (
      tracked.metadata?.uid !== pod.metadata?.uid ||
      providerRelevant(tracked) !== providerRelevant(pod)
    ) {
      try {
        await provider.updatePod(pod);
      } catch (err) {
        this.#o.events.event(pod, 'Warning', 'ProviderUpdateFailed', errText(err));
        throw err;
      }
    }
    this.#handled.set(key, fp);
  }

  async #syncDeletion(key: string, pod: V1Pod): Promise<void> {
    const [namespace, name] = splitKey(key);
    const tracked = this.#o.provider.getPod(namespace, name);
    if (tracked) {
      // Every tracked pod goes through DeletePod, even with no container running: the
      // Go framework's shortcut here can leak a VM that is still booting (docs/contracts/virtual-node.md "Sync decisions").
      let deleted: boolean;
      try {
        deleted = await this.#providerDelete(pod);
      } catch (err) {
        this.#o.events.event(pod, 'Warning', 'ProviderDeleteFailed', errText(err));
        throw err;
      }
      // Not found: the provider dropped the pod meanwhile (an eviction) after publishing its
      // own terminal status; the generic one must not overwrite it.
      if (deleted) await this.#writeTerminalStatus(pod);
    }
    await this.#forceDelete(pod);
    this.#forget(key);
  }

  async #providerDelete(pod: V1Pod): Promise<boolean> {
    try {
      await this.#o.provider.deletePod(pod);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  async #forceDelete(pod: V1Pod): Promise<void> {
    const namespace = pod.metadata?.namespace ?? '';
    const name = pod.metadata?.name ?? '';
    try {
      await this.#o.kube.write(() =>
        this.#o.kube.core.deleteNamespacedPod({
          name,
          namespace,
          gracePeriodSeconds: 0,
          body: { gracePeriodSeconds: 0, preconditions: { uid: pod.metadata?.uid } },
        }),
      );
      this.#log.info({ pod: podKey(namespace, name) }, 'pod deleted');
    } catch (err) {
      const code = apiStatus(err);
      // 404: already gone; 409: a recreated pod with the same name must survive.
      if (code === 404 || code === 409) return;
      throw err;
    }
  }

  async #writeTerminalStatus(pod: V1Pod): Promise<void> {
    const status: V1PodStatus = {
      ...(pod.status ?? {}),
      phase: 'Succeeded',
      conditions: (pod.status?.conditions ?? []).map((c) =>
        c.type === 'Ready' || c.type === 'ContainersReady'
          ? { ...c, status: 'False', lastTransitionTime: new Date() }
          : c,
      ),
      containerStatuses: (pod.spec?.containers ?? []).map((c) => ({
        name: c.name,
        image: c.image ?? '',
        imageID: '',
        ready: false,
        restartCount: 0,
        state: { terminated: { exitCode: 0, reason: 'Completed', finishedAt: new Date() } },
      })),
    };
    try {
      await this.#status.patch(pod, status);
    } catch (err) {
      this.#log.debug(
        { pod: keyOf(pod), err: errText(err) },
        'terminal status write failed (pod is being force-deleted)',
      );
    }
  }

  async #reportCreateFailure(pod: V1Pod, err: unknown): Promise<void> {
    const message = errText(err);
    this.#o.events.event(pod, 'Warning', 'ProviderCreateFailed', message);
    if (pod.status?.reason === 'ProviderFailed' && pod.status?.message === message) return;
    const status: V1PodStatus = {
      ...(pod.status ?? {}),
      phase: pod.spec?.restartPolicy === 'Never' ? 'Failed' : 'Pending',
      reason: 'ProviderFailed',
      message,
    };
    try {
      await this.#status.patch(pod, status);
    } catch (e) {
      this.#log.debug({ pod: keyOf(pod), err: errText(e) }, 'create-failure status write failed');
    }
  }

  #forget(key: string): void {
    this.#handled.delete(key);
    this.#failedSync.delete(key);
    this.#status.forget(key);
    this.#heldBack.delete(key);
  }

  // ---- ConfigMap/Secret dependencies ---------------------------------------------------

  #envSources(): EnvSources {
    const core = this.#o.kube.core;
    const read = async (fn: () => Promise<{ data?: Record<string, string> }>, decode: boolean) => {
      try {
        const obj = await fn();
        const data = obj.data ?? {};
        if (!decode) return data;
        return Object.fromEntries(
          Object.entries(data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]),
        );
      } catch (err) {
        if (apiStatus(err) === 404) return null;
        throw err;
      }
    };
    return {
      configMap: (namespace, name) => read(() => core.readNamespacedConfigMap({ namespace, name }), false),
      secret: (namespace, name) => read(() => core.readNamespacedSecret({ namespace, name }), true),
      serviceEnv: async () => ({}),
    };
  }

  /** Holds a pod back and schedules the re-get of what it waits for. No ConfigMap/Secret is
   * listed or watched: the daemon's identity may read only the objects its pods name
   * (under the Node authorizer, exactly those), so the next sync reads them again by name,
   * after dependencyRecheckMs (any pod change re-syncs sooner). */
  #holdBack(key: string, blockedOn: Dependency[]): void {
    const attempts = (this.#heldBack.get(key) ?? 0) + 1;
    this.#heldBack.set(key, attempts);
    const delayMs = dependencyRecheckMs(attempts);
    this.#queue.addAfter(key, delayMs);
    // Logged at info once per hold, then at debug on every re-get.
    this.#log[attempts === 1 ? 'info' : 'debug'](
      { pod: key, blockedOn: blockedOn.map(depKey), attempts, recheckInMs: delayMs },
      'pod waits for a mandatory ConfigMap/Secret',
    );
  }
}

/** Delay before the `attempt`-th re-get of a held-back pod's missing ConfigMap/Secret: 1 s
 * doubling to 30 s, no give-up (docs/contracts/virtual-node.md "Environment resolution"). So a
 * late object is picked up within 30 s of its creation, sooner in the first minute. */
export function dependencyRecheckMs(attempt: number): number {
  return Math.min(DEPENDENCY_RECHECK_MAX_MS, 1000 * 2 ** Math.min(attempt - 1, 10));
}
export const DEPENDENCY_RECHECK_MAX_MS = 30_000;

/** The pod queue's retry delay after `attempt` failures (5 ms doubling to 1000 s, docs/contracts/virtual-node.md "Queues and retries"). */
function syncBackoffMs(attempt: number): number {
  return Math.min(1_000_000, 5 * 2 ** Math.min(attempt - 1, 40));
}

function errText(err: unknown): string {
  return err instanceof Error ? apiErrorMessage(err) : String(err);
}
