// The processes of bench/blob-read.ts (started with the daemon's V8 flags, bench/lib/child.ts):
//   node bench/blob-read-child.ts '{"op":"serve","mib":512}'   # prints the port; serves GET /blob
//   node bench/blob-read-child.ts '{"op":"read","via":"node:http","url":"...","digest":"..."}'
//   node bench/blob-read-child.ts '{"op":"buffers","fresh":true,"mib":512}'
// `read` fetches the blob once and hashes it as it arrives: through node:http or bulk-get.ts (`bulk`: each piece handed back to the slab pool once hashed, as the pull does
// once cocoon's stdin took it; `bulk-fresh`: never handed back, so every read lands in new
// memory). `buffers` copies the same bytes through 1 MiB buffers, new ones or two reused.
// Prints one JSON line: {ms, cpuMs (from the read's start), hwmKiB, pieces?}.
import { createHash, randomFillSync } from 'node:crypto';
import http from 'node:http';
import { bulkGet } from '../src/registry/bulk-get.ts';
import { SlabPool } from '../src/registry/slab-pool.ts';
import { memOf } from './lib/procfs.ts';

interface Job {
  op: 'serve' | 'read' | 'buffers';
  mib?: number;
  via?: 'node:http' | 'bulk' | 'bulk-fresh';
  url?: string;
  digest?: string;
  fresh?: boolean;
}

const job = JSON.parse(process.argv[2] ?? '{}') as Job;
const MiB = 1024 * 1024;

/** CPU since `start` (not the process's start-up). */
let start = process.cpuUsage();

function report(t0: number, extra: Record<string, unknown> = {}): void {
  const cpu = process.cpuUsage(start);
  const ms = performance.now() - t0;
  const line = { ms, cpuMs: (cpu.user + cpu.system) / 1000, hwmKiB: memOf(process.pid).hwmKiB, ...extra };
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

if (job.op === 'serve') {
  const body = randomFillSync(Buffer.allocUnsafe((job.mib ?? 512) * MiB));
  const digest = createHash('sha256').update(body).digest('hex');
  const server = http.createServer((_req, res) => {
    res.writeHead(200, { 'content-length': body.length, 'content-type': 'application/octet-stream' });
    res.end(body);
  });
  server.listen(0, '127.0.0.1', () => {
    const { port } = server.address() as { port: number };
    process.stdout.write(`${JSON.stringify({ port, digest })}\n`);
  });
  // Ends with its parent (stdin closed) or a signal.
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
} else if (job.op === 'buffers') {
  const src = Buffer.alloc(MiB, 7);
  const reused = [Buffer.allocUnsafe(MiB), Buffer.allocUnsafe(MiB)];
  const t0 = performance.now();
  start = process.cpuUsage();
  let sum = 0;
  for (let i = 0; i < (job.mib ?? 512); i++) {
    const b = job.fresh ? Buffer.allocUnsafe(MiB) : reused[i & 1]!;
    src.copy(b);
    sum += b[i & 1023]!;
    // Let the event loop and the collector run, as between socket reads.
    if (i % 16 === 0) await new Promise((resolve) => setImmediate(resolve));
  }
  report(t0, { sum });
} else {
  const url = new URL(job.url ?? '');
  const hash = createHash('sha256');
  let pieces = 0;
  const t0 = performance.now();
  start = process.cpuUsage();
  if (job.via === 'node:http') {
    await new Promise<void>((resolve, reject) => {
      http.get(url, (res) => {
        res.on('data', (c: Buffer) => {
          pieces++;
          hash.update(c);
        });
        res.on('end', resolve);
        res.on('error', reject);
      });
    });
  } else {
    const pool = new SlabPool();
    const res = await bulkGet({ url, headers: {}, idleTimeoutMs: 60_000, pool });
    for await (const c of res) {
      pieces++;
      hash.update(c as Buffer);
      if (job.via === 'bulk') pool.release(c as Buffer);
    }
  }
  if (hash.digest('hex') !== job.digest) throw new Error(`${job.via}: digest mismatch`);
  report(t0, { pieces });
}
