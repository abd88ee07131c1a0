// DeletePod: the VM this pod holds is removed, its DHCP leases released after a confirmed
// removal, and the local snapshots named after that VM removed unless kept. A pod that never
// held a VM of its own (unmanaged, failed create, a name another pod holds) removes nothing.

import type { V1Pod } from '@kubernetes/client-node';
import { removeArgv, snapshotRemoveArgv } from '../../../cocoon/argv.ts';
import type { VmRecord } from '../../../cocoon/records.ts';
import { CocoonCommandError } from '../../../cocoon/runner.ts';
import { KEEP_SNAPSHOT_ON_DELETE, SNAPSHOT_POLICY } from '../../../contract/annotations.ts';
import { releaseLease } from '../../../net/release.ts';
import { NotFoundError } from '../../../pods/ports.ts';
import { logFor, type ProviderContext } from '../context.ts';
import { supersedeJobs } from '../readiness/jobs.ts';
import { markDeleted, type PodRecord, setDeleting, takeHeld } from '../state.ts';
import { cancelRetry } from './failure.ts';

export async function deletePod(ctx: ProviderContext, pod: V1Pod, key: string): Promise<void> {
  const rec = ctx.pods.get(key);
  if (!rec) throw new NotFoundError(`pod ${key} is not known to the provider`);
  if (rec.uid !== pod.metadata?.uid) return; // superseded incarnation: success
  const log = logFor(ctx, rec);
  supersedeJobs(rec, 'pod is being deleted');
  cancelRetry(ctx, key);
  ctx.probes.get(key)?.stop();
  ctx.probes.delete(key);
  const vm = rec.vm;
  if (!rec.ownsVm || !vm) {
    forget(ctx, rec);
    ctx.metrics.podLifecycle('delete', 'skipped', rec.spec?.managed === false ? 'unmanaged' : 'no_vm');
    return;
  }
  const keep =
    (pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE] ??
      rec.pod.metadata?.annotations?.[KEEP_SNAPSHOT_ON_DELETE]) === 'true';
  warnUnbuiltSnapshotPolicy(ctx, rec);
  setDeleting(rec, true);
  try {
    try {
      await ctx.cli.run(removeArgv(vm.id), { timeoutMs: 60_000 });
    } catch (err) {
      if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) {
        throw new Error(`kept VM ${vm.id}: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    // Lease release only after a confirmed removal.
    await releaseLeases(ctx, vm);
    if (!keep && vm.name) {
      for (const name of [vm.name, `fork-${vm.name}`]) {
        await ctx.cli.run(snapshotRemoveArgv(name), { timeoutMs: 10_000 }).catch(() => {});
      }
    }
  } catch (err) {
    setDeleting(rec, false);
    ctx.metrics.podLifecycle('delete', 'failed', 'remove');
    log.warn({ err: String(err) }, 'delete failed; the pod stays Terminating and is retried');
    throw err;
  }
  forget(ctx, rec);
  markDeleted(rec);
  ctx.metrics.podLifecycle('delete', 'ok', '');
  log.info({ vmId: vm.id }, 'VM removed');
}

/** A delete-time snapshot the pod explicitly asked for (`snapshot-policy: always`, or
 * `main-only` on a main agent) is not built yet: the delete proceeds, and says loudly that no
 * `:latest` snapshot was pushed (docs/decisions.md, "Not built yet"). */
function warnUnbuiltSnapshotPolicy(ctx: ProviderContext, rec: PodRecord): void {
  const raw = rec.pod.metadata?.annotations?.[SNAPSHOT_POLICY];
  const spec = rec.spec;
  if (!spec || raw === undefined || spec.snapshotPolicy === 'never') return;
  if (spec.snapshotPolicy === 'main-only' && spec.role !== 'main') return;
  const message = `delete: snapshot-policy ${spec.snapshotPolicy}: the delete-time snapshot push is not supported by this vk-cocoon release; VM ${rec.vm?.name} is removed without a :latest snapshot`;
  ctx.events.event(rec.pod, 'Warning', 'SnapshotPolicyUnsupported', message);
  logFor(ctx, rec).warn({ policy: spec.snapshotPolicy }, message);
}

/** Releases the DHCP leases of a removed VM's NICs through cocoon-net's control socket. */
export async function releaseLeases(ctx: ProviderContext, vm: VmRecord): Promise<void> {
  const macs = [
    ...new Set(
      vm.nics
        .filter((n) => !n.static)
        .map((n) => n.mac.toLowerCase())
        .filter(Boolean),
    ),
  ];
  for (const mac of macs) {
    const r = await releaseLease(ctx.config.netControlSocket, mac);
    ctx.metrics.leaseRelease(r.result);
    if (r.result === 'failed')
      ctx.log.warn({ vm: vm.name, mac, err: r.detail }, 'lease release failed; expiry is the fallback');
  }
}

function forget(ctx: ProviderContext, rec: PodRecord): void {
  supersedeJobs(rec, 'forgotten');
  takeHeld(rec);
  if (ctx.pods.get(rec.key) === rec) ctx.pods.delete(rec.key);
}
