// One side of a cross-host wake in a process of its own, for bench/peer-wake.ts: its peak RSS
// (VmHWM) and CPU are then the transfer's (plus Node.js and the modules it loads, reported
// separately as `idleKiB`), not the bench's, which also writes the test disk and runs the
// registry and the other side.
//   node bench/peer-wake-child.ts '<json job>'
// The job:
//   {op: 'serve', host, storeDir, cocoonBin, certFile, keyFile, plainHttp}: host A's PeerServer
//     (TLS with the given self-signed certificate, every caller authorized; plain HTTP, Go's
//     wire, only with `plainHttp` and only from 127.0.0.0/8) on
//     <host>:<free port>, resolving a plan's name with `cocoon snapshot inspect` on host A's
//     simulator; prints {port} once listening, then serves until SIGTERM/SIGINT or until its
//     stdin closes (the bench is gone);
//   {op: 'pull', registry: '<host:port>/<prefix>', cocoonBin, repo, tag, localName, spillDir}:
//     host B's registry wake, pullSnapshot (registry ⇒ verified stream ⇒ cocoon snapshot import);
//   {op: 'restore', registry, repo, tag, vmName, baseUrl, pinSha256, stagingRoot}: host B's peer
//     wake, the registry identity (manifest and config, as a wake reads it) then
//     PeerClient.restore into a staging directory, kept for the bench to check and remove.
// The simulator's environment comes through the process environment. 'pull' and 'restore' print
// one JSON line on stdout: {ms, bytes, idleKiB, hwmKiB, cpuMs, childrenCpuMs, dir?, files?}.
import fs from 'node:fs';
import { CocoonCli } from '../src/cocoon/runner.ts';
import { inspectSnapshot } from '../src/cocoon/snapshots.ts';
import { createLogger, silentLogger } from '../src/log.ts';
import { PeerClient } from '../src/peer/client.ts';
import { PeerServer } from '../src/peer/server.ts';
import { stagedBytesBound } from '../src/peer/wire.ts';
import { RegistryClient } from '../src/registry/client.ts';
import { readSnapshotIdentity } from '../src/registry/identity.ts';
import { pullSnapshot } from '../src/registry/pull.ts';
import { clockTicks, memOf, parseStatTimes } from './lib/procfs.ts';

interface ServeJob {
  op: 'serve';
  host: string;
  storeDir: string;
  cocoonBin: string;
  certFile: string;
  keyFile: string;
  plainHttp: boolean;
}

interface PullJob {
  op: 'pull';
  registry: string;
  cocoonBin: string;
  repo: string;
  tag: string;
  localName: string;
  spillDir: string;
}

interface RestoreJob {
  op: 'restore';
  registry: string;
  repo: string;
  tag: string;
  vmName: string;
  baseUrl: string;
  pinSha256: string;
  stagingRoot: string;
}

type Job = ServeJob | PullJob | RestoreJob;

/** What the daemon allows a restore to stage at most beyond the config's own bound (src/main.ts). */
const HOST_STAGING_BOUND = 2 ** 50;

const job = JSON.parse(process.argv[2] ?? '{}') as Job;
// VK_BENCH_CHILD_LOG=info (or debug): the transfer's own log lines on stderr.
const logLevel = process.env.VK_BENCH_CHILD_LOG;
const log = logLevel ? createLogger(logLevel) : silentLogger;
const lifetime = new AbortController();

/** Host A: serves until told to stop; a stop closes the server (its sockets and streams). */
async function serve(j: ServeJob): Promise<void> {
  const cli = new CocoonCli(j.cocoonBin, lifetime.signal, silentLogger);
  const server = new PeerServer({
    listen: { host: j.host, port: 0 },
    tls: { cert: fs.readFileSync(j.certFile, 'utf8'), key: fs.readFileSync(j.keyFile, 'utf8') },
    storeDir: j.storeDir,
    // The daemon (src/node/peer-host.ts) also checks its ledger; the bench serves any snapshot.
    resolve: async (name, signal) => {
      const rec = await inspectSnapshot(cli, name, signal);
      return rec ? { id: rec.id } : 'absent';
    },
    // The daemon requires a node client certificate verified against the cluster CA; the
    // bench authorizes every TLS caller (one handshake per connection either way), and plain
    // HTTP from loopback only (as VK_PEER_PLAIN_HTTP=127.0.0.0/8 would).
    authorize: async (who) =>
      who.transport === 'tls' || /^(::ffff:)?127\./.test(who.remoteAddress)
        ? { ok: true, node: 'bench-b' }
        : { ok: false, status: 403, message: 'plain HTTP is answered from loopback only' },
    allowPlainHttp: j.plainHttp,
    log,
  });
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    lifetime.abort();
    void server.close().finally(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();
  await server.start();
  process.stdout.write(`${JSON.stringify({ port: server.port })}\n`);
}

/** Host B: one wake's transfer, measured; prints the result line. */
async function transfer(j: PullJob | RestoreJob): Promise<void> {
  const registry = new RegistryClient({ base: j.registry, credentials: [] });
  try {
    const idleKiB = memOf(process.pid).rssKiB;
    let last = 0;
    let got = 0;
    const progress = logLevel
      ? setInterval(() => {
          log.info(
            { mib: Math.round(got / 2 ** 20), mibPerS: Math.round((got - last) / 2 ** 20) },
            'peer restore',
          );
          last = got;
        }, 1000)
      : undefined;
    const t0 = performance.now();
    let bytes = 0;
    let extra: { dir?: string; files?: number } = {};
    if (j.op === 'pull') {
      const cli = new CocoonCli(j.cocoonBin, lifetime.signal, silentLogger);
      await pullSnapshot({
        registry,
        cli,
        repo: j.repo,
        tag: j.tag,
        localName: j.localName,
        spillDir: j.spillDir,
        log,
        progressIntervalMs: logLevel ? 1000 : undefined,
      });
    } else {
      // What a wake reads before it asks a peer (ops/restore.ts): the manifest and config.
      const id = await readSnapshotIdentity(registry, j.repo, j.tag, lifetime.signal);
      if (id === 'absent') throw new Error(`${j.repo}:${j.tag} is absent from the registry`);
      const r = await new PeerClient().restore({
        baseUrl: j.baseUrl,
        pinSha256: j.pinSha256,
        vmName: j.vmName,
        config: id.config,
        stagingRoot: j.stagingRoot,
        signal: lifetime.signal,
        log,
        limits: { maxTotalBytes: stagedBytesBound(id.config, HOST_STAGING_BOUND) },
        onBytes: (n) => {
          got += n;
        },
      });
      bytes = r.bytes;
      extra = { dir: r.dir, files: r.files };
    }
    const ms = performance.now() - t0;
    if (progress) clearInterval(progress);
    const cpu = process.cpuUsage();
    const cpuMs = (cpu.user + cpu.system) / 1000;
    // cutime + cstime: the `cocoon` client processes this one waited for.
    const childrenCpuMs = parseStatTimes(
      fs.readFileSync('/proc/self/stat', 'latin1'),
      clockTicks(),
    ).childrenMs;
    process.stdout.write(
      `${JSON.stringify({ ms, bytes, idleKiB, hwmKiB: memOf(process.pid).hwmKiB, cpuMs, childrenCpuMs, ...extra })}\n`,
    );
  } finally {
    registry.close();
    lifetime.abort();
  }
}

if (job.op === 'serve') await serve(job);
else await transfer(job);
