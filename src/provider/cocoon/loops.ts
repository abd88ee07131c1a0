// The provider's background loops: the readiness reconcile scheduler (one queued reconcile
// per pod, coalesced), the periodic lifecycle tick, the lease-file watch and the per-pod
// probes. Each only enqueues work in the pod's queue.

import { watch as watchFs } from 'node:fs';
import { dirname } from 'node:path';
import { isCurrent, logFor, type ProviderContext } from './context.ts';
import { driveOps } from './ops/drive.ts';
import { sweepKeptEvicted } from './ops/evicted.ts';
import { checkVm } from './ops/vm-events.ts';
import { ProbeAgent } from './probe-agent.ts';
import { publish } from './publication/held.ts';
import { refreshIp } from './publication/status.ts';
import { supersedeJobs } from './readiness/jobs.ts';
import { reconcile } from './readiness/reconcile.ts';
import { type PodRecord, setHeldTimer, setProbeReady } from './state.ts';

export class Loops {
  readonly #ctx: ProviderContext;
  readonly #pending = new Set<string>();
  #tick: NodeJS.Timeout | undefined;
  #pidWatch: NodeJS.Timeout | undefined;
  /** VMs whose dead pid is being re-checked (one check at a time per VM). */
  readonly #pidSuspects = new Set<string>();
  #leaseWatch: ReturnType<typeof watchFs> | undefined;
  #leaseDebounce: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(ctx: ProviderContext) {
    this.#ctx = ctx;
  }

  /** Enqueues one readiness reconcile for the key (coalesced while one is already queued). */
  reconcileSoon(key: string): void {
    // After shutdown nothing is re-derived: a job ended by the lifetime signal would
    // otherwise start the same job again at once, forever (the next process re-derives).
    if (this.#ctx.lifetime.aborted || this.#stopped) return;
    if (this.#pending.has(key)) return;
    this.#pending.add(key);
    void this.#ctx.queue
      .run(key, async () => {
        this.#pending.delete(key);
        // What the hibernate annotation asks goes first (it may start a hibernate or a wake).
        const rec = this.#ctx.pods.get(key);
        if (rec) await driveOps(this.#ctx, rec);
        await reconcile(this.#ctx, key);
      })
      .catch((err: unknown) =>
        this.#ctx.log.warn({ pod: key, err: String(err) }, 'readiness reconcile failed'),
      );
  }

  /** Starts the lifecycle tick and the lease-file watch. Call after startup reconcile. */
  start(): void {
    const ctx = this.#ctx;
    this.#tick = setInterval(() => {
      this.#watchLeases(false);
      for (const key of ctx.pods.keys()) this.reconcileSoon(key);
      if (ctx.keptEvicted.size > 0)
        void sweepKeptEvicted(ctx).catch((err: unknown) =>
          ctx.log.warn({ err: String(err) }, 'sweep of the VMs kept after taint evictions failed'),
        );
    }, ctx.config.reconcileIntervalSeconds * 1000);
    this.#tick.unref();
    this.#watchLeases(true);
  }

  /** Watches the lease file's directory; until that works (cocoon-net has not made it yet, or
   * it went away) the 1 s poll serves and each lifecycle tick tries again. Warned once. */
  #watchLeases(warn: boolean): void {
    const ctx = this.#ctx;
    if (this.#leaseWatch || this.#stopped) return;
    try {
      const file = ctx.leases.path;
      const watcher = watchFs(dirname(file), { persistent: false }, (_ev, name) => {
        if (name && !file.endsWith(String(name))) return;
        clearTimeout(this.#leaseDebounce);
        this.#leaseDebounce = setTimeout(() => this.#onLeaseChange(), 20);
      });
      watcher.on('error', () => {
        watcher.close();
        if (this.#leaseWatch === watcher) this.#leaseWatch = undefined;
      });
      this.#leaseWatch = watcher;
      if (!warn) ctx.log.info({ path: file }, 'watching the lease file directory');
    } catch (err) {
      if (warn)
        ctx.log.warn(
          { err: String(err), path: ctx.leases.path },
          'cannot watch the lease file directory; polling it every second and retrying the watch on each tick',
        );
    }
  }

  /** Every second, each tracked managed VM's process is checked with signal 0: a dead VMM is
   * seen at once and re-inspected like an event (the stream is the authority; this only
   * makes it faster). A reused pid hides a death from this check, never from the stream. */
  startPidWatch(): void {
    const ctx = this.#ctx;
    this.#pidWatch = setInterval(() => {
      for (const rec of ctx.pods.values()) {
        const vm = rec.vm;
        if (!vm || vm.pid <= 0 || !rec.ownsVm || !rec.spec?.managed || this.#pidSuspects.has(vm.id)) continue;
        try {
          process.kill(vm.pid, 0);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ESRCH') continue;
          this.#pidSuspects.add(vm.id);
          const vmId = vm.id;
          void ctx.queue
            .run(rec.key, () => checkVm(ctx, rec, vmId))
            .finally(() => this.#pidSuspects.delete(vmId))
            .catch(() => {});
        }
      }
    }, 1000);
    this.#pidWatch.unref();
  }

  stop(): void {
    const ctx = this.#ctx;
    this.#stopped = true;
    clearInterval(this.#tick);
    clearInterval(this.#pidWatch);
    clearTimeout(this.#leaseDebounce);
    this.#leaseWatch?.close();
    for (const p of ctx.probes.values()) p.stop();
    for (const t of ctx.retryTimers.values()) clearTimeout(t);
    ctx.retryTimers.clear();
    for (const rec of ctx.pods.values()) {
      supersedeJobs(rec, 'provider shutting down');
      // Held writes stay unwritten: the next process re-derives them (adoption by name).
      if (rec.held?.timer) {
        clearTimeout(rec.held.timer);
        setHeldTimer(rec, undefined);
      }
    }
  }

  /** A lease-file change matters at once only to pods still waiting for a decision; IP
   * changes of decided pods are picked up by the periodic tick (a burst of N lease writes
   * would otherwise cost N × pods reconciles). */
  #onLeaseChange(): void {
    for (const rec of this.#ctx.pods.values()) {
      const state = rec.intent?.state ?? '';
      if (rec.vm && (state === '' || state === 'creating')) this.reconcileSoon(rec.key);
    }
  }

  /** Starts (or restarts) the probe of a pod with a VM; transitions run in the pod's queue.
   * With `ready` the probe starts as ready (a failure counts towards the 3 that flip it). */
  startProbe(rec: PodRecord, opts: { ready?: boolean } = {}): void {
    const ctx = this.#ctx;
    ctx.probes.get(rec.key)?.stop();
    const agent = new ProbeAgent({
      target: () => (isCurrent(ctx, rec) && rec.vm ? { ip: rec.ip, port: rec.spec?.probePort } : undefined),
      onTransition: (ready) => {
        void ctx.queue
          .run(rec.key, async () => {
            if (!isCurrent(ctx, rec)) return;
            setProbeReady(rec, ready);
            await refreshIp(ctx, rec);
            publish(ctx, rec);
            this.reconcileSoon(rec.key);
          })
          .catch((err: unknown) =>
            ctx.log.warn({ pod: rec.key, err: String(err) }, 'probe transition failed'),
          );
      },
      refreshIp: async () => {
        await refreshIp(ctx, rec);
      },
      onDuration: (s) => ctx.metrics.probeDuration(rec.pod.metadata?.namespace ?? '', s),
      icmp: ctx.icmp,
      log: logFor(ctx, rec),
      ready: opts.ready,
    });
    ctx.probes.set(rec.key, agent);
    agent.start();
  }
}
