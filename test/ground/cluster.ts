// The local control plane of the test ground: etcd + kube-apiserver built from the Go
// module proxy (scripts/testbin.sh), on loopback, with generated certificates, static
// tokens, service-account keys and the kubelet-client settings the apiserver needs to
// proxy `kubectl logs`/`exec` to a node (test-ground.md §3–§5).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type GroundCerts, makeGroundCerts } from './certs.ts';
import { freePort, httpsGet, isAlive, run, startProcess, stopPid, waitFor } from './proc.ts';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Static bearer tokens of the ground (`--token-auth-file`). */
export interface GroundTokens {
  admin: string;
  provider: string;
  metrics: string;
  nobody: string;
}

/** Everything a test or the provider needs to reach the control plane; persisted as JSON. */
export interface ClusterState {
  dir: string;
  binDir: string;
  version: string;
  url: string;
  apiserverPort: number;
  etcdPort: number;
  etcdPeerPort: number;
  pids: { etcd: number; apiserver: number };
  /** CA bundle that verifies the apiserver's self-signed serving certificate. */
  apiserverCa: string;
  kubeconfig: string;
  providerKubeconfig: string;
  tokens: GroundTokens;
  certs: GroundCerts;
  extraApiserverArgs: string[];
}

export interface ClusterOptions {
  dir: string;
  detached?: boolean;
  extraApiserverArgs?: string[];
  log?: (line: string) => void;
}

/** Builds (or finds cached) kube-apiserver, etcd and kubectl; returns their directory. */
export async function ensureTestBinaries(log: (line: string) => void = () => {}): Promise<string> {
  log('ensuring kube-apiserver/etcd/kubectl (first build takes minutes)');
  const { stdout } = await run('bash', [join(repoRoot, 'scripts', 'testbin.sh')]);
  const dir = stdout.trim().split('\n').pop() ?? '';
  if (!existsSync(join(dir, 'kube-apiserver')))
    throw new Error(`testbin.sh did not produce binaries (${dir})`);
  return dir;
}

function kubeconfigYaml(url: string, ca: string, user: string, token: string): string {
  return [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    '- name: ground',
    '  cluster:',
    `    server: ${url}`,
    `    certificate-authority: ${ca}`,
    'users:',
    `- name: ${user}`,
    '  user:',
    `    token: ${token}`,
    'contexts:',
    '- name: ground',
    '  context: {cluster: ground, user: ' + user + '}',
    'current-context: ground',
    '',
  ].join('\n');
}

function apiserverArgs(s: ClusterState): string[] {
  return [
    `--etcd-servers=http://127.0.0.1:${s.etcdPort}`,
    '--bind-address=127.0.0.1',
    '--advertise-address=127.0.0.1',
    `--secure-port=${s.apiserverPort}`,
    `--cert-dir=${join(s.dir, 'apiserver-certs')}`,
    `--service-account-issuer=https://127.0.0.1:${s.apiserverPort}`,
    `--service-account-key-file=${s.certs.saPub}`,
    `--service-account-signing-key-file=${s.certs.saKey}`,
    '--service-cluster-ip-range=10.0.0.0/24',
    `--token-auth-file=${join(s.dir, 'tokens.csv')}`,
    `--client-ca-file=${s.certs.caCert}`,
    '--authorization-mode=RBAC',
    '--disable-admission-plugins=ServiceAccount',
    '--allow-privileged=true',
    '--kubelet-preferred-address-types=InternalIP',
    `--kubelet-client-certificate=${s.certs.kubeletClientCert}`,
    `--kubelet-client-key=${s.certs.kubeletClientKey}`,
    '--profiling=false',
    '--v=1',
    ...s.extraApiserverArgs,
  ];
}

async function startEtcd(s: ClusterState, detached: boolean): Promise<number> {
  const child = startProcess(
    join(s.binDir, 'etcd'),
    [
      `--data-dir=${join(s.dir, 'etcd')}`,
      `--listen-client-urls=http://127.0.0.1:${s.etcdPort}`,
      `--advertise-client-urls=http://127.0.0.1:${s.etcdPort}`,
      `--listen-peer-urls=http://127.0.0.1:${s.etcdPeerPort}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${s.etcdPeerPort}`,
      `--initial-cluster=default=http://127.0.0.1:${s.etcdPeerPort}`,
      '--unsafe-no-fsync',
      '--log-level=warn',
    ],
    { logFile: join(s.dir, 'etcd.log'), detached },
  );
  const pid = child.pid ?? 0;
  await waitFor(
    'etcd /health',
    async () => {
      if (!isAlive(pid)) throw new Error(`etcd exited; see ${join(s.dir, 'etcd.log')}`);
      const res = await fetch(`http://127.0.0.1:${s.etcdPort}/health`);
      return res.ok && (await res.text()).includes('"true"');
    },
    30_000,
  );
  return pid;
}

/** Starts kube-apiserver on the state's port and waits until it serves the core API. */
export async function startApiserver(s: ClusterState, detached = false): Promise<number> {
  const child = startProcess(join(s.binDir, 'kube-apiserver'), apiserverArgs(s), {
    logFile: join(s.dir, 'apiserver.log'),
    detached,
  });
  const pid = child.pid ?? 0;
  s.pids.apiserver = pid;
  await waitFor(
    'kube-apiserver /readyz',
    async () => {
      if (!isAlive(pid)) throw new Error(`kube-apiserver exited; see ${join(s.dir, 'apiserver.log')}`);
      return (await httpsGet(`${s.url}/readyz`)).status === 200;
    },
    90_000,
    250,
  );
  await waitFor(
    'system namespaces',
    async () =>
      (await httpsGet(`${s.url}/api/v1/namespaces/default`, s.tokens.admin)).status === 200 &&
      (await httpsGet(`${s.url}/api/v1/namespaces/kube-node-lease`, s.tokens.admin)).status === 200,
    60_000,
    250,
  );
  return pid;
}

export async function stopApiserver(s: ClusterState): Promise<void> {
  await stopPid(s.pids.apiserver);
}

/** Runs the ground's kubectl with the admin kubeconfig. */
export async function kubectl(s: ClusterState, args: string[], input?: string): Promise<string> {
  const { stdout } = await run(join(s.binDir, 'kubectl'), ['--kubeconfig', s.kubeconfig, ...args], { input });
  return stdout;
}

export async function startCluster(opts: ClusterOptions): Promise<ClusterState> {
  const log = opts.log ?? (() => {});
  const binDir = await ensureTestBinaries(log);
  const version = readFileSync(join(binDir, 'VERSION'), 'utf8').split('\n')[0]?.trim() ?? 'unknown';
  mkdirSync(opts.dir, { recursive: true });
  const certDir = join(opts.dir, 'pki');
  mkdirSync(certDir, { recursive: true });
  const certs = await makeGroundCerts(certDir);
  const tokens: GroundTokens = {
    admin: `admin-${Math.random().toString(36).slice(2)}`,
    provider: `vk-${Math.random().toString(36).slice(2)}`,
    metrics: `ms-${Math.random().toString(36).slice(2)}`,
    nobody: `nobody-${Math.random().toString(36).slice(2)}`,
  };
  writeFileSync(
    join(opts.dir, 'tokens.csv'),
    [
      `${tokens.admin},admin,uid-admin,"system:masters"`,
      `${tokens.provider},vk-cocoon,uid-vk-cocoon,"cocoonstack:vk"`,
      `${tokens.metrics},metrics-server,uid-metrics-server,""`,
      `${tokens.nobody},nobody,uid-nobody,""`,
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  const apiserverPort = await freePort();
  const state: ClusterState = {
    dir: opts.dir,
    binDir,
    version,
    url: `https://127.0.0.1:${apiserverPort}`,
    apiserverPort,
    etcdPort: await freePort(),
    etcdPeerPort: await freePort(),
    pids: { etcd: 0, apiserver: 0 },
    apiserverCa: join(opts.dir, 'apiserver-certs', 'apiserver.crt'),
    kubeconfig: join(opts.dir, 'admin.kubeconfig'),
    providerKubeconfig: join(opts.dir, 'vk-cocoon.kubeconfig'),
    tokens,
    certs,
    extraApiserverArgs: opts.extraApiserverArgs ?? [],
  };
  writeFileSync(state.kubeconfig, kubeconfigYaml(state.url, state.apiserverCa, 'admin', tokens.admin));
  writeFileSync(
    state.providerKubeconfig,
    kubeconfigYaml(state.url, state.apiserverCa, 'vk-cocoon', tokens.provider),
  );
  log(`starting etcd on 127.0.0.1:${state.etcdPort}`);
  state.pids.etcd = await startEtcd(state, opts.detached ?? false);
  log(`starting kube-apiserver ${version} on ${state.url}`);
  try {
    await startApiserver(state, opts.detached ?? false);
  } catch (err) {
    await stopPid(state.pids.apiserver);
    await stopPid(state.pids.etcd);
    throw err;
  }
  await kubectl(state, ['apply', '-f', join(repoRoot, 'deploy', 'rbac.yaml')]);
  await kubectl(state, [
    'create',
    'clusterrolebinding',
    'metrics-server-kubelet-reader',
    '--clusterrole=vk-cocoon-kubelet-reader',
    '--user=metrics-server',
  ]);
  writeFileSync(join(opts.dir, 'cluster.json'), JSON.stringify(state, null, 2));
  log('control plane ready');
  return state;
}

export function readClusterState(dir: string): ClusterState | undefined {
  const file = join(dir, 'cluster.json');
  if (!existsSync(file)) return undefined;
  return JSON.parse(readFileSync(file, 'utf8')) as ClusterState;
}

/** True when both recorded processes are alive and the apiserver answers /readyz. */
export async function clusterHealthy(s: ClusterState): Promise<boolean> {
  if (!isAlive(s.pids.etcd) || !isAlive(s.pids.apiserver)) return false;
  try {
    return (await httpsGet(`${s.url}/readyz`)).status === 200;
  } catch {
    return false;
  }
}

/** Stops the apiserver first, then etcd (test-ground.md §4.3). Kills by recorded PID only. */
export async function stopCluster(s: ClusterState): Promise<void> {
  await stopPid(s.pids.apiserver);
  await stopPid(s.pids.etcd);
}
