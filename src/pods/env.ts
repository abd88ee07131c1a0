// Container environment resolution (docs/contracts/virtual-node.md "Environment resolution"). The guest VM never receives the
// environment: resolution exists for validation, for the standard kubelet events, and to
// hold back pods whose mandatory ConfigMap/Secret is missing. Sources are injected, so the
// rules are unit-tested without a cluster; the pod controller supplies API-backed sources.
import type { V1Container, V1EnvVar, V1Pod } from '@kubernetes/client-node';

export interface EnvSources {
  /** `null` when the object does not exist; throws on read errors. */
  configMap(namespace: string, name: string): Promise<Record<string, string> | null>;
  secret(namespace: string, name: string): Promise<Record<string, string> | null>;
  /** Service-link variables for the namespace (kubelet semantics); may be empty. */
  serviceEnv(namespace: string): Promise<Record<string, string>>;
}

export interface EnvEvent {
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
}

export interface Dependency {
  kind: 'ConfigMap' | 'Secret';
  namespace: string;
  name: string;
}

export interface EnvResolution {
  /** Resolved variables per container name (only when not blocked). */
  env: Map<string, Record<string, string>>;
  events: EnvEvent[];
  /** Non-empty when a mandatory source or key is missing: do not call the provider. */
  blockedOn: Dependency[];
}

const C_IDENTIFIER = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/;

/** Kubelet's `$(VAR)` expansion: `$$` escapes, unknown references stay literal. */
export function expandVars(input: string, lookup: (name: string) => string | undefined): string {
  let out = '';
  for (let i = 0; i < input.length; i++) {
    const c = input[i];
    if (c !== '$' || i + 1 >= input.length) {
      out += c;
      continue;
    }
    const next = input[i + 1];
    if (next === '$') {
      out += '$';
      i++;
      continue;
    }
    if (next === '(') {
      const close = input.indexOf(')', i + 2);
      if (close > 0) {
        const name = input.slice(i + 2, close);
        const v = lookup(name);
        out += v ?? `$(${name})`;
        i = close;
        continue;
      }
    }
    out += c;
  }
  return out;
}

function fieldRefValue(pod: V1Pod, path: string): string | undefined {
  const meta = pod.metadata ?? {};
  const labelMatch = /^metadata\.labels\['(.+)'\]$/.exec(path) ?? /^metadata\.labels\[(.+)\]$/.exec(path);
  if (labelMatch) return meta.labels?.[labelMatch[1] as string] ?? '';
  const annMatch =
    /^metadata\.annotations\['(.+)'\]$/.exec(path) ?? /^metadata\.annotations\[(.+)\]$/.exec(path);
  if (annMatch) return meta.annotations?.[annMatch[1] as string] ?? '';
  switch (path) {
    case 'metadata.name':
      return meta.name ?? '';
    case 'metadata.namespace':
      return meta.namespace ?? '';
    case 'metadata.uid':
      return meta.uid ?? '';
    case 'spec.nodeName':
      return pod.spec?.nodeName ?? '';
    case 'spec.serviceAccountName':
      return pod.spec?.serviceAccountName ?? '';
    // Resolved to empty at create time instead of blocking the pod forever (pitfall 7).
    case 'status.podIP':
    case 'status.podIPs':
    case 'status.hostIP':
    case 'status.hostIPs':
      return '';
    default:
      return undefined;
  }
}

function resourceFieldValue(container: V1Container, resource: string, divisor: string | undefined): string {
  const [kind, name] = resource.split('.', 2) as [string, string];
  const set = kind === 'limits' ? container.resources?.limits : container.resources?.requests;
  const v = set?.[name];
  if (v === undefined) return '0';
  if (!divisor || divisor === '1') return String(v);
  return `${String(v)}/${divisor}`;
}

type Cache = Map<string, Promise<Record<string, string> | null | Error>>;

async function lookup(
  cache: Cache,
  kind: Dependency['kind'],
  namespace: string,
  name: string,
  sources: EnvSources,
): Promise<Record<string, string> | null | Error> {
  const key = `${kind}/${namespace}/${name}`;
  let p = cache.get(key);
  if (!p) {
    const read = kind === 'ConfigMap' ? sources.configMap(namespace, name) : sources.secret(namespace, name);
    p = read.catch((err: unknown) => (err instanceof Error ? err : new Error(String(err))));
    cache.set(key, p);
  }
  return await p;
}

export async function resolvePodEnv(pod: V1Pod, sources: EnvSources): Promise<EnvResolution> {
  const namespace = pod.metadata?.namespace ?? 'default';
  const events: EnvEvent[] = [];
  const blockedOn: Dependency[] = [];
  const env = new Map<string, Record<string, string>>();
  const cache: Cache = new Map();
  const block = (dep: Dependency) => {
    if (!blockedOn.some((d) => d.kind === dep.kind && d.name === dep.name)) blockedOn.push(dep);
  };
  const serviceEnv =
    pod.spec?.enableServiceLinks === false ? {} : await sources.serviceEnv(namespace).catch(() => ({}));

  for (const container of pod.spec?.containers ?? []) {
    const vars: Record<string, string> = {};
    for (const from of container.envFrom ?? []) {
      const ref = from.configMapRef ?? from.secretRef;
      if (!ref?.name) continue;
      const kind: Dependency['kind'] = from.configMapRef ? 'ConfigMap' : 'Secret';
      const optional = ref.optional === true;
      const data = await lookup(cache, kind, namespace, ref.name, sources);
      const label = optional ? 'Optional' : 'Mandatory';
      if (data instanceof Error) {
        events.push({
          type: 'Warning',
          reason: `FailedToRead${label}${kind}`,
          message: `Couldn't get ${kind.toLowerCase()} ${namespace}/${ref.name}: ${data.message}`,
        });
        if (!optional) block({ kind, namespace, name: ref.name });
        continue;
      }
      if (data === null) {
        events.push({
          type: 'Warning',
          reason: `${label}${kind}NotFound`,
          message: `${kind.toLowerCase()} "${ref.name}" not found`,
        });
        if (!optional) block({ kind, namespace, name: ref.name });
        continue;
      }
      const invalid: string[] = [];
      for (const [k, v] of Object.entries(data)) {
        const name = `${from.prefix ?? ''}${k}`;
        if (!C_IDENTIFIER.test(name)) {
          invalid.push(name);
          continue;
        }
        vars[name] = v;
      }
      if (invalid.length > 0) {
        events.push({
          type: 'Warning',
          reason: 'InvalidEnvironmentVariableNames',
          message: `Keys [${invalid.sort().join(', ')}] from the EnvFrom ${kind.toLowerCase()} ${namespace}/${ref.name} were skipped since they are considered invalid environment variable names.`,
        });
      }
    }
    const mapping = (name: string) => vars[name] ?? serviceEnv[name];
    for (const ev of container.env ?? ([] as V1EnvVar[])) {
      if (ev.valueFrom === undefined) {
        vars[ev.name] = expandVars(ev.value ?? '', mapping);
        continue;
      }
      const vf = ev.valueFrom;
      const keyRef = vf.configMapKeyRef ?? vf.secretKeyRef;
      if (keyRef) {
        const kind: Dependency['kind'] = vf.configMapKeyRef ? 'ConfigMap' : 'Secret';
        const optional = keyRef.optional === true;
        const label = optional ? 'Optional' : 'Mandatory';
        const data = await lookup(cache, kind, namespace, keyRef.name ?? '', sources);
        if (data instanceof Error) {
          events.push({
            type: 'Warning',
            reason: `FailedToRead${label}${kind}`,
            message: `Couldn't get ${kind.toLowerCase()} ${namespace}/${keyRef.name}: ${data.message}`,
          });
          if (!optional) block({ kind, namespace, name: keyRef.name ?? '' });
        } else if (data === null) {
          events.push({
            type: 'Warning',
            reason: `${label}${kind}NotFound`,
            message: `${kind.toLowerCase()} "${keyRef.name}" not found`,
          });
          if (!optional) block({ kind, namespace, name: keyRef.name ?? '' });
        } else if (!(keyRef.key in data)) {
          events.push({
            type: 'Warning',
            reason: `${label}${kind}KeyNotFound`,
            message: `Couldn't find key ${keyRef.key} in ${kind} ${namespace}/${keyRef.name}`,
          });
          if (!optional) block({ kind, namespace, name: keyRef.name ?? '' });
        } else {
          vars[ev.name] = data[keyRef.key] as string;
        }
        continue;
      }
      if (vf.fieldRef) {
        const v = fieldRefValue(pod, vf.fieldRef.fieldPath);
        if (v !== undefined) vars[ev.name] = v;
        continue;
      }
      if (vf.resourceFieldRef) {
        const target = vf.resourceFieldRef.containerName
          ? (pod.spec?.containers.find((c) => c.name === vf.resourceFieldRef?.containerName) ?? container)
          : container;
        vars[ev.name] = resourceFieldValue(
          target,
          vf.resourceFieldRef.resource,
          vf.resourceFieldRef.divisor as string | undefined,
        );
      }
    }
    env.set(container.name, { ...serviceEnv, ...vars });
  }
  return { env: blockedOn.length > 0 ? new Map() : env, events, blockedOn };
}
