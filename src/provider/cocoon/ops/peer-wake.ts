// The peer step of a wake (docs/peer-restore.md, "When a wake asks a peer"): after the local
// copy and before the registry pull, the hibernated state is fetched from the host that pushed
// it (the manifest's `cocoonstack.snapshot.from-node`). A skip (no such host, this host, no
// config) costs nothing; a failed restore is counted, logged and falls back to the registry.
import type { Logger } from '../../../log.ts';
import { currentOpSignal } from '../../../util/op-signal.ts';
import type { VMSpec } from '../../../vmspec/decode.ts';
import type { PeerStaged, ProviderContext, SnapshotIdentity } from '../context.ts';
import type { PodRecord } from '../state.ts';

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The peer restorer, under the provider's lifetime, counted. */
export type PeerWakeCtx = Pick<ProviderContext, 'config' | 'lifetime' | 'metrics' | 'peer'>;

/** Stages the state of `spec.vmName` from its pushing host, or `undefined` when the wake should
 * pull from the registry instead (skipped or failed; the reason is logged). */
export async function peerWake(
  ctx: PeerWakeCtx,
  spec: VMSpec,
  rec: PodRecord,
  id: SnapshotIdentity,
  log: Logger,
): Promise<(PeerStaged & { node: string }) | undefined> {
  const node = id.fromNode;
  if (!ctx.peer) return undefined;
  if (node === '' || node === ctx.config.nodeName || !id.config) {
    log.debug(
      { fromNode: node || '(none)' },
      node === ctx.config.nodeName
        ? 'peer restore skipped: the state was pushed by this host'
        : 'peer restore skipped: the manifest names no pushing host',
    );
    return undefined;
  }
  const namespace = rec.pod.metadata?.namespace ?? '';
  const op = currentOpSignal();
  const started = performance.now();
  try {
    const r = await ctx.peer.restore({
      vmName: spec.vmName,
      fromNode: node,
      stamp: id.peerAddress && id.peerPin ? { address: id.peerAddress, pin: id.peerPin } : undefined,
      config: id.config,
      // A DeletePod aborts the bring-up (ops/abort.ts): the transfer stops with it, not only
      // the clone after it; the next bring-up re-derives the source.
      signal: op ? AbortSignal.any([ctx.lifetime, op]) : ctx.lifetime,
      log,
    });
    if ('skip' in r) {
      log.info({ fromNode: node, why: r.skip }, 'peer restore skipped; pulling from the registry');
      return undefined;
    }
    const seconds = (performance.now() - started) / 1000;
    ctx.metrics.peerRestore(namespace, 'ok', seconds);
    log.info(
      { fromNode: node, bytes: r.bytes, seconds: Number(seconds.toFixed(2)) },
      `peer restore ${spec.vmName} from ${node} in ${seconds.toFixed(1)} s`,
    );
    return { ...r, node };
  } catch (err) {
    // Aborted by a delete or the shutdown: not a failed peer, and no fallback to start.
    if (op?.aborted || ctx.lifetime.aborted) throw err;
    ctx.metrics.peerRestore(namespace, 'failed', 0);
    log.warn(
      { fromNode: node, err: errText(err) },
      `peer restore of ${spec.vmName} from ${node} failed; falling back to the registry`,
    );
    return undefined;
  }
}
