// metrics-server in the test ground (test-ground.md "metrics-server"): the real aggregated
// metrics API that `kubectl top` goes through, built from the Go module proxy
// (scripts/metricsserverbin.sh) and run on loopback against a ground's apiserver the way its
// release manifests run it in a cluster:
//
// - its own service account, kube-system/metrics-server, with the manifests' RBAC
//   (system:metrics-server: get nodes/metrics, get/list/watch nodes and pods; the
//   system:auth-delegator binding for delegated authentication/authorization; the
//   extension-apiserver-authentication-reader role binding for the front-proxy CA), and a
//   bound token from the TokenRequest API in its kubeconfig;
// - scraping our kubelet API with that token: the daemon authenticates it with a TokenReview
//   and authorizes nodes/metrics with a SubjectAccessReview (VK_KUBELET_AUTH stays webhook).
//   Only the kubelet's serving certificate goes unverified (`--kubelet-insecure-tls`: the
//   daemon's is self-signed);
// - registered as the APIService v1beta1.metrics.k8s.io behind an ExternalName Service
//   pointing at 127.0.0.1 (Endpoints may not hold loopback addresses; the aggregator resolves
//   an ExternalName Service to its name and the APIService's port), reached through the
//   apiserver's aggregation layer (its --requestheader-*/--proxy-client-* flags, ground/cluster.ts).
//
// The APIService and the Service are cluster-wide: one metrics-server per control plane, so a
// test that uses it runs on a private ground (`useWorld({ privateGround: true })`). While an
// APIService is registered but unavailable, discovery fails for every client and namespace
// deletion stalls: `stop()` removes the registration before stopping the process.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type ClusterState, kubectl, repoRoot } from './cluster.ts';
import { freePort, httpsGet, isAlive, run, startProcess, stopPid, waitFor } from './proc.ts';

export const METRICS_SERVER_NAMESPACE = 'kube-system';
export const METRICS_SERVER_SA = 'metrics-server';
export const METRICS_APISERVICE = 'v1beta1.metrics.k8s.io';

/** metrics-server's binary: VK_METRICS_SERVER_BIN (scripts/test.sh), else built or found by
 * scripts/metricsserverbin.sh (a cold build takes minutes). */
export async function ensureMetricsServerBin(): Promise<string> {
  if (process.env.VK_METRICS_SERVER_BIN) return process.env.VK_METRICS_SERVER_BIN;
  const { stdout } = await run('bash', [join(repoRoot, 'scripts', 'metricsserverbin.sh')]);
  return join(stdout.trim().split('\n').pop() ?? '', 'metrics-server');
}

/** The RBAC of metrics-server's release manifests (manifests/base/rbac.yaml of v0.8.0). */
export const METRICS_SERVER_RBAC = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: ${METRICS_SERVER_SA}
  namespace: ${METRICS_SERVER_NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:aggregated-metrics-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
    rbac.authorization.k8s.io/aggregate-to-admin: "true"
rules:
- apiGroups: ["metrics.k8s.io"]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
rules:
- apiGroups: [""]
  resources: ["nodes/metrics"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- kind: ServiceAccount
  name: ${METRICS_SERVER_SA}
  namespace: ${METRICS_SERVER_NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- kind: ServiceAccount
  name: ${METRICS_SERVER_SA}
  namespace: ${METRICS_SERVER_NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: ${METRICS_SERVER_NAMESPACE}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- kind: ServiceAccount
  name: ${METRICS_SERVER_SA}
  namespace: ${METRICS_SERVER_NAMESPACE}
`;

/** The ExternalName Service and the APIService that route metrics.k8s.io to `port` on loopback. */
export function apiServiceYaml(port: number): string {
  return `apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: ${METRICS_SERVER_NAMESPACE}
spec:
  type: ExternalName
  externalName: 127.0.0.1
  ports:
  - name: https
    port: ${port}
    protocol: TCP
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: ${METRICS_APISERVICE}
spec:
  service:
    name: metrics-server
    namespace: ${METRICS_SERVER_NAMESPACE}
    port: ${port}
  group: metrics.k8s.io
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
`;
}

export interface MetricsServerOptions {
  cluster: ClusterState;
  /** Directory for its kubeconfig, self-signed serving certificate and log. */
  dir: string;
  /** The kubelet port of every node it scrapes (metrics-server takes one for all nodes). */
  kubeletPort: number;
  /** `--metric-resolution` (default 15s; metrics-server's minimum is 10s). */
  resolution?: string;
  /** Log verbosity (`--v`, default 2: one line per scrape cycle). */
  verbosity?: number;
}

export interface MetricsServer {
  pid: number;
  /** Its secure port on 127.0.0.1. */
  port: number;
  logFile: string;
  kubeconfig: string;
  /** The service-account token it presents to the apiserver and to our kubelet API. */
  token: string;
  /** Removes the APIService and the Service, then stops the process (idempotent). */
  stop(): Promise<void>;
}

/**
 * Starts metrics-server against `cluster` and waits until the aggregated API is Available.
 * Everything it creates is removed and the process stopped by `stop()`; the process is in the
 * run's PID registry too (startProcess), so a teardown finds it whatever happens.
 */
export async function startMetricsServer(o: MetricsServerOptions): Promise<MetricsServer> {
  const bin = await ensureMetricsServerBin();
  const s = o.cluster;
  mkdirSync(o.dir, { recursive: true });
  await kubectl(s, ['apply', '-f', '-'], METRICS_SERVER_RBAC);
  const token = (
    await kubectl(s, ['create', 'token', METRICS_SERVER_SA, '-n', METRICS_SERVER_NAMESPACE, '--duration=2h'])
  ).trim();
  const kubeconfig = join(o.dir, 'metrics-server.kubeconfig');
  writeFileSync(
    kubeconfig,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      '- name: ground',
      '  cluster:',
      `    server: ${s.url}`,
      `    certificate-authority: ${s.apiserverCa}`,
      'users:',
      '- name: metrics-server',
      '  user:',
      `    token: ${token}`,
      'contexts:',
      '- name: ground',
      '  context: {cluster: ground, user: metrics-server}',
      'current-context: ground',
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  const port = await freePort();
  const logFile = join(o.dir, 'metrics-server.log');
  const child = startProcess(
    bin,
    [
      `--kubeconfig=${kubeconfig}`,
      `--authentication-kubeconfig=${kubeconfig}`,
      `--authorization-kubeconfig=${kubeconfig}`,
      '--bind-address=127.0.0.1',
      `--secure-port=${port}`,
      `--cert-dir=${join(o.dir, 'serving')}`,
      '--kubelet-insecure-tls',
      '--kubelet-preferred-address-types=InternalIP',
      `--kubelet-port=${o.kubeletPort}`,
      `--metric-resolution=${o.resolution ?? '15s'}`,
      `--v=${o.verbosity ?? 2}`,
    ],
    { logFile },
  );
  const pid = child.pid ?? 0;
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await kubectl(s, [
      'delete',
      'apiservice',
      METRICS_APISERVICE,
      '--ignore-not-found',
      '--wait=false',
    ]).catch(() => {});
    await kubectl(s, [
      'delete',
      'service',
      'metrics-server',
      '-n',
      METRICS_SERVER_NAMESPACE,
      '--ignore-not-found',
      '--wait=false',
    ]).catch(() => {});
    if (pid) await stopPid(pid);
  };
  try {
    await waitFor(
      `metrics-server /livez on 127.0.0.1:${port} (log: ${logFile})`,
      async () => {
        if (!isAlive(pid)) throw new Error(`metrics-server exited; see ${logFile}`);
        return (await httpsGet(`https://127.0.0.1:${port}/livez`).catch(() => undefined))?.status === 200;
      },
      60_000,
      250,
    );
    await kubectl(s, ['apply', '-f', '-'], apiServiceYaml(port));
    await waitFor(
      `APIService ${METRICS_APISERVICE} Available (log: ${logFile})`,
      async () => {
        if (!isAlive(pid)) throw new Error(`metrics-server exited; see ${logFile}`);
        const out = await kubectl(s, [
          'get',
          'apiservice',
          METRICS_APISERVICE,
          '-o',
          'jsonpath={.status.conditions[?(@.type=="Available")].status}',
        ]);
        return out.trim() === 'True';
      },
      60_000,
      500,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { pid, port, logFile, kubeconfig, token, stop };
}

/** One row of `kubectl top pod` / `kubectl top node`: millicores and bytes. */
export interface TopRow {
  name: string;
  cpuMillicores: number;
  memoryBytes: number;
  /** `kubectl top node` only. */
  cpuPercent?: number;
  memoryPercent?: number;
}

const UNITS: Record<string, number> = { '': 1, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 };

/** Parses `kubectl top pod` / `kubectl top node` output (with its header line). */
export function parseTop(text: string): TopRow[] {
  const lines = text.trim().split('\n');
  const header = (lines.shift() ?? '').trim().split(/\s+/);
  const col = (name: string) => header.indexOf(name);
  const rows: TopRow[] = [];
  for (const line of lines) {
    const f = line.trim().split(/\s+/);
    const cpu = /^(\d+)(m?)$/.exec(f[col('CPU(cores)')] ?? '');
    const mem = /^(\d+)(Ki|Mi|Gi|Ti)?$/.exec(f[col('MEMORY(bytes)')] ?? '');
    if (!cpu || !mem) throw new Error(`unexpected kubectl top line: ${JSON.stringify(line)}`);
    const row: TopRow = {
      name: f[col('NAME')] ?? '',
      cpuMillicores: cpu[2] === 'm' ? Number(cpu[1]) : Number(cpu[1]) * 1000,
      memoryBytes: Number(mem[1]) * (UNITS[mem[2] ?? ''] ?? 1),
    };
    const pct = (name: string) => {
      const i = col(name);
      return i < 0 ? undefined : Number.parseFloat(f[i] ?? '');
    };
    const cpuPct = pct('CPU(%)');
    const memPct = pct('MEMORY(%)');
    if (cpuPct !== undefined) row.cpuPercent = cpuPct;
    if (memPct !== undefined) row.memoryPercent = memPct;
    rows.push(row);
  }
  return rows;
}
