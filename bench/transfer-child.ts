// One snapshot transfer in a process of its own, for bench/transfer.ts: its peak RSS (VmHWM)
// is then the transfer's (plus Node.js and the modules it loads, reported separately as
// `idleKiB`), not the bench's, which also writes the test disk and runs the registry helpers.
//   node bench/transfer-child.ts '<json job>'
// The job: {op: 'push' | 'pull' | 'fetch' | 'upload', registry: '<host:port>/<prefix>', cocoonBin, repo, tag,
// localName, baseImage?, spoolDir?, spillDir?, budgetMiB?, readAheadWindowBytes?, concurrency?, v2?,
// exportFrom?, discardImport?}; the simulator's environment comes through the process
// environment. With `exportFrom` (push) or `discardImport` (pull) the transfer runs on the
// bench's CocoonCli (bench/lib/bench-cli.ts): the export read from a tar file, the import's
// tar discarded. `fetch` is the registry part of a pull as the pull reads it: the manifest, then
// the config and every layer fetched and verified (RegistryClient.getBlob, `concurrency` at
// once, each piece handed back as it is read), nothing decoded, no tar; `upload` the registry
// part of a push: the blobs of an OCI layout (`layoutDir`, what `crane pull` wrote) uploaded with
// RegistryClient.uploadBlob (`concurrency` at once, one request each), then the manifest. Prints one JSON line on
// stdout: {ms, bytes,
// uploadedBytes?, discardedBytes?, idleKiB, hwmKiB, cpuMs, childrenCpuMs}.
import fs from 'node:fs';
import path from 'node:path';
import { CocoonCli } from '../src/cocoon/runner.ts';
import { createLogger, silentLogger } from '../src/log.ts';
import { validateSnapshotManifest } from '../src/registry/artifact.ts';
import { RegistryClient } from '../src/registry/client.ts';
import { DEFAULT_TRANSFER_CONCURRENCY, pullSnapshot } from '../src/registry/pull.ts';
import { DEFAULT_PUSH_CONCURRENCY, pushSnapshot } from '../src/registry/push.ts';
import { parseReference } from '../src/registry/reference.ts';
import type { V2Format } from '../src/registry/v2-write.ts';
import { BenchCli } from './lib/bench-cli.ts';
import { clockTicks, memOf, parseStatTimes } from './lib/procfs.ts';

interface Job {
  op: 'push' | 'pull' | 'fetch' | 'upload';
  registry: string;
  cocoonBin: string;
  repo: string;
  tag: string;
  localName: string;
  baseImage?: string;
  spoolDir?: string;
  spillDir?: string;
  budgetMiB?: number;
  readAheadWindowBytes?: number;
  /** Pull: blob downloads at once (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
  concurrency?: number;
  /** Push: the v2 writer's settings (`SNAPSHOT_ZSTD_LEVEL`, `SNAPSHOT_CHUNK_SIZE_MIB` in bytes). */
  v2?: V2Format;
  /** Push: the export is this tar file, not a live `cocoon snapshot export`. */
  exportFrom?: string;
  /** Pull: the import's tar is read and discarded, no `cocoon snapshot import`. */
  discardImport?: boolean;
  /** Upload: the OCI layout whose blobs and manifest go up. */
  layoutDir?: string;
}

/** Runs `work` over `items`, `n` at a time. */
async function eachAtOnce<T>(
  items: readonly T[],
  n: number,
  work: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < items.length) await work(items[next++] as T);
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(n, items.length)) }, lane));
}

/** `fetch`: every blob of the artifact fetched and verified; the bytes read. */
async function fetchAll(
  registry: RegistryClient,
  repo: string,
  tag: string,
  concurrency: number,
): Promise<number> {
  const name = registry.repository(repo);
  const fetched = await registry.getManifest(name, parseReference(tag));
  if (fetched === 'absent') throw new Error(`${repo}:${tag} is absent`);
  const m = validateSnapshotManifest(fetched.document);
  if (!m.ok) throw new Error(m.error);
  let bytes = fetched.bytes.length;
  await eachAtOnce([m.value.config, ...m.value.layers], concurrency, async (d) => {
    for await (const piece of await registry.getBlob(name, d)) {
      bytes += (piece as Buffer).length;
      registry.recycle(piece as Buffer);
    }
  });
  return bytes;
}

/** `upload`: an OCI layout's manifest and its blobs into `repo:tag`; the bytes sent. */
async function uploadLayout(
  registry: RegistryClient,
  layoutDir: string,
  repo: string,
  tag: string,
  concurrency: number,
): Promise<number> {
  const name = registry.repository(repo);
  const blobFile = (digest: string) => path.join(layoutDir, 'blobs', ...digest.split(':'));
  const index = JSON.parse(fs.readFileSync(path.join(layoutDir, 'index.json'), 'utf8')) as {
    manifests: { digest: string; mediaType: string }[];
  };
  const top = index.manifests[0];
  if (!top) throw new Error(`${layoutDir}: no manifest`);
  const manifestBytes = fs.readFileSync(blobFile(top.digest));
  const manifest = JSON.parse(manifestBytes.toString()) as {
    config: { digest: string; size: number };
    layers: { digest: string; size: number }[];
  };
  let bytes = manifestBytes.length;
  await eachAtOnce([manifest.config, ...manifest.layers], concurrency, async (d) => {
    // One request per blob, as the push sends a large file (one streamed PATCH): 64 MiB PATCH
    // chunks are for a spooled file only, and distribution then hashes the file again at the PUT.
    await registry.uploadBlob(
      name,
      { digest: d.digest, size: d.size, file: blobFile(d.digest) },
      { chunkBytes: Math.max(1, d.size) },
    );
    bytes += d.size;
  });
  await registry.putManifest(name, tag, manifestBytes, top.mediaType);
  return bytes;
}

const job = JSON.parse(process.argv[2] ?? '{}') as Job;
// VK_BENCH_CHILD_LOG=info (or debug): the transfer's own log lines on stderr (progress every second).
const logLevel = process.env.VK_BENCH_CHILD_LOG;
const log = logLevel ? createLogger(logLevel) : silentLogger;
const progressIntervalMs = logLevel ? 1000 : undefined;
const lifetime = new AbortController();
const registry = new RegistryClient({ base: job.registry, credentials: [] });
const benchCli =
  job.exportFrom !== undefined || job.discardImport
    ? new BenchCli(job.cocoonBin, lifetime.signal, silentLogger, {
        exportFrom: job.exportFrom,
        discardImportOf: job.discardImport ? job.localName : undefined,
      })
    : undefined;
const cli = benchCli ?? new CocoonCli(job.cocoonBin, lifetime.signal, silentLogger);
try {
  const idleKiB = memOf(process.pid).rssKiB;
  const t0 = performance.now();
  let bytes = 0;
  let uploadedBytes: number | undefined;
  if (job.op === 'fetch') {
    bytes = await fetchAll(registry, job.repo, job.tag, job.concurrency ?? DEFAULT_TRANSFER_CONCURRENCY);
  } else if (job.op === 'upload') {
    bytes = await uploadLayout(
      registry,
      job.layoutDir ?? '',
      job.repo,
      job.tag,
      job.concurrency ?? DEFAULT_PUSH_CONCURRENCY,
    );
  } else if (job.op === 'push') {
    const r = await pushSnapshot({
      registry,
      cli,
      localName: job.localName,
      repo: job.repo,
      tag: job.tag,
      baseImage: job.baseImage ?? '',
      spoolDir: job.spoolDir,
      v2: job.v2,
      log,
      progressIntervalMs,
    });
    bytes = r.bytes;
    uploadedBytes = r.uploadedBytes;
  } else {
    await pullSnapshot({
      registry,
      cli,
      repo: job.repo,
      tag: job.tag,
      localName: job.localName,
      budgetMiB: job.budgetMiB,
      spillDir: job.spillDir,
      readAheadWindowBytes: job.readAheadWindowBytes,
      concurrency: job.concurrency,
      log,
      progressIntervalMs,
    });
  }
  const ms = performance.now() - t0;
  const cpu = process.cpuUsage();
  const cpuMs = (cpu.user + cpu.system) / 1000;
  // cutime + cstime: the `cocoon` client processes this one waited for.
  const childrenCpuMs = parseStatTimes(fs.readFileSync('/proc/self/stat', 'latin1'), clockTicks()).childrenMs;
  process.stdout.write(
    `${JSON.stringify({ ms, bytes, uploadedBytes, discardedBytes: job.discardImport ? benchCli?.discardedBytes : undefined, idleKiB, hwmKiB: memOf(process.pid).hwmKiB, cpuMs, childrenCpuMs })}\n`,
  );
} finally {
  registry.close();
  lifetime.abort();
}
