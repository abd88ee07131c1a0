// Debian's docker-registry (CNCF distribution 2.8) on loopback (test-ground.md §6).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort, isAlive, startProcess, stopPid, waitFor } from './proc.ts';

export interface RegistryState {
  dir: string;
  port: number;
  pid: number;
  /** `host:port` of the registry, e.g. for OCI_REGISTRY=`${hostPort}/cocoon`. */
  hostPort: string;
  url: string;
}

export async function startRegistry(dir: string, detached = false): Promise<RegistryState> {
  mkdirSync(join(dir, 'storage'), { recursive: true });
  const port = await freePort();
  const config = join(dir, 'config.yml');
  writeFileSync(
    config,
    [
      'version: 0.1',
      'log: {level: warn}',
      'storage:',
      `  filesystem: {rootdirectory: ${join(dir, 'storage')}}`,
      '  delete: {enabled: true}',
      'http:',
      `  addr: 127.0.0.1:${port}`,
      '  secret: test-only-secret',
      '',
    ].join('\n'),
  );
  const child = startProcess('docker-registry', ['serve', config], {
    logFile: join(dir, 'registry.log'),
    detached,
  });
  const pid = child.pid ?? 0;
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    'docker-registry /v2/',
    async () => {
      if (!isAlive(pid)) throw new Error(`docker-registry exited; see ${join(dir, 'registry.log')}`);
      return (await fetch(`${url}/v2/`)).status === 200;
    },
    30_000,
  );
  return { dir, port, pid, hostPort: `127.0.0.1:${port}`, url };
}

export async function stopRegistry(r: RegistryState): Promise<void> {
  await stopPid(r.pid);
}
