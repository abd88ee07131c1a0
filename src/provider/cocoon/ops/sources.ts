// Where a managed pod's VM comes from (docs/contracts/pod-to-vm.md, "Bring-up order"):
// restore (asked for, or evidence of hibernated state) → clone-from-dir → fork-from → run →
// clone, with the fresh-boot guard of docs/contracts/pod-to-vm.md ("Evidence on create"): a VM name that still owns
// hibernated state never boots fresh.

import { realpath } from 'node:fs/promises';
import { entryOwns } from '../../../authority/rules.ts';
import { POD_OP_QUEUE } from '../../../cocoon/runner.ts';
import { inspectSnapshot } from '../../../cocoon/snapshots.ts';
import type { Logger } from '../../../log.ts';
import { checkCloneDir } from '../../../vmspec/clone-dir-roots.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { mayDropSnapshot, ownerOfRec, podRef } from '../authority.ts';
import { BringUpError, type BringUpResult, cloneFromSource } from '../bringup.ts';
import type { ProviderContext } from '../context.ts';
import { dropSnapshot, saveSnapshot } from '../snapshots.ts';
import type { PodRecord } from '../state.ts';
import { type EvidenceCtx, hibernateEvidence, LifecycleError } from './restore.ts';

/** fork-from: the source pod, the shared `fork-<source>` save and the clone of it. */
export type ForkCtx = Pick<
  ProviderContext,
  'cli' | 'config' | 'forkSaves' | 'ledger' | 'localSnapshots' | 'metrics' | 'pods'
>;
/** clone-from-dir: the roots' check and the clone. */
export type DirCloneCtx = Pick<ProviderContext, 'cli' | 'config' | 'metrics'>;

export type SourcePlan =
  /** Hibernate is requested and the state is already saved: nothing to boot. */
  | { readonly kind: 'hibernated'; readonly where: string }
  | { readonly kind: 'restore' }
  | { readonly kind: 'dir' }
  | { readonly kind: 'fork' }
  | { readonly kind: 'run' }
  | { readonly kind: 'clone' };

/** Decides the source of a bring-up. Throws {@link LifecycleError} (with its event reason) or
 * {@link BringUpError} when the pod's request cannot be honoured. */
export async function planSource(
  ctx: EvidenceCtx,
  rec: PodRecord,
  spec: VMSpec,
  log: Logger,
): Promise<SourcePlan> {
  const restoreAsked = rec.waking || spec.restoreFromHibernate;
  const evidence = !restoreAsked || spec.hibernate ? await hibernateEvidence(ctx, spec, rec) : undefined;
  if (spec.hibernate) {
    if (evidence) return { kind: 'hibernated', where: evidence.where };
    const was = rec.intent?.state;
    if (was === 'hibernated' || was === 'hibernating') {
      throw new LifecycleError(
        'HibernateEvidenceFailed',
        `hibernated state lost: VM ${spec.vmName} is gone and no hibernated snapshot of it exists (${ctx.store ? `${spec.vmName}:hibernate` : `local snapshot ${spec.vmName}`}); its state is lost: delete the pod to boot it fresh`,
        false,
      );
    }
    // Nothing saved yet: boot it, then hibernate it once it is up (ops/drive.ts).
  }
  if (evidence && !restoreAsked) {
    const dropTo = ctx.store
      ? `delete the ${spec.vmName}:hibernate tag`
      : `remove the local snapshot ${spec.vmName}`;
    if (spec.forkFrom !== '' || spec.cloneFromDir !== '') {
      ctx.metrics.hibernateEvidence('source_conflict');
      const what =
        spec.cloneFromDir !== '' ? `clone-from-dir ${spec.cloneFromDir}` : `fork-from ${spec.forkFrom}`;
      throw new LifecycleError(
        'HibernateEvidenceFailed',
        `VM ${spec.vmName} still owns hibernated state (${evidence.where}); ${what} would boot it from another source and lose that state: ${dropTo} to boot it fresh`,
        false,
      );
    }
    const base = evidence.identity?.baseImage ?? '';
    if (base !== '' && base !== spec.image) {
      ctx.metrics.hibernateEvidence('image_conflict');
      throw new LifecycleError(
        'HibernateEvidenceFailed',
        `VM ${spec.vmName} has hibernated state taken from image ${base} (${evidence.where}) but the pod asks for ${spec.image}: set the image back to ${base} to restore it, or ${dropTo} to boot ${spec.image} fresh`,
        false,
      );
    }
    ctx.metrics.hibernateEvidence('restored');
    ctx.events.event(
      rec.pod,
      'Warning',
      'HibernateSnapshotExists',
      `create: VM ${spec.vmName} has hibernated state (${evidence.where}); restoring it instead of booting fresh`,
    );
    log.info({ where: evidence.where }, 'hibernated state found on create; restoring it');
    return { kind: 'restore' };
  }
  if (restoreAsked) return { kind: 'restore' };
  if (spec.cloneFromDir !== '') {
    if (spec.mode === 'run') {
      throw new BringUpError('clone-from-dir cannot be combined with cocoonset.cocoonstack.io/mode: run');
    }
    return { kind: 'dir' };
  }
  if (spec.forkFrom !== '') return { kind: 'fork' };
  return { kind: spec.mode === 'run' ? 'run' : 'clone' };
}

/** A fresh bring-up drops `fork-<vmName>` of a previous incarnation, so forks of this VM never
 * start from its old state. Only when it is known to exist: no cocoon call otherwise. */
export async function dropStaleFork(
  ctx: Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots'>,
  rec: PodRecord,
  vmName: string,
  log: Logger,
): Promise<void> {
  const name = `fork-${vmName}`;
  if (ctx.localSnapshots.has(name) && mayDropSnapshot(ctx, ownerOfRec(rec, vmName), name))
    await dropSnapshot(ctx, name, log);
}

/** fork-from: one shared `fork-<source>` snapshot (saved once, de-duplicated across concurrent
 * forks, reused while it exists), then a clone of it. The source VM must be held by a pod of
 * the same namespace: a pod never copies another tenant's VM (docs/decisions.md). */
export async function forkBringUp(
  ctx: ForkCtx,
  rec: PodRecord,
  spec: VMSpec,
  log: Logger,
): Promise<BringUpResult> {
  const source = spec.forkFrom;
  const ns = rec.pod.metadata?.namespace ?? '';
  const holder = [...ctx.pods.values()].find((r) => r !== rec && r.vm?.name === source);
  if (!holder?.vm || holder.pod.metadata?.namespace !== ns) {
    throw new BringUpError(
      `fork-from: VM ${source} is not held by a pod in namespace ${ns}; a pod forks only a VM of its own namespace`,
    );
  }
  const sourceId = holder.vm.id;
  const name = `fork-${source}`;
  // The fork snapshot is the source VM's state: its identity's, never the forking pod's.
  const sourceOwner = ownerOfRec(holder, source);
  const snapshot = await ctx.forkSaves.do(name, async () => {
    const have = await inspectSnapshot(ctx.cli, name, undefined, POD_OP_QUEUE);
    // An existing one is used only when the ledger says it was saved from this source.
    if (have && entryOwns(ctx.ledger.snapshot(name), sourceOwner)) return have;
    if (have) ctx.localSnapshots.add(name);
    log.info({ source, snapshot: name }, 'saving the shared fork snapshot');
    const started = performance.now();
    try {
      await saveSnapshot(ctx, name, sourceId, { log, owner: sourceOwner, pod: podRef(holder) });
      ctx.metrics.snapshotSave(ns, 'ok', (performance.now() - started) / 1000);
    } catch (err) {
      ctx.metrics.snapshotSave(ns, 'failed', (performance.now() - started) / 1000);
      throw err;
    }
    const made = await inspectSnapshot(ctx.cli, name, undefined, POD_OP_QUEUE);
    if (!made) throw new BringUpError(`fork-from: snapshot ${name} missing right after its save`);
    return made;
  });
  ctx.localSnapshots.add(name);
  // No snapshot metadata tells a cloud image from an OCI guest: the run-dir probe decides.
  return { vm: await cloneFromSource(ctx, spec, { snapshot }), clonedBoot: true, sourceImage: '' };
}

/** clone-from-dir of a pod: the annotation is a tenant's claim on a host path, so it is
 * checked against VK_CLONE_FROM_DIR_ROOTS first (vmspec/clone-dir-roots.ts) and a refusal
 * is permanent, with a message that never tells whether the path exists. The clone is then
 * made from the resolved path. Clones from directories the daemon stages itself go straight
 * to {@link cloneFromTrustedDir}: the root rule is about what tenants may name. */
export async function dirBringUp(ctx: DirCloneCtx, rec: PodRecord, spec: VMSpec): Promise<BringUpResult> {
  const ns = rec.pod.metadata?.namespace ?? '';
  const verdict = await checkCloneDir(ctx.config.cloneFromDirRoots, ns, spec.cloneFromDir, realpath);
  if (!verdict.ok) {
    ctx.metrics.cloneFromDir('failed');
    throw new LifecycleError('CloneFromDirRefused', verdict.message, false);
  }
  return await cloneFromTrustedDir(ctx, spec, verdict.dir);
}

/** `vm clone --pull --from-dir <dir>` of a directory the daemon trusts (checked or staged). */
export async function cloneFromTrustedDir(
  ctx: DirCloneCtx,
  spec: VMSpec,
  dir: string,
): Promise<BringUpResult> {
  try {
    const vm = await cloneFromSource(ctx, spec, { fromDir: dir });
    ctx.metrics.cloneFromDir('ok');
    return { vm, clonedBoot: true, sourceImage: '' };
  } catch (err) {
    ctx.metrics.cloneFromDir('failed');
    throw err;
  }
}
