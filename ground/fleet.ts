// A fleet: N vk-cocoon hosts against one ground (control plane + registry), each with what a
// real host has of its own: a cocoon simulator root (its VMs, snapshots, lease file), a staging
// dir, a node name, a node IP and ports. `startFleet` for scripts (the demo, `npm run cluster
// -- up --hosts N`), `useFleet` for integration tests (in the style of useWorld).
//
// Addresses: every 127/8 address is loopback on Linux, so a fleet picks a random /24 inside it,
// 127.<1..254>.<0..254>.0/24 (never 127.0.0.0/24, where 127.0.0.1 lives), and host i (0-based)
// gets .(i+2): concurrent fleets of one test run do not collide. The daemon listens on the
// kubelet port on every address, so each host also has a kubelet port of its own; its node's
// InternalIP (VK_NODE_IP) is the host's address, which is where the apiserver proxies logs and
// exec. One peer port serves the whole fleet: VK_PEER_ADDR=<host ip>:<peer port> on each host.
import { randomBytes, randomInt } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach } from 'node:test';
import type { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { type Knobs, newSimRoot, SimRoot } from '../sim/client.ts';
import { type Daemon, startDaemon } from './daemon.ts';
import { type Ground, type UseGroundOptions, useGround } from './ground.ts';
import { adminClients, newNamespace } from './kube.ts';
import { freePort, isAlive, procStart, stopPid } from './proc.ts';

export interface FleetOptions {
  ground: Ground;
  /** Number of hosts (at least 1, at most 253: the host part of the fleet's /24). */
  hosts: number;
  /** The fleet's directory: one sub-directory per host (its simulator root, staging dir, log). */
  dir: string;
  /** Environment of every host's daemon (after the fleet's own, before `restart(env)`'s). */
  env?: Record<string, string>;
  log?: (line: string) => void;
  /** Node names are `<prefix><i+1>` (default `vk-<6 hex>-h`). */
  namePrefix?: string;
  /** Simulator knobs of every host (NewSimRootOptions.knobs). */
  knobs?: Knobs;
  /** DaemonOptions.identity of every host. */
  identity?: 'node' | 'provider';
  /**
   * Hosts that outlive this process (`npm run cluster -- up --hosts N`): daemons detached, and
   * no simulator servers (a server exits with the process that started it; without one every
   * `cocoon` call is a process of its own).
   */
  detached?: boolean;
}

export interface FleetHost {
  /** 0-based position in the fleet. */
  index: number;
  /** The node name. */
  name: string;
  /** VK_NODE_IP, the node's InternalIP: `<fleet subnet>.<index+2>`. */
  ip: string;
  /** The host's directory. */
  dir: string;
  /** COCOON_ROOT_DIR of the host's simulator. */
  simRoot: string;
  simulator: SimRoot;
  cocoonBin: string;
  leasesPath: string;
  /** VK_STAGING_DIR: `<host dir>/staging`. */
  stagingDir: string;
  /** VK_COCOON_SNAPSHOT_DIR: the simulator root's `snapshot/localfile`. */
  snapshotDir: string;
  kubeletPort: number;
  /** VK_PEER_ADDR: `<ip>:<fleet peer port>`. */
  peerAddr: string;
  /** The running daemon (replaced by `restart`). */
  daemon: Daemon;
  logFile: string;
  /** Starts the daemon again (after `kill`, `killHost` or `daemon.stop()`), same ports and dirs;
   * `identity`: this start's credentials (default: the fleet's). */
  restart(env?: Record<string, string>, identity?: 'node' | 'provider'): Promise<Daemon>;
  /** SIGKILL of the daemon only: the host's VMs (simulator stand-ins) keep running. */
  kill(): Promise<void>;
  /** The host is gone: SIGKILL of the daemon, every VM stand-in and simulator process of it. */
  killHost(): Promise<void>;
}

export interface Fleet {
  ground: Ground;
  dir: string;
  /** The fleet's /24 inside 127/8 as its first three octets, e.g. `127.83.12`. */
  subnet: string;
  /** The one peer port of the fleet (VK_PEER_ADDR of every host). */
  peerPort: number;
  /** OCI_REGISTRY of every host (unless `env` names another): the ground's registry. */
  registry: string;
  hosts: FleetHost[];
}

/** A random /24 inside 127/8 other than 127.0.0.0/24, as its first three octets. */
export function fleetSubnet(): string {
  return `127.${randomInt(1, 255)}.${randomInt(0, 255)}`;
}

/**
 * Starts `hosts` daemons (in parallel) against the ground. When one fails to start, everything
 * started so far is stopped and the error is thrown.
 */
export async function startFleet(o: FleetOptions): Promise<Fleet> {
  if (!Number.isInteger(o.hosts) || o.hosts < 1 || o.hosts > 253)
    throw new Error(`startFleet: hosts must be an integer in 1..253, not ${o.hosts}`);
  mkdirSync(o.dir, { recursive: true });
  const id = randomBytes(3).toString('hex');
  const prefix = o.namePrefix ?? `vk-${id}-h`;
  const subnet = fleetSubnet();
  const peerPort = await freePort();
  const fleet: Fleet = {
    ground: o.ground,
    dir: o.dir,
    subnet,
    peerPort,
    registry: `${o.ground.registry.hostPort}/fleet-${id}`,
    hosts: [],
  };
  o.log?.(`fleet: ${o.hosts} hosts on ${subnet}.0/24, peer port ${peerPort}`);
  const started = await Promise.allSettled(
    Array.from({ length: o.hosts }, (_, index) => startHost(fleet, o, index, `${prefix}${index + 1}`)),
  );
  for (const r of started) if (r.status === 'fulfilled') fleet.hosts.push(r.value);
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await stopFleet(fleet);
    throw failed.reason;
  }
  fleet.hosts.sort((a, b) => a.index - b.index);
  return fleet;
}

async function startHost(fleet: Fleet, o: FleetOptions, index: number, name: string): Promise<FleetHost> {
  const ip = `${fleet.subnet}.${index + 2}`;
  const dir = join(o.dir, name);
  const stagingDir = join(dir, 'staging');
  mkdirSync(stagingDir, { recursive: true });
  const simulator = await newSimRoot({
    parent: dir,
    knobs: o.knobs,
    ...(o.detached ? { server: false } : {}),
  });
  const snapshotDir = join(simulator.root, 'snapshot', 'localfile');
  mkdirSync(snapshotDir, { recursive: true });
  // Picked by the first start (ground/daemon.ts retries a port taken meanwhile), then kept.
  let kubeletPort: number | undefined;
  const peerAddr = `${ip}:${fleet.peerPort}`;
  const logFile = join(dir, 'vk-cocoon.log');
  const host: FleetHost = {
    index,
    name,
    ip,
    dir,
    simRoot: simulator.root,
    simulator,
    cocoonBin: simulator.cocoonBin,
    leasesPath: simulator.leasesPath,
    stagingDir,
    snapshotDir,
    kubeletPort: 0,
    peerAddr,
    daemon: undefined as unknown as Daemon,
    logFile,
    restart: async (env, identity) => {
      // After killHost the simulator's server and guest network are gone too: a host coming
      // back has them again.
      simulator.ensureGuestNet();
      if (!o.detached) await simulator.startServer();
      host.daemon = await startDaemon({
        cluster: fleet.ground.cluster,
        nodeName: name,
        cocoonBin: simulator.cocoonBin,
        rootDir: simulator.root,
        leasesPath: simulator.leasesPath,
        logFile,
        nodeIp: ip,
        kubeletPort,
        identity: identity ?? o.identity,
        detached: o.detached,
        env: {
          ...simulator.env(),
          OCI_REGISTRY: fleet.registry,
          VK_PEER_ADDR: peerAddr,
          VK_STAGING_DIR: stagingDir,
          VK_COCOON_SNAPSHOT_DIR: snapshotDir,
          ...o.env,
          ...env,
        },
      });
      kubeletPort = host.daemon.kubeletPort;
      host.kubeletPort = kubeletPort;
      return host.daemon;
    },
    kill: async () => {
      await host.daemon?.kill();
    },
    killHost: async () => {
      await host.daemon?.kill();
      await simulator.cleanup({ keepDir: true });
    },
  };
  try {
    await host.restart();
  } catch (err) {
    await simulator.cleanup({ keepDir: true }).catch(() => {});
    throw err;
  }
  o.log?.(
    `fleet: host ${name} at ${ip} (kubelet :${host.kubeletPort}, pid ${host.daemon.pid}); log ${logFile}`,
  );
  return host;
}

/** A Linux cloud-hypervisor clone source named `name` in every host's simulator. */
export async function fixtureOnEveryHost(hosts: readonly FleetHost[], name: string): Promise<void> {
  await Promise.all(
    hosts.map((h) =>
      h.simulator.fixtureSnapshot(name, {
        backend: 'cloud-hypervisor',
        os: 'linux',
        image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      }),
    ),
  );
}

/** Stops every host: its daemon (SIGTERM, SIGKILL after 15 s), then its simulator's processes. */
export async function stopFleet(f: Fleet): Promise<void> {
  await Promise.all(
    f.hosts.map(async (h) => {
      const d = h.daemon;
      if (d && isAlive(d.pid)) {
        const stopped = d.stop().catch(() => null);
        const grace = new Promise<'late'>((r) => setTimeout(r, 15_000, 'late').unref());
        if ((await Promise.race([stopped, grace])) === 'late') await stopPid(d.pid, 0);
      }
      await h.simulator.cleanup({ keepDir: true }).catch(() => {});
    }),
  );
}

/** What another process needs to find and stop a detached fleet (`npm run cluster`'s fleet.json). */
export interface FleetRecord {
  subnet: string;
  peerPort: number;
  registry: string;
  hosts: {
    name: string;
    ip: string;
    kubeletPort: number;
    pid: number;
    /** The daemon's start time (ground/proc.ts procStart): a reused PID is never signalled. */
    start: number | undefined;
    simDir: string;
    logFile: string;
  }[];
}

export function fleetRecord(f: Fleet): FleetRecord {
  return {
    subnet: f.subnet,
    peerPort: f.peerPort,
    registry: f.registry,
    hosts: f.hosts.map((h) => ({
      name: h.name,
      ip: h.ip,
      kubeletPort: h.kubeletPort,
      pid: h.daemon.pid,
      start: procStart(h.daemon.pid),
      simDir: h.simulator.dir,
      logFile: h.logFile,
    })),
  };
}

/** Stops the hosts of a record from any process: each daemon by PID (SIGTERM, SIGKILL after
 * 15 s), then its simulator's processes (`cocoon-sim __sim kill-all` on its root). */
export async function stopFleetRecord(r: FleetRecord): Promise<void> {
  await Promise.all(
    r.hosts.map(async (h) => {
      if (h.start !== undefined && procStart(h.pid) === h.start) await stopPid(h.pid, 15_000);
      await new SimRoot(h.simDir).cleanup({ keepDir: true }).catch(() => {});
    }),
  );
}

/** What `useFleet` gives a test: the fleet, its ground, admin clients and its namespace. */
export interface FleetWorld {
  ground: Ground;
  fleet: Fleet;
  hosts: FleetHost[];
  core: CoreV1Api;
  kc: KubeConfig;
  /** One namespace for the whole fleet. */
  namespace: string;
  dir: string;
}

export interface UseFleetOptions {
  hosts: number;
  /** The ground's options (a private one for `fastNodeDeath`). */
  ground?: UseGroundOptions;
  env?: Record<string, string>;
  knobs?: Knobs;
}

/**
 * Call at the top level of a test file; `await fleet()` inside tests or hooks. The fleet runs
 * on the shared ground (a private one outside `npm test`) and is stopped after the file; its
 * directory (each host's log and simulator root) is removed unless a test failed or
 * VK_KEEP_WORLD is set.
 */
export function useFleet(opts: UseFleetOptions): () => Promise<FleetWorld> {
  const ground = useGround(opts.ground);
  let pending: Promise<FleetWorld> | undefined;
  let dir: string | undefined;
  let failed = false;
  afterEach((t) => {
    // `passed` exists at runtime (Node 24) but not yet in @types/node.
    if ((t as { passed?: boolean }).passed === false) failed = true;
  });
  after(async () => {
    const fw = await pending?.catch(() => undefined);
    if (fw) await stopFleet(fw.fleet);
    if (!dir) return;
    if (failed || process.env.VK_KEEP_WORLD) console.log(`# kept ${dir} (a fleet: vk-cocoon.log per host)`);
    else rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    pending ??= (async () => {
      const g = await ground();
      dir = mkdtempSync(join(tmpdir(), 'vk-fleet-'));
      const { core, kc } = adminClients(g.cluster);
      const namespace = await newNamespace(core, 'fleet');
      const fleet = await startFleet({ ground: g, hosts: opts.hosts, dir, env: opts.env, knobs: opts.knobs });
      return { ground: g, fleet, hosts: fleet.hosts, core, kc, namespace, dir };
    })();
    return pending;
  };
}
