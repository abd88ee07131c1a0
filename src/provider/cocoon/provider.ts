// The cocoon provider: pods become cocoon VMs, their truth is published as the lifecycle
// contract (docs/contracts/lifecycle.md). This class only routes: every entry point of a pod
// key (CreatePod, UpdatePod, DeletePod, the readiness reconcile, probe callbacks, ticks) runs
// through one per-key queue into one operation module (ops/), the readiness reconcile
// (readiness/), container access (access.ts) or the loops (loops.ts).
import type { Readable } from 'node:stream';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { listArgv } from '../../cocoon/argv.ts';
import { type VmEvent, VmEventStream } from '../../cocoon/events.ts';
import { parseVmList, type SnapshotRecord, type VmRecord } from '../../cocoon/records.ts';
import { keyOf } from '../../kube/key.ts';
import type { ContainerAccess, ExecOutcome, ExecStreams, LogOptions } from '../../kubelet/ports.ts';
import type { NodeHealth } from '../../node/ports.ts';
import type { PodLifecycleHandler } from '../../pods/ports.ts';
import { runAsTenant } from '../../util/fair.ts';
import { KeyedQueue } from '../../util/keyed-queue.ts';
import { monoNow } from '../../util/mono-clock.ts';
import { AdmissionOrder } from '../../util/priority.ts';
import { Singleflight } from '../../util/singleflight.ts';
import { VmAccess } from './access.ts';
import { admission, reject } from './admit.ts';
import type { ProviderContext, ProviderDeps } from './context.ts';
import { DeferredPushes } from './deferred-push.ts';
import { type GcResult, SnapshotGc } from './gc.ts';
import { Loops } from './loops.ts';
import { abortBringUp } from './ops/abort.ts';
import { claim, startBringUp } from './ops/create.ts';
import { deletePod } from './ops/delete.ts';
import { startupReconcile } from './ops/startup.ts';
import { updatePod } from './ops/update.ts';
import { onVmEvent, sweepVms } from './ops/vm-events.ts';
import type { PodRecord } from './state.ts';

export { newLogLines } from './log-follow.ts';
export type CocoonProviderOptions = ProviderDeps;

export class CocoonProvider implements PodLifecycleHandler, ContainerAccess, NodeHealth {
  readonly #ctx: ProviderContext;
  readonly #loops: Loops;
  readonly #access: VmAccess;
  readonly #gc: SnapshotGc;
  readonly #deferred: DeferredPushes;

  constructor(deps: CocoonProviderOptions) {
    // Issue 9: every operation of a pod (and the jobs, timers and calls it starts) runs under
    // the pod's admission sequence, so the cocoon call pool and the write buckets serve the
    // pods admitted first before later ones (docs/decisions.md "Priority"); a key's sequence
    // is dropped once the pod is no longer tracked.
    const admission = new AdmissionOrder();
    const ctx: ProviderContext = {
      ...deps,
      pods: new Map(),
      // The pod's namespace is the tenant of its calls: the call pools are shared fairly
      // between namespaces (src/util/fair.ts).
      queue: new KeyedQueue({
        around: (key, task) =>
          runAsTenant(key.slice(0, key.indexOf('/')), () =>
            admission.run(key, task, () => ctx.pods.has(key)),
          ),
      }),
      reconcileSoon: (key) => this.#loops.reconcileSoon(key),
      startProbe: (rec, opts) => this.#loops.startProbe(rec, opts),
      pushDeferred: (name) => this.#deferred.deferred(name),
      retryCreate: (rec) => startBringUp(ctx, rec),
      startupDoneAt: monoNow(),
      orphansByName: new Map(),
      keptEvicted: new Map(),
      probes: new Map(),
      retryTimers: new Map(),
      localSnapshots: new Set(),
      vmRestarts: new Map(),
      vmRechecks: new Map(),
      forkSaves: new Singleflight<SnapshotRecord>(),
      rejected: new Map(),
      sourceSizes: new Map(),
      bringUps: new Map(),
    };
    this.#ctx = ctx;
    this.#loops = new Loops(ctx);
    this.#access = new VmAccess(ctx);
    this.#gc = new SnapshotGc(ctx);
    this.#deferred = new DeferredPushes(ctx);
  }

  // ---- PodLifecycleHandler -------------------------------------------------------------

  /** Claims the pod (validation, `creating`) and returns; the bring-up continues in the
   * pod's own queue, so a slow pull never holds a pod-controller worker. */
  async createPod(pod: V1Pod): Promise<void> {
    const key = keyOf(pod);
    const rec = await this.#ctx.queue.run(key, async () => {
      // Admission first (admit.ts): a pod that does not fit is rejected like the kubelet
      // rejects it, with no record and no VM. The claim follows in the same tick as the verdict.
      const verdict = admission(this.#ctx, pod, key);
      if (verdict.ok) return claim(this.#ctx, pod);
      await reject(this.#ctx, pod, key, verdict.reason, verdict.message);
      return undefined;
    });
    if (rec) startBringUp(this.#ctx, rec);
  }

  updatePod(pod: V1Pod): Promise<void> {
    return this.#ctx.queue.run(keyOf(pod), () => updatePod(this.#ctx, pod));
  }

  /** Aborts the pod's bring-up in flight (ops/abort.ts) instead of waiting behind it; the
   * delete then removes whatever the bring-up made. */
  deletePod(pod: V1Pod): Promise<void> {
    const key = keyOf(pod);
    const aborted = abortBringUp(this.#ctx, key, pod.metadata?.uid);
    return this.#ctx.queue.run(key, () => deletePod(this.#ctx, pod, key, { abortedBringUp: aborted }));
  }

  getPod(namespace: string, name: string): V1Pod | undefined {
    return this.#ctx.pods.get(`${namespace}/${name}`)?.pod;
  }

  getPodStatus(namespace: string, name: string): V1PodStatus | undefined {
    const rec = this.#ctx.pods.get(`${namespace}/${name}`);
    if (!rec) return undefined;
    return { ...(rec.lastStatus as unknown as V1PodStatus) };
  }

  getPods(): V1Pod[] {
    return [...this.#ctx.pods.values()].map((r) => ({
      ...r.pod,
      status: r.lastStatus as unknown as V1PodStatus,
    }));
  }

  // ---- NodeHealth ----------------------------------------------------------------------

  async ping(signal: AbortSignal): Promise<void> {
    await this.#ctx.cli.run(listArgv(), { timeoutMs: 10_000, signal });
  }

  // ---- ContainerAccess -----------------------------------------------------------------

  getContainerLogs(
    ns: string,
    pod: string,
    c: string,
    opts: LogOptions,
    signal: AbortSignal,
  ): Promise<Readable> {
    return this.#access.getContainerLogs(ns, pod, c, opts, signal);
  }

  runInContainer(
    ns: string,
    pod: string,
    c: string,
    cmd: string[],
    streams: ExecStreams,
  ): Promise<ExecOutcome> {
    return this.#access.runInContainer(ns, pod, c, cmd, streams);
  }

  // ---- lifetime ------------------------------------------------------------------------

  /** Runs once, to completion, before the node registers; throws on failure (startup aborts:
   * refusing to register the node). */
  startupReconcile(pods: V1Pod[]): Promise<void> {
    return startupReconcile(this.#ctx, pods);
  }

  /** Starts the lifecycle tick, the lease-file watch, the deferred delete-time pushes (every
   * pending one tried now) and (with a registry) the local snapshot GC, which runs once now
   * and every 10 min. Call after startup reconcile. */
  startLoops(): void {
    this.#loops.start();
    this.#deferred.start();
    this.#gc.start();
  }

  stopLoops(): void {
    this.#loops.stop();
    this.#deferred.stop();
    this.#gc.stop();
  }

  /** Tries every deferred delete-time push now (tests; the schedule retries them). */
  deferredPushesNow(): Promise<void> {
    return this.#deferred.runNow();
  }

  /** One local snapshot GC pass now (tests; the schedule runs it at start and every 10 min). */
  snapshotGc(): Promise<GcResult | undefined> {
    return this.#gc.runOnce();
  }

  /** Watches the VMs for the process lifetime (docs/contracts/pod-to-vm.md, "VM event
   * watcher and eviction"): the event stream, a re-check after every restart of it, and the
   * pid check that sees a dead VMM within a second (the stream's own ticker takes up to 5 s). */
  startVmWatch(): VmEventStream {
    const ctx = this.#ctx;
    const stream = new VmEventStream({
      cli: ctx.cli,
      log: ctx.log.child({ module: 'vm-events' }),
      lifetime: ctx.lifetime,
      onEvent: (ev) => this.vmEvent(ev),
      // Every start, the first included: the stream's ADDED events are ignored, so a VM that
      // died between the startup listing (or the last stream) and this one is found here.
      onStart: () => void this.#sweep(),
      onEnd: () => {
        const old = monoNow() - 60_000;
        for (const [id, at] of ctx.vmRestarts) if (at < old) ctx.vmRestarts.delete(id);
      },
    });
    stream.start();
    this.#loops.startPidWatch();
    return stream;
  }

  /** One event of the VM event stream (the stream calls it; so do tests). */
  vmEvent(ev: VmEvent): void {
    onVmEvent(this.#ctx, ev);
  }

  async #sweep(): Promise<void> {
    try {
      const { stdout } = await this.#ctx.cli.run(listArgv(), { timeoutMs: 60_000 });
      const listed = parseVmList(stdout);
      if (listed.ok) sweepVms(this.#ctx, listed.value);
    } catch (err) {
      this.#ctx.log.warn({ err: String(err) }, 'VM re-check after the event stream restarted failed');
    }
  }

  /** Tracked VMs, for stats. */
  trackedVms(): { rec: PodRecord; vm: VmRecord }[] {
    return [...this.#ctx.pods.values()].flatMap((rec) => (rec.vm ? [{ rec, vm: rec.vm }] : []));
  }
}
