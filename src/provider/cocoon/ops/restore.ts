// Hibernated state on create and wake (docs/contracts/pod-to-vm.md, "Evidence on create",
// "Wake source", "Restore" and "Wake"): whether a VM name still owns hibernated state, where
// a wake restores it from, and the restoring clone.

import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError, POD_OP_QUEUE } from '../../../cocoon/runner.ts';
import { inspectSnapshot } from '../../../cocoon/snapshots.ts';
import type { Logger } from '../../../log.ts';
import { SnapshotPullError } from '../../../registry/pull.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { checkLocalSource, checkRestoreState, mayDropSnapshot, ownerOfRec } from '../authority.ts';
import { cloneFromSource, inspectVm, SettleError } from '../bringup.ts';
import type { PeerStaged, ProviderContext, SnapshotIdentity } from '../context.ts';
import { dropSnapshot, removeSnapshot } from '../snapshots.ts';
import type { PodRecord } from '../state.ts';
import { type PeerWakeCtx, peerWake } from './peer-wake.ts';

/** Whether hibernated state exists: the registry's tag or the local snapshot. */
export type EvidenceCtx = Pick<ProviderContext, 'config' | 'events' | 'localSnapshots' | 'metrics' | 'store'>;
/** Where a wake clones from (local copy, peer, registry pull) and the restoring clone. */
export type WakeCtx = PeerWakeCtx & Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots' | 'store'>;

/** Every wake failure message starts with this (the op retry and a restart recognise it). */
export const WAKE_PREFIX = 'wake: ';

/** A bring-up refused with an event reason; `transient` failures are retried. */
export class LifecycleError extends Error {
  override name = 'LifecycleError';
  readonly reason: string;
  readonly transient: boolean;
  constructor(reason: string, message: string, transient: boolean) {
    super(message);
    this.reason = reason;
    this.transient = transient;
  }
}

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The pod's published state says a wake is owed (no VM, hibernate not requested). */
export function wakeOwed(rec: PodRecord): boolean {
  const state = rec.intent?.state;
  const message = rec.intent?.message ?? '';
  return state === 'hibernated' || (state === 'failed' && message.startsWith(WAKE_PREFIX));
}

export function importName(vmName: string): string {
  return `${vmName}-hibernate-import`;
}

/** Where the hibernated state of a VM name is: the registry's `<vmName>:hibernate`, or
 * (without a registry) a local snapshot `<vmName>`; `undefined` when there is none. A registry
 * that does not answer fails closed (`HibernateEvidenceUnavailable`). */
export async function hibernateEvidence(
  ctx: EvidenceCtx,
  spec: VMSpec,
  rec: PodRecord,
): Promise<{ identity: SnapshotIdentity | undefined; where: string } | undefined> {
  if (!ctx.store) {
    return ctx.localSnapshots.has(spec.vmName)
      ? { identity: undefined, where: `local snapshot ${spec.vmName}` }
      : undefined;
  }
  let id: SnapshotIdentity | 'absent';
  try {
    id = await ctx.store.identity(spec.vmName, 'hibernate', AbortSignal.timeout(60_000));
  } catch (err) {
    ctx.metrics.hibernateEvidence('unavailable');
    const message = `cannot tell whether VM ${spec.vmName} has hibernated state (${spec.vmName}:hibernate): ${errText(err)}; not booting it fresh`;
    ctx.events.event(rec.pod, 'Warning', 'HibernateEvidenceUnavailable', `create: ${message}`.slice(0, 512));
    throw new LifecycleError('HibernateEvidenceFailed', message, true);
  }
  if (id === 'absent') return undefined;
  const verdict = checkRestoreState(ctx, rec, `${spec.vmName}:hibernate`, id);
  if (!verdict.ok) {
    ctx.metrics.hibernateEvidence('source_conflict');
    throw new LifecycleError('HibernateEvidenceFailed', verdict.message, false);
  }
  return { identity: id, where: `${spec.vmName}:hibernate` };
}

/** Where a wake or restore clones from: a local snapshot (the verified copy or the registry
 * import), or a directory a peer restore staged. `source` names it for the `Woken` event
 * (`<vmName>`, `<vmName>:hibernate` or `peer <node>`). */
export type WakeSource =
  | {
      kind: 'snapshot';
      name: string;
      imported: boolean;
      snapshot: Awaited<ReturnType<typeof inspectSnapshot>>;
      source: string;
    }
  | { kind: 'dir'; staged: PeerStaged; hypervisor: string; source: string };

/** The source a wake or restore clones from (docs/contracts/pod-to-vm.md, "Wake source";
 * docs/peer-restore.md): a local `<vmName>` verified against the registry (an unverifiable copy
 * is never trusted), else the pushing host's copy through a peer restore, else a registry pull
 * into `<vmName>-hibernate-import`. */
export async function wakeSource(
  ctx: WakeCtx,
  spec: VMSpec,
  rec: PodRecord,
  log: Logger,
): Promise<WakeSource> {
  const vmName = spec.vmName;
  const local = await inspectSnapshot(ctx.cli, vmName, undefined, POD_OP_QUEUE);
  // With a registry its `:hibernate` is read first: what a local copy is verified against,
  // and whose the state is.
  let id: SnapshotIdentity | 'absent' = 'absent';
  if (ctx.store) {
    try {
      id = await ctx.store.identity(vmName, 'hibernate', AbortSignal.timeout(60_000));
    } catch (err) {
      if (local) ctx.metrics.snapshotVerify('error');
      throw new LifecycleError(
        'WakePullFailed',
        local
          ? `cannot verify the local snapshot ${vmName} against ${vmName}:hibernate: ${errText(err)}; an unverified copy is never used`
          : `cannot read ${vmName}:hibernate: ${errText(err)}`,
        true,
      );
    }
    const verdict = id === 'absent' ? undefined : checkRestoreState(ctx, rec, `${vmName}:hibernate`, id);
    if (verdict && !verdict.ok) throw new LifecycleError('WakePullFailed', verdict.message, false);
  }
  if (local) {
    const mine = checkLocalSource(ctx, rec, vmName);
    if (!mine.ok) throw new LifecycleError('WakePullFailed', mine.message, false);
    ctx.localSnapshots.add(vmName);
    const here = {
      kind: 'snapshot' as const,
      name: vmName,
      imported: false,
      snapshot: local,
      source: vmName,
    };
    if (!ctx.store) return here;
    if (id !== 'absent' && id.snapshotId === local.id) {
      ctx.metrics.snapshotVerify('ok');
      return here;
    }
    ctx.metrics.snapshotVerify('stale');
    log.info(
      { snapshot: vmName, localId: local.id, registryId: id === 'absent' ? 'absent' : id.snapshotId },
      'local hibernate copy is stale against the registry; removing it',
    );
    // Only a copy the ledger gives to this identity is removed; any other is left alone and
    // the wake pulls into its own import name.
    const owner = ownerOfRec(rec, vmName);
    if (mayDropSnapshot(ctx, owner, vmName)) await removeSnapshot(ctx, vmName);
    if (mayDropSnapshot(ctx, owner, `fork-${vmName}`)) await dropSnapshot(ctx, `fork-${vmName}`, log);
  }
  if (!ctx.store) {
    throw new LifecycleError(
      'WakePullFailed',
      `no hibernated state for VM ${vmName}: no local snapshot ${vmName} and no registry configured`,
      false,
    );
  }
  // The pushing host's copy, when the tag names one other than this host (an absent tag skips
  // the peer: there is nothing to verify a peer's copy against).
  if (id !== 'absent') {
    const staged = await peerWake(ctx, spec, rec, id, log);
    if (staged) {
      return { kind: 'dir', staged, hypervisor: id.config?.hypervisor ?? '', source: `peer ${staged.node}` };
    }
  }
  const name = importName(vmName);
  try {
    log.info({ snapshot: name }, `pulling ${vmName}:hibernate from the registry`);
    const snap = await ctx.store.pull({ repo: vmName, tag: 'hibernate', localName: name, log });
    return { kind: 'snapshot', name, imported: true, snapshot: snap, source: `${vmName}:hibernate` };
  } catch (err) {
    const absent = err instanceof SnapshotPullError && err.absent;
    throw new LifecycleError(
      'WakePullFailed',
      absent
        ? `no hibernated state for VM ${vmName}: ${vmName}:hibernate is absent from the registry`
        : `pull ${vmName}:hibernate: ${errText(err)}`,
      !absent,
    );
  }
}

/** Restores the pod's VM from its hibernated state: clone with the restore mode, CPU policy,
 * `--nics 1` for CH+Windows; a cross-node import is removed after the clone. */
export async function restoreBringUp(
  ctx: WakeCtx,
  spec: VMSpec,
  rec: PodRecord,
  log: Logger,
): Promise<{ vm: VmRecord; source: string; chWindows: boolean }> {
  const src = await wakeSource(ctx, spec, rec, log);
  if (src.kind === 'snapshot' && !src.snapshot)
    throw new LifecycleError('WakePullFailed', `snapshot ${src.name} vanished`, true);
  const chWindows = spec.backend === 'cloud-hypervisor' && spec.os === 'windows';
  // A peer-staged directory is the daemon's own (never a pod's clone-from-dir): no root check.
  const from =
    src.kind === 'dir'
      ? { fromDir: src.staged.dir, hypervisor: src.hypervisor }
      : { snapshot: src.snapshot as NonNullable<typeof src.snapshot> };
  const fromName = src.kind === 'dir' ? `${src.source} (${src.staged.dir})` : src.name;
  let vm: VmRecord;
  try {
    vm = await cloneFromSource(ctx, spec, from, { nics: chWindows ? 1 : undefined });
  } catch (err) {
    // A VM that may exist under the name is looked up by the caller (salvage), unwrapped.
    if (err instanceof SettleError) throw err;
    if (err instanceof CocoonCommandError && err.errorClass === 'vm_name_taken') {
      // A `creating` placeholder is a clone of this name still in flight (a killed
      // predecessor's, after a restart): salvage cannot adopt it yet, so the restore is
      // retried (transient) and a later attempt adopts it once it runs.
      const holder = await inspectVm(ctx, spec.vmName).catch(() => undefined);
      if (holder?.state === 'creating') {
        throw new LifecycleError(
          'WakeCloneFailed',
          `clone ${spec.vmName} from ${fromName}: a clone of that name is still in flight (VM ${holder.id} creating); retrying`,
          true,
        );
      }
      throw err;
    }
    throw new LifecycleError(
      'WakeCloneFailed',
      `clone ${spec.vmName} from ${fromName}: ${errText(err)}`,
      true,
    );
  } finally {
    if (src.kind === 'dir') await src.staged.release().catch(() => {});
    else if (src.imported) void dropSnapshot(ctx, src.name, log);
  }
  return { vm, source: src.source, chWindows };
}
