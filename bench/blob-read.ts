// Benchmark (a script, not a test): what a blob body costs the reader, the measurement behind
// src/registry/bulk-get.ts and slab-pool.ts (docs/decisions.md "Snapshot transfer memory").
// Usage: npm run bench:blob-read      (VK_BENCH_BLOB_MIB=512, VK_BENCH_RUNS=3 by default)
// A server process (bench/blob-read-child.ts, node:http on loopback) holds VK_BENCH_BLOB_MIB of
// random bytes; each row runs in a process of its own with the daemon's V8 flags and reads the
// blob once, hashing it as it arrives:
//   - node:http: the client the daemon uses for everything else (64 KiB socket reads, each in
//     new memory);
//   - bulk-get, new memory: bulk-get.ts with its pieces never handed back (1 MiB slabs, each new);
//   - bulk-get, reused: each piece handed back once hashed, as the pull does once cocoon's
//     stdin took it;
// and, without a socket, the same bytes copied through 1 MiB buffers, new ones or two reused.
// CPU is the reading process's own (user + system) from the start of the read; peak RSS its
// VmHWM (Node.js and the modules included). Everything it starts it stops (the server ends with
// this process's pipe to it).
import { runBenchChild, spawnBenchChild } from './lib/child.ts';
import { envInt, machineLines } from './lib/harness.ts';
import { fmtN } from './lib/stats.ts';

const mib = envInt('VK_BENCH_BLOB_MIB', 512);
const runs = envInt('VK_BENCH_RUNS', 3);
interface Result {
  ms: number;
  cpuMs: number;
  hwmKiB: number;
  pieces?: number;
}

const server = spawnBenchChild('blob-read-child.ts', { op: 'serve', mib }, {}, { stdin: 'pipe' });
const stop = () => server.kill();
process.on('exit', stop);
for (const sig of ['SIGINT', 'SIGTERM'] as const)
  process.on(sig, () => {
    stop();
    process.exit(130);
  });
const { port, digest } = await new Promise<{ port: number; digest: string }>((resolve, reject) => {
  let out = '';
  server.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
    if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0] ?? ''));
  });
  server.on('exit', (code) => reject(new Error(`the blob server exited (${code})`)));
});

for (const line of machineLines()) console.log(line);
console.log(`blob: ${mib} MiB of random bytes from node:http on loopback, ${runs} run(s) of each row\n`);
console.log('| read | run | wall | CPU | pieces | peak RSS |');
console.log('|---|---|---|---|---|---|');
const url = `http://127.0.0.1:${port}/blob`;
const rows: [string, Record<string, unknown>][] = [
  ['node:http', { op: 'read', via: 'node:http', url, digest }],
  ['bulk-get, new memory', { op: 'read', via: 'bulk-fresh', url, digest }],
  ['bulk-get, reused', { op: 'read', via: 'bulk', url, digest }],
  ['1 MiB buffers, new (no socket)', { op: 'buffers', fresh: true, mib }],
  ['1 MiB buffers, two reused (no socket)', { op: 'buffers', fresh: false, mib }],
];
for (const [label, job] of rows) {
  for (let run = 1; run <= runs; run++) {
    const r = await runBenchChild<Result>('blob-read-child.ts', job, {});
    console.log(
      `| ${label} | ${run} | ${fmtN(r.ms / 1000, 2)} s | ${fmtN(r.cpuMs / 1000, 2)} s | ${r.pieces ?? '–'} | ${Math.round(r.hwmKiB / 1024)} MiB |`,
    );
  }
}
server.stdin?.end();
