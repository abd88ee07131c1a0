// The test ground as one unit: control plane + OCI registry. Integration tests call
// `useGround()`: inside `npm test` they share the ground that ground/run-tests.ts
// started (VK_TEST_GROUND_DIR); a test file run on its own starts a private ground, and so
// does a file that stops or restarts the apiserver (`useGround({ private: true })`), since
// the files sharing the ground run at the same time.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach } from 'node:test';
import { type ClusterState, FAST_NODE_DEATH, startCluster, stopCluster } from './cluster.ts';
import {
  defaultRegistryKind,
  type RegistryKind,
  type RegistryState,
  startRegistry,
  stopRegistry,
} from './registry.ts';

export interface Ground {
  dir: string;
  cluster: ClusterState;
  registry: RegistryState;
}

export async function startGround(
  dir: string,
  opts: {
    detached?: boolean;
    log?: (line: string) => void;
    /** The apiserver's audit log of writes (ClusterOptions.audit; `cluster.auditLog`). Off by default. */
    audit?: boolean;
    /** The registry's kind (ground/registry.ts; recorded as `registry.kind` in ground.json).
     * Default: distribution v3, or VK_REGISTRY_KIND. */
    registry?: RegistryKind;
    /** Short node-monitor grace and default tolerations (cluster.ts `FAST_NODE_DEATH`). */
    fastNodeDeath?: boolean;
  } = {},
): Promise<Ground> {
  const cluster = await startCluster({
    dir: join(dir, 'cluster'),
    detached: opts.detached,
    log: opts.log,
    audit: opts.audit,
    ...(opts.fastNodeDeath
      ? {
          extraApiserverArgs: FAST_NODE_DEATH.apiserver,
          extraControllerManagerArgs: FAST_NODE_DEATH.controllerManager,
        }
      : {}),
  });
  let registry: RegistryState;
  try {
    const kind = opts.registry ?? defaultRegistryKind();
    opts.log?.(`starting the registry (${kind})`);
    registry = await startRegistry(join(dir, 'registry'), { kind, detached: opts.detached });
    opts.log?.(`registry ${registry.version} at ${registry.url}`);
  } catch (err) {
    await stopCluster(cluster);
    throw err;
  }
  const ground: Ground = { dir, cluster, registry };
  writeFileSync(join(dir, 'ground.json'), JSON.stringify(ground, null, 2));
  return ground;
}

export function readGround(dir: string): Ground | undefined {
  const file = join(dir, 'ground.json');
  if (!existsSync(file)) return undefined;
  const g = JSON.parse(readFileSync(file, 'utf8')) as Ground;
  // A ground.json written before grounds had a registry kind ran Debian's 2.8.
  g.registry.kind ??= 'docker-registry';
  return g;
}

export async function stopGround(g: Ground): Promise<void> {
  await stopRegistry(g.registry);
  await stopCluster(g.cluster);
}

export interface UseGroundOptions {
  /**
   * Always start a ground of this file's own, also inside `npm test`: for files that stop or
   * restart the apiserver (the other files of the run share theirs meanwhile).
   */
  private?: boolean;
  /**
   * The registry kind this file needs. When the shared ground runs another kind, the file gets
   * a private ground with this one (as with `private`). Default: whatever the ground runs.
   */
  registry?: RegistryKind;
  /** A private ground whose nodes die fast (cluster.ts `FAST_NODE_DEATH`), for host-death tests. */
  fastNodeDeath?: boolean;
}

/**
 * Call at the top level of a test file; `await ground()` inside tests. Inside `npm test` the
 * ground is shared (VK_TEST_GROUND_DIR) unless `private` is set; otherwise a private ground is
 * started on first use and stopped after the file's tests. Its directory is made inside the
 * run's (kept with the run's logs when the run fails) and removed after the file unless one of
 * its tests failed.
 */
export function useGround(opts: UseGroundOptions = {}): () => Promise<Ground> {
  let pending: Promise<Ground> | undefined;
  let own: string | undefined;
  let failed = false;
  afterEach((t) => {
    // `passed` exists at runtime (Node 24) but not yet in @types/node.
    if ((t as { passed?: boolean }).passed === false) failed = true;
  });
  after(async () => {
    if (!own || !pending) return;
    const g = await pending.catch(() => undefined);
    if (g) await stopGround(g);
    if (failed) console.log(`# kept ${own} (the private ground of a failed test)`);
    else rmSync(own, { recursive: true, force: true });
  });
  return () => {
    if (pending) return pending;
    const shared = process.env.VK_TEST_GROUND_DIR;
    const ownGround = opts.private || opts.fastNodeDeath;
    const sharedGround = shared && !ownGround ? readGround(shared) : undefined;
    if (shared && !ownGround && !sharedGround) {
      pending = Promise.reject(new Error(`VK_TEST_GROUND_DIR=${shared} holds no ground.json`));
      return pending;
    }
    if (sharedGround && (!opts.registry || sharedGround.registry.kind === opts.registry)) {
      pending = Promise.resolve(sharedGround);
      return pending;
    }
    own = mkdtempSync(join(shared ?? tmpdir(), shared ? 'private-ground-' : 'vk-ground-'));
    pending = startGround(own, { registry: opts.registry, fastNodeDeath: opts.fastNodeDeath });
    return pending;
  };
}
