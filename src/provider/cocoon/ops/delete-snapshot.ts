// The delete-time snapshot (docs/contracts/pod-to-vm.md, "Delete with a snapshot policy";
// docs/registry.md, "Delete during a registry outage"): with a registry, a running VM whose
// policy asks for it is saved as the local snapshot `<vmName>` and pushed to `<vmName>:latest`
// before it is removed. A push that fails, or would not end before the pod's grace period does,
// is deferred: recorded in the provenance ledger and pushed once the registry takes it
// (deferred-push.ts), while the delete goes on. A failed save keeps the VM and the pod
// Terminating (retried): the state exists nowhere else. Without a registry an explicit policy
// is reported, never silently dropped.
import type { V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../../cocoon/records.ts';
import { EVENT_MESSAGE_MAX_BYTES, SNAPSHOT_POLICY } from '../../../contract/annotations.ts';
import type { Logger } from '../../../log.ts';
import { timeoutSignal } from '../../../util/deadline.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import { AuthorityError, checkPush, ownerOfRec, podRef, pushStamps } from '../authority.ts';
import { inspectVm } from '../bringup.ts';
import type { ProviderContext } from '../context.ts';
import { saveSnapshot } from '../snapshots.ts';
import type { PodRecord } from '../state.ts';

/** The removal and lease release after the push: the push must end this long before the
 * pod's deletion timestamp, or it is deferred. */
export const DELETE_RESERVE_MS = 5_000;
/** With less than this left for it, the push is not started: it is deferred at once. */
const MIN_PUSH_WINDOW_MS = 1_000;
/** A pod without a deletion timestamp (a direct call) gets the default grace period. */
const DEFAULT_GRACE_MS = 30_000;

/** The save failed (or the VM could not be inspected): the VM is kept. */
export class SnapshotKeptVm extends Error {}

/** `never` ⇒ no; `main-only` ⇒ a main agent only; `always`, empty or unknown ⇒ yes. */
export function shouldSnapshot(spec: Pick<VMSpec, 'snapshotPolicy' | 'role'>): boolean {
  if (spec.snapshotPolicy === 'never') return false;
  if (spec.snapshotPolicy === 'main-only') return spec.role === 'main';
  return true;
}

/** How long the push may take: until the pod's deletion timestamp (its grace period's end)
 * less the reserve. The timestamp is the apiserver's wall clock; only its distance from now
 * is used. */
export function pushWindowMs(pod: V1Pod, nowMs: number): number {
  const ts = pod.metadata?.deletionTimestamp as Date | string | undefined;
  const end = ts ? new Date(ts).getTime() : Number.NaN;
  const left = Number.isFinite(end) ? end - nowMs : DEFAULT_GRACE_MS;
  return Math.max(0, left - DELETE_RESERVE_MS);
}

/** The save and push before a removal, or the push deferred (the ledger, ctx.pushDeferred). */
export type DeleteSnapshotCtx = Pick<
  ProviderContext,
  'cli' | 'config' | 'events' | 'ledger' | 'localSnapshots' | 'metrics' | 'pushDeferred' | 'store'
>;

/** `'deferred'` when the state was saved locally and its push deferred (the local snapshot is
 * then kept), else `'done'`. Throws {@link SnapshotKeptVm} when the VM must be kept. */
export async function snapshotBeforeDelete(
  ctx: DeleteSnapshotCtx,
  rec: PodRecord,
  pod: V1Pod,
  vm: VmRecord,
  keep: boolean,
  log: Logger,
): Promise<'done' | 'deferred'> {
  const spec = rec.spec;
  if (!spec?.managed || !shouldSnapshot(spec)) return 'done';
  if (!ctx.store) {
    if (rec.pod.metadata?.annotations?.[SNAPSHOT_POLICY] === undefined) return 'done';
    const message = `delete: snapshot-policy ${spec.snapshotPolicy}: no registry is configured (OCI_REGISTRY); VM ${vm.name} is removed without a :latest snapshot`;
    ctx.events.event(rec.pod, 'Warning', 'SnapshotPolicyNoRegistry', message);
    log.warn({ policy: spec.snapshotPolicy }, message);
    return 'done';
  }
  const ns = rec.pod.metadata?.namespace ?? '';
  const fail = (what: string, err: unknown) =>
    new SnapshotKeptVm(
      `kept VM ${vm.id}: delete-time snapshot: ${what}: ${err instanceof Error ? err.message : String(err)}`,
    );
  let live: VmRecord | undefined;
  try {
    live = await inspectVm(ctx, vm.id);
  } catch (err) {
    throw fail('inspect', err);
  }
  if (live?.state !== 'running') return 'done'; // a stopped or vanished VM is not snapshotted
  const started = performance.now();
  try {
    await saveSnapshot(ctx, spec.vmName, vm.id, { log, owner: ownerOfRec(rec), pod: podRef(rec) });
    ctx.metrics.snapshotSave(ns, 'ok', (performance.now() - started) / 1000);
  } catch (err) {
    ctx.metrics.snapshotSave(ns, 'failed', (performance.now() - started) / 1000);
    if (err instanceof AuthorityError) {
      refused(ctx, rec, `snapshot ${spec.vmName}`, err.message, log);
      return 'done';
    }
    throw fail('snapshot save', err);
  }
  const savedAt = new Date().toISOString();
  const windowMs = pushWindowMs(pod, Date.now());
  if (windowMs < MIN_PUSH_WINDOW_MS) {
    return defer(ctx, rec, keep, spec.vmName, savedAt, 'the grace period leaves no time for the push', log);
  }
  // The push (and the tag read before it) ends before the grace period does, or is deferred.
  const window = timeoutSignal(windowMs);
  const late = (err: unknown) =>
    window.aborted ? `not done within the grace period (${Math.round(windowMs / 1000)} s)` : errText(err);
  const pushed = performance.now();
  let verdict: Awaited<ReturnType<typeof checkPush>>;
  try {
    verdict = await checkPush(ctx, rec, spec.vmName, 'latest', window);
  } catch (err) {
    return defer(ctx, rec, keep, spec.vmName, savedAt, `read ${spec.vmName}:latest: ${late(err)}`, log);
  }
  if (!verdict.ok) {
    refused(ctx, rec, `${spec.vmName}:latest`, verdict.message, log);
    return 'done';
  }
  try {
    const r = await ctx.store.push({
      localName: spec.vmName,
      repo: spec.vmName,
      tag: 'latest',
      baseImage: spec.image,
      ...pushStamps(rec),
      signal: window,
      log,
    });
    ctx.metrics.snapshotPush(ns, 'ok', (performance.now() - pushed) / 1000);
    log.info(
      { digest: r.digest, snapshotId: r.snapshotId },
      `pushed ${spec.vmName}:latest before removing the VM`,
    );
    return 'done';
  } catch (err) {
    ctx.metrics.snapshotPush(ns, 'failed', (performance.now() - pushed) / 1000);
    return defer(ctx, rec, keep, spec.vmName, savedAt, `push ${spec.vmName}:latest: ${late(err)}`, log);
  }
}

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** Records the deferred push (durably, before the VM goes: a failed write keeps the VM). */
async function defer(
  ctx: Pick<ProviderContext, 'events' | 'ledger' | 'metrics' | 'pushDeferred'>,
  rec: PodRecord,
  keep: boolean,
  vmName: string,
  savedAt: string,
  why: string,
  log: Logger,
): Promise<'deferred'> {
  const stamps = pushStamps(rec);
  try {
    await ctx.ledger.deferPush({
      name: vmName,
      repo: vmName,
      tag: 'latest',
      snapshotId: ctx.ledger.snapshot(vmName)?.id ?? '',
      baseImage: rec.spec?.image ?? '',
      owner: ownerOfRec(rec, vmName),
      pod: stamps.pod,
      podUid: stamps.podUid,
      savedAt,
      keep,
      lastError: why,
    });
  } catch (err) {
    throw new SnapshotKeptVm(
      `kept VM ${rec.vm?.id ?? ''}: delete-time snapshot: cannot defer the push: ${errText(err)}`,
    );
  }
  ctx.metrics.deferredPush('deferred', ctx.ledger.size().pushes);
  ctx.pushDeferred(vmName);
  const message = `delete: ${vmName}:latest push deferred (${why}); the state is kept as local snapshot ${vmName} and pushed when the registry takes it`;
  ctx.events.event(
    rec.pod,
    'Warning',
    'SnapshotPushDeferred',
    truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES),
  );
  log.warn({ savedAt }, message);
  return 'deferred';
}

/** A delete-time snapshot the authority rules refuse (never over another identity's tag or
 * snapshot, or a base image) is skipped loudly and the delete goes on: a refusal never
 * changes, so waiting would strand the pod Terminating. */
function refused(
  ctx: Pick<ProviderContext, 'events'>,
  rec: PodRecord,
  what: string,
  why: string,
  log: Logger,
): void {
  const message = `delete: ${what} not written: ${why}; VM ${rec.vm?.name ?? ''} is removed without its delete-time snapshot`;
  ctx.events.event(rec.pod, 'Warning', 'SnapshotPushRefused', truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES));
  log.warn(message);
}
