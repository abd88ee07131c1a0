// VMs that die behind our back (docs/contracts/pod-to-vm.md, "VM event watcher and
// eviction"): a `DELETED` or non-running `MODIFIED` event of a tracked managed pod's VM is
// re-inspected in the pod's queue. Gone ⇒ leases released, evicted `VMGone`; stopped or errored
// ⇒ `vm start`, unless it was restarted less than 30 s ago (removed, evicted `RestartCooldown`);
// a failed start ⇒ removed, evicted `RestartFailed`; inconclusive ⇒ re-checked with backoff
// (1 s doubling to 30 s) for up to 30 min, then removed and evicted `VMInspectTimeout`.
// Hibernating pods and deletes in flight are left alone; so are VMs in `creating`/`created`.
import { removeArgv, startArgv } from '../../../cocoon/argv.ts';
import type { VmEvent } from '../../../cocoon/events.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { inspectVm, inspectWithRetry } from '../bringup.ts';
import { isCurrent, logFor, type ProviderContext } from '../context.ts';
import { type PodRecord, refreshVm, setOpRetry, unbindVm } from '../state.ts';
import { type ReleaseCtx, releaseLeases } from './delete.ts';
import { type EvictCtx, evict } from './evict.ts';

export const RESTART_COOLDOWN_MS = 30_000;
const RECHECK_BASE_MS = 1000;
const RECHECK_MAX_MS = 30_000;
const RECHECK_BUDGET_MS = 30 * 60_000;
/** States a restart may bring back (cocoon-cli "VM states"). */
const RESTARTABLE: ReadonlySet<string> = new Set(['stopped', 'error', 'stopped (stale)']);

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** A VM death: re-inspected, restarted (with its cooldown) or removed and the pod evicted. */
export type VmEventsCtx = EvictCtx &
  ReleaseCtx &
  Pick<ProviderContext, 'cli' | 'ledger' | 'reconcileSoon' | 'vmRechecks' | 'vmRestarts'>;

/** The tracked managed pod whose VM has this ID (or, failing that, this name). */
function podOfVm(
  ctx: Pick<ProviderContext, 'pods'>,
  vm: Pick<VmRecord, 'id' | 'name'>,
): PodRecord | undefined {
  let byName: PodRecord | undefined;
  for (const rec of ctx.pods.values()) {
    if (!rec.vm || !rec.ownsVm || !rec.spec?.managed) continue;
    if (rec.vm.id === vm.id) return rec;
    if (vm.name && rec.vm.name === vm.name) byName = rec;
  }
  return byName;
}

/** An event from the stream (outside any queue): what may be a death is checked in the
 * pod's queue. */
export function onVmEvent(ctx: VmEventsCtx, ev: VmEvent): void {
  if (ev.event === 'ADDED') return;
  if (ev.event === 'MODIFIED' && ev.vm.state === 'running') return;
  const rec = podOfVm(ctx, ev.vm);
  const vmId = rec?.vm?.id;
  if (!rec || !vmId) return;
  logFor(ctx, rec).info({ event: ev.event, state: ev.vm.state }, 'VM event; re-inspecting');
  queueCheck(ctx, rec, vmId);
}

function queueCheck(ctx: VmEventsCtx, rec: PodRecord, vmId: string): void {
  void ctx.queue
    .run(rec.key, () => checkVm(ctx, rec, vmId))
    .catch((err: unknown) => logFor(ctx, rec).warn({ err: errText(err) }, 'VM check failed'));
}

/** After the stream (re)started: VMs that died while no stream ran (one `vm list`). */
export function sweepVms(ctx: VmEventsCtx, listed: readonly VmRecord[]): void {
  const byId = new Map(listed.map((vm) => [vm.id, vm]));
  for (const rec of ctx.pods.values()) {
    if (!rec.vm || !rec.ownsVm || !rec.spec?.managed) continue;
    const now = byId.get(rec.vm.id);
    if (now?.state !== 'running') queueCheck(ctx, rec, rec.vm.id);
  }
}

/** Re-inspects the VM of a pod and restarts or evicts. Runs in the pod's queue. */
export async function checkVm(ctx: VmEventsCtx, rec: PodRecord, vmId: string): Promise<void> {
  if (!isCurrent(ctx, rec) || rec.vm?.id !== vmId || !rec.ownsVm || rec.evicting) return;
  if (rec.hibernate) return; // a hibernate in flight handles its own VM
  if (rec.spec?.hibernate) {
    // Hibernate requested: never restarted or evicted; a VM gone for good is unbound, and the
    // hibernate annotation decides from the registry what is left (ops/drive.ts).
    let gone = false;
    try {
      gone = (await inspectWithRetry(ctx, vmId)) === undefined;
    } catch {
      return;
    }
    if (gone && rec.vm) {
      await releaseLeases(ctx, rec.vm);
      ctx.probes.get(rec.key)?.stop();
      ctx.probes.delete(rec.key);
      unbindVm(rec);
      setOpRetry(rec, undefined); // nothing left to retry on: decide now
      ctx.reconcileSoon(rec.key);
    }
    return;
  }
  const log = logFor(ctx, rec);
  const vm = rec.vm;
  let live: VmRecord | undefined;
  try {
    live = await inspectWithRetry(ctx, vmId);
  } catch (err) {
    ctx.metrics.vmInspectTransientFail();
    scheduleRecheck(ctx, rec, vmId, errText(err));
    return;
  }
  const recheck = ctx.vmRechecks.get(rec.key);
  if (recheck) {
    clearTimeout(recheck.timer);
    ctx.vmRechecks.delete(rec.key);
  }
  if (!live) {
    await releaseLeases(ctx, vm);
    await evict(ctx, rec, 'VMGone', `VM ${vm.name} (${vmId}) is gone`);
    return;
  }
  if (live.state === 'running') {
    refreshVm(rec, live);
    return;
  }
  if (!RESTARTABLE.has(live.state)) return;
  const last = ctx.vmRestarts.get(vmId);
  if (last !== undefined && monoNow() - last < RESTART_COOLDOWN_MS) {
    await removeThenEvict(
      ctx,
      rec,
      'RestartCooldown',
      `VM ${vm.name} (${vmId}) died again (${live.state}) within ${RESTART_COOLDOWN_MS / 1000}s of its restart`,
    );
    return;
  }
  try {
    await ctx.cli.run(startArgv(vmId), { timeoutMs: 60_000, priority: 'high' });
  } catch (err) {
    await removeThenEvict(ctx, rec, 'RestartFailed', `vm start ${vmId} (${live.state}): ${errText(err)}`);
    return;
  }
  ctx.vmRestarts.set(vmId, monoNow());
  ctx.events.event(
    rec.pod,
    'Warning',
    'VMRestarted',
    `VM ${vm.name} (${vmId}) was ${live.state}; restarted it`,
  );
  log.warn({ state: live.state }, 'VM died; restarted');
  try {
    const again = await inspectVm(ctx, vmId);
    if (again) refreshVm(rec, again);
  } catch {
    // the next event or tick re-checks
  }
  ctx.reconcileSoon(rec.key);
}

/** Inconclusive inspect: re-checked later; past the budget the VM is removed and evicted. */
function scheduleRecheck(ctx: VmEventsCtx, rec: PodRecord, vmId: string, why: string): void {
  const prev = ctx.vmRechecks.get(rec.key);
  const firstAt = prev?.firstAt ?? monoNow();
  if (monoNow() - firstAt >= RECHECK_BUDGET_MS) {
    ctx.vmRechecks.delete(rec.key);
    void ctx.queue.run(rec.key, () =>
      removeThenEvict(ctx, rec, 'VMInspectTimeout', `VM ${vmId} could not be inspected for 30 min: ${why}`),
    );
    return;
  }
  const delayMs = prev ? Math.min(RECHECK_MAX_MS, prev.delayMs * 2) : RECHECK_BASE_MS;
  if (prev) clearTimeout(prev.timer);
  const timer = setTimeout(() => queueCheck(ctx, rec, vmId), delayMs);
  timer.unref();
  ctx.vmRechecks.set(rec.key, { timer, firstAt, delayMs });
  logFor(ctx, rec).warn({ err: why, retryInMs: delayMs }, 'VM inspect inconclusive; re-checking later');
}

/** Removes the VM, releases its leases, evicts the pod; a failed removal keeps the pod (the
 * next event or tick tries again). */
async function removeThenEvict(
  ctx: VmEventsCtx,
  rec: PodRecord,
  reason: string,
  message: string,
): Promise<void> {
  const vm = rec.vm;
  if (!vm || !isCurrent(ctx, rec)) return;
  try {
    await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
  } catch (err) {
    if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
      logFor(ctx, rec).warn({ reason, err: errText(err) }, 'removing a dead VM failed; the pod is kept');
      return;
    }
  }
  await ctx.ledger.forget('vm', vm.name);
  await releaseLeases(ctx, vm);
  await evict(ctx, rec, reason, message);
}
