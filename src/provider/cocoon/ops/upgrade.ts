// The one-time upgrade rule of the provenance ledger (docs/security.md, "Upgrading from the
// Go daemon"): a node that has no ledger yet takes over only what its pods unambiguously name.
import type { V1Pod } from '@kubernetes/client-node';
import { ownerOf } from '../../../authority/owner.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { LIFECYCLE_STATE, VM_ID, VM_NAME } from '../../../contract/annotations.ts';
import { isManagedRaw } from '../claims.ts';
import type { ProviderContext } from '../context.ts';

export type TakeOverEntry = Parameters<ProviderContext['ledger']['takeOver']>[0][number];

import { keyOf } from '../../../kube/key.ts';

/** The one-time takeover: the ledger, and a log line of what it took. */
export type UpgradeCtx = Pick<ProviderContext, 'ledger' | 'log'>;

/** The one-time upgrade rule (docs/security.md, "Upgrading from the Go daemon"): with no
 * ledger yet, a VM named by `vm.cocoonstack.io/id` on exactly one live managed pod of this
 * node, under that pod's VM name, becomes that pod's identity's; so does the local snapshot
 * of a pod published `hibernated` whose VM name no other pod claims. Anything else (a VM two
 * pods name, a VM no pod names) stays unowned: kept, never adopted by a managed pod. */
export async function takeOverAtFirstStart(
  ctx: UpgradeCtx,
  pods: readonly V1Pod[],
  vms: readonly VmRecord[],
  snapshots: readonly { name: string; id: string }[] | undefined,
): Promise<void> {
  const entries = upgradeEntries(pods, vms, snapshots);
  await ctx.ledger.takeOver(entries);
  ctx.log.info(
    {
      vms: entries.filter((e) => e.kind === 'vm').length,
      snapshots: entries.filter((e) => e.kind === 'snapshot').length,
    },
    "no provenance ledger yet: took over what this node's pods name (one-time upgrade rule)",
  );
}

/** The entries the upgrade rule takes over (pure; test/unit/provider/upgrade.test.ts). */
export function upgradeEntries(
  pods: readonly V1Pod[],
  vms: readonly Pick<VmRecord, 'id' | 'name'>[],
  snapshots: readonly { name: string; id: string }[] | undefined,
): TakeOverEntry[] {
  const live = pods.filter(
    (p) => p.status?.phase !== 'Succeeded' && p.status?.phase !== 'Failed' && isManagedRaw(p),
  );
  const byId = new Map(vms.map((vm) => [vm.id, vm]));
  const snaps = new Map((snapshots ?? []).map((s) => [s.name, s]));
  const vmClaims = new Map<string, V1Pod[]>();
  const snapClaims = new Map<string, V1Pod[]>();
  for (const pod of live) {
    const ann = pod.metadata?.annotations ?? {};
    const vm = byId.get(ann[VM_ID] ?? '');
    if (vm && vm.name === ann[VM_NAME]) vmClaims.set(vm.id, [...(vmClaims.get(vm.id) ?? []), pod]);
    const name = ann[VM_NAME] ?? '';
    if (name) snapClaims.set(name, [...(snapClaims.get(name) ?? []), pod]);
  }
  const entries: TakeOverEntry[] = [];
  for (const [id, claimants] of vmClaims) {
    const vm = byId.get(id);
    if (!vm || claimants.length !== 1) continue;
    const pod = claimants[0]!;
    entries.push({
      kind: 'vm',
      name: vm.name,
      id,
      owner: ownerOf(pod, vm.name),
      pod: { key: keyOf(pod), uid: pod.metadata?.uid ?? '' },
    });
  }
  for (const [name, claimants] of snapClaims) {
    const snap = snaps.get(name);
    const pod = claimants[0]!;
    if (!snap || claimants.length !== 1 || pod.metadata?.annotations?.[LIFECYCLE_STATE] !== 'hibernated')
      continue;
    entries.push({
      kind: 'snapshot',
      name,
      id: snap.id,
      owner: ownerOf(pod, name),
      pod: { key: keyOf(pod), uid: pod.metadata?.uid ?? '' },
    });
  }
  return entries;
}
