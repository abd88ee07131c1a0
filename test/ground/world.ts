// A test world: the shared control plane, a private cocoon simulator root with its lease
// file, and vk-cocoon running as a child process against both, on its own node name.
// Integration tests create one per file (or per scenario) with `useWorld()`.
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import type { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { repoRoot } from './cluster.ts';
import { type Daemon, startDaemon } from './daemon.ts';
import { type Ground, useGround } from './ground.ts';
import { adminClients, newNamespace } from './kube.ts';
import { run } from './proc.ts';

export interface World {
  ground: Ground;
  core: CoreV1Api;
  kc: KubeConfig;
  namespace: string;
  nodeName: string;
  simRoot: string;
  cocoonBin: string;
  leasesPath: string;
  daemon: Daemon;
  /** Runs the simulator CLI (`cocoon-sim ...`) against this world's root. */
  sim(args: string[]): Promise<string>;
  /** Starts vk-cocoon again (after `daemon.kill()` or `daemon.stop()`). */
  restart(env?: Record<string, string>): Promise<Daemon>;
  logFile: string;
}

export interface WorldOptions {
  env?: Record<string, string>;
  /** Do not start the daemon (tests that prepare the simulator first). */
  deferDaemon?: boolean;
}

/** Call at the top level of a test file; `await world()` inside tests or hooks. */
export function useWorld(opts: WorldOptions = {}): () => Promise<World> {
  const ground = useGround();
  let pending: Promise<World> | undefined;
  let dir: string | undefined;
  after(async () => {
    const w = await pending?.catch(() => undefined);
    if (w) {
      await w.daemon.stop().catch(() => {});
      await destroySimVms(w).catch(() => {});
    }
    if (dir && !process.env.VK_KEEP_WORLD) rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    pending ??= (async () => {
      const g = await ground();
      dir = mkdtempSync(join(tmpdir(), 'vk-world-'));
      const simRoot = join(dir, 'cocoon');
      mkdirSync(join(simRoot, 'net'), { recursive: true });
      const binDir = join(dir, 'bin');
      mkdirSync(binDir);
      const cocoonBin = join(binDir, 'cocoon');
      symlinkSync(join(repoRoot, 'bin', 'cocoon-sim'), cocoonBin);
      const leasesPath = join(simRoot, 'net', 'leases.json');
      const { core, kc } = adminClients(g.cluster);
      const namespace = await newNamespace(core);
      const nodeName = `vk-${randomBytes(3).toString('hex')}`;
      const logFile = join(dir, 'vk-cocoon.log');
      const simEnv = {
        ...process.env,
        COCOON_SIM_ROOT: simRoot,
        COCOON_ROOT_DIR: simRoot,
        COCOON_SIM_LEASES: leasesPath,
      };
      const w: World = {
        ground: g,
        core,
        kc,
        namespace,
        nodeName,
        simRoot,
        cocoonBin,
        leasesPath,
        logFile,
        daemon: undefined as unknown as Daemon,
        sim: async (args) => (await run(join(repoRoot, 'bin', 'cocoon-sim'), args, { env: simEnv })).stdout,
        restart: async (env) => {
          w.daemon = await startDaemon({
            cluster: g.cluster,
            nodeName,
            cocoonBin,
            rootDir: simRoot,
            leasesPath,
            logFile,
            env: { ...opts.env, ...env },
          });
          return w.daemon;
        },
      };
      if (!opts.deferDaemon) await w.restart();
      return w;
    })();
    return pending;
  };
}

/** Removes every simulated VM of the world (kills the stand-in processes). */
export async function destroySimVms(w: World): Promise<void> {
  const out = await run(w.cocoonBin, ['vm', 'list', '-o', 'json'], {
    env: {
      ...process.env,
      COCOON_SIM_ROOT: w.simRoot,
      COCOON_ROOT_DIR: w.simRoot,
      COCOON_SIM_LEASES: w.leasesPath,
    },
  });
  const text = out.stdout.trim();
  if (!text.startsWith('[')) return;
  for (const vm of JSON.parse(text) as { id: string }[]) {
    await run(w.cocoonBin, ['vm', 'rm', '--force', vm.id], {
      env: { ...process.env, COCOON_SIM_ROOT: w.simRoot, COCOON_ROOT_DIR: w.simRoot },
    }).catch(() => {});
  }
}
