// The network allow-list (docs/contracts/annotations.md, "Network allow-list"). The pod's
// `cocoonset.cocoonstack.io/network` goes verbatim to `cocoon vm clone|run --network`, so
// without a rule a tenant attaches its VM to any CNI network of the host (another tenant's,
// a management network). Two optional settings restrict it:
//
//   VK_ALLOWED_NETWORKS=net1,net2            networks a pod may name, node-wide
//   VK_NAMESPACE_NETWORKS=ns-a=net1|net2;ns-b=net3;ns-c=
//                                            per namespace: a listed namespace may name only
//                                            its own list (`ns-c=`: none), whatever
//                                            VK_ALLOWED_NETWORKS says
//
// The most specific rule wins: a namespace listed in VK_NAMESPACE_NETWORKS is governed by its
// entry alone (so an operator can grant one namespace a network the node list withholds); any
// other namespace by VK_ALLOWED_NETWORKS when it is set; with neither, any network (the
// historical behaviour). No annotation (the default network) is always allowed: cocoon then
// uses the host's default CNI network, which is the operator's own choice, not the tenant's.
// Pure; the settings are validated at startup (src/config/env.ts).

export const ALLOWED_NETWORKS_ENV = 'VK_ALLOWED_NETWORKS';
export const NAMESPACE_NETWORKS_ENV = 'VK_NAMESPACE_NETWORKS';

/** A CNI network name as libcni accepts it (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`). */
const NETWORK_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
/** A Kubernetes namespace (a DNS label). */
const NAMESPACE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

export interface NetworkPolicy {
  /** VK_ALLOWED_NETWORKS; `undefined`: no node-wide limit. */
  readonly allowed: readonly string[] | undefined;
  /** VK_NAMESPACE_NETWORKS: namespace → the only networks its pods may name. */
  readonly perNamespace: ReadonlyMap<string, readonly string[]>;
}

export const OPEN_NETWORK_POLICY: NetworkPolicy = { allowed: undefined, perNamespace: new Map() };

function networkProblem(env: string, where: string, name: string): string | undefined {
  if (NETWORK_NAME.test(name) && name.length <= 253) return undefined;
  return `${env}: ${where}${JSON.stringify(name)} is not a network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)`;
}

/** Parses both settings; every bad entry is one problem naming the variable and the entry. */
export function parseNetworkPolicy(
  allowedValue: string | undefined,
  perNamespaceValue: string | undefined,
): { policy: NetworkPolicy; problems: readonly string[] } {
  const problems: string[] = [];
  let allowed: string[] | undefined;
  const nodeWide = (allowedValue ?? '').trim();
  if (nodeWide !== '') {
    allowed = [];
    for (const raw of nodeWide.split(',')) {
      const name = raw.trim();
      if (name === '') continue;
      const p = networkProblem(ALLOWED_NETWORKS_ENV, '', name);
      if (p) problems.push(p);
      else if (!allowed.includes(name)) allowed.push(name);
    }
  }
  const perNamespace = new Map<string, string[]>();
  for (const raw of (perNamespaceValue ?? '').split(';')) {
    const entry = raw.trim();
    if (entry === '') continue;
    const eq = entry.indexOf('=');
    if (eq < 0) {
      problems.push(
        `${NAMESPACE_NETWORKS_ENV}: entry ${JSON.stringify(entry)} has no '=': expected <namespace>=<network>[|<network>...], entries separated by ';'`,
      );
      continue;
    }
    const ns = entry.slice(0, eq).trim();
    if (!NAMESPACE.test(ns) || ns.length > 63) {
      problems.push(`${NAMESPACE_NETWORKS_ENV}: ${JSON.stringify(ns)} is not a namespace name`);
      continue;
    }
    if (perNamespace.has(ns)) {
      problems.push(`${NAMESPACE_NETWORKS_ENV}: namespace ${ns} is listed twice`);
      continue;
    }
    const nets: string[] = [];
    for (const rawNet of entry.slice(eq + 1).split('|')) {
      const name = rawNet.trim();
      if (name === '') continue;
      const p = networkProblem(NAMESPACE_NETWORKS_ENV, `${ns}: `, name);
      if (p) problems.push(p);
      else if (!nets.includes(name)) nets.push(name);
    }
    perNamespace.set(ns, nets);
  }
  return { policy: { allowed, perNamespace }, problems };
}

/**
 * Whether a pod of `namespace` may attach its VM to `network` (`''`: no annotation, the
 * default network, always allowed). Returns `undefined` when allowed, else the refusal
 * message, which names the rule and the networks the pod may name.
 */
export function networkRefusal(
  policy: NetworkPolicy,
  namespace: string,
  network: string,
): string | undefined {
  if (network === '') return undefined;
  const own = policy.perNamespace.get(namespace);
  const list = own ?? policy.allowed;
  if (list === undefined || list.includes(network)) return undefined;
  const may = list.length === 0 ? 'no network but the default one' : list.join(', ');
  const rule =
    own !== undefined
      ? `${NAMESPACE_NETWORKS_ENV} limits namespace ${namespace} to ${may}`
      : `${ALLOWED_NETWORKS_ENV} limits pods of this node to ${may}`;
  return `network ${JSON.stringify(network)} refused: ${rule} (leave cocoonset.cocoonstack.io/network unset for the default network)`;
}
