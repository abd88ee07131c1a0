// Pods, events and VM records as the apiserver and cocoon show them, for the explain tests.
import type { CoreV1Event, V1Pod, V1PodCondition } from '@kubernetes/client-node';
import type { ExplainFacts } from '../../../src/cli/explain/facts.ts';
import type { VmRecord } from '../../../src/cocoon/records.ts';

export const NOW = new Date('2026-03-01T12:10:00.000Z');
export const NS = 'team-a';
export const VM_ID = 'GA7I6UC3X7MJ7SQDFU3KEB3ZJ4';
export const MAC = '02:1f:89:93:bf:8c';

const base = (vmName: string, extra: Record<string, string> = {}) => ({
  'vm.cocoonstack.io/name': vmName,
  'cocoonset.cocoonstack.io/image': 'acme/agent',
  'cocoonset.cocoonstack.io/managed': 'true',
  'cocoonset.cocoonstack.io/generation': '3',
  ...extra,
});

export function pod(
  name: string,
  annotations: Record<string, string>,
  status: { phase?: string; podIP?: string; ready?: boolean; readiness?: Partial<V1PodCondition> } = {},
): V1Pod {
  const conditions: V1PodCondition[] = [
    { type: 'PodScheduled', status: 'True' },
    { type: 'Ready', status: status.ready ? 'True' : 'False' },
  ];
  if (status.readiness)
    conditions.push({
      type: 'vm.cocoonstack.io/Readiness',
      status: 'False',
      lastTransitionTime: '2026-03-01T12:00:01Z' as unknown as Date,
      ...status.readiness,
    } as V1PodCondition);
  return {
    metadata: {
      name,
      namespace: NS,
      uid: `uid-${name}`,
      annotations,
      ownerReferences: [
        { apiVersion: 'apps/v1', kind: 'ReplicaSet', name: `${name}-rs`, uid: 'rs', controller: true },
      ],
    },
    spec: { nodeName: 'cocoon-pool', containers: [{ name: 'agent', image: 'acme/agent' }] },
    status: { phase: status.phase ?? 'Running', podIP: status.podIP, conditions },
  };
}

export function event(
  reason: string,
  message: string,
  opts: { type?: string; count?: number; at?: string } = {},
) {
  return {
    metadata: { name: `${reason}.1`, namespace: NS },
    involvedObject: { kind: 'Pod', namespace: NS, name: 'x' },
    type: opts.type ?? 'Warning',
    reason,
    message,
    count: opts.count ?? 1,
    firstTimestamp: opts.at ?? '2026-03-01T12:00:02Z',
    lastTimestamp: opts.at ?? '2026-03-01T12:00:02Z',
    source: { component: 'vk-cocoon', host: 'cocoon-pool' },
  } as unknown as CoreV1Event;
}

export const created = event('ProviderCreateSuccess', 'Create pod in provider successfully', {
  type: 'Normal',
  at: '2026-03-01T12:00:00Z',
});

export function vmRecord(name: string, nic: Partial<VmRecord['nics'][number]> = {}): VmRecord {
  return {
    id: VM_ID,
    hypervisor: 'cloud-hypervisor',
    state: 'running',
    pid: 4242,
    name,
    image: 'acme/agent',
    createdAt: '2026-03-01T12:00:00Z',
    imageType: 'oci',
    nics: [{ mac: MAC, tap: 'tap0', netnsPath: '', static: undefined, ...nic }],
    storage: [],
    vsockSocket: '',
  };
}

export const NODE_READY = {
  name: 'cocoon-pool',
  ready: 'True',
  since: '2026-03-01T09:00:00Z',
  message: undefined,
};

export function facts(
  p: V1Pod | undefined,
  events: CoreV1Event[],
  extra: Partial<ExplainFacts> = {},
): ExplainFacts {
  return {
    namespace: NS,
    name: p?.metadata?.name ?? 'gone',
    pod: p,
    events,
    node: NODE_READY,
    now: NOW,
    ...extra,
  };
}

export const SCRIPT = [
  'echo 3 > /proc/sys/vm/drop_caches',
  'echo vk-db-0 > /etc/hostname',
  'rm -f /etc/systemd/network/10-*.network',
  `printf '[Match]\\nMACAddress=${MAC}\\n\\n[Network]\\nAddress=10.88.7.17/16\\nGateway=10.88.0.1\\n' > /etc/systemd/network/10-021f8993bf8c.network`,
  'systemctl restart systemd-networkd',
].join('\n');

export const ann = base;
