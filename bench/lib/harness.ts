// What every benchmark script shares: a work directory, a PID registry and a teardown that
// stops everything the bench started however it ends (done, an error, SIGINT/SIGTERM, a crash:
// ground/proc.ts installTeardown), one test ground with the apiserver's audit log, and
// "daemon environments" (a simulator root + a vk-cocoon on its own node name + a namespace).
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import type { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { repoRoot } from '../../ground/cluster.ts';
import { type Daemon, type DaemonOptions, startDaemon } from '../../ground/daemon.ts';
import { type Ground, startGround, stopGround } from '../../ground/ground.ts';
import { adminClients, newNamespace } from '../../ground/kube.ts';
import { installTeardown, openPidRegistry } from '../../ground/proc.ts';
import { newSimRoot, type SimRoot } from '../../sim/client.ts';
import { AuditTail } from './audit.ts';

/** Daemon settings a bench run passes through from its own environment. */
export const PASS_THROUGH = [
  'VK_KUBE_QPS',
  'VK_KUBE_BURST',
  'VK_KUBE_EVENT_QPS',
  'VK_KUBE_EVENT_BURST',
  'VK_RECONCILE_INTERVAL_SECONDS',
  'VK_READY_DEADLINE_SECONDS',
];

/** One simulator root, one vk-cocoon on its own node name, one namespace for its pods. */
export interface DaemonEnv {
  label: string;
  nodeName: string;
  ns: string;
  sim: SimRoot;
  daemon: Daemon;
  daemonOpts: DaemonOptions;
  core: CoreV1Api;
  kc: KubeConfig;
  /** The clone source every bench pod uses. */
  image: string;
}

export class Bench {
  readonly name: string;
  readonly dir: string;
  readonly log: (line: string) => void;
  ground: Ground | undefined;
  audit: AuditTail | undefined;
  stopping = false;
  /** Simulator roots to clean and daemons to stop at teardown (the env once its daemon runs). */
  readonly #live = new Set<{ sim: SimRoot; env?: DaemonEnv }>();
  readonly #end: ReturnType<typeof installTeardown>;
  /** The release tree's launcher and version once built (VK_BENCH_RELEASE=1), else undefined:
   * the checkout's bin/vk-cocoon. */
  release: { bin: string; version: string; cache: string } | undefined;
  /** 1-minute load average when the bench started (the machine may be shared). */
  readonly loadAtStart = os.loadavg()[0] ?? 0;
  /** Bulky paths (test disks, registry storage) removed at teardown in every outcome. */
  readonly #bulky = new Set<string>();

  constructor(name: string) {
    this.name = name;
    this.dir = mkdtempSync(join(tmpdir(), `vk-${name}-`));
    const registry = openPidRegistry(join(this.dir, 'pids'));
    this.log = (line: string) => console.log(`${name}: ${line}`);
    this.log(`work dir ${this.dir}`);
    this.#end = installTeardown(
      async (why) => {
        this.stopping = true;
        if (why.kind === 'signal') this.log(`${why.signal}: stopping`);
        for (const { sim, env } of this.#live) {
          if (env) await Promise.race([env.daemon.stop().catch(() => null), sleep(15_000)]);
          await sim.cleanup({ keepDir: true }).catch(() => {});
        }
        if (this.ground) await stopGround(this.ground).catch(() => {});
        // After installTeardown has stopped whatever is left in the registry (the registry
        // server, the simulator), so nothing writes there any more.
        // VK_BENCH_KEEP keeps them too.
        if (!process.env.VK_BENCH_KEEP) {
          process.once('exit', () => {
            for (const p of this.#bulky) rmSync(p, { recursive: true, force: true });
          });
        }
        if (why.kind === 'done' && why.code === 0 && !process.env.VK_BENCH_KEEP) {
          // After installTeardown has stopped whatever is left in the registry.
          process.once('exit', () => rmSync(this.dir, { recursive: true, force: true }));
        } else {
          this.log(`logs kept in ${this.dir}`);
        }
        return undefined;
      },
      { registry, log: this.log },
    );
  }

  /** Runs the bench's main function, then the teardown (exit code 0, or 1 on an error). */
  run(main: () => Promise<void>): void {
    main().then(
      () => this.#end({ kind: 'done', code: 0 }),
      (error: unknown) => this.#end({ kind: 'error', error }),
    );
  }

  /** Removes `path` at teardown however the bench ends (the logs next to it are kept on a
   * failure; gigabytes of test data are not). Returns `path`. */
  removeAtEnd(path: string): string {
    this.#bulky.add(path);
    return path;
  }

  /** Throws when a signal started the teardown (long phases call it between steps). */
  check(): void {
    if (this.stopping) throw new Error('stopping');
  }

  /** Starts the control plane with the audit log. */
  async startGround(): Promise<Ground> {
    const g = await startGround(join(this.dir, 'ground'), { log: (l) => this.log(l), audit: true });
    this.ground = g;
    this.check();
    if (!g.cluster.auditLog) throw new Error('the ground has no audit log');
    this.audit = new AuditTail(g.cluster.auditLog);
    return g;
  }

  /**
   * With VK_BENCH_RELEASE=1 (or `--release`), builds the release artifact (scripts/release.sh,
   * into the work directory; VK_BENCH_RELEASE=<artifact.tar.gz> takes one built before),
   * unpacks it there and warms its compile cache with one `--version` start (as a host's
   * second start finds it), so that every daemon this bench starts is the release build: its
   * stripped JavaScript on its own runtime, through its own launcher (packaging/launcher.sh)
   * and flags. Without it, daemons run from the checkout.
   */
  async prepareDaemon(): Promise<void> {
    if (!releaseWanted() || this.release) return;
    const run = promisify(execFile);
    let artifact = process.env.VK_BENCH_RELEASE ?? '';
    if (artifact.endsWith('.tar.gz')) {
      this.log(`using the release artifact ${artifact}`);
    } else {
      const dist = join(this.dir, 'dist');
      this.log('building the release tree (scripts/release.sh)');
      const { stdout } = await run('bash', [join(repoRoot, 'scripts', 'release.sh'), '--out', dist], {
        // Gzip level 1: the tarball is only unpacked here (the tree is the same at any level).
        env: { ...process.env, VK_RELEASE_GZIP_LEVEL: '1' },
        maxBuffer: 16 << 20,
      });
      artifact = stdout.trim().split('\n').at(-1) ?? '';
    }
    const tree = join(this.dir, 'release');
    mkdirSync(tree, { recursive: true });
    await run('tar', ['-xzf', artifact, '-C', tree]);
    // The artifact's one top directory (vk-cocoon-<version>-linux-<arch>/).
    const top = join(tree, readdirSync(tree)[0] ?? '');
    const bin = join(top, 'bin', 'vk-cocoon');
    const cache = join(this.dir, 'release-compile-cache');
    const version = (
      await run(bin, ['--version'], {
        env: { PATH: '/usr/bin:/bin', HOME: this.dir, NODE_COMPILE_CACHE: cache },
      })
    ).stdout.trim();
    this.release = { bin, version, cache };
    this.log(`daemons run the release build ${version} (${top})`);
    this.check();
  }

  /** Which daemon build runs: printed above the results. */
  daemonLine(): string {
    return this.release
      ? `daemon: the release build ${this.release.version} (scripts/release.sh, bin/vk-cocoon of the unpacked tree)`
      : 'daemon: the checkout (bin/vk-cocoon on src/*.ts; VK_BENCH_RELEASE=1 or --release runs the release build)';
  }

  /** A fresh simulator root, namespace and daemon (node `label`) with a clonable snapshot. */
  async newEnv(label: string, opts: { pods: number }): Promise<DaemonEnv> {
    const g = this.ground;
    if (!g) throw new Error('startGround first');
    await this.prepareDaemon();
    const sim = await newSimRoot({ parent: this.dir });
    const live: { sim: SimRoot; env?: DaemonEnv } = { sim };
    this.#live.add(live);
    const image = 'bench/base';
    await sim.fixtureSnapshot(image, {
      backend: 'cloud-hypervisor',
      os: 'linux',
      image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
    });
    const { core, kc } = adminClients(g.cluster);
    const ns = await newNamespace(core, label);
    const daemonEnv: Record<string, string> = {
      ...sim.env(),
      VK_LOG_LEVEL: process.env.VK_LOG_LEVEL ?? 'info',
      // The node's pod capacity: CreatePod admission rejects past it (OutOfpods), so every
      // size fits. cpu and memory likewise: admission counts every VM at its size (2 vCPUs and
      // 2 GiB for the bench's snapshot) against what the node advertises less its reserve, and
      // ground/daemon.ts's default (1024 cpus, 2 TiB) held about 409 VMs (OutOfcpu past it).
      VK_NODE_PODS: String(Math.max(256, opts.pods)),
      VK_NODE_CPU: String(Math.max(1024, 4 * opts.pods)),
      VK_NODE_MEM: `${Math.max(2048, 4 * opts.pods)}Gi`,
    };
    for (const k of PASS_THROUGH) if (process.env[k]) daemonEnv[k] = process.env[k] as string;
    if (this.release) daemonEnv.NODE_COMPILE_CACHE = this.release.cache;
    // Node flags for the daemon alone, e.g. VK_BENCH_DAEMON_NODE_OPTIONS="--cpu-prof --cpu-prof-dir=/tmp/prof".
    if (process.env.VK_BENCH_DAEMON_NODE_OPTIONS)
      daemonEnv.NODE_OPTIONS = process.env.VK_BENCH_DAEMON_NODE_OPTIONS;
    // Other variables for the daemon alone (space-separated NAME=value), e.g.
    // VK_BENCH_DAEMON_ENV="MALLOC_ARENA_MAX=2" to measure an allocator setting.
    for (const pair of (process.env.VK_BENCH_DAEMON_ENV ?? '').split(/\s+/)) {
      const eq = pair.indexOf('=');
      if (eq > 0) daemonEnv[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
    const daemonOpts: DaemonOptions = {
      cluster: g.cluster,
      nodeName: label,
      cocoonBin: sim.cocoonBin,
      rootDir: sim.root,
      leasesPath: sim.leasesPath,
      logFile: join(this.dir, `vk-cocoon-${label}.log`),
      env: daemonEnv,
      ...(this.release ? { bin: this.release.bin } : {}),
    };
    const daemon = await startDaemon(daemonOpts);
    const env: DaemonEnv = { label, nodeName: label, ns, sim, daemon, daemonOpts, core, kc, image };
    live.env = env;
    this.check();
    return env;
  }

  /** SIGKILLs the env's daemon (a crash). */
  async killDaemon(env: DaemonEnv): Promise<void> {
    await env.daemon.kill();
  }

  /** Starts the env's daemon again (same node, simulator root and lease file); resolves once
   * it serves /healthz, which it does only after its startup reconcile, pod controller and
   * node registration. */
  async startDaemonAgain(env: DaemonEnv): Promise<Daemon> {
    env.daemon = await startDaemon(env.daemonOpts);
    return env.daemon;
  }

  /**
   * Stops the env's daemon (SIGTERM), then removes its pods at once (grace 0: no kubelet is
   * left to confirm a graceful deletion), its namespace and its node object, and cleans the
   * simulator root, so the next size starts from an empty node.
   */
  async dropEnv(env: DaemonEnv): Promise<void> {
    await Promise.race([env.daemon.stop().catch(() => null), sleep(15_000)]);
    await env.daemon.kill().catch(() => {});
    const { core, ns } = env;
    await core.deleteCollectionNamespacedPod({ namespace: ns, gracePeriodSeconds: 0 }).catch((e: unknown) => {
      this.log(`deleting the pods of ${ns}: ${e instanceof Error ? e.message : String(e)}`);
    });
    await core.deleteNamespace({ name: ns }).catch(() => {});
    await core.deleteNode({ name: env.nodeName }).catch(() => {});
    await env.sim.cleanup({ keepDir: true }).catch(() => {});
    for (const l of this.#live) if (l.sim === env.sim) this.#live.delete(l);
  }
}

/** Whether the daemons are the release build: VK_BENCH_RELEASE=1, or `--release` among the
 * arguments (which the scripts' own argument parsing then skips), or VK_BENCH_RELEASE=<an
 * artifact of scripts/release.sh> (a `.tar.gz` built before, e.g. of another commit). */
export function releaseWanted(): boolean {
  const v = process.env.VK_BENCH_RELEASE ?? '';
  return v === '1' || v.endsWith('.tar.gz') || process.argv.includes('--release');
}

/** The script's arguments without `--release`. */
export function benchArgs(): string[] {
  return process.argv.slice(2).filter((a) => a !== '--release');
}

/** The machine, printed above every result. */
export function machineLines(g?: Ground, bench?: Bench): string[] {
  const cpus = os.cpus();
  const load = (os.loadavg()[0] ?? 0).toFixed(1);
  return [
    `machine: ${os.availableParallelism()} CPUs (nproc), ${cpus[0]?.model.trim() ?? 'unknown CPU'}, ` +
      `${(os.totalmem() / 2 ** 30).toFixed(1)} GiB RAM, ${os.type()} ${os.release()}`,
    `node ${process.version} (daemon and simulator)` + (g ? `, kube-apiserver ${g.cluster.version}` : ''),
    `load average (1 min): ${bench ? `${bench.loadAtStart.toFixed(1)} at the start, ` : ''}${load} at the end`,
    ...(bench ? [bench.daemonLine()] : []),
  ];
}

/** A positive integer from the environment, or the default. */
export function envInt(name: string, dflt: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name}=${raw}: expected a positive integer`);
  return n;
}
