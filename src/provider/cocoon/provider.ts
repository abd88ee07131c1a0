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
import {
  EVENT_MESSAGE_MAX_BYTES,
  KEEP_SNAPSHOT_ON_DELETE,
  LIFECYCLE_OBSERVED_GENERATION,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
  VM_IP,
} from '../../contract/annotations.ts';
import { guestProfile } from '../../guest/profiles.ts';
import type { ExecOutcome, ExecStreams } from '../../kubelet/streams/exec-session.ts';
import { echoGeneration, seedFromAnnotations } from '../../lifecycle/intent.ts';
import { releaseLease } from '../../net/release.ts';
import { KeyedQueue } from '../../util/keyed-queue.ts';
import { monoNow } from '../../util/mono-clock.ts';
import { truncateUtf8 } from '../../util/text.ts';
import { decodeVMSpec, isClonedBootSpec, type VMSpec } from '../../vmspec/decode.ts';
import { type LogOptions, NotFoundError, type Provider } from '../types.ts';
import {
  type BringUpResult,
  cloneBringUp,
  inspectVm,
  inspectWithRetry,
  isTransientCreateError,
  runBringUp,
  SettleError,
  type SnapshotPuller,
} from './bringup.ts';
import { byAge, holderOfName, holderOfVm, isManagedRaw, isVmId, referencedVms } from './claims.ts';
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
  refreshIp,
  stageLifecycle,
  warnOnce,
} from './context.ts';
import { ProbeAgent } from './probe-agent.ts';
import { bindForReadiness, reconcile, supersedeJobs } from './readiness.ts';
import {
  annotationsOf,
  applyAnnotations,
  createInputsKey,
  newRecord,
  type PodRecord,
  retrack,
} from './record.ts';

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

/** Transient create failures are retried 10 s, 20 s, … up to every 5 min (like the kubelet's
 * back-off), until the ready deadline turns them into `failed`. */
const CREATE_RETRY_BASE_MS = 10_000;
const CREATE_RETRY_MAX_MS = 5 * 60_000;

function nameHeldMessage(vmName: string, holder: PodRecord): string {
  const vm = holder.vm ? ` (VM ${holder.vm.id})` : '';
  return `VM name ${vmName} is already used by pod ${holder.key}${vm}; two pods never share a VM: give this pod a distinct vm.cocoonstack.io/name`;
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
      startupDoneAt: monoNow(),
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

  #stopped = false;

  stopLoops(): void {
    this.#stopped = true;
    clearInterval(this.#tick);
    clearTimeout(this.#leaseDebounce);
    this.#leaseWatch?.close();
    for (const p of this.#probes.values()) p.stop();
    for (const t of this.#retryTimers.values()) clearTimeout(t);
    this.#retryTimers.clear();
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
    // After shutdown nothing is re-derived: a job ended by the lifetime signal would
    // otherwise start the same job again at once, forever (the next process re-derives).
    if (this.#ctx.lifetime.aborted || this.#stopped) return;
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

  /** Claims the pod (validation, `creating`) and returns; the bring-up runs afterwards in
   * the pod's own queue, so a slow pull never holds one of the pod controller's workers. */
  async createPod(pod: V1Pod): Promise<void> {
    const rec = await this.#ctx.queue.run(keyOf(pod), () => this.#claim(pod));
    if (rec) this.#startBringUp(rec);
  }

  #decode(pod: V1Pod) {
    return decodeVMSpec(pod.metadata?.annotations, {
      namespace: pod.metadata?.namespace,
      ownerReferences: pod.metadata?.ownerReferences,
      containers: pod.spec?.containers,
    });
  }

  /** Validation and the claim of a create attempt (inside the pod's queue). Returns the
   * record when a bring-up is owed; failures are recorded on the record (never thrown,
   * except a missing VM name, which stays a CreatePod error). */
  async #claim(pod: V1Pod): Promise<PodRecord | undefined> {
    const ctx = this.#ctx;
    const key = keyOf(pod);
    const uid = pod.metadata?.uid ?? '';
    const existing = ctx.pods.get(key);
    if (existing?.deleting) throw new Error('delete operation still in flight');
    if (existing && existing.uid === uid && (existing.vm || existing.bringingUp)) {
      // Idempotent: a repeated CreatePod only refreshes status (pod-to-vm.md §2.1).
      publish(ctx, existing);
      return undefined;
    }
    if (existing && existing.uid !== uid) this.#detach(existing);

    const decoded = this.#decode(pod);
    if (!decoded.ok && decoded.errors.some((e) => e.code === 'missing_vmname')) {
      ctx.metrics.podLifecycle('create', 'skipped', 'missing_vmname');
      throw new Error(decoded.errors.map((e) => e.message).join('; '));
    }
    const fresh = existing?.uid !== uid;
    const rec = fresh ? newRecord(key, pod, undefined) : existing;
    rec.spec = decoded.ok ? decoded.spec : undefined;
    this.#cancelRetry(key);
    ctx.pods.set(key, rec);
    const log = logFor(ctx, rec);
    if (fresh) {
      // R7: a pod this process has not tracked yet (after a restart) keeps its published
      // state. A `failed` at its current generation stays parked: failed is sticky across
      // restarts, and only a generation bump (or an input change seen live) re-runs it.
      rec.intent = seedFromAnnotations(uid, pod.metadata?.annotations);
      if (rec.intent?.state === 'failed' && generationOf(pod) <= rec.intent.generation) {
        rec.createFailure = {
          inputsKey: createInputsKey(pod),
          generation: rec.intent.generation,
          transient: false,
          attempts: 1,
          firstAt: monoNow(),
          retryAt: undefined,
          message: rec.intent.message,
        };
        log.info({ message: rec.intent.message }, 'pod was published failed at its generation; parked');
        publish(ctx, rec);
        return undefined;
      }
    }

    if (!decoded.ok) {
      // Bad input: a Warning naming the key, lifecycle failed, never a VM, never a crash.
      const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}`;
      await this.#createFailed(rec, 'CreateBringUpFailed', message, false);
      return undefined;
    }
    const spec = decoded.spec;
    for (const w of decoded.warnings) log.warn({ key: w.key }, w.message);

    // Claim the incarnation (R1). A re-run after a failure is a new attempt (R4): it only
    // happens when the pod's create inputs changed or its generation went up.
    if (stageLifecycle(ctx, rec, 'creating')) await flushIntent(ctx, rec);

    if (!spec.managed) {
      await this.#adoptUnmanaged(rec, spec);
      return undefined;
    }
    if (spec.hibernate) {
      await this.#refuseHibernate(rec, 'create');
      return undefined;
    }
    const guest = guestProfile(spec.os);
    if (!guest.supported.ok) {
      await this.#createFailed(rec, 'CreateBringUpFailed', guest.supported.message, false);
      return undefined;
    }
    const holder = holderOfName(ctx.pods, key, spec.vmName);
    if (holder) {
      await this.#createFailed(rec, 'CreateBringUpFailed', nameHeldMessage(spec.vmName, holder), false);
      return undefined;
    }
    if (await this.#adoptByName(rec, spec)) return undefined;
    rec.bringingUp = true;
    return rec;
  }

  #startBringUp(rec: PodRecord): void {
    rec.bringingUp = true;
    void this.#ctx.queue
      .run(rec.key, () => this.#bringUp(rec))
      .catch((err: unknown) => logFor(this.#ctx, rec).warn({ err: String(err) }, 'bring-up failed'));
  }

  /** The bring-up (clone or run) of a claimed record, in the pod's queue. */
  async #bringUp(rec: PodRecord): Promise<void> {
    const ctx = this.#ctx;
    try {
      if (!isCurrent(ctx, rec) || rec.vm || !rec.spec?.managed) return;
      const spec = rec.spec;
      const log = logFor(ctx, rec);
      const started = performance.now();
      rec.step = { name: 'BringingUp', since: monoNow() };
      let result: BringUpResult;
      try {
        result =
          spec.mode === 'run'
            ? await runBringUp(ctx, spec, log)
            : await cloneBringUp(ctx, spec, this.#puller, log);
      } catch (err) {
        // The VM may exist all the same: a clone that printed its record and then failed to
        // settle, or one that finished after a restart and now holds the name.
        if (await this.#salvageByName(rec, spec, err)) return;
        const message = err instanceof Error ? err.message : String(err);
        await this.#createFailed(rec, 'CreateBringUpFailed', message, isTransientCreateError(err));
        return;
      }
      ctx.metrics.bootDuration(
        rec.pod.metadata?.namespace ?? '',
        spec.mode === 'run' ? 'run' : 'clone',
        spec.backend,
        (performance.now() - started) / 1000,
      );
      rec.clonedBoot = result.clonedBoot;
      rec.sourceImage = result.sourceImage;
      await this.#bind(rec, result.vm);
      ctx.metrics.podLifecycle('create', 'ok', '');
      log.info({ vmId: result.vm.id, ms: Math.round(performance.now() - started) }, 'VM up');
    } finally {
      rec.bringingUp = false;
    }
  }

  /** After a failed bring-up: the VM with the pod's name, if one exists, is running and no
   * other pod holds it, is adopted (the clone did happen). */
  async #salvageByName(rec: PodRecord, spec: VMSpec, err: unknown): Promise<boolean> {
    const ctx = this.#ctx;
    const nameTaken = err instanceof CocoonCommandError && err.errorClass === 'vm_name_taken';
    if (!nameTaken && !(err instanceof SettleError)) return false;
    let vm: VmRecord | undefined;
    try {
      vm = await inspectWithRetry(ctx, spec.vmName);
    } catch {
      return false;
    }
    if (!vm || vm.name !== spec.vmName || vm.state === 'creating' || vm.state === 'error') return false;
    const holder = holderOfVm(ctx.pods, rec.key, vm);
    if (holder) return false;
    rec.clonedBoot = isClonedBootSpec(spec);
    await this.#bind(rec, vm);
    ctx.metrics.podLifecycle('create', 'ok', 'adopted');
    logFor(ctx, rec).info(
      { vmId: vm.id, err: err instanceof Error ? err.message : String(err) },
      "the bring-up failed but the VM exists under the pod's name: adopted it",
    );
    return true;
  }

  /** Records a failed create (docs/decisions.md, "Create failures"). Permanent failures are
   * published `failed` and wait for a change of the pod's create inputs or a generation
   * bump; transient ones stay `creating` and are retried on a backoff schedule, until the
   * ready deadline turns them into `failed` too. Our own writes never re-run either. */
  async #createFailed(rec: PodRecord, reason: string, message: string, transient: boolean): Promise<void> {
    const ctx = this.#ctx;
    const now = monoNow();
    const inputsKey = createInputsKey(rec.pod);
    const generation = rec.intent?.generation ?? generationOf(rec.pod);
    const prev = rec.createFailure;
    const streak = prev !== undefined && prev.inputsKey === inputsKey && prev.generation === generation;
    const attempts = streak ? prev.attempts + 1 : 1;
    const firstAt = streak ? prev.firstAt : now;
    const giveUp = transient && now - firstAt >= ctx.config.readyDeadlineSeconds * 1000;
    if (transient && !giveUp && rec.intent?.state !== 'failed') {
      const delay = Math.min(CREATE_RETRY_MAX_MS, CREATE_RETRY_BASE_MS * 2 ** Math.min(attempts - 1, 20));
      rec.createFailure = {
        inputsKey,
        generation,
        transient,
        attempts,
        firstAt,
        retryAt: now + delay,
        message,
      };
      rec.step = { name: 'CreateBackoff', since: now };
      ctx.metrics.podLifecycle('create', 'failed', 'transient');
      // One event per (pod, reason, message): repeats are aggregated into its count.
      ctx.events.event(
        rec.pod,
        'Warning',
        reason,
        truncateUtf8(`create: ${message}; retrying`, EVENT_MESSAGE_MAX_BYTES),
      );
      logFor(ctx, rec).warn(
        { reason, err: message, attempts, retryInMs: delay },
        'create failed; retrying with backoff',
      );
      publish(ctx, rec);
      this.#scheduleRetry(rec, delay);
      return;
    }
    rec.createFailure = {
      inputsKey,
      generation,
      transient: false,
      attempts,
      firstAt,
      retryAt: undefined,
      message,
    };
    await failOp(
      ctx,
      rec,
      'create',
      reason,
      giveUp ? `${message} (gave up after ${attempts} attempts)` : message,
    );
  }

  readonly #retryTimers = new Map<string, NodeJS.Timeout>();

  #scheduleRetry(rec: PodRecord, delayMs: number): void {
    this.#cancelRetry(rec.key);
    const t = setTimeout(() => {
      this.#retryTimers.delete(rec.key);
      void this.#ctx.queue
        .run(rec.key, () => {
          const f = rec.createFailure;
          if (!isCurrent(this.#ctx, rec) || rec.vm || rec.bringingUp || !f?.transient) return false;
          rec.bringingUp = true;
          return true;
        })
        .then((go) => {
          if (go) this.#startBringUp(rec);
        });
    }, delayMs);
    t.unref();
    this.#retryTimers.set(rec.key, t);
  }

  #cancelRetry(key: string): void {
    clearTimeout(this.#retryTimers.get(key));
    this.#retryTimers.delete(key);
  }

  /** Binds a VM to the record: id/ip annotations (UID-fenced), probe, status, reconcile. */
  async #bind(rec: PodRecord, vm: VmRecord): Promise<void> {
    const ctx = this.#ctx;
    if (!isCurrent(ctx, rec)) return;
    const previousId = annotationsOf(rec)[VM_ID] ?? '';
    rec.vm = vm;
    rec.ownsVm = true;
    rec.createFailure = undefined;
    rec.startTime ??= new Date();
    bindForReadiness(rec);
    await refreshIp(ctx, rec);
    const changes: Record<string, string | null> = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
    if (previousId !== vm.id) {
      // The post-clone marker belongs to the VM it was written for: a replacement VM gets
      // its own fixup, never the previous VM's `done` or `failed`.
      changes[POST_CLONE_STATE] = null;
      changes[POST_CLONE_HINT] = null;
      changes[POST_CLONE_ERRORS] = null;
      rec.postCloneFailureReason = undefined;
    }
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

  /** An unmanaged pod names its VM in `vm.cocoonstack.io/id`, written by its operator. That
   * is pod-authored input: only a full VM ID of a VM on this host that no other pod holds
   * is accepted (docs/decisions.md, "VM ownership"); the VM is never touched. */
  async #adoptUnmanaged(rec: PodRecord, spec: VMSpec): Promise<void> {
    const ctx = this.#ctx;
    const ann = rec.pod.metadata?.annotations ?? {};
    const id = ann[VM_ID] ?? '';
    const ip = ann[VM_IP] ?? '';
    const fail = (message: string, transient = false) =>
      this.#createFailed(
        rec,
        'CreateBringUpFailed',
        `unmanaged vm ${spec.vmName || rec.key}: ${message}`,
        transient,
      );
    if (!id || !ip)
      return await fail('missing pre-assigned IP/VMID (vm.cocoonstack.io/id and vm.cocoonstack.io/ip)');
    if (!isVmId(id)) {
      return await fail(
        `vm.cocoonstack.io/id must be a full 26-character cocoon VM ID, got ${JSON.stringify(truncateUtf8(id, 64))}`,
      );
    }
    let found: VmRecord | undefined;
    try {
      found = await inspectVm(ctx, id);
    } catch (err) {
      return await fail(`cannot inspect VM ${id}: ${err instanceof Error ? err.message : String(err)}`, true);
    }
    if (!found || found.id !== id) return await fail(`no VM with id ${id} exists on this node`);
    const holder = holderOfVm(ctx.pods, rec.key, { id });
    if (holder) return await fail(`VM ${id} is already bound to pod ${holder.key}`);
    rec.vm = {
      ...found,
      nics: [{ mac: '', tap: '', netnsPath: '', static: { ip, gateway: '', prefix: 32 } }],
    } as VmRecord;
    rec.ownsVm = false;
    rec.createFailure = undefined;
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
      await this.#createFailed(
        rec,
        'CreateAdoptInspectFailed',
        `inspect ${spec.vmName}: ${String(err)}`,
        true,
      );
      return true;
    }
    this.#orphansByName.delete(spec.vmName);
    if (!vm || vm.name !== spec.vmName) return false;
    if (holderOfVm(ctx.pods, rec.key, vm)) return false;
    rec.clonedBoot = isClonedBootSpec(spec);
    await this.#bind(rec, vm);
    ctx.metrics.podLifecycle('create', 'ok', 'adopted');
    logFor(ctx, rec).info({ vmId: vm.id }, 'adopted an existing VM by name');
    return true;
  }

  async #refuseHibernate(rec: PodRecord, op: 'create' | 'update'): Promise<void> {
    const message =
      'hibernate: hibernation is not supported by this vk-cocoon release (the hibernate tier is not built yet)';
    if (op === 'create') {
      await this.#createFailed(rec, 'HibernateUnsupported', message, false);
      return;
    }
    await failOp(this.#ctx, rec, op, 'HibernateUnsupported', message);
  }

  /** Detaches a superseded incarnation: its VM is indexed by name for adoption (§4 row 4). */
  #detach(rec: PodRecord): void {
    supersedeJobs(rec, 'superseded by a new incarnation');
    this.#cancelRetry(rec.key);
    this.#probes.get(rec.key)?.stop();
    this.#probes.delete(rec.key);
    if (rec.vm && rec.ownsVm) this.#orphansByName.set(rec.vm.name, rec.vm);
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
      const claimed = await this.#claim(pod);
      if (claimed) this.#startBringUp(claimed);
      return;
    }
    if (rec.deleting) throw new Error('delete operation still in flight');
    // Track the new copy, keeping provider-owned annotations (R6: a stale copy never wins).
    reassertIfStale(rec, pod.metadata?.annotations, pod.metadata?.resourceVersion);
    retrack(rec, pod);
    const decoded = this.#decode(pod);
    if (!rec.vm) {
      if (rec.bringingUp) {
        await flushIntent(ctx, rec);
        return;
      }
      // No VM (a failed or parked create, §4 row 3): a new attempt only when the pod's
      // create inputs changed or its generation went up; never for our own writes, status
      // or label updates (docs/decisions.md, "Create failures").
      const f = rec.createFailure;
      if (!f || f.inputsKey !== createInputsKey(pod) || generationOf(pod) > f.generation) {
        const claimed = await this.#claim(pod);
        if (claimed) this.#startBringUp(claimed);
      } else {
        await flushIntent(ctx, rec);
      }
      return;
    }
    if (!decoded.ok) {
      // The VM stays and keeps its state; the edit is reported, never silently dropped.
      const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}; the VM is kept and the change is not applied`;
      ctx.events.event(
        rec.pod,
        'Warning',
        'UpdateInvalidAnnotations',
        truncateUtf8(`update: ${message}`, EVENT_MESSAGE_MAX_BYTES),
      );
      logFor(ctx, rec).warn({ err: message }, 'annotations no longer decode');
    } else if (!rec.ownsVm && !decoded.spec.managed) {
      // An unmanaged pod's operator re-pointed it: the new id is validated like the first.
      const ann = pod.metadata?.annotations ?? {};
      rec.spec = decoded.spec;
      if ((ann[VM_ID] ?? '') !== rec.vm.id || (ann[VM_IP] ?? '') !== rec.ip) {
        rec.vm = undefined;
        await this.#adoptUnmanaged(rec, decoded.spec);
      }
      return;
    } else if (rec.ownsVm && !decoded.spec.managed) {
      // `managed` turned off on a live pod: we created the VM, so we keep managing it and
      // remove it with the pod (docs/decisions.md), instead of leaking it.
      warnOnce(
        ctx,
        rec,
        'ManagedFlagRemoved',
        `update: cocoonset.cocoonstack.io/managed was turned off on a running pod; vk-cocoon keeps managing VM ${rec.vm.name} and removes it when the pod is deleted`,
      );
    } else {
      rec.spec = decoded.spec;
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
    supersedeJobs(rec, 'pod is being deleted');
    this.#cancelRetry(key);
    this.#probes.get(key)?.stop();
    this.#probes.delete(key);
    const vm = rec.vm;
    if (!rec.ownsVm || !vm) {
      // Unmanaged (its VM belongs to its operator) or never bound a VM of its own: nothing
      // to remove — in particular never a VM or snapshot named after another pod's VM.
      this.#forget(rec);
      ctx.metrics.podLifecycle('delete', 'skipped', rec.spec?.managed === false ? 'unmanaged' : 'no_vm');
      return;
    }
    const keep =
      (pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE] ??
        rec.pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE]) === 'true';
    rec.deleting = true;
    try {
      try {
        await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
      } catch (err) {
        if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
          throw new Error(`kept VM ${vm.id}: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
      // Lease release only after a confirmed removal (§5.3).
      await this.#releaseLeases(vm);
      // Local snapshots named after the VM this pod held (never after a name it merely asked for).
      if (!keep && vm.name) {
        for (const name of [vm.name, `fork-${vm.name}`]) {
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
    ctx.metrics.podLifecycle('delete', 'ok', '');
    log.info({ vmId: vm.id }, 'VM removed');
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
   * failure (startup aborts: refusing to register node). A VM, by ID or by name, goes to at
   * most one pod (the oldest claimant); no VM any pod references is ever removed as an
   * orphan (docs/decisions.md, "VM ownership"). */
  async startupReconcile(pods: V1Pod[]): Promise<void> {
    const ctx = this.#ctx;
    const { stdout } = await ctx.cli.run(listArgv(), { timeoutMs: 60_000 });
    const listed = parseVmList(stdout);
    if (!listed.ok) throw new Error(`cocoon vm list: ${listed.error}`);
    const byId = new Map(listed.value.map((vm) => [vm.id, vm]));
    const byName = new Map(listed.value.map((vm) => [vm.name, vm]));
    const live = pods
      .filter((p) => p.status?.phase !== 'Succeeded' && p.status?.phase !== 'Failed')
      .sort(byAge);
    const claimed = new Set<string>();

    // Pass 1: pods that name an existing VM by its ID keep it (oldest first).
    for (const pod of live) {
      const ann = pod.metadata?.annotations ?? {};
      const vm = ann[VM_ID] ? byId.get(ann[VM_ID]) : undefined;
      if (!vm || claimed.has(vm.id)) continue;
      const key = keyOf(pod);
      const decoded = this.#decode(pod);
      if (!isManagedRaw(pod)) {
        if (!decoded.ok) continue; // CreatePod reports the invalid annotations
        const rec = newRecord(key, pod, decoded.spec);
        rec.intent = seedFromAnnotations(rec.uid, ann);
        ctx.pods.set(key, rec);
        await this.#adoptUnmanaged(rec, decoded.spec);
        if (rec.vm) claimed.add(vm.id);
        continue;
      }
      if (vm.state === 'creating') continue;
      claimed.add(vm.id);
      const rec = newRecord(key, pod, decoded.ok ? decoded.spec : undefined);
      rec.intent = seedFromAnnotations(rec.uid, ann); // R7: seeded and marked flushed
      this.#adopt(rec, vm);
      if (!decoded.ok) {
        // Its annotations stopped decoding: the VM is kept (never destroyed because of an
        // annotation edit) and the problem is reported.
        const message = `invalid VM annotations: ${decoded.errors.map((e) => e.message).join('; ')}; the VM ${vm.name} is kept`;
        ctx.events.event(
          pod,
          'Warning',
          'UpdateInvalidAnnotations',
          truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES),
        );
        ctx.log.warn(
          { pod: key, vm: vm.name, vmId: vm.id, err: message },
          'adopted a VM of a pod whose annotations do not decode',
        );
      }
      await refreshIp(ctx, rec);
      ctx.log.info(
        { pod: key, vm: vm.name, vmId: vm.id, intent: rec.intent?.state },
        'adopted after restart',
      );
    }

    // Pass 2: managed pods without a live VM ID adopt the VM of their name, unless another
    // pod holds that VM or that name.
    for (const pod of live) {
      const key = keyOf(pod);
      if (ctx.pods.has(key) || !isManagedRaw(pod)) continue;
      const decoded = this.#decode(pod);
      if (!decoded.ok) continue;
      const spec = decoded.spec;
      const ann = pod.metadata?.annotations ?? {};
      if (ann[VM_ID] && !byId.has(ann[VM_ID])) {
        ctx.log.warn(
          { pod: key, vmId: ann[VM_ID] },
          'pod names a VM that does not exist; leaving it to CreatePod',
        );
        continue;
      }
      const vm = byName.get(spec.vmName);
      if (!vm || vm.state === 'creating' || claimed.has(vm.id) || holderOfName(ctx.pods, key, spec.vmName))
        continue;
      claimed.add(vm.id);
      const rec = newRecord(key, pod, spec);
      rec.intent = seedFromAnnotations(rec.uid, ann);
      this.#adopt(rec, vm);
      await refreshIp(ctx, rec);
      ctx.metrics.adoptByName();
      const changes: Record<string, string | null> = { [VM_ID]: vm.id, [VM_IP]: rec.ip || null };
      if ((ann[VM_ID] ?? '') !== vm.id) {
        // A marker written without this VM's ID on the pod cannot be attributed to it.
        changes[POST_CLONE_STATE] = null;
        changes[POST_CLONE_HINT] = null;
        changes[POST_CLONE_ERRORS] = null;
      }
      applyAnnotations(rec, changes);
      await patchAnnotations(ctx, rec, changes);
      ctx.log.info(
        { pod: key, vm: vm.name, vmId: vm.id, intent: rec.intent?.state },
        'adopted by VM name after restart',
      );
    }

    // Orphans (§6 step 6): VMs no pod holds and no pod references by ID or name.
    const refs = referencedVms(live);
    for (const vm of listed.value) {
      if (claimed.has(vm.id) || vm.state === 'creating') continue;
      if (refs.ids.has(vm.id) || refs.names.has(vm.name)) {
        ctx.log.info({ vm: vm.name, vmId: vm.id }, 'VM referenced by a pod that does not hold it; kept');
        this.#orphansByName.set(vm.name, vm);
        continue;
      }
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
    ctx.startupDoneAt = monoNow();
    for (const rec of [...ctx.pods.values()]) {
      if (rec.vm && rec.ownsVm) this.#startProbe(rec);
      // A hibernate request that arrived while the daemon was down is handled like a live one.
      if (rec.ownsVm && rec.spec?.hibernate && rec.intent?.state !== 'failed') {
        await this.#refuseHibernate(rec, 'update');
      }
      publish(ctx, rec);
      this.#reconcileSoon(rec.key);
    }
  }

  /** Tracks an adopted VM of a managed pod (startup). */
  #adopt(rec: PodRecord, vm: VmRecord): void {
    this.#ctx.pods.set(rec.key, rec);
    rec.vm = vm;
    rec.ownsVm = true;
    rec.clonedBoot = rec.spec ? isClonedBootSpec(rec.spec) : false;
    rec.startTime = rec.pod.status?.startTime ? new Date(rec.pod.status.startTime) : new Date();
    bindForReadiness(rec);
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
    const logs = guestProfile(rec.spec?.os ?? 'linux').consoleLogs;
    if (logs.kind === 'none') {
      out.end(`${logs.line}\n`);
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
