// The desired Node object (docs/contracts/virtual-node.md "Node object"). Pure: built from configuration and host
// facts, unit-tested; the heartbeat writes it.
import type { V1Node, V1NodeCondition } from '@kubernetes/client-node';
import type { Config } from '../config/env.ts';
import { parseQuantity, quantityMilliValue, quantityValue } from '../vmspec/quantity.ts';
import type { HostFacts } from './host.ts';

export const PROVIDER_TAINT_KEY = 'virtual-kubelet.io/provider';
export const DECLARED_FEATURES = ['ExtendWebSocketsToKubelet'];

export interface NodeFacts {
  config: Pick<
    Config,
    | 'nodeName'
    | 'nodePool'
    | 'providerID'
    | 'kubeletPort'
    | 'reservePercent'
    | 'nodeCpu'
    | 'nodeMem'
    | 'nodeStorage'
    | 'nodeHugepages'
    | 'nodePods'
    | 'snapshotCpuClass'
  >;
  host: HostFacts;
  nodeIP: string;
  version: string;
  /** WebSocket exec passes the exec suite: declare ExtendWebSocketsToKubelet (docs/contracts/virtual-node.md "Node object"). */
  declareWebSockets: boolean;
  /** The daemon runs as the node identity `system:node:<name>` (src/kube/identity.ts): the
   * labels NodeRestriction refuses are left out and the taint is never re-added. */
  nodeIdentity?: boolean;
}

// What a kubelet may label its own Node with (k8s.io/kubelet pkg/apis/well_known_labels.go).
const KUBELET_LABELS = new Set([
  'kubernetes.io/hostname',
  'topology.kubernetes.io/zone',
  'topology.kubernetes.io/region',
  'failure-domain.beta.kubernetes.io/zone',
  'failure-domain.beta.kubernetes.io/region',
  'beta.kubernetes.io/instance-type',
  'node.kubernetes.io/instance-type',
  'kubernetes.io/os',
  'kubernetes.io/arch',
  'beta.kubernetes.io/os',
  'beta.kubernetes.io/arch',
]);
const KUBELET_LABEL_NAMESPACES = ['kubelet.kubernetes.io', 'node.kubernetes.io'];

const inNamespace = (ns: string, domain: string) => ns === domain || ns.endsWith(`.${domain}`);

/** True for a label key the NodeRestriction admission plugin refuses when a node sets it on
 * itself (plugin/pkg/admission/noderestriction getForbiddenLabels): the
 * node-restriction.kubernetes.io namespace, and every kubernetes.io / k8s.io key that is not a
 * kubelet label. `node-role.kubernetes.io/*` and `kubernetes.io/role` are among them: a node
 * must not steer workloads to itself by claiming a role. */
export function nodeRestrictedLabel(key: string): boolean {
  const slash = key.indexOf('/');
  if (slash < 0) return false;
  const ns = key.slice(0, slash);
  if (inNamespace(ns, 'node-restriction.kubernetes.io')) return true;
  const kubernetes = inNamespace(ns, 'kubernetes.io') || inNamespace(ns, 'k8s.io');
  if (!kubernetes) return false;
  return !KUBELET_LABELS.has(key) && !KUBELET_LABEL_NAMESPACES.some((d) => inNamespace(ns, d));
}

export function nodeLabels(f: NodeFacts): Record<string, string> {
  const labels: Record<string, string> = {
    type: 'virtual-kubelet',
    'kubernetes.io/role': 'agent',
    'kubernetes.io/hostname': f.config.nodeName,
    'kubernetes.io/os': 'linux',
    'kubernetes.io/arch': 'amd64',
    'cocoonstack.io/pool': f.config.nodePool,
    'node-role.kubernetes.io/cocoon-vm': '',
  };
  if (f.config.snapshotCpuClass) labels['cocoonstack.io/snapshot-cpu-class'] = f.config.snapshotCpuClass;
  if (!f.nodeIdentity) return labels;
  // As a node identity these would make NodeRestriction refuse the whole create or patch; an
  // administrator applies them instead (docs/operations.md, The node identity).
  return Object.fromEntries(Object.entries(labels).filter(([k]) => !nodeRestrictedLabel(k)));
}

/** The labels of nodeLabels a node identity cannot set on itself (for the startup log). */
export function labelsLeftToAdmin(f: NodeFacts): string[] {
  if (!f.nodeIdentity) return [];
  return Object.keys(nodeLabels({ ...f, nodeIdentity: false })).filter(nodeRestrictedLabel);
}

function bytesOrOverride(override: string | undefined, probed: bigint): bigint {
  if (override) {
    const q = parseQuantity(override);
    if (q && !q.negative) return quantityValue(q);
  }
  return probed;
}

function reduce(value: bigint, reservePercent: number): bigint {
  return (value * BigInt(100 - reservePercent)) / 100n;
}

export interface Resources {
  capacity: Record<string, string>;
  allocatable: Record<string, string>;
}

function cpuCapacityMilli(f: NodeFacts): bigint {
  if (f.config.nodeCpu) {
    const q = parseQuantity(f.config.nodeCpu);
    if (q && !q.negative) return quantityMilliValue(q);
  }
  return BigInt(f.host.cpus) * 1000n;
}

/** The allocatable pods, cpu (millicores) and memory (bytes) as numbers: what pod admission
 * counts against (src/lifecycle/admission.ts), the same figures the node object advertises. */
export function allocatableForAdmission(f: NodeFacts): {
  pods: number;
  cpuMilli: bigint;
  memoryBytes: bigint;
} {
  return {
    pods: f.config.nodePods,
    cpuMilli: reduce(cpuCapacityMilli(f), f.config.reservePercent),
    memoryBytes: reduce(bytesOrOverride(f.config.nodeMem, f.host.memoryBytes), f.config.reservePercent),
  };
}

/** Capacity from the host (or overrides); allocatable withholds VK_RESERVE_PERCENT of
 * every resource except pods, and storage allocatable starts from statfs available. */
export function nodeResources(f: NodeFacts): Resources {
  const c = f.config;
  const cpuMilli = cpuCapacityMilli(f);
  const mem = bytesOrOverride(c.nodeMem, f.host.memoryBytes);
  const storage = bytesOrOverride(c.nodeStorage, f.host.storageTotalBytes);
  const storageAvail = c.nodeStorage ? storage : f.host.storageAvailableBytes;
  const capacity: Record<string, string> = {
    cpu: cpuMilli % 1000n === 0n ? String(cpuMilli / 1000n) : `${cpuMilli}m`,
    memory: String(mem),
    'ephemeral-storage': String(storage),
    pods: String(c.nodePods),
  };
  const allocatable: Record<string, string> = {
    cpu: `${reduce(cpuMilli, c.reservePercent)}m`,
    memory: String(reduce(mem, c.reservePercent)),
    'ephemeral-storage': String(reduce(storageAvail, c.reservePercent)),
    pods: String(c.nodePods),
  };
  if (f.host.hugepages) {
    const hp = bytesOrOverride(c.nodeHugepages, f.host.hugepages.bytes);
    capacity[f.host.hugepages.resource] = String(hp);
    allocatable[f.host.hugepages.resource] = String(reduce(hp, c.reservePercent));
  }
  return { capacity, allocatable };
}

/** The provider-owned conditions, always sent in full (pitfall 19: never adopt values
 * read back from the server). `lastTransitionTime` is kept from `previous` when the status
 * did not change. */
export function nodeConditions(now: Date, previous: V1NodeCondition[] | undefined): V1NodeCondition[] {
  const want: [string, string, string, string][] = [
    ['Ready', 'True', 'KubeletReady', 'kubelet is posting ready status'],
    ['DiskPressure', 'False', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'],
    ['MemoryPressure', 'False', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'],
    ['PIDPressure', 'False', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available'],
    ['NetworkUnavailable', 'False', 'RouteCreated', 'RouteController created a route'],
  ];
  return want.map(([type, status, reason, message]) => {
    const prev = previous?.find((c) => c.type === type);
    const lastTransitionTime =
      prev && prev.status === status && prev.lastTransitionTime ? prev.lastTransitionTime : now;
    return { type, status, reason, message, lastHeartbeatTime: now, lastTransitionTime };
  });
}

export function desiredNode(f: NodeFacts, now: Date): V1Node {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: f.config.nodeName, labels: nodeLabels(f) },
    spec: {
      taints: [{ key: PROVIDER_TAINT_KEY, value: 'cocoon', effect: 'NoSchedule' }],
      ...(f.config.providerID ? { providerID: f.config.providerID } : {}),
    },
    status: desiredNodeStatus(f, now, undefined),
  };
}

export function desiredNodeStatus(f: NodeFacts, now: Date, previous: V1NodeCondition[] | undefined) {
  const { capacity, allocatable } = nodeResources(f);
  return {
    conditions: nodeConditions(now, previous),
    addresses: [
      { type: 'InternalIP', address: f.nodeIP },
      { type: 'Hostname', address: f.config.nodeName },
    ],
    daemonEndpoints: { kubeletEndpoint: { Port: f.config.kubeletPort } },
    capacity,
    allocatable,
    nodeInfo: {
      kubeletVersion: f.version,
      kubeProxyVersion: '',
      operatingSystem: 'linux',
      architecture: 'amd64',
      machineID: '',
      systemUUID: '',
      bootID: '',
      kernelVersion: '',
      osImage: '',
      containerRuntimeVersion: `cocoon://${f.version}`,
    },
    ...(f.declareWebSockets ? { declaredFeatures: DECLARED_FEATURES } : {}),
  };
}
