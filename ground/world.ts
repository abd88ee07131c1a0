// A test world: the shared control plane, a private cocoon simulator root with its lease
// file, and vk-cocoon running as a child process against both, on its own node name.
// Integration tests create one per file (or per scenario) with `useWorld()`.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach } from 'node:test';
import type { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { type Knobs, newSimRoot, type SimRoot } from '../sim/client.ts';
import { REALISTIC_WORLD } from '../sim/knobs.ts';
import { type Daemon, startDaemon } from './daemon.ts';
import { type Ground, useGround } from './ground.ts';
import { adminClients, newNamespace } from './kube.ts';

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
  /** The simulator root (calls, guest commands, knobs, leases: see docs/simulator.md). */
  simulator: SimRoot;
  /** Runs `cocoon-sim <args>` against this world's root; rejects on a non-zero exit. */
  sim(args: string[]): Promise<string>;
  /** Starts vk-cocoon again (after `daemon.kill()` or `daemon.stop()`). */
  restart(env?: Record<string, string>): Promise<Daemon>;
  logFile: string;
}

export interface WorldOptions {
  env?: Record<string, string>;
  /** Do not start the daemon (tests that prepare the simulator first). */
  deferDaemon?: boolean;
  /** A control plane of this file's own, also inside `npm test`: for files that stop or
   * restart the apiserver (see useGround). */
  privateGround?: boolean;
  /** The daemon's credentials (DaemonOptions.identity): its node identity unless `provider`. */
  identity?: 'node' | 'provider';
  /** The simulator's timing world (docs/simulator.md "Timing worlds"): `instant` (the default:
   * leases, agents and clones at once unless a test's knobs say otherwise) or `realistic`
   * (lease 1–8 s, agent 2–20 s, clone 0.3–3 s per VM, drawn from a seed the file prints;
   * VK_SIM_WORLD_SEED=N replays one). A test's own setKnobs replaces the world. */
  timing?: 'instant' | 'realistic';
}

/** The seed of a realistic world: VK_SIM_WORLD_SEED, else a fresh one (printed). */
function worldSeed(): number {
  const fixed = process.env.VK_SIM_WORLD_SEED;
  if (fixed !== undefined && fixed !== '') {
    const n = Number(fixed);
    if (!Number.isSafeInteger(n) || n < 0)
      throw new Error(`VK_SIM_WORLD_SEED=${fixed}: expected an integer ≥ 0`);
    return n;
  }
  return randomBytes(4).readUInt32BE(0);
}

/**
 * Call at the top level of a test file; `await world()` inside tests or hooks. The world's
 * directory (daemon log, simulator root) is removed after the file unless one of its tests
 * failed or VK_KEEP_WORLD is set.
 */
export function useWorld(opts: WorldOptions = {}): () => Promise<World> {
  const ground = useGround({ private: opts.privateGround });
  let pending: Promise<World> | undefined;
  let dir: string | undefined;
  let failed = false;
  afterEach((t) => {
    // `passed` exists at runtime (Node 24) but not yet in @types/node.
    if ((t as { passed?: boolean }).passed === false) failed = true;
  });
  after(async () => {
    const w = await pending?.catch(() => undefined);
    if (w) {
      await w.daemon?.stop().catch(() => {});
      await w.simulator.cleanup({ keepDir: true }).catch(() => {});
    }
    if (!dir) return;
    if (failed || process.env.VK_KEEP_WORLD)
      console.log(`# kept ${dir} (daemon log: ${join(dir, 'vk-cocoon.log')})`);
    else rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    pending ??= (async () => {
      const g = await ground();
      dir = mkdtempSync(join(tmpdir(), 'vk-world-'));
      let knobs: Knobs | undefined;
      if (opts.timing === 'realistic') {
        const seed = worldSeed();
        console.log(`# timing world: realistic, seed ${seed} (VK_SIM_WORLD_SEED=${seed} replays it)`);
        knobs = {
          world: {
            seed,
            leaseMs: [...REALISTIC_WORLD.leaseMs],
            agentMs: [...REALISTIC_WORLD.agentMs],
            cloneMs: [...REALISTIC_WORLD.cloneMs],
          },
        };
      }
      const simulator = await newSimRoot({ parent: dir, knobs });
      const simRoot = simulator.root;
      const cocoonBin = simulator.cocoonBin;
      const leasesPath = simulator.leasesPath;
      const { core, kc } = adminClients(g.cluster);
      const namespace = await newNamespace(core);
      const nodeName = `vk-${randomBytes(3).toString('hex')}`;
      const logFile = join(dir, 'vk-cocoon.log');
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
        simulator,
        sim: async (args) => {
          const r = await simulator.helper(args);
          if (r.code !== 0)
            throw new Error(`cocoon-sim ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
          return r.stdout;
        },
        restart: async (env) => {
          w.daemon = await startDaemon({
            cluster: g.cluster,
            nodeName,
            cocoonBin,
            rootDir: simRoot,
            leasesPath,
            logFile,
            env: { ...simulator.env(), ...opts.env, ...env },
            identity: opts.identity,
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
