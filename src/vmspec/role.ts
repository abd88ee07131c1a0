/** Role derivation for the `main-only` snapshot policy (docs/contracts/annotations.md "Role derivation", last paragraph). */
import { parseInt64 } from '../contract/annotations.ts';
import type { VMRole } from '../contract/vm.ts';

/** The subset of an ownerReference the role derivation reads (compatible with `V1OwnerReference`). */
export interface OwnerReferenceLike {
  readonly kind: string;
  readonly name: string;
}

/**
 * Derives the VM's role: take the name of the ownerReference with `kind: CocoonSet` (empty if
 * none, first one wins); strip the prefix `vk-<namespace>-<cocoonset>-` from the VM name
 * (left unchanged when absent, like Go's `strings.TrimPrefix`); a remainder of ASCII digits
 * only (within int64, like Go's `strconv.Atoi`) is the slot: `0` ⇒ `main`, `> 0` ⇒
 * `sub-agent`; anything else (empty, a sign, a `-`, letters, overflow) ⇒ `toolbox`. Never inferred from a name suffix or labels.
 */
export function deriveRole(
  vmName: string,
  namespace: string,
  ownerReferences: readonly OwnerReferenceLike[] | undefined,
): VMRole {
  const cocoonSet = ownerReferences?.find((ref) => ref.kind === 'CocoonSet')?.name ?? '';
  const prefix = `vk-${namespace}-${cocoonSet}-`;
  const remainder = vmName.startsWith(prefix) ? vmName.slice(prefix.length) : vmName;
  const slot = parseInt64(remainder);
  if (slot === undefined || !/^[0-9]+$/.test(remainder)) return 'toolbox';
  return slot === 0n ? 'main' : 'sub-agent';
}
