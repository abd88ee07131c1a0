// The snapshot CPU-class gate (docs/contracts/pod-to-vm.md "Snapshot CPU-class gate and local snapshot GC"; docs/decisions.md
// "Snapshot GC and the CPU-class gate"): a pod whose nodeSelector names a snapshot CPU class
// runs only on a node whose VK_SNAPSHOT_CPU_CLASS is exactly that class, because a memory
// snapshot restored on another CPU model can fault in the guest. Succeeded and Failed pods are
// exempt (they never run again). Pure: the provider refuses the create (claim) and startup.
import { keyOf } from '../kube/key.ts';

/** The node label (and nodeSelector key) of the snapshot CPU class. */
export const SNAPSHOT_CPU_CLASS_LABEL = 'cocoonstack.io/snapshot-cpu-class';
/** Counter reason (`cocoon_vk_pod_lifecycle_total`) and Warning reason of a refused pod. */
export const CPU_CLASS_MISMATCH = 'snapshot_cpu_class_mismatch';

/** The parts of a pod the gate reads. */
export interface CpuClassPod {
  readonly metadata?: { readonly namespace?: string; readonly name?: string };
  readonly spec?: { readonly nodeSelector?: { readonly [key: string]: string } };
  readonly status?: { readonly phase?: string };
}

export type CpuClassVerdict =
  | { readonly ok: true }
  | {
      readonly ok: false;
      readonly wanted: string;
      readonly node: string | undefined;
      readonly message: string;
    };

const quoteClass = (c: string | undefined) => (c === undefined ? 'unset' : JSON.stringify(c));

/** Whether `pod` may run on a node of class `nodeClass` (`undefined`: VK_SNAPSHOT_CPU_CLASS unset). */
export function checkSnapshotCpuClass(pod: CpuClassPod, nodeClass: string | undefined): CpuClassVerdict {
  const phase = pod.status?.phase;
  if (phase === 'Succeeded' || phase === 'Failed') return { ok: true };
  const selector = pod.spec?.nodeSelector;
  if (!selector || !Object.hasOwn(selector, SNAPSHOT_CPU_CLASS_LABEL)) return { ok: true };
  const wanted = selector[SNAPSHOT_CPU_CLASS_LABEL] ?? '';
  if (nodeClass !== undefined && wanted === nodeClass) return { ok: true };
  return {
    ok: false,
    wanted,
    node: nodeClass,
    message: `the pod's nodeSelector ${SNAPSHOT_CPU_CLASS_LABEL}=${JSON.stringify(wanted)} does not match this node's VK_SNAPSHOT_CPU_CLASS (${quoteClass(nodeClass)}); a snapshot is only restored on the CPU class it was taken on`,
  };
}

/** The startup refusal (docs/contracts/pod-to-vm.md "Startup reconcile" step 2): `undefined`
 * when every non-terminal pod passes the gate, else a message naming each mismatching pod, its
 * class and the node's class. */
export function cpuClassStartupError(
  pods: readonly CpuClassPod[],
  nodeClass: string | undefined,
): string | undefined {
  const bad: string[] = [];
  for (const pod of pods) {
    const v = checkSnapshotCpuClass(pod, nodeClass);
    if (!v.ok) bad.push(`${keyOf(pod)} (${JSON.stringify(v.wanted)})`);
  }
  if (bad.length === 0) return undefined;
  return (
    `snapshot CPU class gate: ${bad.length} non-terminal pod(s) on this node ask for a ${SNAPSHOT_CPU_CLASS_LABEL} ` +
    `other than this node's VK_SNAPSHOT_CPU_CLASS (${quoteClass(nodeClass)}): ${bad.join(', ')}; ` +
    'delete those pods or start the node with the matching VK_SNAPSHOT_CPU_CLASS'
  );
}
