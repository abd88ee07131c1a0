// The one key format of a namespaced object: `namespace/name` (client-go's
// MetaNamespaceKeyFunc). Pod records, queues, informer caches, the status writer and log lines
// all use it; `splitKey` is its inverse.

/** The parts of an object its key is made of (client-node's objects fit). */
export interface Keyed {
  readonly metadata?: { readonly namespace?: string; readonly name?: string };
}

export function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** `namespace/name` of an object (`''` for a missing part). */
export function keyOf(obj: Keyed): string {
  return podKey(obj.metadata?.namespace ?? '', obj.metadata?.name ?? '');
}

/** `[namespace, name]` of a key (a key without `/` is a name in namespace `''`). */
export function splitKey(key: string): [string, string] {
  const i = key.indexOf('/');
  return i < 0 ? ['', key] : [key.slice(0, i), key.slice(i + 1)];
}
