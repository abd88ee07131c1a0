// The API calls the daemon makes, with client-node's object-parameter call shapes (same
// method and parameter names; the second argument carries the signal and the patch content
// type), over the hand-written REST client (src/kube/rest.ts says why). Every parameter
// other than the path ones (`name`, `namespace`) and `body` is a query parameter of the
// same name, as in the API (fieldSelector, gracePeriodSeconds, dryRun, …). Answers are the
// apiserver's JSON; the client-node model types describe them (`import type` only).
import type {
  AuthenticationV1ApiCreateSelfSubjectReviewRequest,
  AuthenticationV1ApiCreateTokenReviewRequest,
  AuthorizationV1ApiCreateSubjectAccessReviewRequest,
  CoordinationV1ApiCreateNamespacedLeaseRequest,
  CoordinationV1ApiReadNamespacedLeaseRequest,
  CoordinationV1ApiReplaceNamespacedLeaseRequest,
  CoreV1ApiCreateNamespacedEventRequest,
  CoreV1ApiCreateNodeRequest,
  CoreV1ApiDeleteNamespacedPodRequest,
  CoreV1ApiListNodeRequest,
  CoreV1ApiListPodForAllNamespacesRequest,
  CoreV1ApiPatchNamespacedEventRequest,
  CoreV1ApiPatchNamespacedPodRequest,
  CoreV1ApiPatchNamespacedPodStatusRequest,
  CoreV1ApiPatchNodeRequest,
  CoreV1ApiPatchNodeStatusRequest,
  CoreV1ApiReadNamespacedConfigMapRequest,
  CoreV1ApiReadNamespacedPodRequest,
  CoreV1ApiReadNamespacedSecretRequest,
  CoreV1ApiReadNodeRequest,
  CoreV1Event,
  V1ConfigMap,
  V1Lease,
  V1Node,
  V1NodeList,
  V1Pod,
  V1PodList,
  V1Secret,
  V1SelfSubjectReview,
  V1SubjectAccessReview,
  V1TokenReview,
} from '@kubernetes/client-node';
import {
  type CallOptions,
  CONTENT_TYPE_STRATEGIC_MERGE_PATCH,
  type QueryValue,
  type RequestSpec,
  type RestClient,
} from './rest.ts';

type Params = { name?: string; namespace?: string; body?: unknown } & object;

const seg = encodeURIComponent;

/** The query of a call: every parameter but the path ones and the body. */
function queryOf(params: Params): Record<string, QueryValue> {
  const q: Record<string, QueryValue> = {};
  for (const [k, v] of Object.entries(params))
    if (k !== 'name' && k !== 'namespace' && k !== 'body') q[k] = v as QueryValue;
  return q;
}

/** `/api/v1` or `/apis/<group>/<version>`, then `namespaces/<ns>/` when namespaced, the
 * resource, `/<name>` and `/<subresource>`. */
function resourcePath(
  prefix: string,
  resource: string,
  p: { namespace?: string; name?: string },
  sub?: string,
): string {
  let path = prefix;
  if (p.namespace !== undefined) path += `/namespaces/${seg(p.namespace)}`;
  path += `/${resource}`;
  if (p.name !== undefined) path += `/${seg(p.name)}`;
  if (sub) path += `/${sub}`;
  return path;
}

class Group {
  readonly #rest: RestClient;
  readonly #prefix: string;
  constructor(rest: RestClient, prefix: string) {
    this.#rest = rest;
    this.#prefix = prefix;
  }

  protected call<T>(
    method: RequestSpec['method'],
    resource: string,
    params: Params,
    opts: CallOptions | undefined,
    sub?: string,
  ): Promise<T> {
    return this.#rest.request<T>({
      method,
      path: resourcePath(this.#prefix, resource, params, sub),
      query: queryOf(params),
      body: params.body,
      // A patch without a content type is a strategic merge patch (kubectl's default).
      contentType: opts?.contentType ?? (method === 'PATCH' ? CONTENT_TYPE_STRATEGIC_MERGE_PATCH : undefined),
      signal: opts?.signal,
    });
  }
}

/** core/v1: pods, nodes, events, ConfigMaps and Secrets (read by name only: never listed or
 * watched, so the daemon needs no namespace-wide read of them). */
export class CoreV1Api extends Group {
  constructor(rest: RestClient) {
    super(rest, '/api/v1');
  }
  listPodForAllNamespaces(p: CoreV1ApiListPodForAllNamespacesRequest = {}, o?: CallOptions) {
    return this.call<V1PodList>('GET', 'pods', p, o);
  }
  readNamespacedPod(p: CoreV1ApiReadNamespacedPodRequest, o?: CallOptions) {
    return this.call<V1Pod>('GET', 'pods', p, o);
  }
  patchNamespacedPod(p: CoreV1ApiPatchNamespacedPodRequest, o?: CallOptions) {
    return this.call<V1Pod>('PATCH', 'pods', p, o);
  }
  patchNamespacedPodStatus(p: CoreV1ApiPatchNamespacedPodStatusRequest, o?: CallOptions) {
    return this.call<V1Pod>('PATCH', 'pods', p, o, 'status');
  }
  /** Answers the pod (graceful) or a Status (gone at once). */
  deleteNamespacedPod(p: CoreV1ApiDeleteNamespacedPodRequest, o?: CallOptions) {
    return this.call<V1Pod>('DELETE', 'pods', p, o);
  }
  listNode(p: CoreV1ApiListNodeRequest = {}, o?: CallOptions) {
    return this.call<V1NodeList>('GET', 'nodes', p, o);
  }
  readNode(p: CoreV1ApiReadNodeRequest, o?: CallOptions) {
    return this.call<V1Node>('GET', 'nodes', p, o);
  }
  createNode(p: CoreV1ApiCreateNodeRequest, o?: CallOptions) {
    return this.call<V1Node>('POST', 'nodes', p, o);
  }
  patchNode(p: CoreV1ApiPatchNodeRequest, o?: CallOptions) {
    return this.call<V1Node>('PATCH', 'nodes', p, o);
  }
  patchNodeStatus(p: CoreV1ApiPatchNodeStatusRequest, o?: CallOptions) {
    return this.call<V1Node>('PATCH', 'nodes', p, o, 'status');
  }
  createNamespacedEvent(p: CoreV1ApiCreateNamespacedEventRequest, o?: CallOptions) {
    return this.call<CoreV1Event>('POST', 'events', p, o);
  }
  patchNamespacedEvent(p: CoreV1ApiPatchNamespacedEventRequest, o?: CallOptions) {
    return this.call<CoreV1Event>('PATCH', 'events', p, o);
  }
  readNamespacedConfigMap(p: CoreV1ApiReadNamespacedConfigMapRequest, o?: CallOptions) {
    return this.call<V1ConfigMap>('GET', 'configmaps', p, o);
  }
  readNamespacedSecret(p: CoreV1ApiReadNamespacedSecretRequest, o?: CallOptions) {
    return this.call<V1Secret>('GET', 'secrets', p, o);
  }
}

/** coordination.k8s.io/v1: the node Lease. */
export class CoordinationV1Api extends Group {
  constructor(rest: RestClient) {
    super(rest, '/apis/coordination.k8s.io/v1');
  }
  readNamespacedLease(p: CoordinationV1ApiReadNamespacedLeaseRequest, o?: CallOptions) {
    return this.call<V1Lease>('GET', 'leases', p, o);
  }
  createNamespacedLease(p: CoordinationV1ApiCreateNamespacedLeaseRequest, o?: CallOptions) {
    return this.call<V1Lease>('POST', 'leases', p, o);
  }
  replaceNamespacedLease(p: CoordinationV1ApiReplaceNamespacedLeaseRequest, o?: CallOptions) {
    return this.call<V1Lease>('PUT', 'leases', p, o);
  }
}

/** authentication.k8s.io/v1: TokenReview (kubelet API bearer tokens), SelfSubjectReview (the
 * daemon's own identity at startup). */
export class AuthenticationV1Api extends Group {
  constructor(rest: RestClient) {
    super(rest, '/apis/authentication.k8s.io/v1');
  }
  createTokenReview(p: AuthenticationV1ApiCreateTokenReviewRequest, o?: CallOptions) {
    return this.call<V1TokenReview>('POST', 'tokenreviews', p, o);
  }
  createSelfSubjectReview(p: AuthenticationV1ApiCreateSelfSubjectReviewRequest, o?: CallOptions) {
    return this.call<V1SelfSubjectReview>('POST', 'selfsubjectreviews', p, o);
  }
}

/** authorization.k8s.io/v1: SubjectAccessReview (kubelet API authorization). */
export class AuthorizationV1Api extends Group {
  constructor(rest: RestClient) {
    super(rest, '/apis/authorization.k8s.io/v1');
  }
  createSubjectAccessReview(p: AuthorizationV1ApiCreateSubjectAccessReviewRequest, o?: CallOptions) {
    return this.call<V1SubjectAccessReview>('POST', 'subjectaccessreviews', p, o);
  }
}
