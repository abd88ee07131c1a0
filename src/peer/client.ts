// The peer restore client (shared/spec/peer-restore.md §5; docs/peer-restore.md): fetch the
// plan of a hibernated VM's snapshot from the node that pushed it, check it against the
// registry's identity and our bounds, fetch its slices into a private staging directory and
// write the envelope `cocoon vm clone --from-dir` reads. Any failure removes the directory and
// rejects with a PeerRestoreError; the caller then pulls from the registry.
import { constants, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../log.ts';
import type { SnapshotConfig } from '../registry/artifact-config.ts';
import { fetchSlice, SectionWriter } from './fetch.ts';
import { Gate, runPool, TokenBucket } from './gate.ts';
import { get, makeAgent, PeerRestoreError, readSome } from './transport.ts';
import {
  ENVELOPE_NAME,
  MAX_PLAN_BYTES,
  type PeerPlan,
  type PlanFile,
  parsePlanJson,
  peerEnvelope,
  planUrl,
  RESTORE_CONCURRENCY,
  STREAMS_PER_FILE,
  sliceUrl,
  stagingPrefix,
  streamGroups,
  validatePlan,
} from './wire.ts';

export { PeerRestoreError, type PeerRestoreReason } from './transport.ts';

export interface PeerRestoreLimits {
  /** Stream groups per file (8). */
  streamsPerFile?: number;
  /** Slice workers of the restore (32). */
  concurrency?: number;
  /** A slice whose body is silent this long fails (30 s). */
  stallMs?: number;
  /** TCP connect (and, for https, handshake) bound (3 s). */
  dialMs?: number;
  /** Response-header bound (10 s). */
  headerMs?: number;
  /** Most bytes all slices may carry (1 TiB). */
  maxTotalBytes?: number;
  /** Most files in the plan (256). */
  maxFiles?: number;
  /** Receive rate of the restore (0: unbounded). */
  bytesPerSecond?: number;
}

export interface PeerRestoreOptions {
  /** `http://ip:port` (a Go peer) or `https://ip:port` (ours). */
  baseUrl: string;
  /** For https (required there): hex SHA-256 of the server's DER certificate. */
  pinSha256?: string;
  clientCert?: { cert: string; key: string };
  vmName: string;
  /** The registry's config: its snapshotId must equal the plan's. The envelope is made from it. */
  config: SnapshotConfig;
  stagingRoot: string;
  signal?: AbortSignal;
  log?: Logger;
  limits?: PeerRestoreLimits;
  /** Body bytes as they arrive. */
  onBytes?: (n: number) => void;
}

export interface PeerRestoreResult {
  /** The staging directory: the files and `snapshot.json`. */
  dir: string;
  /** Slice bytes received. */
  bytes: number;
  /** Files staged (the envelope not counted). */
  files: number;
  /** Removes the directory (idempotent). */
  release(): Promise<void>;
}

const DEFAULT_LIMITS: Required<PeerRestoreLimits> = {
  streamsPerFile: STREAMS_PER_FILE,
  concurrency: RESTORE_CONCURRENCY,
  stallMs: 30_000,
  dialMs: 3_000,
  headerMs: 10_000,
  maxTotalBytes: 2 ** 40,
  maxFiles: 256,
  bytesPerSecond: 0,
};
/** Go's `peerRestoreGate`: restores of one process at once. */
const RESTORES_AT_ONCE = 2;
const QUOTED_BODY = 512;

/** Holds the process-wide restore gate (blocking, abortable). */
export class PeerClient {
  readonly #gate: Gate;

  constructor(o: { maxRestores?: number } = {}) {
    this.#gate = new Gate(o.maxRestores ?? RESTORES_AT_ONCE);
  }

  async restore(opts: PeerRestoreOptions): Promise<PeerRestoreResult> {
    try {
      await this.#gate.take(opts.signal);
    } catch (err) {
      throw new PeerRestoreError('aborted', 'peer restore aborted while waiting for the restore gate', err);
    }
    try {
      return await restoreOnce(opts, { ...DEFAULT_LIMITS, ...opts.limits });
    } finally {
      this.#gate.release();
    }
  }
}

async function restoreOnce(
  o: PeerRestoreOptions,
  limits: Required<PeerRestoreLimits>,
): Promise<PeerRestoreResult> {
  const isHttps = o.baseUrl.startsWith('https:');
  if (!isHttps && !o.baseUrl.startsWith('http:')) {
    throw new PeerRestoreError('plan', `peer base URL must be http:// or https://`);
  }
  if (isHttps && !o.pinSha256) throw new PeerRestoreError('tls', 'an https peer needs pinSha256');
  const ac = new AbortController();
  const onAbort = () => ac.abort(o.signal?.reason);
  if (o.signal?.aborted) throw new PeerRestoreError('aborted', 'peer restore aborted');
  o.signal?.addEventListener('abort', onAbort, { once: true });
  let agent: ReturnType<typeof makeAgent> | undefined;
  try {
    agent = makeAgent({
      https: isHttps,
      pinSha256: o.pinSha256,
      clientCert: o.clientCert,
      dialMs: limits.dialMs,
      maxSockets: limits.concurrency,
    });
    const plan = await fetchPlan(agent, o, limits, ac.signal);
    if (plan.snapshotId !== o.config.snapshotId) {
      throw new PeerRestoreError(
        'identity',
        `peer has snapshot ${plan.snapshotId}, registry says ${o.config.snapshotId}`,
      );
    }
    const problem = validatePlan(plan, limits);
    if (problem) throw new PeerRestoreError('validation', problem);
    return await stage(agent, o, limits, plan, ac);
  } catch (err) {
    if (o.signal?.aborted) throw new PeerRestoreError('aborted', 'peer restore aborted', err);
    if (err instanceof PeerRestoreError) throw err;
    throw new PeerRestoreError('transfer', (err as Error).message, err);
  } finally {
    o.signal?.removeEventListener('abort', onAbort);
    agent?.destroy();
  }
}

async function fetchPlan(
  agent: ReturnType<typeof makeAgent>,
  o: PeerRestoreOptions,
  limits: Required<PeerRestoreLimits>,
  signal: AbortSignal,
): Promise<PeerPlan> {
  try {
    const res = await get(agent, planUrl(o.baseUrl, o.vmName), { signal, headerMs: limits.headerMs });
    if (res.statusCode !== 200) {
      const body = await readSome(res, QUOTED_BODY, limits.stallMs).catch(() => Buffer.alloc(0));
      throw new PeerRestoreError(
        'plan',
        `peer plan: HTTP ${res.statusCode} ${res.statusMessage ?? ''}: ${body.toString('utf8').trim()}`,
      );
    }
    const body = await readSome(res, MAX_PLAN_BYTES + 1, limits.stallMs);
    if (body.length > MAX_PLAN_BYTES)
      throw new PeerRestoreError('plan', `peer plan is larger than ${MAX_PLAN_BYTES} bytes`);
    const plan = parsePlanJson(body.toString('utf8'));
    if (typeof plan === 'string') throw new PeerRestoreError('plan', `peer plan: ${plan}`);
    return plan;
  } catch (err) {
    if (err instanceof PeerRestoreError) throw err;
    throw new PeerRestoreError(
      signal.aborted ? 'aborted' : 'plan',
      `peer plan: ${(err as Error).message}`,
      err,
    );
  }
}

interface Task {
  file: PlanFile;
  fh: FileHandle;
  group: { offset: number; length: number }[];
}

async function stage(
  agent: ReturnType<typeof makeAgent>,
  o: PeerRestoreOptions,
  limits: Required<PeerRestoreLimits>,
  plan: PeerPlan,
  ac: AbortController,
): Promise<PeerRestoreResult> {
  let dir: string;
  try {
    await fsp.mkdir(o.stagingRoot, { recursive: true, mode: 0o750 });
    dir = await fsp.mkdtemp(join(o.stagingRoot, `${stagingPrefix(o.vmName)}-`));
  } catch (err) {
    throw new PeerRestoreError('staging', `staging directory: ${(err as Error).message}`, err);
  }
  const release = () => fsp.rm(dir, { recursive: true, force: true });
  const handles: FileHandle[] = [];
  try {
    const tasks: Task[] = [];
    for (const file of plan.files) {
      let fh: FileHandle;
      try {
        fh = await fsp.open(
          join(dir, file.name),
          constants.O_CREAT | constants.O_EXCL | constants.O_WRONLY,
          0o640,
        );
        handles.push(fh);
        await fh.truncate(file.size);
      } catch (err) {
        throw new PeerRestoreError('staging', `stage ${file.name}: ${(err as Error).message}`, err);
      }
      for (const group of streamGroups(file.slices ?? [], limits.streamsPerFile))
        tasks.push({ file, fh, group });
    }
    const bucket = new TokenBucket(limits.bytesPerSecond);
    const bytes = await runPool(tasks, limits.concurrency, ac, async (task) => {
      const writer = new SectionWriter(task.fh);
      let n = 0;
      for (const slice of task.group) {
        n += await fetchSlice({
          agent,
          url: sliceUrl(o.baseUrl, plan.snapshotId, task.file.name, slice),
          what: `${task.file.name}@${slice.offset}+${slice.length}`,
          slice,
          writer,
          signal: ac.signal,
          headerMs: limits.headerMs,
          stallMs: limits.stallMs,
          bucket,
          onBytes: o.onBytes,
        });
      }
      return n;
    });
    await Promise.all(handles.splice(0).map((fh) => fh.close()));
    try {
      await fsp.writeFile(join(dir, ENVELOPE_NAME), peerEnvelope(o.config, o.vmName), {
        mode: 0o644,
        flag: 'wx',
      });
    } catch (err) {
      throw new PeerRestoreError('staging', `write ${ENVELOPE_NAME}: ${(err as Error).message}`, err);
    }
    o.log?.debug({ dir, bytes, files: plan.files.length }, 'peer restore staged');
    return { dir, bytes, files: plan.files.length, release };
  } catch (err) {
    ac.abort();
    await Promise.allSettled(handles.map((fh) => fh.close()));
    await release().catch((rmErr: Error) =>
      o.log?.warn({ dir, err: rmErr.message }, 'peer restore: staging directory not removed'),
    );
    throw err;
  }
}

/** Empties the staging root (what a crash left behind); a missing root is fine. */
export async function sweepStaging(root: string): Promise<void> {
  let names: string[];
  try {
    names = await fsp.readdir(root);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  await Promise.all(names.map((name) => fsp.rm(join(root, name), { recursive: true, force: true })));
}
