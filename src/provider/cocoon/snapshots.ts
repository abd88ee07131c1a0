// Local cocoon snapshots the provider makes and removes (docs/contracts/pod-to-vm.md,
// "Hibernate" step 3, "Fork-from", "Delete with a snapshot policy"), and the index of the
// names known to exist, so a bring-up checks for a stale `fork-<vmName>` without a cocoon
// call (docs/decisions.md, "Hibernate and wake").
import type { LedgerPod } from '../../authority/ledger.ts';
import type { Owner } from '../../authority/owner.ts';
import { snapshotListArgv, snapshotSaveArgv } from '../../cocoon/argv.ts';
import { snapshotHolder } from '../../cocoon/errors.ts';
import { parseSnapshotList, type SnapshotRecord } from '../../cocoon/records.ts';
import { CocoonCommandError, POD_OP_QUEUE } from '../../cocoon/runner.ts';
import { inspectSnapshot, removeSnapshot as removeCocoonSnapshot } from '../../cocoon/snapshots.ts';
import type { Logger } from '../../log.ts';
import { checkSnapshotWrite, enforce } from './authority.ts';
import type { ProviderContext } from './context.ts';

/** A save writes the VM's memory and disk: generous, but bounded. */
export const SAVE_TIMEOUT_MS = 10 * 60_000;
const REMOVE_TIMEOUT_MS = 10_000;

/** Records every local snapshot name (startup) and returns the list. A failure leaves the
 * index empty (`undefined`): a stale `fork-<vmName>` is then left in place (a warning says
 * so), never a reason not to start. */
export async function indexLocalSnapshots(
  ctx: Pick<ProviderContext, 'cli' | 'localSnapshots' | 'log'>,
): Promise<readonly SnapshotRecord[] | undefined> {
  try {
    const { stdout } = await ctx.cli.run(snapshotListArgv(), { timeoutMs: 60_000 });
    const listed = parseSnapshotList(stdout);
    if (!listed.ok) throw new Error(listed.error);
    for (const s of listed.value) ctx.localSnapshots.add(s.name);
    return listed.value;
  } catch (err) {
    ctx.log.warn({ err: String(err) }, 'cannot list local snapshots; stale fork snapshots are not dropped');
    return undefined;
  }
}

/** `snapshot save --name <name> <vmId>` for `owner` (docs/security.md, rule snapshot write):
 * refused when the name is another identity's or exists without a ledger entry (a base
 * image is never replaced); the intent is written first and confirmed after. A taken name
 * the ledger gives to the same identity (a previous save of this VM, a stale fork) is removed,
 * retried while it is leased, and the save runs once more. */
export async function saveSnapshot(
  ctx: Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots'>,
  name: string,
  vmId: string,
  opts: { signal?: AbortSignal; log: Logger; owner: Owner; pod: LedgerPod },
): Promise<void> {
  enforce(checkSnapshotWrite(ctx, opts.owner, name));
  await ctx.ledger.intend('snapshot', name, opts.owner, opts.pod);
  const save = () =>
    ctx.cli.run(snapshotSaveArgv(name, vmId), { timeoutMs: SAVE_TIMEOUT_MS, signal: opts.signal });
  try {
    await save();
  } catch (err) {
    if (!(err instanceof CocoonCommandError && err.errorClass === 'snapshot_name_taken')) throw err;
    const holder = snapshotHolder(`${err.message}\n${err.output}`) ?? name;
    // A holder the index knows (listed at startup, or written since) is checked like the
    // name; one it does not know is a pending record of an interrupted save (not a usable
    // snapshot), removed as before. A complete snapshot imported by hand after startup is the
    // documented gap (docs/security.md).
    if (ctx.localSnapshots.has(holder)) enforce(checkSnapshotWrite(ctx, opts.owner, holder));
    opts.log.info({ snapshot: name, holder }, 'snapshot name taken; removing the holder and saving again');
    await removeSnapshot(ctx, holder, { signal: opts.signal });
    await save();
  }
  ctx.localSnapshots.add(name);
  // `snapshot save` prints no id: one inspect gives the ledger the very snapshot it saved (what
  // the peer server hands out, docs/peer-restore.md). A failed inspect leaves the id empty, as
  // before; the startup reconcile fills it.
  const saved = await inspectSnapshot(ctx.cli, name, opts.signal).catch(() => undefined);
  await ctx.ledger.confirm('snapshot', name, saved?.id ?? '', opts.owner, opts.pod);
}

/** `snapshot rm <ref>` (src/cocoon/snapshots.ts: not found is success; `is in use by an
 * active …` is retried for up to 30 s), then the name leaves the index and the ledger. Other
 * failures throw. */
export async function removeSnapshot(
  ctx: Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots'>,
  ref: string,
  opts: { signal?: AbortSignal; leasedRetryMs?: number; queueTimeoutMs?: number } = {},
): Promise<void> {
  await removeCocoonSnapshot(ctx.cli, ref, {
    signal: opts.signal,
    leasedRetryMs: opts.leasedRetryMs,
    timeoutMs: REMOVE_TIMEOUT_MS,
    queueTimeoutMs: opts.queueTimeoutMs,
  });
  ctx.localSnapshots.delete(ref);
  await ctx.ledger.forget('snapshot', ref);
}

/** Best-effort removal (logged, never thrown). It waits for a call slot as a pod's bring-up
 * or delete does (POD_OP_QUEUE): a clean-up behind a busy pool (a mass delete whose deferred
 * pushes land together) is late, not skipped with its snapshot left on the host. */
export async function dropSnapshot(
  ctx: Pick<ProviderContext, 'cli' | 'ledger' | 'localSnapshots'>,
  ref: string,
  log: Logger,
): Promise<void> {
  try {
    await removeSnapshot(ctx, ref, POD_OP_QUEUE);
  } catch (err) {
    log.warn({ snapshot: ref, err: String(err) }, 'could not remove a local snapshot; left in place');
  }
}
