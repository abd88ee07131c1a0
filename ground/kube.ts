// Kubernetes helpers for integration tests: admin clients, unique namespaces, polling.
import { randomBytes } from 'node:crypto';
import {
  AppsV1Api,
  CoordinationV1Api,
  CoreV1Api,
  KubeConfig,
  type RequestContext,
  type V1Pod,
} from '@kubernetes/client-node';
import type { ClusterState } from './cluster.ts';
import { waitFor } from './proc.ts';

export interface AdminClients {
  kc: KubeConfig;
  core: CoreV1Api;
  coordination: CoordinationV1Api;
  apps: AppsV1Api;
}

type Dispatcher = NonNullable<ReturnType<RequestContext['getDispatcher']>>;

/**
 * A KubeConfig whose API clients share their connections. @kubernetes/client-node 2.0 builds
 * a new undici Agent for every request, so every request opened a TLS connection of its own (a
 * handshake on both sides, the CA and client credentials loaded again): a quarter to a third of
 * a polling test process's CPU (docs/test-ground.md "Suite CPU"). The first dispatcher of a
 * cluster and user is kept and used for every later request (keep-alive, as client-go does).
 */
export class PooledKubeConfig extends KubeConfig {
  readonly #dispatchers = new Map<string, Dispatcher>();

  override async applySecurityAuthentication(context: RequestContext): Promise<void> {
    await super.applySecurityAuthentication(context);
    const built = context.getDispatcher();
    if (built === undefined) return;
    const key = JSON.stringify([this.getCurrentCluster()?.name, this.getCurrentUser()?.name]);
    const kept = this.#dispatchers.get(key);
    if (kept === undefined) this.#dispatchers.set(key, built);
    else context.setDispatcher(kept);
  }
}

export function adminClients(cluster: ClusterState): AdminClients {
  const kc = new PooledKubeConfig();
  kc.loadFromFile(cluster.kubeconfig);
  return {
    kc,
    core: kc.makeApiClient(CoreV1Api),
    coordination: kc.makeApiClient(CoordinationV1Api),
    apps: kc.makeApiClient(AppsV1Api),
  };
}

/** Creates a namespace with a unique name. Tests leave namespaces in place: the namespace
 * controller would gracefully delete their pods, and a stopped world's pods would stay
 * Terminating (nobody completes the deletion). */
export async function newNamespace(core: CoreV1Api, prefix = 't'): Promise<string> {
  const name = `${prefix}-${randomBytes(4).toString('hex')}`;
  await core.createNamespace({ body: { metadata: { name } } });
  return name;
}

/** A pod bound to `nodeName` (the scheduler skips it) with the provider's toleration. */
export function vmPod(
  name: string,
  nodeName: string,
  annotations: Record<string, string>,
  extra: Partial<V1Pod['spec']> = {},
): V1Pod {
  return {
    metadata: { name, annotations },
    spec: {
      nodeName,
      containers: [{ name: 'agent', image: annotations['cocoonset.cocoonstack.io/image'] ?? 'vm' }],
      tolerations: [{ key: 'virtual-kubelet.io/provider', operator: 'Exists', effect: 'NoSchedule' }],
      ...extra,
    },
  };
}

export async function waitForPod(
  core: CoreV1Api,
  namespace: string,
  name: string,
  what: string,
  check: (pod: V1Pod) => boolean,
  timeoutMs = 30_000,
): Promise<V1Pod> {
  let last: V1Pod | undefined;
  await waitFor(
    `pod ${namespace}/${name}: ${what}`,
    async () => {
      last = await core.readNamespacedPod({ namespace, name });
      return check(last);
    },
    timeoutMs,
    100,
  );
  return last as V1Pod;
}

export async function waitForPodGone(
  core: CoreV1Api,
  namespace: string,
  name: string,
  timeoutMs = 30_000,
): Promise<void> {
  await waitFor(
    `pod ${namespace}/${name} to disappear`,
    async () => {
      try {
        await core.readNamespacedPod({ namespace, name });
        return false;
      } catch (err) {
        if ((err as { code?: number }).code === 404) return true;
        throw err;
      }
    },
    timeoutMs,
    100,
  );
}

export function podReady(pod: V1Pod): boolean {
  return pod.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
}
