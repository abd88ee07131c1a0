// The local control plane of the test ground: etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler built from the Go module proxy (scripts/testbin.sh), on loopback, with
// a kubeadm-shaped PKI (one cluster CA: certs.ts), static tokens, service-account keys and
// the kubelet-client settings the apiserver needs to proxy `kubectl logs`/`exec` to a node
// (test-ground.md §3–§5).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type GroundCerts, makeGroundCerts } from './certs.ts';
import { freePort, httpsGet, isAlive, run, startProcess, stopPid, waitFor } from './proc.ts';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');

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
  /** Secure (healthz) ports of kube-controller-manager and kube-scheduler on 127.0.0.1. */
  controllerManagerPort: number;
  schedulerPort: number;
  pids: { etcd: number; apiserver: number; controllerManager: number; scheduler: number };
  /** CA that verifies the apiserver's serving certificate: the cluster CA (`certs.caCert`). */
  apiserverCa: string;
  kubeconfig: string;
  providerKubeconfig: string;
  controllerManagerKubeconfig: string;
  schedulerKubeconfig: string;
  tokens: GroundTokens;
  certs: GroundCerts;
  extraApiserverArgs: string[];
  /** Flags added to kube-controller-manager's (a host-death test's short node-monitor grace). */
  extraControllerManagerArgs?: string[];
  /** The apiserver's audit log (JSON lines), when started with `audit: true`. */
  auditLog?: string;
}

export interface ClusterOptions {
  dir: string;
  detached?: boolean;
  extraApiserverArgs?: string[];
  extraControllerManagerArgs?: string[];
  /**
   * Opt-in audit log (the benchmarks count API writes per client with it): every create,
   * update, patch, delete and deletecollection at level Metadata, one event per request (stage
   * ResponseComplete), nothing else. Off by default.
   */
  audit?: boolean;
  log?: (line: string) => void;
}

/**
 * The timings of a host-death test's private ground (ground.ts `fastNodeDeath`): a node whose
 * Lease (renewed every 10 s by the daemon) stops for 16 s turns Unknown, checked every second;
 * the NoExecute taint then evicts pods after their `tolerationSeconds` (a pod without its own
 * gets 5 s from DefaultTolerationSeconds).
 */
export const FAST_NODE_DEATH = {
  controllerManager: ['--node-monitor-period=1s', '--node-monitor-grace-period=16s'],
  apiserver: ['--default-not-ready-toleration-seconds=5', '--default-unreachable-toleration-seconds=5'],
};

/** The audit policy of `audit: true`: writes at Metadata, one event per request, nothing else. */
export const AUDIT_POLICY = [
  'apiVersion: audit.k8s.io/v1',
  'kind: Policy',
  'omitStages: ["RequestReceived"]',
  'rules:',
  '- level: Metadata',
  '  verbs: ["create", "update", "patch", "delete", "deletecollection"]',
  '- level: None',
  '',
].join('\n');

/** apiserver flags of the audit log: blocking mode (an event is on disk when its request is
 * answered) and no rotation (lumberjack would rotate at 100 MB otherwise). */
function auditArgs(dir: string): { args: string[]; log: string } {
  const policy = join(dir, 'audit-policy.yaml');
  const log = join(dir, 'audit.log');
  writeFileSync(policy, AUDIT_POLICY);
  return {
    log,
    args: [
      `--audit-policy-file=${policy}`,
      `--audit-log-path=${log}`,
      '--audit-log-format=json',
      '--audit-log-mode=blocking',
      '--audit-log-maxsize=100000',
    ],
  };
}

/** Builds (or finds cached) kube-apiserver, kube-controller-manager, kube-scheduler, etcd
 * and kubectl; returns their directory. */
export async function ensureTestBinaries(log: (line: string) => void = () => {}): Promise<string> {
  log(
    'ensuring kube-apiserver/kube-controller-manager/kube-scheduler/etcd/kubectl (first build takes minutes)',
  );
  const { stdout } = await run('bash', [join(repoRoot, 'scripts', 'testbin.sh')]);
  const dir = stdout.trim().split('\n').pop() ?? '';
  for (const bin of ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler'])
    if (!existsSync(join(dir, bin))) throw new Error(`testbin.sh did not produce ${bin} (${dir})`);
  return dir;
}

export type Credential = { token: string } | { cert: string; key: string };

export function kubeconfigYaml(url: string, ca: string, user: string, cred: Credential): string {
  const userLines =
    'token' in cred
      ? [`    token: ${cred.token}`]
      : [`    client-certificate: ${cred.cert}`, `    client-key: ${cred.key}`];
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
    ...userLines,
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
    `--tls-cert-file=${s.certs.apiserverCert}`,
    `--tls-private-key-file=${s.certs.apiserverKey}`,
    `--service-account-issuer=https://127.0.0.1:${s.apiserverPort}`,
    `--service-account-key-file=${s.certs.saPub}`,
    `--service-account-signing-key-file=${s.certs.saKey}`,
    '--service-cluster-ip-range=10.0.0.0/24',
    `--token-auth-file=${join(s.dir, 'tokens.csv')}`,
    `--client-ca-file=${s.certs.caCert}`,
    // As kubeadm configures it: the Node authorizer before RBAC, and NodeRestriction, so a
    // daemon running as its node identity meets what it meets in a kubeadm cluster.
    '--authorization-mode=Node,RBAC',
    '--enable-admission-plugins=NodeRestriction',
    // test-ground.md: the create-after-namespace race of the ServiceAccount plugin.
    '--disable-admission-plugins=ServiceAccount',
    '--allow-privileged=true',
    '--kubelet-preferred-address-types=InternalIP',
    `--kubelet-client-certificate=${s.certs.kubeletClientCert}`,
    `--kubelet-client-key=${s.certs.kubeletClientKey}`,
    `--requestheader-client-ca-file=${s.certs.frontProxyCaCert}`,
    '--requestheader-allowed-names=front-proxy-client',
    '--requestheader-username-headers=X-Remote-User',
    '--requestheader-group-headers=X-Remote-Group',
    '--requestheader-extra-headers-prefix=X-Remote-Extra-',
    `--proxy-client-cert-file=${s.certs.frontProxyClientCert}`,
    `--proxy-client-key-file=${s.certs.frontProxyClientKey}`,
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

/**
 * kube-controller-manager as kubeadm runs it: its own client certificate (the bootstrap
 * RBAC role of `system:kube-controller-manager` applies), one service account per
 * controller, the cluster CA as root CA and signer. Default timings (node monitor grace
 * period, pod eviction via DefaultTolerationSeconds, PodGC quarantine) are kept, so the
 * ground behaves like a real cluster: a node whose Lease stops turns Unknown after 50 s,
 * unless a private ground of a host-death test shortens them (`FAST_NODE_DEATH`).
 */
function controllerManagerArgs(s: ClusterState): string[] {
  const kc = s.controllerManagerKubeconfig;
  return [
    `--kubeconfig=${kc}`,
    `--authentication-kubeconfig=${kc}`,
    `--authorization-kubeconfig=${kc}`,
    '--bind-address=127.0.0.1',
    `--secure-port=${s.controllerManagerPort}`,
    `--client-ca-file=${s.certs.caCert}`,
    `--requestheader-client-ca-file=${s.certs.frontProxyCaCert}`,
    '--leader-elect=false',
    '--use-service-account-credentials=true',
    `--service-account-private-key-file=${s.certs.saKey}`,
    `--root-ca-file=${s.certs.caCert}`,
    `--cluster-signing-cert-file=${s.certs.caCert}`,
    `--cluster-signing-key-file=${s.certs.caKey}`,
    '--service-cluster-ip-range=10.0.0.0/24',
    '--profiling=false',
    '--v=1',
    ...(s.extraControllerManagerArgs ?? []),
  ];
}

function schedulerArgs(s: ClusterState): string[] {
  const kc = s.schedulerKubeconfig;
  return [
    `--kubeconfig=${kc}`,
    `--authentication-kubeconfig=${kc}`,
    `--authorization-kubeconfig=${kc}`,
    '--bind-address=127.0.0.1',
    `--secure-port=${s.schedulerPort}`,
    '--leader-elect=false',
    '--profiling=false',
    '--v=1',
  ];
}

/** Starts a control-plane component, records its PID in the state at once (so a failed
 * start is still stopped by stopCluster) and waits for /healthz on its secure port. */
async function startComponent(
  s: ClusterState,
  name: 'kube-controller-manager' | 'kube-scheduler',
  detached: boolean,
): Promise<number> {
  const kcm = name === 'kube-controller-manager';
  const port = kcm ? s.controllerManagerPort : s.schedulerPort;
  const logFile = join(s.dir, `${name}.log`);
  const child = startProcess(join(s.binDir, name), kcm ? controllerManagerArgs(s) : schedulerArgs(s), {
    logFile,
    detached,
  });
  const pid = child.pid ?? 0;
  if (kcm) s.pids.controllerManager = pid;
  else s.pids.scheduler = pid;
  await waitFor(
    `${name} /healthz`,
    async () => {
      if (!isAlive(pid)) throw new Error(`${name} exited; see ${logFile}`);
      return (await httpsGet(`https://127.0.0.1:${port}/healthz`)).status === 200;
    },
    60_000,
    250,
  );
  return pid;
}

export function startControllerManager(s: ClusterState, detached = false): Promise<number> {
  return startComponent(s, 'kube-controller-manager', detached);
}

export function startScheduler(s: ClusterState, detached = false): Promise<number> {
  return startComponent(s, 'kube-scheduler', detached);
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
  const audit = opts.audit ? auditArgs(opts.dir) : undefined;
  const state: ClusterState = {
    dir: opts.dir,
    binDir,
    version,
    url: `https://127.0.0.1:${apiserverPort}`,
    apiserverPort,
    etcdPort: await freePort(),
    etcdPeerPort: await freePort(),
    controllerManagerPort: await freePort(),
    schedulerPort: await freePort(),
    pids: { etcd: 0, apiserver: 0, controllerManager: 0, scheduler: 0 },
    apiserverCa: certs.caCert,
    kubeconfig: join(opts.dir, 'admin.kubeconfig'),
    providerKubeconfig: join(opts.dir, 'vk-cocoon.kubeconfig'),
    controllerManagerKubeconfig: join(opts.dir, 'controller-manager.kubeconfig'),
    schedulerKubeconfig: join(opts.dir, 'scheduler.kubeconfig'),
    tokens,
    certs,
    // In the state (not computed per start), so an apiserver restarted by startApiserver keeps them.
    extraApiserverArgs: [...(opts.extraApiserverArgs ?? []), ...(audit?.args ?? [])],
    extraControllerManagerArgs: opts.extraControllerManagerArgs ?? [],
    ...(audit ? { auditLog: audit.log } : {}),
  };
  const ca = certs.caCert;
  writeFileSync(state.kubeconfig, kubeconfigYaml(state.url, ca, 'admin', { token: tokens.admin }));
  writeFileSync(
    state.providerKubeconfig,
    kubeconfigYaml(state.url, ca, 'vk-cocoon', { token: tokens.provider }),
  );
  writeFileSync(
    state.controllerManagerKubeconfig,
    kubeconfigYaml(state.url, ca, 'system:kube-controller-manager', {
      cert: certs.controllerManagerCert,
      key: certs.controllerManagerKey,
    }),
  );
  writeFileSync(
    state.schedulerKubeconfig,
    kubeconfigYaml(state.url, ca, 'system:kube-scheduler', {
      cert: certs.schedulerCert,
      key: certs.schedulerKey,
    }),
  );
  const detached = opts.detached ?? false;
  try {
    log(`starting etcd on 127.0.0.1:${state.etcdPort}`);
    state.pids.etcd = await startEtcd(state, detached);
    log(`starting kube-apiserver ${version} on ${state.url}`);
    await startApiserver(state, detached);
    log('starting kube-controller-manager and kube-scheduler');
    await Promise.all([
      startControllerManager(state, detached),
      startScheduler(state, detached),
      (async () => {
        await kubectl(state, ['apply', '-f', join(repoRoot, 'deploy', 'rbac.yaml')]);
        // The provider identity (user vk-cocoon) for daemons started with identity 'provider'.
        await kubectl(state, ['apply', '-f', join(repoRoot, 'deploy', 'rbac-provider-identity.yaml')]);
        await kubectl(state, [
          'create',
          'clusterrolebinding',
          'metrics-server-kubelet-reader',
          '--clusterrole=vk-cocoon-kubelet-reader',
          '--user=metrics-server',
        ]);
      })(),
    ]);
  } catch (err) {
    await stopCluster(state);
    throw err;
  }
  writeFileSync(join(opts.dir, 'cluster.json'), JSON.stringify(state, null, 2));
  log('control plane ready');
  return state;
}

export function readClusterState(dir: string): ClusterState | undefined {
  const file = join(dir, 'cluster.json');
  if (!existsSync(file)) return undefined;
  return JSON.parse(readFileSync(file, 'utf8')) as ClusterState;
}

/** True when every recorded process is alive and the apiserver answers /readyz. */
export async function clusterHealthy(s: ClusterState): Promise<boolean> {
  if (![s.pids.etcd, s.pids.apiserver, s.pids.controllerManager, s.pids.scheduler].every(isAlive))
    return false;
  try {
    return (await httpsGet(`${s.url}/readyz`)).status === 200;
  } catch {
    return false;
  }
}

/** Stops the scheduler and the controller-manager, then the apiserver, then etcd
 * (test-ground.md §4.3). Kills by recorded PID only; a PID of 0 (never started) is skipped. */
export async function stopCluster(s: ClusterState): Promise<void> {
  const stop = (pid: number | undefined) => (pid ? stopPid(pid) : Promise.resolve());
  await Promise.all([stop(s.pids.scheduler), stop(s.pids.controllerManager)]);
  await stop(s.pids.apiserver);
  await stop(s.pids.etcd);
}
