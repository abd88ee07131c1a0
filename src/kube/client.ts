// Kubernetes API access on @kubernetes/client-node, with the client-side write rate limit
// of virtual-node.md §4.2 (a token bucket shared by all writes; the Go client's 5 QPS
// default throttled large nodes) and small helpers for the patch content types.
import { readFileSync } from 'node:fs';
import {
  ApiException,
  AuthenticationV1Api,
  AuthorizationV1Api,
  CoordinationV1Api,
  CoreV1Api,
  KubeConfig,
  PatchStrategy,
  setHeaderOptions,
} from '@kubernetes/client-node';

export function loadKubeConfig(kubeconfigPath: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  if (kubeconfigPath) kc.loadFromFile(kubeconfigPath);
  else kc.loadFromDefault();
  if (!kc.getCurrentCluster()) throw new Error('no Kubernetes cluster configured (set KUBECONFIG)');
  return kc;
}

/** Token bucket: `take()` resolves when a token is available. */
export class TokenBucket {
  #tokens: number;
  #last = performance.now();
  #waiters: (() => void)[] = [];
  #timer: NodeJS.Timeout | undefined;
  readonly qps: number;
  readonly burst: number;

  constructor(qps: number, burst: number) {
    this.qps = qps;
    this.burst = burst;
    this.#tokens = burst;
  }

  #refill(): void {
    const now = performance.now();
    this.#tokens = Math.min(this.burst, this.#tokens + ((now - this.#last) / 1000) * this.qps);
    this.#last = now;
  }

  take(): Promise<void> {
    this.#refill();
    if (this.#waiters.length === 0 && this.#tokens >= 1) {
      this.#tokens -= 1;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      this.#waiters.push(resolve);
      this.#schedule();
    });
  }

  #schedule(): void {
    if (this.#timer) return;
    this.#refill();
    const wait = this.#tokens >= 1 ? 0 : ((1 - this.#tokens) / this.qps) * 1000;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#refill();
      while (this.#waiters.length > 0 && this.#tokens >= 1) {
        this.#tokens -= 1;
        this.#waiters.shift()?.();
      }
      if (this.#waiters.length > 0) this.#schedule();
    }, wait);
  }
}

/** HTTP status of an API error, or 0 for transport errors. */
export function apiStatus(err: unknown): number {
  if (err instanceof ApiException) return err.code;
  const code = (err as { code?: unknown; statusCode?: unknown } | null)?.code;
  if (typeof code === 'number') return code;
  const sc = (err as { statusCode?: unknown } | null)?.statusCode;
  return typeof sc === 'number' ? sc : 0;
}

/** A short, single-line description of an API error for logs and events. */
export function apiErrorMessage(err: unknown): string {
  if (err instanceof ApiException) {
    const body = err.body as { message?: string } | string | undefined;
    const msg = typeof body === 'string' ? body : body?.message;
    return `HTTP ${err.code}${msg ? `: ${msg}` : ''}`;
  }
  return err instanceof Error ? err.message : String(err);
}

export const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
export const strategicMergePatch = setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch);

/** API clients of the provider identity plus the shared write limiter. */
export class Kube {
  readonly kc: KubeConfig;
  readonly core: CoreV1Api;
  readonly coordination: CoordinationV1Api;
  readonly authn: AuthenticationV1Api;
  readonly authz: AuthorizationV1Api;
  readonly writes: TokenBucket;
  /** Called once per API write (metrics: cocoon_vk_api_writes_total). */
  onWrite: () => void = () => {};

  constructor(kc: KubeConfig, qps: number, burst: number) {
    this.kc = kc;
    this.core = kc.makeApiClient(CoreV1Api);
    this.coordination = kc.makeApiClient(CoordinationV1Api);
    this.authn = kc.makeApiClient(AuthenticationV1Api);
    this.authz = kc.makeApiClient(AuthorizationV1Api);
    this.writes = new TokenBucket(qps, burst);
  }

  /** Runs one API write after taking a token from the shared bucket. */
  async write<T>(fn: () => Promise<T>): Promise<T> {
    await this.writes.take();
    this.onWrite();
    return await fn();
  }

  /** Node heartbeat writes (Lease, node status) use their own small bucket, so a burst of
   * pod writes can never starve the heartbeat and turn the node NotReady. */
  readonly heartbeatWrites = new TokenBucket(5, 10);

  async heartbeatWrite<T>(fn: () => Promise<T>): Promise<T> {
    await this.heartbeatWrites.take();
    this.onWrite();
    return await fn();
  }

  /** PEM bundle of the cluster CA from the kubeconfig (the default client CA). */
  clusterCaPem(): string | undefined {
    const cluster = this.kc.getCurrentCluster();
    if (!cluster) return undefined;
    if (cluster.caData) return Buffer.from(cluster.caData, 'base64').toString();
    return cluster.caFile ? readFileSync(cluster.caFile, 'utf8') : undefined;
  }
}
