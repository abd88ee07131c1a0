/**
 * De-duplicated clone-source pulls (docs/contracts/pod-to-vm.md "Bring-up: clone" step 3):
 * {@link SnapshotPuller} inspects the local name and, when it is missing, runs one
 * {@link pullSnapshot} per local name under its own cap.
 */
import type { SnapshotRecord } from '../cocoon/records.ts';
import type { CocoonCli } from '../cocoon/runner.ts';
import { inspectSnapshot } from '../cocoon/snapshots.ts';
import { type Logger, silentLogger } from '../log.ts';
import { untilAborted } from '../util/deadline.ts';
import { Singleflight } from '../util/singleflight.ts';
import { localSnapshotName, splitCloneImage } from '../vmspec/snapshot-name.ts';
import type { RegistryClient } from './client.ts';
import { PULL_CAP_MS, pullSnapshot, SnapshotPullError } from './pull.ts';

export interface SnapshotPullerOptions {
  /** `undefined` without `OCI_REGISTRY`: a missing snapshot is then an error. */
  readonly registry: RegistryClient | undefined;
  readonly cli: CocoonCli;
  readonly log?: Logger;
  /** `SNAPSHOT_PULL_BUDGET_MIB`. */
  readonly budgetMiB?: number;
  /** `SNAPSHOT_TRANSFER_CONCURRENCY`. */
  readonly concurrency?: number;
  /** Cap of one pull (default 30 min). */
  readonly capMs?: number;
  /** Provider lifetime: shutdown aborts pulls in flight. */
  readonly lifetime?: AbortSignal;
  readonly progressIntervalMs?: number;
  /** Metrics hook: `cocoon_vk_snapshot_pull_total{result}` and `..._duration_seconds`. */
  readonly onPullDone?: (result: 'ok' | 'failed', seconds: number) => void;
}

/**
 * Ensures clone-source snapshots are present (docs/contracts/pod-to-vm.md "Bring-up: clone" step 3): inspect the local
 * name; when missing, pull `<OCI_REGISTRY>/<repo>:<tag>` into it. Pulls are de-duplicated per
 * local name — callers arriving while one runs share it, and the pull itself re-checks the
 * local name first. A pull is not bound to any caller's signal (the caller's signal only stops
 * that caller's wait); it has its own 30-minute cap and ends at provider shutdown.
 */
export class SnapshotPuller {
  readonly #o: SnapshotPullerOptions;
  readonly #log: Logger;
  readonly #flight = new Singleflight<SnapshotRecord>();

  constructor(opts: SnapshotPullerOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ module: 'snapshot-pull' });
  }

  /** The local snapshot of a clone image `repo[:tag]`, pulled first if missing. */
  async ensure(image: string, opts: { signal?: AbortSignal; log?: Logger } = {}): Promise<SnapshotRecord> {
    const local = localSnapshotName(image);
    const existing = await inspectSnapshot(this.#o.cli, local, opts.signal);
    if (existing) return existing;
    const registry = this.#o.registry;
    if (!registry) throw new Error(`snapshot ${local} not found locally and no registry configured`);
    const { repo, tag } = splitCloneImage(image);
    const pulling = this.#flight.do(local, async () => {
      const again = await inspectSnapshot(this.#o.cli, local, this.#o.lifetime);
      if (again) return again;
      // A whole pull holds one transfer slot (VK_TRANSFER_SLOTS); its cap counts from the grant.
      return await this.#o.cli.transfer(
        () => this.#pull(registry, repo, tag, local, opts.log ?? this.#log),
        this.#o.lifetime,
      );
    });
    return await untilAborted(pulling, opts.signal);
  }

  async #pull(
    registry: RegistryClient,
    repo: string,
    tag: string,
    local: string,
    log: Logger,
  ): Promise<SnapshotRecord> {
    const capMs = this.#o.capMs ?? PULL_CAP_MS;
    const cap = AbortSignal.timeout(capMs);
    const signal = this.#o.lifetime ? AbortSignal.any([cap, this.#o.lifetime]) : cap;
    const started = performance.now();
    try {
      const record = await pullSnapshot({
        registry,
        cli: this.#o.cli,
        repo,
        tag,
        localName: local,
        signal,
        log,
        budgetMiB: this.#o.budgetMiB,
        concurrency: this.#o.concurrency,
        importTimeoutMs: capMs,
        progressIntervalMs: this.#o.progressIntervalMs,
      });
      this.#o.onPullDone?.('ok', (performance.now() - started) / 1000);
      return record;
    } catch (error) {
      this.#o.onPullDone?.('failed', (performance.now() - started) / 1000);
      if (cap.aborted && !this.#o.lifetime?.aborted) {
        const limit = capMs % 60_000 === 0 ? `${capMs / 60_000} min` : `${capMs} ms`;
        throw new SnapshotPullError(
          `snapshot pull of ${repo}:${tag} into ${local} exceeded its ${limit} cap`,
          {
            cause: error,
          },
        );
      }
      throw error;
    }
  }
}
