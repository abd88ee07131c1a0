// Semantic comparison of pod objects (docs/contracts/virtual-node.md "Sync decisions" step 4–5, pitfall 9): nil equals
// empty, env order does not matter, status and bookkeeping fields are ignored. Pure.
import type { V1Pod } from '@kubernetes/client-node';

/** Stable JSON: sorted keys; null, undefined, empty arrays and empty objects dropped. */
export function canonical(value: unknown): string {
  return JSON.stringify(normalize(value)) ?? '';
}

function normalize(value: unknown): unknown {
  if (value === null || value === undefined) return undefined;
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) {
    const items = value.map(normalize).filter((v) => v !== undefined);
    return items.length === 0 ? undefined : items;
  }
  if (typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(value as object).sort()) {
      const v = normalize((value as Record<string, unknown>)[k]);
      if (v !== undefined) out[k] = v;
    }
    return Object.keys(out).length === 0 ? undefined : out;
  }
  return value;
}

function sortedEnv<T extends { env?: { name: string }[] }>(containers: T[] | undefined): T[] | undefined {
  return containers?.map((c) => ({
    ...c,
    env: c.env ? [...c.env].sort((a, b) => a.name.localeCompare(b.name)) : undefined,
  }));
}

/** The fields whose change makes the controller call UpdatePod. */
export function providerRelevant(pod: V1Pod): string {
  return canonical({
    containers: sortedEnv(pod.spec?.containers),
    initContainers: sortedEnv(pod.spec?.initContainers),
    ephemeralContainers: sortedEnv(pod.spec?.ephemeralContainers),
    activeDeadlineSeconds: pod.spec?.activeDeadlineSeconds,
    tolerations: pod.spec?.tolerations,
    labels: pod.metadata?.labels,
    annotations: pod.metadata?.annotations,
  });
}

/** Identity of a pod version as the controller last handled it (status ignored). */
export function handledFingerprint(pod: V1Pod): string {
  return `${pod.metadata?.uid ?? ''}\0${pod.metadata?.deletionTimestamp ? 'deleting' : ''}\0${providerRelevant(pod)}`;
}
