// Deferred delete-time pushes (docs/registry.md, "Delete during a registry outage"): a delete
// whose `<vmName>:latest` push fails, or would outlast the pod's grace period, saves the VM's
// state as the local snapshot `<vmName>`, records the push in the provenance ledger and lets
// the pod go. This schedule pushes it once the registry takes it: first try 5 s after the
// delete, then doubling to 5 min, every pending push at once after a restart. The local
// snapshot is kept until the push lands (the snapshot GC skips it). Before every try the
// authority rule `mayPushDeferred` re-reads the world: a push whose state is no longer the
// identity's newest (the local snapshot replaced, the identity running again here, a newer
// tag of it in the registry) is dropped, never written over newer state.
import type { V1Pod } from '@kubernetes/client-node';
import type { PendingPush } from '../../authority/ledger.ts';
import { type DatedStamp, mayPushDeferred } from '../../authority/rules.ts';
import { EVENT_MESSAGE_MAX_BYTES } from '../../contract/annotations.ts';
import { monoNow } from '../../util/mono-clock.ts';
import { truncateUtf8 } from '../../util/text.ts';
import { mayDropSnapshot, stampOf } from './authority.ts';
import type { ProviderContext, SnapshotIdentity } from './context.ts';
import { dropSnapshot } from './snapshots.ts';

/** The first retry after a deferral, and the most a retry waits (doubling in between). */
export const DEFERRED_FIRST_RETRY_MS = 5_000;
export const DEFERRED_MAX_RETRY_MS = 5 * 60_000;
/** One tag read before a try; a registry that hangs is a failed try. */
const READ_TIMEOUT_MS = 30_000;

export type DeferredOutcome = 'pushed' | 'dropped' | 'failed' | 'no-registry';

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The pod a deferred push was saved for, as the event recorder needs it (the pod is gone:
 * its events stay readable under its name, which `vk-cocoon explain` lists). */
function podOf(p: PendingPush): V1Pod {
  const slash = p.pod.indexOf('/');
  return {
    metadata: { namespace: p.pod.slice(0, slash), name: p.pod.slice(slash + 1), uid: p.podUid },
  } as V1Pod;
}

function dated(id: SnapshotIdentity | 'absent'): DatedStamp | 'absent' {
  return id === 'absent' ? 'absent' : { ...stampOf(id), created: id.created ?? '' };
}

/** One try of one deferred push: the rule, then the push. Never throws. */
export async function tryDeferredPush(ctx: ProviderContext, p: PendingPush): Promise<DeferredOutcome> {
  const store = ctx.store;
  if (!store) return 'no-registry';
  const log = ctx.log.child({ module: 'deferred-push', pod: p.pod, vm: p.name });
  const ref = `${p.repo}:${p.tag}`;
  const started = performance.now();
  try {
    const read = (tag: string) =>
      store.identity(p.repo, tag, AbortSignal.any([ctx.lifetime, AbortSignal.timeout(READ_TIMEOUT_MS)]));
    const [target, hibernate] = [await read(p.tag), await read('hibernate')];
    const verdict = mayPushDeferred(p, {
      snapshot: ctx.ledger.snapshot(p.name),
      vm: ctx.ledger.vm(p.name),
      target: dated(target),
      hibernate: dated(hibernate),
      acceptUnstamped: ctx.config.acceptUnstampedState,
    });
    if (!verdict.ok) {
      await ctx.ledger.endPush(p.name);
      // A superseded local snapshot is newer state: never removed here.
      if (!p.keep && verdict.rule !== 'push-superseded' && mayDropSnapshot(ctx, p.owner, p.name))
        await dropSnapshot(ctx, p.name, log);
      ctx.metrics.deferredPush('dropped', ctx.ledger.size().pushes);
      const message = `deferred push of ${ref} dropped: ${verdict.message}`;
      const gone = podOf(p);
      ctx.events.event(
        gone,
        'Warning',
        'SnapshotPushDropped',
        truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES),
      );
      log.warn({ rule: verdict.rule, savedAt: p.savedAt }, message);
      return 'dropped';
    }
    const r = await store.push({
      localName: p.name,
      repo: p.repo,
      tag: p.tag,
      baseImage: p.baseImage,
      namespace: p.owner.namespace,
      controllerUid: p.owner.controllerUid,
      pod: p.pod,
      podUid: p.podUid,
      log,
    });
    await ctx.ledger.endPush(p.name);
    ctx.metrics.snapshotPush(p.owner.namespace, 'ok', (performance.now() - started) / 1000);
    ctx.metrics.deferredPush('pushed', ctx.ledger.size().pushes);
    if (!p.keep && mayDropSnapshot(ctx, p.owner, p.name)) await dropSnapshot(ctx, p.name, log);
    const message = `pushed ${ref} (deferred at delete, saved ${p.savedAt}, ${p.attempts + 1} tries)`;
    ctx.events.event(podOf(p), 'Normal', 'SnapshotPushed', message);
    log.info({ digest: r.digest, snapshotId: r.snapshotId, attempts: p.attempts + 1 }, message);
    return 'pushed';
  } catch (err) {
    ctx.metrics.snapshotPush(p.owner.namespace, 'failed', (performance.now() - started) / 1000);
    ctx.metrics.deferredPush('failed', ctx.ledger.size().pushes);
    await ctx.ledger.pushFailed(p.name, errText(err)).catch((e: unknown) => {
      log.warn({ err: errText(e) }, 'cannot record the failed try in the ledger');
    });
    log.warn({ err: errText(err), attempts: p.attempts + 1 }, `deferred push of ${ref} failed; retried`);
    return 'failed';
  }
}

/** The schedule of the deferred pushes. Tries run one at a time, each in the queue of the pod
 * it was saved for (a pod of that name recreated here waits behind it, never races it). */
export class DeferredPushes {
  readonly #ctx: ProviderContext;
  /** Next try per local snapshot name (monotonic ms) and the wait after a failure. */
  readonly #due = new Map<string, { at: number; waitMs: number }>();
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = false;

  constructor(ctx: ProviderContext) {
    this.#ctx = ctx;
  }

  /** Every pending push is tried now (after a restart, the registry may be back). */
  start(): void {
    if (this.#stopped) return;
    const pending = this.#ctx.ledger.pendingPushes();
    if (!this.#ctx.store && pending.length > 0) {
      // Loud, never a quiet loss: the state stays on disk until a registry is configured.
      this.#ctx.log.error(
        { pending: pending.map((p) => `${p.repo}:${p.tag}`) },
        'deferred pushes are pending but no registry is configured (OCI_REGISTRY); their local snapshots are kept',
      );
      return;
    }
    for (const p of pending) this.#due.set(p.name, { at: monoNow(), waitMs: DEFERRED_FIRST_RETRY_MS });
    this.#arm();
  }

  /** A push was just deferred: its first try comes after the first retry wait. */
  deferred(name: string): void {
    if (this.#stopped) return;
    this.#due.set(name, { at: monoNow() + DEFERRED_FIRST_RETRY_MS, waitMs: DEFERRED_FIRST_RETRY_MS });
    this.#arm();
  }

  /** Tries every pending push now, whatever its schedule (tests; resolves when done). */
  async runNow(): Promise<void> {
    for (const p of this.#ctx.ledger.pendingPushes()) {
      const d = this.#due.get(p.name);
      this.#due.set(p.name, { at: monoNow(), waitMs: d?.waitMs ?? DEFERRED_FIRST_RETRY_MS });
    }
    await this.#pass();
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #arm(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#stopped || this.#running || this.#due.size === 0) return;
    const next = Math.min(...[...this.#due.values()].map((d) => d.at));
    this.#timer = setTimeout(() => void this.#pass(), Math.max(0, next - monoNow()));
    this.#timer.unref();
  }

  #pass(): Promise<void> {
    // A pass that throws (never expected: each try catches its own errors) is logged and the
    // records stay in the ledger for the next pass: nothing is decided by it.
    this.#running ??= this.#runDue()
      .catch((err: unknown) => {
        this.#ctx.log.error({ err: errText(err) }, 'deferred pushes: a pass failed');
        // Tried again after each entry's wait, never in a tight loop.
        const now = monoNow();
        for (const d of this.#due.values()) if (d.at <= now) d.at = now + d.waitMs;
      })
      .finally(() => {
        this.#running = undefined;
        this.#arm();
      });
    return this.#running;
  }

  async #runDue(): Promise<void> {
    const ctx = this.#ctx;
    for (const p of ctx.ledger.pendingPushes()) {
      if (this.#stopped || ctx.lifetime.aborted) return;
      const d = this.#due.get(p.name);
      if (!d || d.at > monoNow()) continue;
      // Read again inside the pod's queue: a later deferral of the same name replaces it.
      const outcome = await ctx.queue.run(p.pod, async () => {
        const now = ctx.ledger.pendingPush(p.name);
        return now ? tryDeferredPush(ctx, now) : ('dropped' as const);
      });
      if (outcome === 'failed') {
        const waitMs = Math.min(d.waitMs * 2, DEFERRED_MAX_RETRY_MS);
        this.#due.set(p.name, { at: monoNow() + d.waitMs, waitMs });
      } else {
        this.#due.delete(p.name);
      }
    }
    // Entries the ledger no longer has (ended elsewhere) are not scheduled.
    for (const name of this.#due.keys()) if (!ctx.ledger.pendingPush(name)) this.#due.delete(name);
  }
}
