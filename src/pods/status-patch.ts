// Builds the UID-fenced strategic merge patch for pods/<name>/status (docs/contracts/virtual-node.md "Status writes").
// A strategic merge patch merges maps, so switching a container from `running` to
// `terminated` must null the other state keys explicitly, and a cleared podIP must be
// sent as null, or the old values would survive. Pure.
import type { V1ContainerStatus, V1PodStatus } from '@kubernetes/client-node';

const STATE_KEYS = ['waiting', 'running', 'terminated'] as const;

function containerPatch(cs: V1ContainerStatus): Record<string, unknown> {
  const state: Record<string, unknown> = {};
  for (const k of STATE_KEYS) state[k] = cs.state?.[k] ?? null;
  return { ...cs, state };
}

export function buildStatusPatch(uid: string, status: V1PodStatus): Record<string, unknown> {
  const s: Record<string, unknown> = { ...status };
  s.podIP = status.podIP ?? null;
  s.podIPs = status.podIPs && status.podIPs.length > 0 ? status.podIPs : null;
  if (status.containerStatuses) s.containerStatuses = status.containerStatuses.map(containerPatch);
  if (status.reason === undefined) s.reason = null;
  if (status.message === undefined) s.message = null;
  return { metadata: { uid }, status: s };
}

/** The fields whose drift makes a resync re-assert the provider's status (pitfall 4). */
export function statusSignature(status: V1PodStatus | undefined): string {
  if (!status) return '';
  const cond = (t: string) => status.conditions?.find((c) => c.type === t)?.status ?? '';
  const agent = status.containerStatuses?.[0];
  const state = agent?.state ? STATE_KEYS.filter((k) => agent.state?.[k]).join(',') : '';
  return [
    status.phase ?? '',
    status.podIP ?? '',
    cond('Ready'),
    cond('Initialized'),
    String(agent?.ready ?? ''),
    state,
  ].join('|');
}
