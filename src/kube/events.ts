// Kubernetes events for pods (core/v1 Events, as kubelet's recorder writes them). Repeats
// of the same (object, type, reason, message) within 10 minutes bump `count` on the
// existing event instead of creating a new one. Events are best effort: a failed write is
// logged, never thrown, and never blocks the caller's decision.
import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { Logger } from '../log.ts';
import { type Kube, mergePatch } from './client.ts';

export type EventType = 'Normal' | 'Warning';

export interface EventSink {
  event(pod: V1Pod, type: EventType, reason: string, message: string): void;
}

interface Seen {
  name: string;
  namespace: string;
  count: number;
  at: number;
}

const AGGREGATE_WINDOW_MS = 10 * 60_000;

export class EventRecorder implements EventSink {
  readonly #kube: Kube;
  readonly #host: string;
  readonly #log: Logger;
  readonly #seen = new Map<string, Seen>();

  constructor(kube: Kube, host: string, log: Logger) {
    this.#kube = kube;
    this.#host = host;
    this.#log = log;
  }

  event(pod: V1Pod, type: EventType, reason: string, message: string): void {
    void this.#write(pod, type, reason, message).catch((err: unknown) => {
      this.#log.warn({ pod: podKeyOf(pod), reason, err: String(err) }, 'event write failed');
    });
  }

  async #write(pod: V1Pod, type: EventType, reason: string, message: string): Promise<void> {
    const namespace = pod.metadata?.namespace ?? 'default';
    const uid = pod.metadata?.uid ?? '';
    const key = `${uid}\0${type}\0${reason}\0${message}`;
    const now = new Date();
    const seen = this.#seen.get(key);
    if (seen && now.getTime() - seen.at < AGGREGATE_WINDOW_MS) {
      seen.count++;
      seen.at = now.getTime();
      await this.#kube.write(() =>
        this.#kube.core.patchNamespacedEvent(
          {
            name: seen.name,
            namespace: seen.namespace,
            body: { count: seen.count, lastTimestamp: now.toISOString() },
          },
          mergePatch,
        ),
      );
      return;
    }
    const body: CoreV1Event = {
      metadata: { generateName: `${pod.metadata?.name ?? 'pod'}.`, namespace },
      involvedObject: {
        apiVersion: 'v1',
        kind: 'Pod',
        namespace,
        name: pod.metadata?.name,
        uid,
        fieldPath: 'spec.containers{agent}',
      },
      reason,
      message,
      type,
      source: { component: 'vk-cocoon', host: this.#host },
      reportingComponent: 'vk-cocoon',
      reportingInstance: this.#host,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
    const created = await this.#kube.write(() => this.#kube.core.createNamespacedEvent({ namespace, body }));
    if (this.#seen.size > 10_000) this.#prune(now.getTime());
    this.#seen.set(key, { name: created.metadata?.name ?? '', namespace, count: 1, at: now.getTime() });
  }

  #prune(now: number): void {
    for (const [k, v] of this.#seen) if (now - v.at >= AGGREGATE_WINDOW_MS) this.#seen.delete(k);
  }
}

export function podKeyOf(pod: V1Pod): string {
  return `${pod.metadata?.namespace ?? ''}/${pod.metadata?.name ?? ''}`;
}
