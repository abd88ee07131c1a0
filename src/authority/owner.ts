// Who owns a VM or a snapshot (docs/security.md, "Identity"): the namespace, the VM name and
// the pod's controller (its `controller: true` owner reference), never the pod's own name or
// UID. A pod recreated under the same VM name in the same namespace by the same controller
// (the operator's rebuild, a wake after `keep-snapshot-on-delete`) is the same identity; a
// pod of another namespace, or of another controller, writing the same VM name is not.

/** The owner identity of a VM or snapshot. */
export interface Owner {
  readonly namespace: string;
  readonly vmName: string;
  /** UID of the pod's controller; `''` for a pod without one. */
  readonly controllerUid: string;
}

/** The parts of a pod an identity is made of (client-node's V1Pod fits). */
export interface PodIdentityParts {
  readonly metadata?: {
    readonly namespace?: string;
    readonly name?: string;
    readonly uid?: string;
    readonly ownerReferences?: readonly { readonly controller?: boolean; readonly uid?: string }[];
  };
}

/** The owner identity of a pod's VM named `vmName`. */
export function ownerOf(pod: PodIdentityParts, vmName: string): Owner {
  const controller = pod.metadata?.ownerReferences?.find((r) => r.controller === true);
  return { namespace: pod.metadata?.namespace ?? '', vmName, controllerUid: controller?.uid ?? '' };
}

export function sameOwner(a: Owner, b: Owner): boolean {
  return a.namespace === b.namespace && a.vmName === b.vmName && a.controllerUid === b.controllerUid;
}

/** `namespace/vmName` (plus `controller <uid>`), for messages. */
export function describeOwner(o: Owner): string {
  const who = o.vmName ? `${o.namespace}/${o.vmName}` : `namespace ${o.namespace || '(none)'}`;
  return o.controllerUid ? `${who} (controller ${o.controllerUid})` : who;
}
