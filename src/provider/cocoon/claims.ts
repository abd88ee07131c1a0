// Which pod holds which VM (docs/decisions.md, "VM ownership"). A VM, by ID or by name, is
// held by at most one tracked pod: never destroyed, shared or handed over to another. The
// answer is derived from the tracked records every time it is asked (level-triggered: no
// second index that could drift from them).
import type { V1Pod } from '@kubernetes/client-node';
import { MANAGED, VM_ID, VM_NAME } from '../../contract/annotations.ts';
import { keyOf } from '../../kube/key.ts';
import type { PodRecord } from './state.ts';

/** A full cocoon VM ID: 26 characters of the RFC 4648 base32 alphabet. */
export function isVmId(value: string): boolean {
  return /^[A-Z2-7]{26}$/.test(value);
}

/** The tracked pod other than `self` whose bound VM has this ID (or, when given, name). */
export function holderOfVm(
  pods: ReadonlyMap<string, PodRecord>,
  self: string,
  vm: { id: string; name?: string },
): PodRecord | undefined {
  for (const rec of pods.values()) {
    if (rec.key === self || !rec.vm) continue;
    if (rec.vm.id === vm.id || (vm.name && rec.vm.name === vm.name)) return rec;
  }
  return undefined;
}

/** The tracked pod other than `self` that holds the VM name: its bound VM has that name, a
 * bring-up for that name is queued or running, or the name's VM is hibernated, hibernating
 * or waking for it (its saved state is that pod's, never another pod's to restore). */
export function holderOfName(
  pods: ReadonlyMap<string, PodRecord>,
  self: string,
  vmName: string,
): PodRecord | undefined {
  if (!vmName) return undefined;
  for (const rec of pods.values()) {
    if (rec.key === self) continue;
    if (rec.vm?.name === vmName) return rec;
    if (rec.spec?.vmName !== vmName) continue;
    if (rec.bringingUp || rec.waking || rec.hibernate || rec.intent?.state === 'hibernated') return rec;
  }
  return undefined;
}

/** VM IDs and names that pods reference in their raw annotations, decodable or not: the
 * orphan sweep never removes what any of them names (an unmanaged pod's pre-written id, a
 * managed pod whose annotations stopped decoding). */
export function referencedVms(pods: readonly V1Pod[]): { ids: Set<string>; names: Set<string> } {
  const ids = new Set<string>();
  const names = new Set<string>();
  for (const pod of pods) {
    const ann = pod.metadata?.annotations ?? {};
    if (ann[VM_ID]) ids.add(ann[VM_ID]);
    if (ann[VM_NAME]) names.add(ann[VM_NAME]);
  }
  return { ids, names };
}

/** Raw `managed` flag, readable even when the rest of the annotations do not decode. */
export function isManagedRaw(pod: V1Pod): boolean {
  return pod.metadata?.annotations?.[MANAGED] === 'true';
}

/** Oldest first (creation time, then key): when two pods claim one VM the older keeps it. */
export function byAge(a: V1Pod, b: V1Pod): number {
  const ta = new Date(a.metadata?.creationTimestamp ?? 0).getTime();
  const tb = new Date(b.metadata?.creationTimestamp ?? 0).getTime();
  if (ta !== tb) return ta - tb;
  const ka = keyOf(a);
  const kb = keyOf(b);
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}
