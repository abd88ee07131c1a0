// Who the daemon is to the apiserver. A node identity (user `system:node:<name>` in group
// `system:nodes`, what a kubelet's client certificate carries) is held to the Node authorizer
// and the NodeRestriction admission plugin: it may write only its own Node (without
// node-role labels or taint changes), Lease and pods. The daemon asks once at startup
// (SelfSubjectReview, allowed to every authenticated user) and adapts what it writes.
import { apiErrorMessage, type Kube } from './client.ts';

/** The identity as the apiserver authenticated it. */
export interface Identity {
  username: string;
  groups: string[];
}

const NODE_USER_PREFIX = 'system:node:';
const NODES_GROUP = 'system:nodes';

/** The node name of a node identity, else undefined: the apiserver's own rule
 * (k8s.io/kubernetes pkg/auth/nodeidentifier: the `system:node:` prefix and the group). */
export function nodeNameOf(id: Identity): string | undefined {
  if (!id.username.startsWith(NODE_USER_PREFIX) || !id.groups.includes(NODES_GROUP)) return undefined;
  return id.username.slice(NODE_USER_PREFIX.length);
}

/** Why a node identity cannot run the node `nodeName`, or undefined when it can (or the
 * identity is no node): the Node authorizer lets `system:node:<a>` touch only node `a`'s
 * objects, so any other VK_NODE_NAME would fail on every write. */
export function identityMismatch(id: Identity, nodeName: string): string | undefined {
  const own = nodeNameOf(id);
  if (own === undefined || own === nodeName) return undefined;
  return `the kubeconfig's identity ${id.username} is the node ${JSON.stringify(own)}, but VK_NODE_NAME is ${JSON.stringify(nodeName)}: a node identity may only register and act as its own node`;
}

/** The daemon's identity from a SelfSubjectReview, or the error when the apiserver cannot
 * say (no such API, refused): the daemon then writes what an unrestricted identity writes. */
export async function whoAmI(kube: Kube, signal?: AbortSignal): Promise<Identity | { error: string }> {
  try {
    const review = await kube.authn.createSelfSubjectReview(
      { body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' } },
      { signal },
    );
    const user = review.status?.userInfo;
    return { username: user?.username ?? '', groups: user?.groups ?? [] };
  } catch (err) {
    return { error: apiErrorMessage(err) };
  }
}
