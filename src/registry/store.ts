// The registry side of hibernate, wake and delete-time snapshots in one object (the
// provider's SnapshotStore port, src/provider/cocoon/context.ts): push (push.ts), the identity
// read and the tag delete (identity.ts), and the wake pull into a local name (pull.ts), each bounded by the
// daemon's lifetime and the transfer settings of the configuration (docs/registry.md).
import type { SnapshotRecord } from '../cocoon/records.ts';
import type { CocoonCli } from '../cocoon/runner.ts';
import type { Logger } from '../log.ts';
import { ANNOTATION } from './artifact-write.ts';
import type { RegistryClient } from './client.ts';
import { deleteSnapshotTag, readSnapshotIdentity, type SnapshotIdentity } from './identity.ts';
import { PULL_CAP_MS, pullSnapshot } from './pull.ts';
import { pushSnapshot } from './push.ts';
import type { V2Format } from './v2-write.ts';

export interface SnapshotStoreOptions {
  readonly registry: RegistryClient;
  readonly cli: CocoonCli;
  readonly lifetime: AbortSignal;
  readonly concurrency?: number;
  readonly pullBudgetMiB?: number;
  readonly spoolDir?: string;
  /** Push format: v2 when either is set (`SNAPSHOT_ZSTD_LEVEL`, `SNAPSHOT_CHUNK_SIZE_MIB`), else v1. */
  readonly v2?: V2Format;
  /** `SNAPSHOT_MEMORY_BUDGET_MIB`: v2 blobs spooled and not yet uploaded, at most. */
  readonly spoolBudgetMiB?: number;
  /** Metrics hook of the wake pulls: `cocoon_vk_snapshot_pull_total{result}` and its duration. */
  readonly onPullDone?: (result: 'ok' | 'failed', seconds: number) => void;
}

export class RegistrySnapshotStore {
  readonly #o: SnapshotStoreOptions;

  constructor(opts: SnapshotStoreOptions) {
    this.#o = opts;
  }

  #signal(signal: AbortSignal | undefined): AbortSignal {
    return signal ? AbortSignal.any([signal, this.#o.lifetime]) : this.#o.lifetime;
  }

  async push(args: {
    localName: string;
    repo: string;
    tag: string;
    baseImage: string;
    fromNode?: string;
    namespace?: string;
    controllerUid?: string;
    pod?: string;
    podUid?: string;
    peer?: { address: string; pin: string };
    signal?: AbortSignal;
    log?: Logger;
  }): Promise<{ digest: string; snapshotId: string; bytes: number }> {
    // A whole push holds one transfer slot (VK_TRANSFER_SLOTS): export, spool and upload.
    const r = await this.#o.cli.transfer(() => this.#push(args), this.#signal(args.signal));
    return { digest: r.digest, snapshotId: r.snapshotId, bytes: r.bytes };
  }

  #push(args: Parameters<RegistrySnapshotStore['push']>[0]) {
    const stamps: Record<string, string> = {};
    if (args.namespace) stamps[ANNOTATION.namespace] = args.namespace;
    if (args.controllerUid) stamps[ANNOTATION.controllerUid] = args.controllerUid;
    if (args.pod) stamps[ANNOTATION.pod] = args.pod;
    if (args.podUid) stamps[ANNOTATION.podUid] = args.podUid;
    if (args.peer) {
      stamps[ANNOTATION.peerAddress] = args.peer.address;
      stamps[ANNOTATION.peerPin] = args.peer.pin;
    }
    return pushSnapshot({
      registry: this.#o.registry,
      cli: this.#o.cli,
      localName: args.localName,
      repo: args.repo,
      tag: args.tag,
      baseImage: args.baseImage,
      fromNode: args.fromNode,
      annotations: Object.keys(stamps).length > 0 ? stamps : undefined,
      concurrency: this.#o.concurrency,
      spoolDir: this.#o.spoolDir,
      v2: this.#o.v2,
      spoolBudgetMiB: this.#o.spoolBudgetMiB,
      signal: this.#signal(args.signal),
      log: args.log,
    });
  }

  identity(repo: string, tag: string, signal?: AbortSignal): Promise<SnapshotIdentity | 'absent'> {
    return readSnapshotIdentity(this.#o.registry, repo, tag, this.#signal(signal));
  }

  deleteTag(repo: string, tag: string, signal?: AbortSignal): Promise<'deleted' | 'absent'> {
    return deleteSnapshotTag(this.#o.registry, repo, tag, this.#signal(signal));
  }

  pull(args: {
    repo: string;
    tag: string;
    localName: string;
    signal?: AbortSignal;
    log?: Logger;
  }): Promise<SnapshotRecord> {
    // A whole pull holds one transfer slot (VK_TRANSFER_SLOTS); its cap counts from the grant.
    return this.#o.cli.transfer(() => this.#pull(args), this.#signal(args.signal));
  }

  #pull(args: Parameters<RegistrySnapshotStore['pull']>[0]): Promise<SnapshotRecord> {
    const cap = AbortSignal.timeout(PULL_CAP_MS);
    const started = performance.now();
    const done = (result: 'ok' | 'failed') =>
      this.#o.onPullDone?.(result, (performance.now() - started) / 1000);
    return pullSnapshot({
      registry: this.#o.registry,
      cli: this.#o.cli,
      repo: args.repo,
      tag: args.tag,
      localName: args.localName,
      signal: this.#signal(args.signal ? AbortSignal.any([args.signal, cap]) : cap),
      log: args.log,
      budgetMiB: this.#o.pullBudgetMiB,
      concurrency: this.#o.concurrency,
      importTimeoutMs: PULL_CAP_MS,
    }).then(
      (r) => {
        done('ok');
        return r;
      },
      (err: unknown) => {
        done('failed');
        throw err;
      },
    );
  }
}
