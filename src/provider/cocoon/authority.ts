// The provider's side of the authority rules (docs/security.md): a pod record's owner
// identity, the ledger writes around every VM and snapshot the provider makes, and the checks
// every adopt, claim, save, remove, clone source and push goes through. The decisions are
// the pure rows of src/authority/rules.ts; this file gathers their facts.
import { type Owner, ownerOf } from '../../authority/owner.ts';
import {
  mayAdopt,
  mayClaimName,
  mayCloneRegistrySource,
  mayOverwriteTag,
  mayRemove,
  mayRestoreState,
  mayUseLocalSource,
  mayWriteSnapshot,
  type Stamp,
  type Verdict,
} from '../../authority/rules.ts';
import type { VmRecord } from '../../cocoon/records.ts';
import type { ProviderContext, SnapshotIdentity } from './context.ts';
import type { PodRecord } from './state.ts';

/** A request the authority rules refuse: permanent (bringup.ts isTransientCreateError),
 * `failed` with the rule in the message. */
export class AuthorityError extends Error {
  override name = 'AuthorityError';
  readonly rule: string;
  constructor(verdict: Extract<Verdict, { ok: false }>) {
    super(verdict.message);
    this.rule = verdict.rule;
  }
}

/** Throws the refusal of a verdict. */
export function enforce(verdict: Verdict): void {
  if (!verdict.ok) throw new AuthorityError(verdict);
}

/** The owner identity of a record's VM (its VM name by default). */
export function ownerOfRec(rec: PodRecord, vmName?: string): Owner {
  return ownerOf(rec.pod, vmName ?? rec.spec?.vmName ?? rec.vm?.name ?? '');
}

export function podRef(rec: PodRecord): { key: string; uid: string } {
  return { key: rec.key, uid: rec.uid };
}

/** The VM name a managed pod claims (create, before any cocoon call). */
export function checkClaim(
  ctx: Pick<ProviderContext, 'ledger' | 'localSnapshots'>,
  rec: PodRecord,
  vmName: string,
): Verdict {
  return mayClaimName(ownerOfRec(rec, vmName), {
    vm: ctx.ledger.vm(vmName),
    snapshot: ctx.ledger.snapshot(vmName),
    localSnapshotExists: ctx.localSnapshots.has(vmName),
  });
}

/** Adopting an existing VM for a managed pod. */
export function checkAdopt(ctx: Pick<ProviderContext, 'ledger'>, rec: PodRecord, vm: VmRecord): Verdict {
  return mayAdopt(ownerOfRec(rec, vm.name), vm, ctx.ledger.vm(vm.name));
}

/** Records the intent to make the pod's VM (before `vm clone`/`vm run`). */
export async function intendVm(
  ctx: Pick<ProviderContext, 'ledger'>,
  rec: PodRecord,
  vmName: string,
): Promise<void> {
  await ctx.ledger.intend('vm', vmName, ownerOfRec(rec, vmName), podRef(rec));
}

/** Confirms the pod's VM (bound after a bring-up or an adoption). */
export async function confirmVm(
  ctx: Pick<ProviderContext, 'ledger'>,
  rec: PodRecord,
  vm: VmRecord,
): Promise<void> {
  await ctx.ledger.confirm('vm', vm.name, vm.id, ownerOfRec(rec, vm.name), podRef(rec));
}

/** A local snapshot `name` may be written (saved, replaced) for `owner`. */
export function checkSnapshotWrite(
  ctx: Pick<ProviderContext, 'ledger' | 'localSnapshots'>,
  owner: Owner,
  name: string,
): Verdict {
  return mayWriteSnapshot(owner, name, ctx.ledger.snapshot(name), ctx.localSnapshots.has(name));
}

/** A local snapshot may be removed for `owner` (its ledger entry is that identity's). */
export function mayDropSnapshot(ctx: Pick<ProviderContext, 'ledger'>, owner: Owner, name: string): boolean {
  return mayRemove(owner, ctx.ledger.snapshot(name));
}

/** A local snapshot as the clone, fork, wake or restore source of a pod. */
export function checkLocalSource(
  ctx: Pick<ProviderContext, 'ledger'>,
  rec: PodRecord,
  name: string,
): Verdict {
  return mayUseLocalSource(rec.pod.metadata?.namespace ?? '', name, ctx.ledger.snapshot(name));
}

export function stampOf(id: SnapshotIdentity): Stamp {
  return { namespace: id.namespace ?? '', controllerUid: id.controllerUid ?? '', fromNode: id.fromNode };
}

/** A registry snapshot as a clone source. */
export function checkRegistrySource(rec: PodRecord, ref: string, id: SnapshotIdentity): Verdict {
  return mayCloneRegistrySource(rec.pod.metadata?.namespace ?? '', ref, stampOf(id));
}

/** Registry hibernated state as the pod's own, to wake or restore. */
export function checkRestoreState(
  ctx: Pick<ProviderContext, 'config'>,
  rec: PodRecord,
  ref: string,
  id: SnapshotIdentity,
): Verdict {
  return mayRestoreState(
    rec.pod.metadata?.namespace ?? '',
    ref,
    stampOf(id),
    ctx.config.acceptUnstampedState,
  );
}

/** Before a push of `<repo>:<tag>` for a record: the tag is absent or this identity's. */
export async function checkPush(
  ctx: Pick<ProviderContext, 'config' | 'store'>,
  rec: PodRecord,
  repo: string,
  tag: string,
  signal?: AbortSignal,
): Promise<Verdict> {
  if (!ctx.store) return { ok: true };
  const existing = await ctx.store.identity(repo, tag, signal);
  return mayOverwriteTag(
    ownerOfRec(rec, repo),
    repo,
    tag,
    existing === 'absent' ? 'absent' : stampOf(existing),
    ctx.config.acceptUnstampedState,
  );
}

/** The owner stamps a push for this record writes into the manifest. */
export function pushStamps(rec: PodRecord): {
  namespace: string;
  controllerUid: string;
  pod: string;
  podUid: string;
} {
  const owner = ownerOfRec(rec);
  return { namespace: owner.namespace, controllerUid: owner.controllerUid, pod: rec.key, podUid: rec.uid };
}
