// Benchmark (a script, not a test): a cross-host wake of a hibernated VM, peer against registry.
// Usage:
//   node_modules/.bin/node bench/peer-wake.ts                    # a 1 GiB and a 4 GiB sparse disk, a quarter of each random data
//   VK_BENCH_DISK_GIB=4 VK_BENCH_DATA_GIB=2 node_modules/.bin/node bench/peer-wake.ts
//   VK_BENCH_RUNS=3 node_modules/.bin/node bench/peer-wake.ts   # every row three times, alternating the order
// Starts the ground's CNCF distribution v3 registry (filesystem storage in the work directory)
// and, per disk size, two simulator roots: host A, which hibernated the VM, and host B, where it
// wakes. On A it saves a VM snapshot whose disk (`cow.raw`) is a sparse file of VK_BENCH_DISK_GIB
// (default: 1, then 4; a comma list is allowed) with VK_BENCH_DATA_GIB (default a quarter of the
// disk; fractions allowed) of random data spread through it in 16 MiB extents, plus 64 MiB of
// random memory, and pushes it as `<vm>:hibernate` with pushSnapshot (the hibernate, not
// measured as a row). Then it measures, on B:
//   - registry: pullSnapshot of `<vm>:hibernate` into `<vm>-hibernate-import` (manifest ⇒
//     config ⇒ verified blob streams ⇒ cocoon snapshot import), what a wake through the
//     registry costs;
//   - peer: the registry identity (manifest and config, as a wake reads it), then
//     PeerClient.restore over TLS pinned to A's self-signed certificate from A's PeerServer
//     (on 127.0.0.2, serving A's snapshot directory, names resolved by `cocoon snapshot
//     inspect`) into a staging directory, what a peer wake does before `cocoon vm clone
//     --from-dir`; the staged files are then compared with A's. The clone itself is not measured.
// MB/s is payload bytes (registry: layers and config as stored; peer: the slice bytes received)
// over wall time. Each transfer runs in a process of its own (bench/peer-wake-child.ts; the
// push in bench/transfer-child.ts), and so does A's peer server, all with the daemon's V8 flags
// (--max-semi-space-size=2 --no-opt --no-maglev --optimize-for-size): peak RSS is the transfer
// process's VmHWM, with its RSS before the transfer in brackets; the server's VmHWM is in the
// last column. CPU: the transfer process's own; then what A's peer server (with the `cocoon`
// client it ran), the registry and the simulators (both roots' servers, where import and
// inspect run, and the `cocoon` clients the transfer ran) spent during the phase.
// VK_BENCH_PEER_PLAIN=1 adds a peer row over plain HTTP (Go's wire; the server then answers it
// from 127.0.0.0/8). VK_BENCH_CHILD_FLAGS adds Node flags to the transfer processes (e.g.
// --cpu-prof --cpu-prof-dir=/tmp/prof), VK_BENCH_SERVER_FLAGS to the peer server;
// VK_BENCH_CHILD_LOG=info logs their progress every second on stderr.
// Everything it starts it stops (bench/lib/harness.ts teardown, the PID registry; the peer
// server also exits when the bench's end of its stdin closes).
import type { ChildProcess } from 'node:child_process';
import { randomFillSync, X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startRegistry, stopRegistry } from '../ground/registry.ts';
import { newSimRoot, type SimRoot } from '../sim/client.ts';
import { loadOrCreateServingCert } from '../src/kubelet/tls.ts';
import { certSha256 } from '../src/peer/transport.ts';
import { runBenchChild, spawnBenchChild } from './lib/child.ts';
import { Bench, envInt, machineLines } from './lib/harness.ts';
import { cpuTimes, memOf } from './lib/procfs.ts';
import { compareStaged, usage, writeSparseDisk } from './lib/sparse.ts';
import { fmtN, markdownTable } from './lib/stats.ts';

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const PEER_HOST = '127.0.0.2';

/** This machine's first non-loopback IPv4 address, if any. */
function nonLoopbackIpv4(): string | undefined {
  for (const list of Object.values(os.networkInterfaces()))
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  return undefined;
}
const IMAGE = 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04';

interface ChildResult {
  ms: number;
  bytes: number;
  /** The child's RSS before the transfer (Node.js and the modules it loaded). */
  idleKiB: number;
  /** The child's VmHWM at the end: its peak over its whole life. */
  hwmKiB: number;
  cpuMs: number;
  /** CPU time of the child's own children (the `cocoon` client processes it ran), ms. */
  childrenCpuMs: number;
  /** restore: the staging directory and the files staged. */
  dir?: string;
  files?: number;
}

interface Row {
  path: 'registry' | 'peer' | 'peer-plain';
  diskGiB: number;
  dataGiB: number;
  bytes: number;
  ms: number;
  peakKiB: number;
  startKiB: number;
  cpuMs: number;
  serverMs: number;
  registryMs: number;
  simMs: number;
  note: string;
}

/** CPU ms so far of a process (itself and the children it waited for); 0 when there is none. */
function cpuOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const t = cpuTimes(pid);
    return t.selfMs + t.childrenMs;
  } catch {
    return 0;
  }
}

/** Host A's peer server in a process of its own; resolves once it listens. */
function startPeerServer(
  job: Record<string, unknown>,
  env: Record<string, string>,
): Promise<{ child: ChildProcess; pid: number; port: number; stop: () => Promise<void> }> {
  return new Promise((resolve, reject) => {
    // stdin stays open while the bench lives: the server exits when it closes.
    const child = spawnBenchChild('peer-wake-child.ts', { op: 'serve', ...job }, env, {
      flagsVar: 'VK_BENCH_SERVER_FLAGS',
      stdin: 'pipe',
    });
    const exited = new Promise<void>((r) => child.once('close', () => r()));
    const stop = async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    };
    let stdout = '';
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    child.stdout?.on('data', (d: Buffer) => {
      stdout += d.toString();
      const nl = stdout.indexOf('\n');
      if (nl < 0 || child.pid === undefined) return;
      const { port } = JSON.parse(stdout.slice(0, nl)) as { port: number };
      resolve({ child, pid: child.pid, port, stop });
    });
    child.on('error', reject);
    child.on('close', (code) => reject(new Error(`the peer server exited ${code}: ${stderr.trim()}`)));
  });
}

function median(values: readonly number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] ?? Number.NaN) : ((s[mid - 1] ?? 0) + (s[mid] ?? 0)) / 2;
}

function diskSizes(): number[] {
  const raw = process.env.VK_BENCH_DISK_GIB ?? '';
  if (raw === '') return [1, 4];
  return raw.split(',').map((s) => {
    const n = Number(s.trim());
    if (!Number.isInteger(n) || n <= 0)
      throw new Error(`VK_BENCH_DISK_GIB=${raw}: expected positive integers`);
    return n;
  });
}

function dataGiBFor(diskGiB: number): number {
  const raw = process.env.VK_BENCH_DATA_GIB ?? '';
  if (raw === '') return diskGiB / 4;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0 || n > diskGiB)
    throw new Error(`VK_BENCH_DATA_GIB=${raw}: expected 0 < n ≤ the disk`);
  return n;
}

const bench = new Bench('peer-wake');
bench.run(async () => {
  const sizes = diskSizes();
  const runs = envInt('VK_BENCH_RUNS', 1);
  const plainToo = process.env.VK_BENCH_PEER_PLAIN === '1';
  const kindsRun: Row['path'][] = plainToo ? ['registry', 'peer', 'peer-plain'] : ['registry', 'peer'];
  // A production registry speaks HTTPS: the registry wake pays TLS as the peer wake does. The
  // registry client treats loopback as plain HTTP, so the TLS registry listens on this machine's
  // first non-loopback IPv4 address (its self-signed certificate trusted by the transfer processes
  // through NODE_EXTRA_CA_CERTS); without one, or with VK_BENCH_REGISTRY_PLAIN=1, plain HTTP on
  // loopback.
  const regHost = process.env.VK_BENCH_REGISTRY_PLAIN === '1' ? undefined : nonLoopbackIpv4();
  let regTls: { host: string; certFile: string; keyFile: string } | undefined;
  if (regHost) {
    const certFile = path.join(bench.dir, 'registry.crt');
    const keyFile = path.join(bench.dir, 'registry.key');
    const made = await loadOrCreateServingCert(certFile, keyFile, {
      dns: ['bench-registry'],
      ips: [regHost],
    });
    fs.writeFileSync(certFile, made.cert);
    fs.writeFileSync(keyFile, made.key, { mode: 0o600 });
    regTls = { host: regHost, certFile, keyFile };
  }
  bench.log(
    `starting the distribution registry (${regTls ? `HTTPS on ${regTls.host}` : 'plain HTTP on loopback'})`,
  );
  const reg = await startRegistry(path.join(bench.dir, 'registry'), { kind: 'distribution', tls: regTls });
  const trust: Record<string, string> = regTls ? { NODE_EXTRA_CA_CERTS: regTls.certFile } : {};
  const sims = new Set<SimRoot>();
  let server: Awaited<ReturnType<typeof startPeerServer>> | undefined;
  const rows: Row[] = [];
  const pushes: string[] = [];
  try {
    // Host A's peer certificate, made as the daemon makes its own (self-signed; the pin is its identity).
    const certFile = path.join(bench.dir, 'peer.crt');
    const keyFile = path.join(bench.dir, 'peer.key');
    const made = await loadOrCreateServingCert(certFile, keyFile, { dns: ['bench-a'], ips: [PEER_HOST] });
    fs.writeFileSync(certFile, made.cert);
    fs.writeFileSync(keyFile, made.key, { mode: 0o600 });
    const pin = certSha256(new X509Certificate(made.cert));

    for (const diskGiB of sizes) {
      const dataGiB = dataGiBFor(diskGiB);
      const vm = `wake-${diskGiB}g`;
      const simA = await newSimRoot({ parent: bench.dir });
      sims.add(simA);
      const simB = await newSimRoot({ parent: bench.dir });
      sims.add(simB);
      bench.check();
      await simA.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
      await simB.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
      const cloneArgv = ['vm', 'clone', '--output', 'json', '--name', vm, 'base'];
      const clone = await simA.json<{ id: string }>(cloneArgv);
      const saved = await simA.run(['snapshot', 'save', '--name', vm, clone.id]);
      if (saved.code !== 0) throw new Error(`snapshot save: ${saved.stderr.trim()}`);
      const storeA = path.join(simA.root, 'snapshot', 'localfile');
      const dataDir = path.join(storeA, saved.stdout.trim());
      bench.log(
        `${vm}: writing the disk: ${diskGiB} GiB sparse, ${fmtN(dataGiB, 2)} GiB random data in 16 MiB extents`,
      );
      writeSparseDisk(path.join(dataDir, 'cow.raw'), diskGiB * GiB, dataGiB * GiB);
      fs.writeFileSync(path.join(dataDir, 'memory-range-0'), randomFillSync(Buffer.alloc(64 * MiB)));
      bench.check();

      bench.log(`${vm}: hibernate push (pushSnapshot) from host A`);
      const push = await runBenchChild<ChildResult>(
        'transfer-child.ts',
        {
          op: 'push',
          registry: `${reg.hostPort}/bench`,
          cocoonBin: simA.cocoonBin,
          localName: vm,
          repo: vm,
          tag: 'hibernate',
          baseImage: IMAGE,
          spoolDir: bench.dir,
        },
        { ...simA.env(), ...trust },
      );
      const payload = push.bytes;
      pushes.push(
        `${vm}: push ${fmtN(payload / MiB, 0)} MiB in ${fmtN(push.ms / 1000, 1)} s (${fmtN(payload / 1e6 / (push.ms / 1000), 0)} MB/s), peak RSS ${fmtN(push.hwmKiB / 1024, 0)} MiB`,
      );
      bench.check();

      bench.log(`${vm}: starting host A's peer server on ${PEER_HOST}`);
      server = await startPeerServer(
        {
          host: PEER_HOST,
          storeDir: storeA,
          cocoonBin: simA.cocoonBin,
          certFile,
          keyFile,
          plainHttp: plainToo,
        },
        simA.env(),
      );
      const srv = server;
      /** CPU ms so far of A's peer server, the registry and both simulator servers. */
      const others = () => ({
        serverMs: cpuOf(srv.pid),
        registryMs: cpuOf(reg.pid),
        simMs: cpuOf(simA.serverPid) + cpuOf(simB.serverPid),
      });
      const phase = async (fn: () => Promise<ChildResult>) => {
        const before = others();
        const r = await fn();
        const after = others();
        return {
          r,
          serverMs: after.serverMs - before.serverMs,
          registryMs: after.registryMs - before.registryMs,
          simMs: after.simMs - before.simMs + r.childrenCpuMs,
        };
      };
      const stagingRoot = path.join(simB.root, 'vk-staging');
      const registry = `${reg.hostPort}/bench`;
      const importName = `${vm}-hibernate-import`;
      /** One wake on host B, measured; its row. */
      const wake = async (which: Row['path'], suffix: string): Promise<Row> => {
        const tls = which === 'peer';
        const p = await phase(() =>
          runBenchChild<ChildResult>(
            'peer-wake-child.ts',
            which === 'registry'
              ? {
                  op: 'pull',
                  registry,
                  cocoonBin: simB.cocoonBin,
                  repo: vm,
                  tag: 'hibernate',
                  localName: importName,
                  spillDir: bench.dir,
                }
              : {
                  op: 'restore',
                  registry,
                  repo: vm,
                  tag: 'hibernate',
                  vmName: vm,
                  baseUrl: `${tls ? 'https' : 'http'}://${PEER_HOST}:${srv.port}`,
                  pinSha256: tls ? pin : undefined,
                  stagingRoot,
                },
            { ...simB.env(), ...trust },
          ),
        );
        const row = {
          path: which,
          diskGiB,
          dataGiB,
          bytes: p.r.bytes,
          ms: p.r.ms,
          peakKiB: p.r.hwmKiB,
          startKiB: p.r.idleKiB,
          cpuMs: p.r.cpuMs,
          serverMs: p.serverMs,
          registryMs: p.registryMs,
          simMs: p.simMs,
        };
        if (which === 'registry') {
          const removed = await simB.run(['snapshot', 'rm', importName]);
          if (removed.code !== 0) throw new Error(`snapshot rm: ${removed.stderr.trim()}`);
          return {
            ...row,
            bytes: payload,
            serverMs: Number.NaN,
            note: `registry${suffix}: manifest ⇒ config ⇒ verified streams ⇒ snapshot import`,
          };
        }
        const staged = p.r.dir ?? '';
        const u = usage(staged);
        const problem = await compareStaged(staged, dataDir);
        fs.rmSync(staged, { recursive: true, force: true });
        if (problem) throw new Error(`peer restore staged wrong bytes: ${problem}`);
        return {
          ...row,
          note:
            `peer${suffix}: identity ⇒ plan ⇒ ${p.r.files} files staged over ${tls ? 'TLS (pinned)' : 'plain HTTP'}, ` +
            `${fmtN(u.allocated / MiB, 0)} MiB allocated of ${fmtN(u.apparent / MiB, 0)} MiB, equal to A's; ` +
            `server peak RSS ${fmtN(memOf(srv.pid).hwmKiB / 1024, 0)} MiB`,
        };
      };
      for (let run = 1; run <= runs; run++) {
        const suffix = runs > 1 ? ` #${run}` : '';
        for (const which of run % 2 === 1 ? kindsRun : [...kindsRun].reverse()) {
          bench.log(`${vm}: ${which} wake on host B${suffix}`);
          rows.push(await wake(which, suffix));
          bench.check();
        }
      }
      await srv.stop();
      server = undefined;
      for (const sim of [simA, simB]) {
        await sim.cleanup({ keepDir: Boolean(process.env.VK_BENCH_KEEP) });
        sims.delete(sim);
      }
    }

    console.log('');
    for (const l of machineLines(undefined, bench)) console.log(l);
    console.log(
      `registry: ${reg.version} ${regTls ? `over HTTPS on ${regTls.host}` : 'over plain HTTP on loopback'}, filesystem storage under ${os.tmpdir()}; ` +
        `peer server: PeerServer on ${PEER_HOST}, TLS (self-signed, pinned), every caller authorized`,
    );
    for (const l of pushes) console.log(`hibernate ${l}`);
    console.log('');
    const sec = (ms: number) => (Number.isFinite(ms) ? `${fmtN(ms / 1000, 1)} s` : '–');
    console.log(
      markdownTable(
        [
          'wake',
          'disk (data)',
          'payload',
          'wall',
          'MB/s',
          'peak RSS (idle)',
          'CPU',
          'CPU peer server / registry / simulator',
          'what',
        ],
        rows.map((r) => [
          r.path === 'registry'
            ? 'registry: pullSnapshot'
            : `peer: PeerClient.restore${r.path === 'peer-plain' ? ' (plain HTTP)' : ''}`,
          `${r.diskGiB} GiB (${fmtN(r.dataGiB, 2)})`,
          `${fmtN(r.bytes / MiB, 0)} MiB`,
          `${fmtN(r.ms / 1000, 1)} s`,
          fmtN(r.bytes / 1e6 / (r.ms / 1000), 0),
          `${fmtN(r.peakKiB / 1024, 0)} MiB (${fmtN(r.startKiB / 1024, 0)})`,
          sec(r.cpuMs),
          `${sec(r.serverMs)} / ${sec(r.registryMs)} / ${sec(r.simMs)}`,
          r.note,
        ]),
      ),
    );
    console.log('');
    for (const diskGiB of sizes) {
      const wall = (p: Row['path']) =>
        median(rows.filter((r) => r.diskGiB === diskGiB && r.path === p).map((r) => r.ms));
      const regMs = wall('registry');
      for (const p of kindsRun) {
        if (p === 'registry') continue;
        const ms = wall(p);
        console.log(
          `peer${p === 'peer-plain' ? ' (plain HTTP)' : ''} is ${fmtN(regMs / ms, 1)}x faster than the registry at ${diskGiB} GiB ` +
            `(wall${runs > 1 ? ', median' : ''}: registry ${fmtN(regMs / 1000, 1)} s, peer ${fmtN(ms / 1000, 1)} s)`,
        );
      }
    }
  } finally {
    await server?.stop().catch(() => {});
    for (const sim of sims) await sim.cleanup({ keepDir: true }).catch(() => {});
    await stopRegistry(reg).catch(() => {});
  }
});
