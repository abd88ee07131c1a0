// Runs vk-cocoon as a child process against the test ground, the way an operator would:
// environment variables only. Restart tests SIGKILL it and start a new one on the same
// apiserver, simulator root and lease file.
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, openSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { netControlSocket } from '../sim/netctl.ts';
import { cgroupRootDir } from '../sim/paths.ts';
import type { ClusterState } from './cluster.ts';
import { repoRoot } from './cluster.ts';
import { nodeKubeconfig } from './node-identity.ts';
import { freePort, httpsGet, isAlive, recordPid, registryEnv, stopPid, waitFor } from './proc.ts';

export interface DaemonOptions {
  cluster: ClusterState;
  nodeName: string;
  /** The cocoon binary (the simulator's `cocoon` symlink). */
  cocoonBin: string;
  /** COCOON_ROOT_DIR (the simulator root). */
  rootDir: string;
  leasesPath: string;
  logFile: string;
  env?: Record<string, string>;
  kubeletPort?: number;
  /**
   * VK_NODE_IP, the node's InternalIP (default 127.0.0.1): the address the apiserver proxies
   * logs/exec to and the readiness check and metrics listener use. Any 127/8 address is
   * loopback on Linux, so every host of a fleet (ground/fleet.ts) has its own. The daemon binds
   * the kubelet port on all addresses, so hosts still need ports of their own.
   */
  nodeIp?: string;
  /** Started in its own session and unref'd: outlives the caller (`npm run cluster -- up --hosts N`). */
  detached?: boolean;
  /**
   * Whose credentials the daemon runs with: `node` (default), the node identity
   * `system:node:<nodeName>` as on a kubeadm cluster (ground/node-identity.ts, a certificate
   * made once per node name next to the log file); `provider`, the ground's user `vk-cocoon`
   * with deploy/rbac-provider-identity.yaml (for apiservers without the Node authorizer).
   */
  identity?: 'node' | 'provider';
  /** The launcher to run (default the checkout's `bin/vk-cocoon`; the bench passes an unpacked
   * release tree's `bin/vk-cocoon` to measure the release build). */
  bin?: string;
}

export interface Daemon {
  pid: number;
  nodeIp: string;
  kubeletPort: number;
  metricsPort: number;
  child: ChildProcess;
  /** SIGTERM and wait (graceful shutdown); resolves with the exit code. */
  stop(): Promise<number | null>;
  /** SIGKILL (crash). */
  kill(): Promise<void>;
}

/**
 * Starts the daemon. A port picked by freePort() is free when picked, not when the daemon binds
 * it (another process of a loaded run may take it in between, an outgoing connection's
 * ephemeral port included): a start refused with EADDRINUSE is tried again, up to 3 times, with
 * the ports this function picked picked again.
 */
export async function startDaemon(o: DaemonOptions): Promise<Daemon> {
  for (let attempt = 1; ; attempt++) {
    const logStart = existsSync(o.logFile) ? statSync(o.logFile).size : 0;
    try {
      return await startDaemonOnce(o);
    } catch (err) {
      const tail = existsSync(o.logFile) ? readFileSync(o.logFile, 'utf8').slice(logStart) : '';
      if (attempt >= 3 || !/before serving/.test(String(err)) || !tail.includes('EADDRINUSE')) throw err;
    }
  }
}

async function startDaemonOnce(o: DaemonOptions): Promise<Daemon> {
  const nodeIp = o.nodeIp ?? '127.0.0.1';
  const logStart = existsSync(o.logFile) ? statSync(o.logFile).size : 0;
  let listening = false;
  const kubeletPort = o.kubeletPort ?? (await freePort());
  const metricsPort = await freePort();
  // A peer server of its own (the default :12501 is one port for every daemon of a run).
  const peerPort = await freePort();
  const kubeconfig =
    o.identity === 'provider'
      ? o.cluster.providerKubeconfig
      : await nodeKubeconfig(o.cluster, o.nodeName, dirname(o.logFile));
  const fd = openSync(o.logFile, 'a');
  // Started the way a host starts it (bin/vk-cocoon execs node, so the PID is the daemon's).
  const child = spawn(o.bin ?? join(repoRoot, 'bin', 'vk-cocoon'), ['run'], {
    stdio: ['ignore', fd, fd],
    detached: o.detached ?? false,
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/root',
      KUBECONFIG: kubeconfig,
      VK_NODE_NAME: o.nodeName,
      VK_NODE_IP: nodeIp,
      VK_KUBELET_PORT: String(kubeletPort),
      VK_METRICS_ADDR: `${nodeIp}:${metricsPort}`,
      VK_COCOON_BIN: o.cocoonBin,
      COCOON_ROOT_DIR: o.rootDir,
      // The simulator's cgroup tree (sim/cgroup.ts): VM CPU from each scope's cpu.stat.
      VK_CGROUP_ROOT: cgroupRootDir(o.rootDir),
      COCOON_SIM_ROOT: o.rootDir,
      VK_LEASES_PATH: o.leasesPath,
      COCOON_SIM_LEASES: o.leasesPath,
      // The provenance ledger beside the simulator root: a restart of this host keeps it.
      VK_STATE_DIR: join(o.rootDir, 'vk-state'),
      VK_PEER_ADDR: `${nodeIp}:${peerPort}`,
      VK_STAGING_DIR: join(o.rootDir, 'vk-staging'),
      VK_COCOON_SNAPSHOT_DIR: join(o.rootDir, 'snapshot', 'localfile'),
      // The simulator server's cocoon-net control socket (sim/netctl.ts): lease release on the
      // production path. Without a server (detached hosts) there is none: release disabled.
      VK_COCOON_NET_CONTROL_SOCKET: existsSync(netControlSocket(o.rootDir))
        ? netControlSocket(o.rootDir)
        : '',
      VK_TLS_CERT: join(o.rootDir, 'no-such-cert.crt'),
      VK_TLS_KEY: join(o.rootDir, 'no-such-cert.key'),
      VK_LOG_LEVEL: 'debug',
      // The simulator's VMs take no real cpu or memory, but admission counts every VM at its
      // size (2 vCPUs, 1 GiB for a fixture snapshot): the node advertises room for hundreds
      // of them, whatever the test machine has. A test of admission sets its own.
      VK_NODE_CPU: '1024',
      VK_NODE_MEM: '2Ti',
      ...o.env,
      // The run's PID registry marker: its teardown finds the daemon and everything it starts.
      ...registryEnv(),
    },
  });
  const pid = child.pid ?? 0;
  recordPid(pid, 'vk-cocoon', ['run']);
  if (o.detached) child.unref();
  let exitCode: number | null | undefined;
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => {
      exitCode = code;
      resolve(code);
    }),
  );
  // A daemon that exits before it serves (a refused startup) fails the wait at once, not at
  // the 60 s bound (waitFor retries through errors its check throws).
  let serving = false;
  const died = exited.then((code) => {
    if (!serving) throw new Error(`vk-cocoon exited with ${code} before serving; see ${o.logFile}`);
  });
  died.catch(() => {});
  await Promise.race([
    waitFor(
      `vk-cocoon to serve the kubelet API on ${kubeletPort} (log: ${o.logFile})`,
      async () => {
        // The daemon's own word first: a kubelet API of another daemon of this machine that
        // listens on every interface answers on this node IP too (two daemons of a fleet once
        // drew one port; the second never served and the first answered its health check).
        listening ||= readFileSync(o.logFile, 'utf8').slice(logStart).includes('"kubelet API listening');
        if (!listening) return false;
        const res = await httpsGet(`https://${nodeIp}:${kubeletPort}/healthz`).catch(() => undefined);
        return res?.status === 200;
      },
      60_000,
      100,
    ),
    died,
  ]).catch(async (err) => {
    if (isAlive(pid)) await stopPid(pid, 1000);
    throw err;
  });
  serving = true;
  return {
    pid,
    nodeIp,
    kubeletPort,
    metricsPort,
    child,
    stop: async () => {
      if (exitCode !== undefined) return exitCode;
      child.kill('SIGTERM');
      return await exited;
    },
    kill: async () => {
      if (exitCode !== undefined) return;
      child.kill('SIGKILL');
      await exited;
    },
  };
}
