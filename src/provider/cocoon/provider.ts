// The cocoon provider: pods become cocoon VMs (pod-to-vm.md), their truth is published as
// the lifecycle contract (lifecycle.md). Every entry point of a pod key — CreatePod,
// UpdatePod, DeletePod, the readiness reconcile, probe callbacks, ticks — runs through one
// per-key queue (§10.7); long steps run as jobs outside it (readiness.ts).
import { watch as watchFs } from 'node:fs';
import { dirname } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { execArgv, listArgv, logsArgv, removeArgv, snapshotRemoveArgv } from '../../cocoon/argv.ts';
import { parseVmList, type VmRecord } from '../../cocoon/records.ts';
import { CocoonCommandError, killGroup } from '../../cocoon/runner.ts';
import type { ExecOutcome, ExecStreams } from '../../kubelet/streams/exec-session.ts';
import {
  KEEP_SNAPSHOT_ON_DELETE,
  LIFECYCLE_OBSERVED_GENERATION,
  VM_ID,
  VM_IP,
} from '../../lifecycle/annotations.ts';
import { echoGeneration, seedFromAnnotations } from '../../lifecycle/intent.ts';
import { releaseLease } from '../../net/release.ts';
import { KeyedQueue } from '../../util/keyed-queue.ts';
import { decodeVMSpec, isClonedBootSpec, type VMSpec } from '../../vmspec/decode.ts';
import { type LogOptions, NotFoundError, type Provider } from '../types.ts';
import { cloneBringUp, inspectWithRetry, runBringUp, type SnapshotPuller } from './bringup.ts';
import {
  failOp,
  flushIntent,
  generationOf,
  isCurrent,
  logFor,
  type ProviderContext,
  type ProviderDeps,
  patchAnnotations,
  publish,
  reassertIfStale,
  stageLifecycle,
} from './context.ts';
import { ProbeAgent } from './probe-agent.ts';
import { bindForReadiness, reconcile, refreshIp, supersedeJobs } from './readiness.ts';
import { applyAnnotations, newRecord, type PodRecord, retrack } from './record.ts';

/** Lines of `next` (a newer tail of the same log) that come after the end of `previous`:
 * the last lines of `previous` are located in `next`, searching from the end. Without an
 * anchor (log rotated, or more new lines than the tail holds) all of `next` is new. */
export function newLogLines(previous: readonly string[], next: readonly string[]): string[] {
  const k = Math.min(previous.length, 20);
  if (k === 0) return [...next];
  const anchor = previous.slice(previous.length - k);
  for (let end = next.length - 1; end >= k - 1; end--) {
    let match = true;
    for (let i = 0; i < k; i++) {
      if (next[end - k + 1 + i] !== anchor[i]) {
        match = false;
        break;
      }
    }
    if (match) return next.slice(end + 1);
  }
  return [...next];
}

const keyOf = (pod: V1Pod) => `${pod.metadata?.namespace ?? ''}/${pod.metadata?.name ?? ''}`;

export interface CocoonProviderOptions extends ProviderDeps {
  puller?: SnapshotPuller;
}

export class CocoonProvider implements Provider {
  readonly #ctx: ProviderContext;
  readonly #puller: SnapshotPuller | undefined;
  readonly #probes = new Map<string, ProbeAgent>();
  /** VMs not bound to a pod, by VM name, for adoption by the next CreatePod (§6 step 6). */
  readonly #orphansByName = new Map<string, VmRecord>();
  #notify: (pod: V1Pod) => void = () => {};
  #writeStatus: (pod: V1Pod) => Promise<void> = async () => {};
  #tick: NodeJS.Timeout | undefined;
  #leaseWatch: ReturnType<typeof watchFs> | undefined;
  #leaseDebounce: NodeJS.Timeout | undefined;

  constructor(opts: CocoonProviderOptions) {
    this.#puller = opts.puller;
    this.#ctx = {
      ...opts,
      pods: new Map(),
      queue: new KeyedQueue(),
      writeStatus: (pod) => this.#writeStatus(pod),
      notify: (pod) => this.#notify(pod),
      reconcileSoon: (key) => this.#reconcileSoon(key),
      startupDoneAt: Date.now(),
    };
  }

  // ---- framework wiring ---------------------------------------------------------------

  notifyPods(cb: (pod: V1Pod) => void): void {
    this.#notify = cb;
  }

  /** The synchronous status writer used for R8 (status before the ready annotation). */
  setStatusWriter(fn: (pod: V1Pod) => Promise<void>): void {
    this.#writeStatus = fn;
  }

  async ping(signal: AbortSignal): Promise<void> {
    await this.#ctx.cli.run(listArgv(), { timeoutMs: 10_000, signal });
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

  /** Tracked VMs, for stats. */
  trackedVms(): { rec: PodRecord; vm: VmRecord }[] {
    return [...this.#ctx.pods.values()].flatMap((rec) => (rec.vm ? [{ rec, vm: rec.vm }] : []));
  }

  // ---- background loops ---------------------------------------------------------------

  /** Starts the lifecycle tick and the lease-file watch. Call after startup reconcile. */
  startLoops(): void {
    const interval = this.#ctx.config.reconcileIntervalSeconds * 1000;
    this.#tick = setInterval(() => {
      for (const key of this.#ctx.pods.keys()) this.#reconcileSoon(key);
    }, interval);
    this.#tick.unref();
    try {
      const file = this.#ctx.leases.path;
      this.#leaseWatch = watchFs(dirname(file), { persistent: false }, (_ev, name) => {
        if (name && !file.endsWith(String(name))) return;
        clearTimeout(this.#leaseDebounce);
        this.#leaseDebounce = setTimeout(() => this.#onLeaseChange(), 20);
      });
      this.#leaseWatch.on('error', () => {});
    } catch (err) {
      this.#ctx.log.warn(
        { err: String(err), path: this.#ctx.leases.path },
        'cannot watch the lease file directory; relying on polling',
      );
    }
  }

  stopLoops(): void {
    clearInterval(this.#tick);
    clearTimeout(this.#leaseDebounce);
    this.#leaseWatch?.close();
    for (const p of this.#probes.values()) p.stop();
    for (const rec of this.#ctx.pods.values()) supersedeJobs(rec, 'provider shutting down');
  }

  /** A lease-file change matters at once only to pods still waiting for a decision; IP
   * changes of decided pods are picked up by the periodic tick (a burst of N lease writes
   * would otherwise cost N × pods reconciles). */
  #onLeaseChange(): void {
    for (const rec of this.#ctx.pods.values()) {
      const state = rec.intent?.state ?? '';
      if (rec.vm && (state === '' || state === 'creating')) this.#reconcileSoon(rec.key);
    }
  }

  #pendingReconcile = new Set<string>();

  /** Enqueues one reconcile per key (coalesced while one is already queued). */
  #reconcileSoon(key: string): void {
    if (this.#pendingReconcile.has(key)) return;
    this.#pendingReconcile.add(key);
    void this.#ctx.queue
      .run(key, async () => {
        this.#pendingReconcile.delete(key);
        await reconcile(this.#ctx, key);
      })
      .catch((err: unknown) =>
        this.#ctx.log.warn({ pod: key, err: String(err) }, 'readiness reconcile failed'),
      );
  }

  // ---- CreatePod ----------------------------------------------------------------------

  createPod(pod: V1Pod): Promise<void> {
    return this.#ctx.queue.run(keyOf(pod), () => this.#create(pod));
  }

  async #create(pod: V1Pod): Promise<void> {
    const ctx = this.#ctx;
    const key = keyOf(pod);
    const uid = pod.metadata?.uid ?? '';
    const existing = ctx.pods.get(key);
    if (existing?.deleting) throw new Error('delete operation still in flight');
    if (existing && existing.uid === uid && existing.vm) {
      // Idempotent: a repeated CreatePod only refreshes status (pod-to-vm.md §2.1).
      publish(ctx, existing);
      return;
    }
    if (existing && existing.uid !== uid) this.#detach(existing);

    const decoded = decodeVMSpec(pod.metadata?.annotations, {
      namespace: pod.metadata?.namespace,
      ownerReferences: pod.metadata?.ownerReferences,
      containers: pod.spec?.containers,
    });
    if (!decoded.ok && decoded.errors.some((e) => e.code === 'missing_vmname')) {
      ctx.metrics.podLifecycle('create', 'skipped', 'missing_vmname');
      throw new Error(decoded.errors.map((e) => e.message).join('; '));
    }
    const rec = existing?.uid === uid ? existing : newRecord(key, pod, decoded.ok ? decoded.spec : undefined);
    rec.pod = pod;
    rec.spec = decoded.ok ? decoded.spec : undefined;
    ctx.pods.set(key, rec);
    const log = logFor(ctx, rec);

    if (!decoded.ok) {
      // Bad input: a Warning naming the key, lifecycle failed, never a VM, never a crash.
      const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}`;
      await failOp(ctx, rec, 'create', 'CreateBringUpFailed', message);
      return;
    }
    const spec = decoded.spec;
    for (const w of decoded.warnings) log.warn({ key: w.key }, w.message);

    // Claim the incarnation (R1).
    if (stageLifecycle(ctx, rec, 'creating')) await flushIntent(ctx, rec);

    if (!spec.managed) {
      await this.#adoptUnmanaged(rec, spec);
      return;
    }
    if (spec.hibernate) {
      await this.#refuseHibernate(rec, 'create');
      return;
    }
    if (spec.os === 'macos') {
      await failOp(
        ctx,
        rec,
        'create',
        'CreateBringUpFailed',
        'macOS guests belong to a later tier and are not supported by this vk-cocoon release',
      );
      return;
    }
    if (await this.#adoptByName(rec, spec)) return;

    const started = performance.now();
    rec.step = { name: 'BringingUp', since: Date.now() };
    let result: Awaited<ReturnType<typeof cloneBringUp>>;
    try {
      result =
        spec.mode === 'run'
          ? await runBringUp(ctx, spec, log)
          : await cloneBringUp(ctx, spec, this.#puller, log);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      await failOp(ctx, rec, 'create', 'CreateBringUpFailed', message);
      // Drop the provisional claim but keep the failure intent visible (§2.1 step 7); the
      // pod controller retries the create with backoff.
      if (ctx.pods.get(key) === rec) ctx.pods.delete(key);
      throw err;
    }
    ctx.metrics.bootDuration(
      pod.metadata?.namespace ?? '',
      spec.mode === 'run' ? 'run' : 'clone',
      spec.backend,
      (performance.now() - started) / 1000,
    );
    rec.clonedBoot = result.clonedBoot;
    rec.sourceImage = result.sourceImage;
    await this.#bind(rec, result.vm);
    ctx.metrics.podLifecycle('create', 'ok', '');
    log.info({ vmId: result.vm.id, ms: Math.round(performance.now() - started) }, 'VM up');
  }

  /** Binds a VM to the record: id/ip annotations (UID-fenced), probe, status, reconcile. */
  async #bind(rec: PodRecord, vm: VmRecord): Promise<void> {
    const ctx = this.#ctx;
    if (!isCurrent(ctx, rec)) return;
    rec.vm = vm;
    rec.startTime ??= new Date();
    bindForReadiness(rec);
    await refreshIp(ctx, rec);
    const changes = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
    applyAnnotations(rec, changes);
    const outcome = await patchAnnotations(ctx, rec, changes);
    if (outcome === 'superseded') {
      logFor(ctx, rec).info('another incarnation owns the name now; detaching quietly');
      return;
    }
    this.#startProbe(rec);
    publish(ctx, rec);
    this.#reconcileSoon(rec.key);
  }

  async #adoptUnmanaged(rec: PodRecord, spec: VMSpec): Promise<void> {
    const ctx = this.#ctx;
    const ann = rec.pod.metadata?.annotations ?? {};
    const id = ann[VM_ID] ?? '';
    const ip = ann[VM_IP] ?? '';
    if (!id || !ip) {
      ctx.pods.delete(rec.key);
      throw new Error(`unmanaged vm ${spec.vmName || rec.key} missing pre-assigned IP/VMID`);
    }
    rec.vm = {
      id,
      hypervisor: spec.backend,
      state: 'running',
      pid: 0,
      name: spec.vmName,
      image: spec.image,
      imageType: '',
      nics: [{ mac: '', tap: '', netnsPath: '', static: { ip, gateway: '', prefix: 32 } }],
      storage: [],
    } as unknown as VmRecord;
    rec.ip = ip;
    rec.startTime ??= new Date();
    rec.probeReady = true;
    if (stageLifecycle(ctx, rec, 'ready')) await flushIntent(ctx, rec);
    publish(ctx, rec);
  }

  async #adoptByName(rec: PodRecord, spec: VMSpec): Promise<boolean> {
    const ctx = this.#ctx;
    const indexed = this.#orphansByName.get(spec.vmName);
    if (!indexed) return false;
    let vm: VmRecord | undefined;
    try {
      vm = await inspectWithRetry(ctx, indexed.id);
    } catch (err) {
      await failOp(ctx, rec, 'create', 'CreateAdoptInspectFailed', `inspect ${spec.vmName}: ${String(err)}`);
      throw err;
    }
    this.#orphansByName.delete(spec.vmName);
    if (!vm) return false;
    rec.clonedBoot = isClonedBootSpec(spec);
    await this.#bind(rec, vm);
    ctx.metrics.podLifecycle('create', 'ok', 'adopted');
    logFor(ctx, rec).info({ vmId: vm.id }, 'adopted an existing VM by name');
    return true;
  }

  async #refuseHibernate(rec: PodRecord, op: 'create' | 'update'): Promise<void> {
    await failOp(
      this.#ctx,
      rec,
      op,
      'HibernateUnsupported',
      'hibernate: hibernation is not supported by this vk-cocoon release (the hibernate tier is not built yet)',
    );
  }

  /** Detaches a superseded incarnation: its VM is indexed by name for adoption (§4 row 4). */
  #detach(rec: PodRecord): void {
    supersedeJobs(rec, 'superseded by a new incarnation');
    this.#probes.get(rec.key)?.stop();
    this.#probes.delete(rec.key);
    if (rec.vm && rec.spec?.managed) this.#orphansByName.set(rec.vm.name || rec.spec.vmName, rec.vm);
    if (this.#ctx.pods.get(rec.key) === rec) this.#ctx.pods.delete(rec.key);
  }

  // ---- UpdatePod ----------------------------------------------------------------------

  updatePod(pod: V1Pod): Promise<void> {
    return this.#ctx.queue.run(keyOf(pod), () => this.#update(pod));
  }

  async #update(pod: V1Pod): Promise<void> {
    const ctx = this.#ctx;
    const key = keyOf(pod);
    const rec = ctx.pods.get(key);
    if (!rec || rec.uid !== pod.metadata?.uid) {
      await this.#create(pod);
      return;
    }
    if (rec.deleting) throw new Error('delete operation still in flight');
    // Track the new copy, keeping provider-owned annotations (R6: a stale copy never wins).
    reassertIfStale(rec, pod.metadata?.annotations, pod.metadata?.resourceVersion);
    retrack(rec, pod);
    const decoded = decodeVMSpec(pod.metadata?.annotations, {
      namespace: pod.metadata?.namespace,
      ownerReferences: pod.metadata?.ownerReferences,
      containers: pod.spec?.containers,
    });
    if (decoded.ok) rec.spec = decoded.spec;
    if (!rec.vm) {
      // No VM (a failed or parked create): handle as CreatePod (§4 row 3).
      if (!rec.spec?.hibernate) await this.#create(pod);
      return;
    }
    if (!rec.spec?.managed) return;
    if (rec.spec.hibernate && rec.intent?.state !== 'failed') {
      supersedeJobs(rec, 'hibernate requested');
      await this.#refuseHibernate(rec, 'update');
      return;
    }
    // Generation echo (R5): re-stamp the current state with a newer generation.
    if (rec.intent) {
      const echo = echoGeneration(rec.intent, generationOf(pod));
      if (echo.changed) {
        rec.intent = { ...echo.record };
        applyAnnotations(rec, {
          [LIFECYCLE_OBSERVED_GENERATION]: echo.record.generation.toString(),
        });
      }
    }
    await flushIntent(ctx, rec);
    // An update only enqueues: it never cancels a job in flight (seed 000).
    this.#reconcileSoon(key);
  }

  // ---- DeletePod ----------------------------------------------------------------------

  deletePod(pod: V1Pod): Promise<void> {
    return this.#ctx.queue.run(keyOf(pod), () => this.#delete(pod));
  }

  async #delete(pod: V1Pod): Promise<void> {
    const ctx = this.#ctx;
    const key = keyOf(pod);
    const rec = ctx.pods.get(key);
    if (!rec) throw new NotFoundError(`pod ${key} is not known to the provider`);
    if (rec.uid !== pod.metadata?.uid) return; // superseded incarnation: success
    const log = logFor(ctx, rec);
    const spec = rec.spec;
    supersedeJobs(rec, 'pod is being deleted');
    this.#probes.get(key)?.stop();
    this.#probes.delete(key);
    if (!spec?.managed) {
      this.#forget(rec);
      ctx.metrics.podLifecycle('delete', 'skipped', 'unmanaged');
      return;
    }
    const keep =
      (pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE] ??
        rec.pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE]) === 'true';
    rec.deleting = true;
    try {
      if (rec.vm) {
        try {
          await ctx.cli.run(removeArgv(rec.vm.id), { timeoutMs: 60_000 });
        } catch (err) {
          if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
            throw new Error(`kept VM ${rec.vm.id}: ${err instanceof Error ? err.message : String(err)}`);
          }
        }
        // Lease release only after a confirmed removal (§5.3).
        await this.#releaseLeases(rec.vm);
      }
      if (!keep && spec.vmName) {
        for (const name of [spec.vmName, `fork-${spec.vmName}`]) {
          await ctx.cli.run(snapshotRemoveArgv(name), { timeoutMs: 10_000 }).catch(() => {});
        }
      }
    } catch (err) {
      rec.deleting = false;
      ctx.metrics.podLifecycle('delete', 'failed', 'remove');
      log.warn({ err: String(err) }, 'delete failed; the pod stays Terminating and is retried');
      throw err;
    }
    this.#forget(rec);
    rec.termination = { kind: 'deleted' };
    ctx.metrics.podLifecycle('delete', 'ok', rec.vm ? '' : 'no_vm');
    log.info({ vmId: rec.vm?.id }, 'VM removed');
  }

  async #releaseLeases(vm: VmRecord): Promise<void> {
    const macs = [
      ...new Set(
        vm.nics
          .filter((n) => !n.static)
          .map((n) => n.mac.toLowerCase())
          .filter(Boolean),
      ),
    ];
    for (const mac of macs) {
      const r = await releaseLease(this.#ctx.config.netControlSocket, mac);
      this.#ctx.metrics.leaseRelease(r.result);
      if (r.result === 'failed')
        this.#ctx.log.warn(
          { vm: vm.name, mac, err: r.detail },
          'lease release failed; expiry is the fallback',
        );
    }
  }

  #forget(rec: PodRecord): void {
    supersedeJobs(rec, 'forgotten');
    if (this.#ctx.pods.get(rec.key) === rec) this.#ctx.pods.delete(rec.key);
  }

  // ---- probes -------------------------------------------------------------------------

  #startProbe(rec: PodRecord): void {
    this.#probes.get(rec.key)?.stop();
    const agent = new ProbeAgent({
      target: () =>
        isCurrent(this.#ctx, rec) && rec.vm ? { ip: rec.ip, port: rec.spec?.probePort } : undefined,
      onTransition: (ready) => {
        void this.#ctx.queue
          .run(rec.key, async () => {
            if (!isCurrent(this.#ctx, rec)) return;
            rec.probeReady = ready;
            await refreshIp(this.#ctx, rec);
            publish(this.#ctx, rec);
            this.#reconcileSoon(rec.key);
          })
          .catch((err: unknown) =>
            this.#ctx.log.warn({ pod: rec.key, err: String(err) }, 'probe transition failed'),
          );
      },
      refreshIp: async () => {
        await refreshIp(this.#ctx, rec);
      },
      onDuration: (s) => this.#ctx.metrics.probeDuration(rec.pod.metadata?.namespace ?? '', s),
      log: logFor(this.#ctx, rec),
    });
    this.#probes.set(rec.key, agent);
    agent.start();
  }

  // ---- startup reconcile ----------------------------------------------------------------

  /** Runs once, to completion, before the node registers (pod-to-vm.md §6). Throws on
   * failure (startup aborts: refusing to register node). */
  async startupReconcile(pods: V1Pod[]): Promise<void> {
    const ctx = this.#ctx;
    const { stdout } = await ctx.cli.run(listArgv(), { timeoutMs: 60_000 });
    const listed = parseVmList(stdout);
    if (!listed.ok) throw new Error(`cocoon vm list: ${listed.error}`);
    const byId = new Map(listed.value.map((vm) => [vm.id, vm]));
    const byName = new Map(listed.value.map((vm) => [vm.name, vm]));
    const claimed = new Set<string>();
    for (const pod of pods) {
      if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') continue;
      const key = keyOf(pod);
      const decoded = decodeVMSpec(pod.metadata?.annotations, {
        namespace: pod.metadata?.namespace,
        ownerReferences: pod.metadata?.ownerReferences,
        containers: pod.spec?.containers,
      });
      if (!decoded.ok) continue; // CreatePod reports invalid annotations
      const spec = decoded.spec;
      const ann = pod.metadata?.annotations ?? {};
      const rec = newRecord(key, pod, spec);
      rec.intent = seedFromAnnotations(rec.uid, ann); // R7: seeded and marked flushed
      if (!spec.managed) {
        if (!ann[VM_ID] || !ann[VM_IP]) continue;
        ctx.pods.set(key, rec);
        await this.#adoptUnmanaged(rec, spec).catch(() => ctx.pods.delete(key));
        continue;
      }
      const id = ann[VM_ID] ?? '';
      let vm = id ? byId.get(id) : undefined;
      let adoptedByName = false;
      if (!vm && id) {
        ctx.log.warn({ pod: key, vmId: id }, 'pod names a VM that does not exist; leaving it to CreatePod');
        continue;
      }
      if (!vm && spec.vmName) {
        vm = byName.get(spec.vmName);
        adoptedByName = vm !== undefined;
      }
      if (!vm || vm.state === 'creating') continue;
      claimed.add(vm.id);
      ctx.pods.set(key, rec);
      rec.vm = vm;
      rec.clonedBoot = isClonedBootSpec(spec);
      rec.startTime = pod.status?.startTime ? new Date(pod.status.startTime) : new Date();
      bindForReadiness(rec);
      await refreshIp(ctx, rec);
      if (adoptedByName) {
        ctx.metrics.adoptByName();
        const changes = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
        applyAnnotations(rec, changes);
        await patchAnnotations(ctx, rec, changes);
      }
      ctx.log.info(
        { pod: key, vm: vm.name, vmId: vm.id, intent: rec.intent?.state, byName: adoptedByName },
        'adopted after restart',
      );
    }
    // Orphans (§6 step 6): VMs matched by no pod.
    for (const vm of listed.value) {
      if (claimed.has(vm.id) || vm.state === 'creating') continue;
      const policy = ctx.config.orphanPolicy;
      if (policy === 'destroy') {
        ctx.log.warn({ vm: vm.name, vmId: vm.id }, 'orphan VM: destroying (VK_ORPHAN_POLICY=destroy)');
        try {
          await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
          await this.#releaseLeases(vm);
        } catch (err) {
          ctx.log.warn({ vm: vm.name, err: String(err) }, 'orphan removal failed; indexing it for adoption');
          this.#orphansByName.set(vm.name, vm);
        }
      } else {
        if (policy === 'alert') {
          ctx.metrics.orphanVm();
          ctx.log.warn({ vm: vm.name, vmId: vm.id }, 'orphan VM kept (VK_ORPHAN_POLICY=alert)');
        }
        this.#orphansByName.set(vm.name, vm);
      }
    }
    ctx.startupDoneAt = Date.now();
    for (const rec of ctx.pods.values()) {
      if (rec.vm && rec.spec?.managed) this.#startProbe(rec);
      publish(ctx, rec);
      this.#reconcileSoon(rec.key);
    }
  }

  // ---- logs and exec ------------------------------------------------------------------

  #vmOf(namespace: string, pod: string): PodRecord & { vm: VmRecord } {
    const rec = this.#ctx.pods.get(`${namespace}/${pod}`);
    if (!rec?.vm) throw new NotFoundError(`pod ${namespace}/${pod} has no VM`);
    return rec as PodRecord & { vm: VmRecord };
  }

  async getContainerLogs(
    namespace: string,
    pod: string,
    _c: string,
    opts: LogOptions,
    signal: AbortSignal,
  ): Promise<Readable> {
    const rec = this.#ctx.pods.get(`${namespace}/${pod}`);
    const out = new PassThrough();
    if (!rec?.vm) {
      if (!rec) throw new NotFoundError(`pod ${namespace}/${pod} is not known to this node`);
      out.end(`vk-cocoon: pod ${namespace}/${pod} has no VM yet\n`);
      return out;
    }
    if (rec.spec?.os === 'windows') {
      out.end('vk-cocoon: Windows guests have no console log; connect with RDP to the pod IP.\n');
      return out;
    }
    const vmId = rec.vm.id;
    if (!opts.follow) {
      const child = this.#ctx.cli.spawn(logsArgv(vmId, opts.tailLines ?? 200), { signal });
      child.stdout?.pipe(out);
      child.stderr?.resume();
      return out;
    }
    // `cocoon vm logs` has no follow mode: poll the tail every 2 s and emit what is new,
    // until the client disconnects (the signal aborts) — virtual-node.md §7.1.
    void (async () => {
      let last: string[] = [];
      let first = true;
      while (!signal.aborted && !out.destroyed) {
        try {
          const { stdout } = await this.#ctx.cli.run(logsArgv(vmId, first ? (opts.tailLines ?? 200) : 1000), {
            timeoutMs: 30_000,
            signal,
          });
          const lines = stdout.split('\n').filter((l, i, a) => l !== '' || i < a.length - 1);
          const fresh = first ? lines : newLogLines(last, lines);
          if (fresh.length > 0) out.write(`${fresh.join('\n')}\n`);
          last = lines;
          first = false;
        } catch {
          if (signal.aborted) break;
        }
        await new Promise((r) => setTimeout(r, 2000));
      }
      out.end();
    })();
    return out;
  }

  async runInContainer(
    namespace: string,
    pod: string,
    _c: string,
    cmd: string[],
    streams: ExecStreams,
  ): Promise<ExecOutcome> {
    const rec = this.#vmOf(namespace, pod);
    const child = this.#ctx.cli.spawn(
      execArgv({ vmId: rec.vm.id, stdin: streams.stdin !== null, command: cmd }),
      {
        signal: streams.signal,
        stdin: streams.stdin !== null,
      },
    );
    if (streams.stdin && child.stdin) {
      child.stdin.on('error', () => {});
      streams.stdin.pipe(child.stdin);
    }
    if (streams.stdout) child.stdout?.pipe(streams.stdout, { end: false });
    else child.stdout?.resume();
    if (streams.stderr) child.stderr?.pipe(streams.stderr, { end: false });
    else child.stderr?.resume();
    const code = await new Promise<number | null>((resolve) => {
      child.once('error', () => resolve(null));
      child.once('close', (c) => resolve(c));
    });
    killGroup(child);
    if (code === 0) return { kind: 'success' };
    if (code === null)
      return {
        kind: 'error',
        message: `cocoon vm exec for ${rec.vm.name} did not start or was killed`,
      };
    return { kind: 'exit', code };
  }
}
