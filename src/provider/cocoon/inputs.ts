// The create inputs of a pod (docs/decisions.md, "Create failures"): what a failed create
// must see change before it is re-run.
import type { V1Pod } from '@kubernetes/client-node';
import { GENERATION, MANAGED, VM_ID, VM_IP } from '../../contract/annotations.ts';
import { PROVIDER_OWNED_KEYS } from './record-types.ts';

/** What a create attempt reads from the pod: every annotation but the provider-owned ones
 * and the generation (a bump re-runs a create on its own, a drop does not), the owner
 * references and the containers (resources). Our own writes and status-only updates never
 * change it, so they never re-run a failed create. An unmanaged pod's `id`/`ip` are inputs
 * written by its operator. */
export function createInputsKey(pod: V1Pod): string {
  const ann = { ...(pod.metadata?.annotations ?? {}) };
  const managed = ann[MANAGED] === 'true';
  for (const k of PROVIDER_OWNED_KEYS) {
    if (managed || (k !== VM_ID && k !== VM_IP)) delete ann[k];
  }
  delete ann[GENERATION];
  return JSON.stringify([
    Object.entries(ann).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
    (pod.metadata?.ownerReferences ?? []).map((o) => [o.kind, o.name, o.uid, o.controller ?? false]),
    (pod.spec?.containers ?? []).map((c) => [c.name, c.image ?? '', c.resources ?? {}]),
  ]);
}
