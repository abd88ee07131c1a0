// Stale creates (docs/contracts/pod-to-vm.md, "Stale creates"): at startup, VM records still
// in `creating` are placeholders of a create that was interrupted (a daemon killed mid-clone;
// its `cocoon` child may still be running in its own process group). Each is handed to
// `cocoon vm reconcile-stale-create <id>` (8 at a time): `collected`/`not-found` free the name;
// `busy` or an error start a background watcher (1 s doubling to 30 s, for up to 30 min) that
// asks again until the placeholder is collected, turns `running` (indexed by name: the pod that
// asked for it adopts it), or ends in another state (the orphan policy decides). The provider
// never removes a placeholder itself: only cocoon knows whether its owner is still at work.
import { entryOwns } from '../../../authority/rules.ts';
import { reconcileStaleCreateArgv, removeArgv } from '../../../cocoon/argv.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import type { Logger } from '../../../log.ts';
import { pause } from '../../../util/deadline.ts';
import { inspectVm } from '../bringup.ts';
import type { ProviderContext } from '../context.ts';
import { type ReleaseCtx, releaseLeases } from './delete.ts';

const FAN_OUT = 8;
const RETRY_BASE_MS = 1000;
const RETRY_MAX_MS = 30_000;
const BUDGET_MS = 30 * 60_000;

type Outcome = 'collected' | 'not-found' | 'not-creating' | 'busy' | 'error';

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The placeholders of interrupted creates: reconciled, watched in the background, indexed. */
export type StaleCtx = ReleaseCtx & Pick<ProviderContext, 'cli' | 'ledger' | 'lifetime' | 'orphansByName'>;

/** Collects the `creating` placeholders of `vms` (startup). Resolves after one round; what
 * is still busy goes on in the background until the daemon stops. */
export async function reconcileStaleCreates(ctx: StaleCtx, vms: readonly VmRecord[]): Promise<void> {
  const stale = vms.filter((vm) => vm.state === 'creating');
  if (stale.length === 0) return;
  const log = ctx.log.child({ module: 'stale-create' });
  log.info({ count: stale.length }, 'collecting the placeholders of interrupted creates');
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < stale.length; i = next++) {
      const vm = stale[i] as VmRecord;
      if (!(await settle(ctx, vm, log))) void watch(ctx, vm, log);
    }
  };
  await Promise.all(Array.from({ length: Math.min(FAN_OUT, stale.length) }, worker));
}

/** One attempt; true when the placeholder needs nothing more. */
async function settle(ctx: StaleCtx, vm: VmRecord, log: Logger): Promise<boolean> {
  const outcome = await reconcileOnce(ctx, vm, log);
  ctx.metrics.staleCreate(outcome);
  if (outcome === 'collected' || outcome === 'not-found') {
    log.info({ vm: vm.name, vmId: vm.id, outcome }, 'stale create collected; its name is free');
    return true;
  }
  if (outcome === 'not-creating') return await decided(ctx, vm, log);
  return false;
}

/** One `vm reconcile-stale-create` of a placeholder; never throws (`error` when inconclusive). */
export async function reconcileOnce(
  ctx: Pick<ProviderContext, 'cli'>,
  vm: VmRecord,
  log: Logger,
): Promise<Outcome> {
  try {
    const { stdout } = await ctx.cli.run(reconcileStaleCreateArgv(vm.id), { timeoutMs: 60_000 });
    const outcome = (JSON.parse(stdout) as { outcome?: unknown }).outcome;
    if (
      outcome === 'collected' ||
      outcome === 'not-found' ||
      outcome === 'not-creating' ||
      outcome === 'busy'
    )
      return outcome;
    log.warn({ vmId: vm.id, outcome }, 'unknown reconcile-stale-create outcome');
    return 'error';
  } catch (err) {
    log.warn({ vmId: vm.id, err: errText(err) }, 'reconcile-stale-create failed');
    return 'error';
  }
}

/** The placeholder became a VM: running ⇒ indexed for adoption by its pod; another settled
 * state ⇒ the orphan policy; still creating or inconclusive ⇒ not decided. */
async function decided(ctx: StaleCtx, vm: VmRecord, log: Logger): Promise<boolean> {
  let live: VmRecord | undefined;
  try {
    live = await inspectVm(ctx, vm.id);
  } catch {
    return false;
  }
  if (!live) return true;
  if (live.state === 'creating' || live.state === 'created') return false;
  if (live.state === 'running') {
    ctx.orphansByName.set(live.name, live);
    log.info(
      { vm: live.name, vmId: live.id },
      'interrupted create finished: indexed for adoption by its pod',
    );
    return true;
  }
  const ours = ctx.ledger.vm(live.name);
  // Only an interrupted create of vk-cocoon's own (its ledger intent) is ever removed.
  if (ctx.config.orphanPolicy === 'destroy' && ours && entryOwns(ours, ours.owner, live)) {
    try {
      await ctx.cli.run(removeArgv(live.id), { timeoutMs: 60_000 });
      await ctx.ledger.forget('vm', live.name);
      await releaseLeases(ctx, live);
      log.warn(
        { vm: live.name, vmId: live.id, state: live.state },
        'interrupted create ended unusable: removed',
      );
      return true;
    } catch (err) {
      log.warn({ vmId: live.id, err: errText(err) }, 'removing an unusable interrupted create failed');
    }
  }
  if (ctx.config.orphanPolicy === 'alert') {
    ctx.metrics.orphanVm();
    log.warn(
      { vm: live.name, vmId: live.id, state: live.state },
      'interrupted create ended unusable: kept (VK_ORPHAN_POLICY=alert)',
    );
  }
  ctx.orphansByName.set(live.name, live);
  return true;
}

/** Background: asks again with backoff until decided or the budget is spent. */
async function watch(ctx: StaleCtx, vm: VmRecord, log: Logger): Promise<void> {
  const until = performance.now() + BUDGET_MS;
  let delay = RETRY_BASE_MS;
  while (!ctx.lifetime.aborted && performance.now() < until) {
    await pause(delay, ctx.lifetime);
    if (ctx.lifetime.aborted) return;
    if (await decided(ctx, vm, log)) return;
    if (await settle(ctx, vm, log)) return;
    delay = Math.min(RETRY_MAX_MS, delay * 2);
  }
  if (!ctx.lifetime.aborted)
    log.error(
      { vm: vm.name, vmId: vm.id },
      'a stale create is still not collected after 30 min; its name stays taken',
    );
}
