// Where the apiserver is and how to authenticate to it: a kubeconfig file (or a KUBECONFIG
// list, merged as kubectl does: the first file that names a cluster, user, context or the
// current context wins), else ~/.kube/config, else the in-cluster service account. Part of the
// hand-written Kubernetes client (src/kube/rest.ts says why it is hand-written).
//
// Supported: cluster `server`, `certificate-authority` / `-data`, `insecure-skip-tls-verify`,
// `tls-server-name`; user `client-certificate` / `-data`, `client-key` / `-data`, `token`,
// `tokenFile` (re-read every minute, like client-go), `username` / `password`. Relative file
// paths resolve against the kubeconfig's directory. Anything else that changes how we connect
// or who we are (`exec`, `auth-provider`, impersonation, `proxy-url`) is a startup error that
// names it, never silently ignored.
import { existsSync, readFileSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { homedir } from 'node:os';
import { delimiter, dirname, isAbsolute, join, resolve } from 'node:path';
import { load as loadYaml } from 'js-yaml';

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
/** How long a token read from a file is used before the file is read again (client-go: 1 min). */
export const TOKEN_FILE_REFRESH_MS = 60_000;

/** Everything the REST client needs to reach and authenticate to one apiserver. */
export interface ClusterAccess {
  /** Base URL of the apiserver (`https://host:port`, maybe with a path prefix), no trailing slash. */
  server: string;
  /** PEM bundle the server certificate is verified against; undefined: the system roots. */
  ca?: string;
  insecureSkipTLSVerify?: boolean;
  /** TLS server name (SNI and verification) when it differs from the server's host. */
  tlsServerName?: string;
  /** Client certificate and key (PEM). */
  cert?: string;
  key?: string;
  /** The bearer token for the next request (undefined: none). */
  token?: () => string | undefined;
  basicAuth?: { username: string; password: string };
  /** Where this came from (a kubeconfig path and context, or `in-cluster`), for messages. */
  source: string;
}

export class KubeConfigError extends Error {
  override name = 'KubeConfigError';
}

type Obj = Record<string, unknown>;

interface Named {
  name: string;
  value: Obj;
  /** Directory of the file it came from (relative paths resolve against it). */
  dir: string;
}

interface RawConfig {
  clusters: Named[];
  users: Named[];
  contexts: Named[];
  currentContext: string | undefined;
  files: string[];
}

const CLUSTER_KEYS = new Set([
  'server',
  'certificate-authority',
  'certificate-authority-data',
  'insecure-skip-tls-verify',
  'tls-server-name',
  'disable-compression',
  'extensions',
]);
const USER_KEYS = new Set([
  'client-certificate',
  'client-certificate-data',
  'client-key',
  'client-key-data',
  'token',
  'tokenFile',
  'username',
  'password',
  'extensions',
]);

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(o: Obj, key: string, where: string): string | undefined {
  const v = o[key];
  if (v === undefined || v === null || v === '') return undefined;
  if (typeof v !== 'string') throw new KubeConfigError(`${where}: ${key} must be a string`);
  return v;
}

function namedList(
  doc: Obj,
  key: 'clusters' | 'users' | 'contexts',
  inner: string,
  dir: string,
  file: string,
) {
  const list = doc[key] ?? [];
  if (!Array.isArray(list)) throw new KubeConfigError(`${file}: ${key} must be a list`);
  return list.map((e, i): Named => {
    if (!isObj(e) || typeof e.name !== 'string')
      throw new KubeConfigError(`${file}: ${key}[${i}] has no name`);
    const value = e[inner] ?? {};
    if (!isObj(value)) throw new KubeConfigError(`${file}: ${key}[${i}] (${e.name}).${inner} must be a map`);
    return { name: e.name, value, dir };
  });
}

/** Parses one kubeconfig document; relative paths in it resolve against `dir`. */
export function parseKubeConfig(text: string, dir: string, file = 'kubeconfig'): RawConfig {
  let doc: unknown;
  try {
    doc = loadYaml(text);
  } catch (err) {
    throw new KubeConfigError(`${file}: not valid YAML: ${(err as Error).message.split('\n')[0]}`);
  }
  if (doc === undefined || doc === null) doc = {};
  if (!isObj(doc)) throw new KubeConfigError(`${file}: not a kubeconfig (expected a map)`);
  const current = doc['current-context'];
  return {
    clusters: namedList(doc, 'clusters', 'cluster', dir, file),
    users: namedList(doc, 'users', 'user', dir, file),
    contexts: namedList(doc, 'contexts', 'context', dir, file),
    currentContext: typeof current === 'string' && current !== '' ? current : undefined,
    files: [file],
  };
}

/** kubectl's merge: the first occurrence of a name (and of current-context) wins. */
function merge(configs: RawConfig[]): RawConfig {
  const first = (lists: Named[][]) => {
    const out = new Map<string, Named>();
    for (const l of lists) for (const n of l) if (!out.has(n.name)) out.set(n.name, n);
    return [...out.values()];
  };
  return {
    clusters: first(configs.map((c) => c.clusters)),
    users: first(configs.map((c) => c.users)),
    contexts: first(configs.map((c) => c.contexts)),
    currentContext: configs.find((c) => c.currentContext)?.currentContext,
    files: configs.flatMap((c) => c.files),
  };
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    throw new KubeConfigError(`${what}: cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? err}`);
  }
}

function data(b64: string, what: string): string {
  const s = Buffer.from(b64, 'base64').toString('utf8');
  if (!s) throw new KubeConfigError(`${what}: not base64 data`);
  return s;
}

/** A token read from `path`, cached for `refreshMs` (service-account tokens rotate); a failed
 * re-read keeps the last token. */
export function fileToken(path: string, refreshMs = TOKEN_FILE_REFRESH_MS): () => string | undefined {
  let token: string | undefined;
  let readAt = Number.NEGATIVE_INFINITY;
  const read = () => {
    token = readFileSync(path, 'utf8').trim();
    readAt = performance.now();
  };
  read(); // a missing file is a startup error
  return () => {
    if (performance.now() - readAt >= refreshMs) {
      try {
        read();
      } catch {
        readAt = performance.now();
      }
    }
    return token;
  };
}

/** The ClusterAccess of the current context (or `context`) of a parsed, merged kubeconfig. */
export function accessFrom(raw: RawConfig, context?: string): ClusterAccess {
  const where = raw.files.join(':');
  const ctxName = context ?? raw.currentContext;
  if (!ctxName) throw new KubeConfigError(`${where}: no current-context`);
  const ctx = raw.contexts.find((c) => c.name === ctxName);
  if (!ctx) throw new KubeConfigError(`${where}: context ${JSON.stringify(ctxName)} not found`);
  const clusterName = str(ctx.value, 'cluster', `context ${ctxName}`);
  const cluster = raw.clusters.find((c) => c.name === clusterName);
  if (!cluster) throw new KubeConfigError(`${where}: cluster ${JSON.stringify(clusterName)} not found`);
  const userName = str(ctx.value, 'user', `context ${ctxName}`);
  const user = userName === undefined ? undefined : raw.users.find((u) => u.name === userName);
  if (userName !== undefined && !user)
    throw new KubeConfigError(`${where}: user ${JSON.stringify(userName)} not found`);

  const cw = `${where}: cluster ${cluster.name}`;
  for (const k of Object.keys(cluster.value))
    if (!CLUSTER_KEYS.has(k)) throw new KubeConfigError(`${cw}: ${k} is not supported by vk-cocoon`);
  const c = cluster.value;
  const server = str(c, 'server', cw);
  if (!server) throw new KubeConfigError(`${cw}: no server`);
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    throw new KubeConfigError(`${cw}: server ${JSON.stringify(server)} is not a URL`);
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    throw new KubeConfigError(`${cw}: server ${server}: only https:// and http:// are supported`);
  const path = (p: string, dir: string) => (isAbsolute(p) ? p : resolve(dir, p));
  const access: ClusterAccess = {
    server: server.replace(/\/+$/, ''),
    source: `${where} (context ${ctxName})`,
  };
  const caData = str(c, 'certificate-authority-data', cw);
  const caFile = str(c, 'certificate-authority', cw);
  if (caData) access.ca = data(caData, `${cw}: certificate-authority-data`);
  else if (caFile) access.ca = readText(path(caFile, cluster.dir), `${cw}: certificate-authority`);
  if (c['insecure-skip-tls-verify'] === true) access.insecureSkipTLSVerify = true;
  const sni = str(c, 'tls-server-name', cw);
  if (sni) access.tlsServerName = sni;

  if (user) {
    const uw = `${where}: user ${user.name}`;
    const u = user.value;
    for (const k of Object.keys(u)) {
      if (USER_KEYS.has(k)) continue;
      const why =
        k === 'exec'
          ? 'exec credential plugins are not supported'
          : k === 'auth-provider'
            ? 'auth-provider plugins are not supported'
            : k.startsWith('as')
              ? 'impersonation is not supported'
              : 'not supported';
      throw new KubeConfigError(
        `${uw}: ${k}: ${why} by vk-cocoon (use a token, a token file or a client certificate)`,
      );
    }
    const certData = str(u, 'client-certificate-data', uw);
    const certFile = str(u, 'client-certificate', uw);
    const keyData = str(u, 'client-key-data', uw);
    const keyFile = str(u, 'client-key', uw);
    if (certData) access.cert = data(certData, `${uw}: client-certificate-data`);
    else if (certFile) access.cert = readText(path(certFile, user.dir), `${uw}: client-certificate`);
    if (keyData) access.key = data(keyData, `${uw}: client-key-data`);
    else if (keyFile) access.key = readText(path(keyFile, user.dir), `${uw}: client-key`);
    if ((access.cert === undefined) !== (access.key === undefined))
      throw new KubeConfigError(`${uw}: a client certificate needs both the certificate and its key`);
    const tokenFile = str(u, 'tokenFile', uw);
    const token = str(u, 'token', uw);
    if (tokenFile) {
      const p = path(tokenFile, user.dir);
      try {
        access.token = fileToken(p);
      } catch (err) {
        throw new KubeConfigError(
          `${uw}: tokenFile: cannot read ${p}: ${(err as NodeJS.ErrnoException).code}`,
        );
      }
    } else if (token) {
      access.token = () => token;
    }
    const username = str(u, 'username', uw);
    if (username !== undefined) access.basicAuth = { username, password: str(u, 'password', uw) ?? '' };
  }
  return access;
}

/** The in-cluster service account: KUBERNETES_SERVICE_HOST/PORT, its CA and its token (re-read
 * every minute: projected tokens rotate). */
export function inClusterAccess(
  env: NodeJS.ProcessEnv = process.env,
  dir = SERVICE_ACCOUNT_DIR,
): ClusterAccess {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port)
    throw new KubeConfigError('in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set');
  const tokenPath = join(dir, 'token');
  let token: () => string | undefined;
  try {
    token = fileToken(tokenPath);
  } catch (err) {
    throw new KubeConfigError(`in-cluster: cannot read ${tokenPath}: ${(err as NodeJS.ErrnoException).code}`);
  }
  return {
    server: `https://${isIPv6(host) ? `[${host}]` : host}:${port}`,
    ca: readText(join(dir, 'ca.crt'), 'in-cluster'),
    token,
    source: 'in-cluster',
  };
}

/**
 * The provider identity's ClusterAccess: `kubeconfig` (KUBECONFIG: one path or a list) when set,
 * else ~/.kube/config when it exists, else the in-cluster service account. Throws
 * KubeConfigError naming the file and field of anything it cannot use.
 */
export function loadKubeConfig(
  kubeconfig: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
  home = homedir(),
): ClusterAccess {
  const files = (kubeconfig ?? '').split(delimiter).filter(Boolean);
  if (files.length === 0) {
    const dflt = join(home, '.kube', 'config');
    if (existsSync(dflt)) files.push(dflt);
  }
  if (files.length === 0) {
    if (env.KUBERNETES_SERVICE_HOST) return inClusterAccess(env);
    throw new KubeConfigError(
      'no Kubernetes cluster configured (set KUBECONFIG, or run in a cluster with a service account)',
    );
  }
  // As kubectl does, files of a list that do not exist are skipped (a single file must exist).
  const present = files.length > 1 ? files.filter((f) => existsSync(f)) : files;
  if (present.length === 0) throw new KubeConfigError(`KUBECONFIG: none of ${files.join(', ')} exists`);
  const parsed = present.map((f) => parseKubeConfig(readText(f, 'KUBECONFIG'), dirname(resolve(f)), f));
  return accessFrom(merge(parsed));
}
