// The test ground as one unit: control plane + OCI registry. Integration tests call
// `useGround()`: inside `npm test` they share the ground that ground/run-tests.ts
// started (VK_TEST_GROUND_DIR); a test file run on its own starts a private ground.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { type ClusterState, startCluster, stopCluster } from './cluster.ts';
import { type RegistryState, startRegistry, stopRegistry } from './registry.ts';

export interface Ground {
  dir: string;
  cluster: ClusterState;
  registry: RegistryState;
}

export async function startGround(
  dir: string,
  opts: { detached?: boolean; log?: (line: string) => void } = {},
): Promise<Ground> {
  const cluster = await startCluster({ dir: join(dir, 'cluster'), detached: opts.detached, log: opts.log });
  let registry: RegistryState;
  try {
    opts.log?.('starting docker-registry');
    registry = await startRegistry(join(dir, 'registry'), opts.detached);
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
  return existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as Ground) : undefined;
}

export async function stopGround(g: Ground): Promise<void> {
  await stopRegistry(g.registry);
  await stopCluster(g.cluster);
}

/**
 * Call at the top level of a test file; `await ground()` inside tests. Inside `npm test` the
 * ground is shared (VK_TEST_GROUND_DIR); a file run on its own starts a private ground on
 * first use and stops it after the file's tests.
 */
export function useGround(): () => Promise<Ground> {
  let pending: Promise<Ground> | undefined;
  let own: string | undefined;
  after(async () => {
    if (!own || !pending) return;
    const g = await pending.catch(() => undefined);
    if (g) await stopGround(g);
    rmSync(own, { recursive: true, force: true });
  });
  return () => {
    if (pending) return pending;
    const dir = process.env.VK_TEST_GROUND_DIR;
    if (dir) {
      const g = readGround(dir);
      pending = g
        ? Promise.resolve(g)
        : Promise.reject(new Error(`VK_TEST_GROUND_DIR=${dir} holds no ground.json`));
      return pending;
    }
    own = mkdtempSync(join(tmpdir(), 'vk-ground-'));
    pending = startGround(own);
    return pending;
  };
}
