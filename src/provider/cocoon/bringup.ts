// Bring-up of a VM for a pod (docs/contracts/pod-to-vm.md "Bring-up: clone" clone, docs/contracts/pod-to-vm.md "Bring-up: run" run). I/O only; every
// decision (names, flags, CPU policy, restore mode) comes from the pure modules, and the
// argv matches the cocoon CLI contract exactly.
import { ArgvError, cloneArgv, imagePullArgv, inspectArgv, removeArgv, runArgv } from '../../cocoon/argv.ts';
import { parseVmRecord, type SnapshotRecord, type VmRecord } from '../../cocoon/records.ts';
import { CocoonCommandError, POD_OP_QUEUE } from '../../cocoon/runner.ts';
import { inspectSnapshot } from '../../cocoon/snapshots.ts';
import { STORAGE } from '../../contract/annotations.ts';
import { guestProfile } from '../../guest/profiles.ts';
import { restoreModeFor } from '../../guest/restore-mode.ts';
import { recordFootprint } from '../../lifecycle/admission.ts';
import type { Logger } from '../../log.ts';
import { SnapshotPullError } from '../../registry/pull.ts';
import { pause, untilAborted } from '../../util/deadline.ts';
import { currentOpSignal } from '../../util/op-signal.ts';
import { Singleflight } from '../../util/singleflight.ts';
import { cpuPolicy } from '../../vmspec/cpu-policy.ts';
import { runMemoryBytes, type VMSpec } from '../../vmspec/decode.ts';
import { localSnapshotName, splitCloneImage } from '../../vmspec/snapshot-name.ts';
import { AuthorityError, checkLocalSource, checkRegistrySource, enforce } from './authority.ts';
import type { ProviderContext, SnapshotPuller } from './context.ts';
import type { PodRecord } from './state.ts';

export interface BringUpResult {
  vm: VmRecord;
  clonedBoot: boolean;
  sourceImage: string;
}

const CLONE_TIMEOUT_MS = 10 * 60_000;
const PULL_TIMEOUT_MS = 30 * 60_000;
const SHORT_TIMEOUT_MS = 60_000;

const imagePulls = new Singleflight<void>();

/** A bring-up refused on the pod's input or the node's content (missing snapshot with no
 * registry, backend mismatch): permanent until the pod changes. */
export class BringUpError extends Error {
  override name = 'BringUpError';
}

/** The create command succeeded but its VM did not settle (unreadable record, failed
 * follow-up inspect): the VM may exist under the pod's name and is looked up by name. */
export class SettleError extends Error {
  override name = 'SettleError';
}

/** Transient create failures (timeouts, crashes, lock contention, a registry that did not
 * answer) are retried on a backoff schedule; a conclusive answer (not found, name taken,
 * input refused, manifest absent) is permanent (docs/decisions.md, "Create failures"). */
export function isTransientCreateError(err: unknown): boolean {
  if (err instanceof BringUpError || err instanceof ArgvError || err instanceof AuthorityError) return false;
  if (err instanceof CocoonCommandError)
    return err.errorClass === 'inconclusive' || err.errorClass === 'agent_not_up';
  // A source this reader cannot decode (a v2 artifact, a malformed config) reads the same on
  // every retry: permanent, with its reason, until the pod's inputs change.
  if (err instanceof SnapshotPullError) return !err.absent && !err.undecodable;
  return true;
}

/** Clone of the pod's image: the local snapshot, else pulled from the registry. Either way
 * the source must not belong to another namespace (docs/security.md, rules local source and
 * registry source): the ledger decides for a local copy, the manifest's stamp (read before
 * anything is pulled) for the registry, and a pulled copy is ledgered under that stamp. */
export async function cloneBringUp(
  ctx: Pick<ProviderContext, 'cli' | 'config' | 'ledger' | 'sourceSizes' | 'store'>,
  rec: PodRecord,
  spec: VMSpec,
  puller: SnapshotPuller | undefined,
  log: Logger,
): Promise<BringUpResult> {
  const { repo, tag } = splitCloneImage(spec.image);
  const local = localSnapshotName(spec.image);
  let snap = await inspectSnapshot(ctx.cli, local, undefined, POD_OP_QUEUE);
  if (!snap) {
    if (!puller) throw new BringUpError(`snapshot ${local} not found locally and no registry configured`);
    enforce(checkLocalSource(ctx, rec, local)); // a reserved name is never pulled for a pod
    let stamp = '';
    if (ctx.store) {
      const id = await ctx.store.identity(repo, tag, AbortSignal.timeout(SHORT_TIMEOUT_MS));
      if (id !== 'absent') {
        enforce(checkRegistrySource(rec, `${repo}:${tag}`, id));
        stamp = id.namespace ?? '';
      }
    }
    log.info({ snapshot: local, repo, tag }, 'clone source missing locally; pulling it from the registry');
    // A delete aborts the wait (the pull itself goes on for whoever else needs it).
    const signal = currentOpSignal();
    await untilAborted(Promise.resolve(puller.ensure(spec.image, { log, signal })), signal);
    snap = await inspectSnapshot(ctx.cli, local, undefined, POD_OP_QUEUE);
    if (!snap) throw new BringUpError(`snapshot ${local} still missing after the registry pull`);
    await ctx.ledger.recordPulled(local, snap.id, stamp);
  }
  enforce(checkLocalSource(ctx, rec, local));
  // Admission counts the next clones of this source at its saved size (admit.ts).
  const size = recordFootprint(snap.cpus, snap.memoryBytes);
  if (size) ctx.sourceSizes.set(local, size);
  const vm = await cloneFromSource(ctx, spec, { snapshot: snap });
  return { vm, clonedBoot: true, sourceImage: snap.image };
}

/** `vm clone` of a local snapshot or a directory with the pod's CPU policy and restore mode
 * (clone, fork, restore and clone-from-dir alike). `nics` is `--nics` (a CH+Windows restore
 * hot-adds one). */
export async function cloneFromSource(
  ctx: Pick<ProviderContext, 'cli' | 'config'>,
  spec: VMSpec,
  source: { snapshot: SnapshotRecord } | { fromDir: string; hypervisor?: string },
  opts: { nics?: number } = {},
): Promise<VmRecord> {
  let backend = spec.backend;
  // A directory's hypervisor is known when the daemon staged it (a peer restore: the registry
  // config's); a pod's clone-from-dir is cocoon's to check.
  const taken = 'snapshot' in source ? source.snapshot.hypervisor : (source.hypervisor ?? '');
  if (taken !== '' && taken !== spec.backend) {
    const what =
      'snapshot' in source ? `snapshot ${source.snapshot.name}` : `the state staged in ${source.fromDir}`;
    throw new BringUpError(`${what} was taken with ${taken} but CocoonSet requests ${spec.backend}`);
  }
  if (taken === 'firecracker') backend = 'firecracker';
  // No `image inspect` first: `--pull` (sent whenever the snapshot records a base image)
  // makes the clone itself fetch a base image missing from the node, and a base image that
  // cannot be had fails this call with cocoon's own message (docs/decisions.md, "Writes per
  // bring-up"). Two cocoon calls per clone: `snapshot inspect` and `vm clone`.
  const cpu = cpuPolicy(spec.cpuRequestMilli, spec.cpuLimitMilli);
  const argv = cloneArgv({
    vmName: spec.vmName,
    backend,
    network: spec.network || undefined,
    noDirectIO: spec.noDirectIO,
    pull: 'snapshot' in source ? source.snapshot.image !== '' : true,
    restoreMode: restoreModeFor(backend, spec.os, ctx.config.restoreMode),
    nics: opts.nics,
    cpuWeight: cpu.weight,
    cpuQuotaUs: cpu.quotaUs,
    cpuPeriodUs: cpu.periodUs,
    source: 'snapshot' in source ? { snapshot: source.snapshot.name } : { fromDir: source.fromDir },
  });
  const { stdout } = await ctx.cli.run(argv, { timeoutMs: CLONE_TIMEOUT_MS, ...POD_OP_QUEUE });
  return await settledRecord(ctx, stdout, spec.vmName);
}

/** The storage cap (VK_MAX_VM_STORAGE): `--storage` is pod-authored and becomes a disk on
 * the host, so a size past the operator's cap is refused before any cocoon call (permanent:
 * the pod fails until its annotation changes). Only run mode sends `--storage`; a clone keeps
 * its source's disk and never reads the annotation. */
export function checkStorageCap(spec: Pick<VMSpec, 'storageBytes'>, capBytes: bigint | undefined): void {
  if (capBytes === undefined || spec.storageBytes === undefined || spec.storageBytes <= capBytes) return;
  throw new BringUpError(
    `${STORAGE} asks for ${spec.storageBytes} bytes, more than this node's cap VK_MAX_VM_STORAGE=${capBytes} bytes; ask for at most that much`,
  );
}

export async function runBringUp(
  ctx: Pick<ProviderContext, 'cli' | 'config' | 'imageImporter'>,
  spec: VMSpec,
  log: Logger,
): Promise<BringUpResult> {
  checkStorageCap(spec, ctx.config.maxVmStorageBytes);
  // With a registry, peek first: a cloud-image artifact is imported and booted under its local
  // name, a snapshot artifact refused; a registry error throws (transient), never a fallback
  // to `image pull` (docs/decisions.md, "Run-mode images").
  const found = ctx.imageImporter
    ? await ctx.imageImporter.ensure(spec.image, { force: spec.forcePull, log })
    : { kind: 'pull' as const };
  if (found.kind === 'refused') throw new BringUpError(found.message);
  const image = found.kind === 'imported' ? found.localName : spec.image;
  if (found.kind === 'pull') {
    await imagePulls.do(`${spec.forcePull ? 'force ' : ''}${spec.image}`, async () => {
      log.info({ image: spec.image, force: spec.forcePull }, 'pulling the VM image');
      await ctx.cli.run(imagePullArgv(spec.image, spec.forcePull), { timeoutMs: PULL_TIMEOUT_MS });
    });
  }
  const cpu = cpuPolicy(spec.cpuRequestMilli, spec.cpuLimitMilli);
  const argv = runArgv({
    vmName: spec.vmName,
    cpus: cpu.cpus,
    cpuWeight: cpu.weight,
    cpuQuotaUs: cpu.quotaUs,
    cpuPeriodUs: cpu.periodUs,
    memoryBytes: runMemoryBytes(spec),
    storageBytes: spec.storageBytes,
    network: spec.network || undefined,
    windows: guestProfile(spec.os).runWindowsFlag,
    firecracker: spec.backend === 'firecracker',
    noDirectIO: spec.noDirectIO,
    image,
  });
  let stdout: string;
  try {
    ({ stdout } = await ctx.cli.run(argv, { timeoutMs: CLONE_TIMEOUT_MS, ...POD_OP_QUEUE }));
  } catch (err) {
    // A start failure leaves a record in state `error` holding the name: remove it so the
    // pod controller's retry can create the VM again (docs/contracts/cocoon-cli.md "vm run", run).
    await removeErrorRecord(ctx, spec.vmName, log);
    throw err;
  }
  const vm = await settledRecord(ctx, stdout, spec.vmName);
  return { vm, clonedBoot: false, sourceImage: spec.image };
}

async function removeErrorRecord(
  ctx: Pick<ProviderContext, 'cli'>,
  vmName: string,
  log: Logger,
): Promise<void> {
  try {
    const { stdout } = await ctx.cli.run(inspectArgv(vmName), { timeoutMs: SHORT_TIMEOUT_MS });
    const rec = parseVmRecord(stdout);
    if (rec.ok && rec.value.state === 'error') {
      await ctx.cli.run(removeArgv(rec.value.id), { timeoutMs: SHORT_TIMEOUT_MS });
      log.info({ vmId: rec.value.id }, 'removed the error record left by a failed vm run');
    }
  } catch {
    // not found or inconclusive: nothing to clean
  }
}

/** The printed record, re-inspected once when it is not `running` or has pid 0. Any
 * failure here is a {@link SettleError}: the VM may exist. */
async function settledRecord(
  ctx: Pick<ProviderContext, 'cli'>,
  stdout: string,
  vmName: string,
): Promise<VmRecord> {
  const printed = parseVmRecord(stdout);
  if (!printed.ok)
    throw new SettleError(`cocoon printed an unreadable VM record for ${vmName}: ${printed.error}`);
  if (printed.value.state === 'running' && printed.value.pid !== 0) return printed.value;
  try {
    return (await inspectVm(ctx, printed.value.id)) ?? printed.value;
  } catch (err) {
    throw new SettleError(
      `VM ${vmName} (${printed.value.id}) did not settle: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}

/** `vm inspect`; `undefined` only when cocoon says the VM is gone (never on inconclusive errors). */
export async function inspectVm(
  ctx: Pick<ProviderContext, 'cli'>,
  ref: string,
): Promise<VmRecord | undefined> {
  try {
    // Work on a VM that already exists goes before new clones in the call pool.
    const { stdout } = await ctx.cli.run(inspectArgv(ref), { timeoutMs: SHORT_TIMEOUT_MS, priority: 'high' });
    const rec = parseVmRecord(stdout);
    if (!rec.ok) throw new BringUpError(`cocoon vm inspect ${ref}: ${rec.error}`);
    return rec.value;
  } catch (err) {
    if (err instanceof CocoonCommandError && err.errorClass === 'vm_not_found') return undefined;
    throw err;
  }
}

/** Inspect with 2 attempts, 200 ms then 400 ms apart (adoption, docs/contracts/pod-to-vm.md "CreatePod" step 5). */
export async function inspectWithRetry(
  ctx: Pick<ProviderContext, 'cli' | 'lifetime'>,
  ref: string,
): Promise<VmRecord | undefined> {
  let last: unknown;
  for (const delay of [200, 400]) {
    try {
      return await inspectVm(ctx, ref);
    } catch (err) {
      last = err;
      await pause(delay, ctx.lifetime);
    }
  }
  throw last;
}
