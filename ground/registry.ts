// The test ground's OCI registry on loopback, one of two kinds (docs/test-ground.md, Registries):
//  - `distribution`: CNCF distribution v3 (`registry serve`), built from the Go module proxy by
//    scripts/distributionbin.sh (VK_DISTRIBUTION_BIN, else the script). The default: it does
//    what production registries do, tag deletion included (`DELETE /v2/<repo>/manifests/<tag>`
//    answers 202).
//  - `docker-registry`: Debian's docker-registry (CNCF distribution 2.8), kept where a test needs
//    its quirks: a tag DELETE is 400 DIGEST_INVALID (2.8 deletes by digest only), which the
//    client's digest fallback is tested through (registry-push.test.ts starts one alone;
//    bench/transfer.ts pins it for its published figures).
// Both run with filesystem storage, deletes enabled and the same `version: 0.1` configuration.
// VK_REGISTRY_KIND=docker-registry makes 2.8 the default of a run (npm test, the demo, cluster).
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from './cluster.ts';
import { freePort, httpsGet, isAlive, run, startProcess, stopPid, waitFor } from './proc.ts';

export type RegistryKind = 'distribution' | 'docker-registry';
export const REGISTRY_KINDS: readonly RegistryKind[] = ['distribution', 'docker-registry'];

/** The kind a ground runs unless it asks for one: VK_REGISTRY_KIND, else distribution v3. */
export function defaultRegistryKind(): RegistryKind {
  const env = process.env.VK_REGISTRY_KIND;
  if (env === undefined || env === '') return 'distribution';
  if (!(REGISTRY_KINDS as readonly string[]).includes(env))
    throw new Error(`VK_REGISTRY_KIND=${env}: expected one of ${REGISTRY_KINDS.join(', ')}`);
  return env as RegistryKind;
}

/** The registry's name in a PID registry (the basename of its executable). */
export function registryCommandName(kind: RegistryKind = defaultRegistryKind()): string {
  return kind === 'distribution' ? 'registry' : 'docker-registry';
}

export interface RegistryState {
  kind: RegistryKind;
  /** The registry's own version line, e.g. `github.com/distribution/distribution/v3 v3.1.2`. */
  version: string;
  /** The executable (its basename is the name in the PID registry: `registry`, `docker-registry`). */
  bin: string;
  dir: string;
  port: number;
  pid: number;
  /** `host:port` of the registry, e.g. for OCI_REGISTRY=`${hostPort}/cocoon`. */
  hostPort: string;
  url: string;
}

export interface RegistryOptions {
  /** Default: {@link defaultRegistryKind}. */
  kind?: RegistryKind;
  /** Detached children survive the parent (used by `npm run cluster -- up`). */
  detached?: boolean;
  /**
   * Serve HTTPS on `host` (an address the registry client does not treat as loopback, so it
   * speaks TLS to it, as to a production registry) with this PEM pair; clients trust `certFile`
   * through NODE_EXTRA_CA_CERTS. Default: plain HTTP on 127.0.0.1.
   */
  tls?: { host: string; certFile: string; keyFile: string };
}

/** The distribution v3 executable: VK_DISTRIBUTION_BIN (scripts/test.sh), else built or found
 * by scripts/distributionbin.sh (a cold build takes minutes). */
export async function distributionBin(): Promise<string> {
  const env = process.env.VK_DISTRIBUTION_BIN;
  if (env && existsSync(env)) return env;
  const { stdout } = await run('bash', [join(repoRoot, 'scripts', 'distributionbin.sh')]);
  const bin = join(stdout.trim().split('\n').pop() ?? '', 'registry');
  if (!existsSync(bin)) throw new Error(`scripts/distributionbin.sh did not produce ${bin}`);
  return bin;
}

async function versionOf(bin: string): Promise<string> {
  const { stdout } = await run(bin, ['--version']).catch(() => ({ stdout: '' }));
  // `<argv0> <module> <version>`; 2.8 prints the same shape.
  return stdout.trim().split(/\s+/).slice(1).join(' ');
}

export async function startRegistry(dir: string, opts: RegistryOptions = {}): Promise<RegistryState> {
  const kind = opts.kind ?? defaultRegistryKind();
  const bin = kind === 'distribution' ? await distributionBin() : 'docker-registry';
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
      `  addr: ${opts.tls?.host ?? '127.0.0.1'}:${port}`,
      '  secret: test-only-secret',
      ...(opts.tls ? [`  tls: {certificate: ${opts.tls.certFile}, key: ${opts.tls.keyFile}}`] : []),
      '',
    ].join('\n'),
  );
  const logFile = join(dir, 'registry.log');
  const child = startProcess(bin, ['serve', config], {
    logFile,
    detached: opts.detached,
    // v3 traces every request through OpenTelemetry, by default to an OTLP collector on
    // localhost:4318 (connection errors in the log): none here.
    env: kind === 'distribution' ? { ...process.env, OTEL_TRACES_EXPORTER: 'none' } : undefined,
  });
  const pid = child.pid ?? 0;
  const hostPort = `${opts.tls?.host ?? '127.0.0.1'}:${port}`;
  const url = `${opts.tls ? 'https' : 'http'}://${hostPort}`;
  await waitFor(
    `${kind} registry /v2/`,
    async () => {
      if (!isAlive(pid)) throw new Error(`${bin} exited; see ${logFile}`);
      return opts.tls
        ? (await httpsGet(`${url}/v2/`)).status === 200
        : (await fetch(`${url}/v2/`)).status === 200;
    },
    30_000,
  );
  const version = (await versionOf(bin)) || kind;
  return { kind, version, bin, dir, port, pid, hostPort, url };
}

export async function stopRegistry(r: RegistryState): Promise<void> {
  await stopPid(r.pid);
}
