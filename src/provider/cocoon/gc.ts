// Local snapshot GC (docs/contracts/pod-to-vm.md "Snapshot CPU-class gate and local snapshot GC"; docs/decisions.md
// "Snapshot GC and the CPU-class gate"): once at start and every 10 min, only with a registry,
// the local snapshots named `vk-*` (VM names: hibernate copies) that no tracked pod uses (nor a deferred push) and
// that are stale against the registry's `<name>:hibernate` (tag gone, or another snapshot ID)
// are removed, and so are `<vmName>-hibernate-import` leftovers of a wake that is no longer in
// flight. A registry that does not answer keeps everything it was asked about. The selection is
// pure (planGc, isStale); the pass re-checks a name against the tracked pods right before it
// removes it.
import { snapshotListArgv } from '../../cocoon/argv.ts';
import { parseSnapshotList, type SnapshotRecord } from '../../cocoon/records.ts';
import { CocoonCommandError } from '../../cocoon/runner.ts';
import { VM_NAME } from '../../contract/annotations.ts';
import { localSnapshotName } from '../../vmspec/snapshot-name.ts';
import type { ProviderContext, SnapshotIdentity } from './context.ts';
import { importName } from './ops/restore.ts';
import { removeSnapshot } from './snapshots.ts';
import type { PodRecord } from './state.ts';

export const GC_INTERVAL_MS = 10 * 60_000;
/** Only snapshots whose name starts with this are ever considered (VM names). */
export const GC_PREFIX = 'vk-';
const IMPORT_SUFFIX = importName('');
/** One identity read; a registry that hangs keeps the snapshot. */
const IDENTITY_TIMEOUT_MS = 30_000;
/** This many registry errors in a row end the pass (the rest is kept until the next one). */
const MAX_ERRORS_IN_A_ROW = 3;

/** The local snapshot names the tracked pods use: each pod's hibernate copy `<vmName>` (while
 * it is tracked, hibernated or not), `fork-<vmName>`, the `fork-<source>` it forks from, its
 * clone source's local name, and `<vmName>-hibernate-import` while a wake or bring-up of it
 * is in flight. */
export function usedSnapshots(pods: Iterable<PodRecord>): Set<string> {
  const used = new Set<string>();
  for (const rec of pods) {
    const vmNames = [rec.spec?.vmName, rec.vm?.name, rec.pod.metadata?.annotations?.[VM_NAME]];
    for (const n of vmNames) {
      if (!n) continue;
      used.add(n);
      used.add(`fork-${n}`);
      if (rec.waking || rec.bringingUp) used.add(importName(n));
    }
    if (rec.spec?.forkFrom) used.add(`fork-${rec.spec.forkFrom}`);
    if (rec.spec?.image) used.add(localSnapshotName(rec.spec.image));
    if (rec.sourceImage) used.add(rec.sourceImage);
  }
  return used;
}

export interface GcPlan {
  /** `<vmName>-hibernate-import` leftovers no wake uses: removed without a registry read. */
  readonly leftovers: readonly SnapshotRecord[];
  /** Unused `vk-*` snapshots: removed when stale against `<name>:hibernate`. */
  readonly candidates: readonly SnapshotRecord[];
  /** `vk-*` snapshots a tracked pod uses. */
  readonly used: readonly string[];
}

/** Which local snapshots the pass looks at (names not starting with `vk-` are never touched). */
export function planGc(local: readonly SnapshotRecord[], used: ReadonlySet<string>): GcPlan {
  const leftovers: SnapshotRecord[] = [];
  const candidates: SnapshotRecord[] = [];
  const kept: string[] = [];
  for (const s of local) {
    if (!s.name.startsWith(GC_PREFIX)) continue;
    if (used.has(s.name)) kept.push(s.name);
    else if (s.name.endsWith(IMPORT_SUFFIX) && s.name.length > IMPORT_SUFFIX.length) leftovers.push(s);
    else candidates.push(s);
  }
  return { leftovers, candidates, used: kept };
}

/** A local copy is stale when `<name>:hibernate` is gone or names another snapshot. */
export function isStale(local: SnapshotRecord, registry: SnapshotIdentity | 'absent'): boolean {
  return registry === 'absent' || registry.snapshotId !== local.id;
}

export interface GcResult {
  removed: string[];
  /** Kept because the registry's tag names this very snapshot. */
  current: string[];
  used: string[];
  /** Kept because the registry did not answer (or the removal failed). */
  errors: { name: string; err: string }[];
}

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** One GC pass; never throws. `undefined` without a registry or when the list failed. */
export async function runSnapshotGc(ctx: ProviderContext): Promise<GcResult | undefined> {
  const store = ctx.store;
  if (!store) return undefined;
  const log = ctx.log.child({ module: 'snapshot-gc' });
  let local: readonly SnapshotRecord[];
  try {
    const { stdout } = await ctx.cli.run(snapshotListArgv(), { timeoutMs: 60_000, signal: ctx.lifetime });
    const listed = parseSnapshotList(stdout);
    if (!listed.ok) throw new Error(listed.error);
    local = listed.value;
  } catch (err) {
    log.warn({ err: errText(err) }, 'snapshot GC: cannot list local snapshots; nothing removed');
    return undefined;
  }
  // A deferred delete-time push's local snapshot is kept until it is pushed (deferred-push.ts).
  const inUse = () => {
    const used = usedSnapshots(ctx.pods.values());
    for (const p of ctx.ledger.pendingPushes()) used.add(p.name);
    return used;
  };
  const all = planGc(local, inUse());
  // Only what vk-cocoon wrote is collected (docs/security.md): a `vk-*` snapshot the ledger
  // does not list (a base image, a host's) is never removed.
  const written = (name: string) => {
    const entry = ctx.ledger.snapshot(name);
    return entry !== undefined && entry.origin !== 'pulled';
  };
  const plan = { ...all, candidates: all.candidates.filter((s) => written(s.name)) };
  const result: GcResult = { removed: [], current: [], used: [...plan.used], errors: [] };
  // Right before a removal the tracked pods are read again: a pod claimed (or a wake started)
  // since the plan keeps what it uses.
  const stillUnused = (name: string) => !inUse().has(name);
  const remove = async (name: string, why: string) => {
    if (!stillUnused(name)) {
      result.used.push(name);
      return;
    }
    try {
      // A leased snapshot (a clone reads it) is in use: kept, no waiting.
      await removeSnapshot(ctx, name, { signal: ctx.lifetime, leasedRetryMs: 0 });
      result.removed.push(name);
      log.info({ snapshot: name, why }, 'snapshot GC: removed a local snapshot');
    } catch (err) {
      const leased = err instanceof CocoonCommandError && err.errorClass === 'snapshot_leased';
      if (leased) result.used.push(name);
      else result.errors.push({ name, err: errText(err) });
    }
  };
  for (const s of plan.leftovers) {
    if (ctx.lifetime.aborted) break;
    await remove(s.name, 'hibernate import left over by a wake that is no longer in flight');
  }
  let inARow = 0;
  for (const s of plan.candidates) {
    if (ctx.lifetime.aborted) break;
    let id: SnapshotIdentity | 'absent';
    try {
      id = await store.identity(
        s.name,
        'hibernate',
        AbortSignal.any([ctx.lifetime, AbortSignal.timeout(IDENTITY_TIMEOUT_MS)]),
      );
      inARow = 0;
    } catch (err) {
      result.errors.push({ name: s.name, err: errText(err) });
      log.warn(
        { snapshot: s.name, err: errText(err) },
        `snapshot GC: cannot read ${s.name}:hibernate; the local snapshot is kept`,
      );
      if (++inARow >= MAX_ERRORS_IN_A_ROW) {
        const rest = plan.candidates.slice(plan.candidates.indexOf(s) + 1).map((r) => r.name);
        for (const name of rest)
          result.errors.push({ name, err: 'not checked: the registry does not answer' });
        break;
      }
      continue;
    }
    if (!isStale(s, id)) {
      result.current.push(s.name);
      continue;
    }
    const why =
      id === 'absent'
        ? `${s.name}:hibernate is absent`
        : `${s.name}:hibernate names snapshot ${id.snapshotId}`;
    await remove(s.name, why);
  }
  log.info(
    {
      removed: result.removed,
      kept: result.current.length + result.used.length + result.errors.length,
      current: result.current,
      used: result.used,
      errors: result.errors.map((e) => e.name),
    },
    `snapshot GC done: ${result.removed.length} removed`,
  );
  return result;
}

/** The GC schedule: a pass at start, then every 10 min; passes never overlap. */
export class SnapshotGc {
  readonly #ctx: ProviderContext;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<GcResult | undefined> | undefined;
  #stopped = false;

  constructor(ctx: ProviderContext) {
    this.#ctx = ctx;
  }

  /** Starts the schedule (a no-op without a registry). */
  start(intervalMs = GC_INTERVAL_MS): void {
    if (!this.#ctx.store || this.#timer || this.#stopped) return;
    this.#timer = setInterval(() => void this.runOnce(), intervalMs);
    this.#timer.unref();
    void this.runOnce();
  }

  /** One pass, unless one is running (then that one's result). */
  runOnce(): Promise<GcResult | undefined> {
    if (this.#stopped) return Promise.resolve(undefined);
    this.#running ??= runSnapshotGc(this.#ctx).finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  stop(): void {
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
