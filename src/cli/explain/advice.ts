// What `vk-cocoon explain` tells an operator to do: the recovery the contracts prescribe
// (docs/contracts/lifecycle.md "Failures and recovery", post-clone.md "Recovery",
// pod-to-vm.md "Hibernate", "Wake", "Op retry", "VM event watcher and eviction"), as one
// table keyed by the Warning reason that decided the pod's state, plus the advice for the
// states that are not failures (creating by step, hibernating, hibernated, ready). Pure.
// docs/operations.md "Runbook" is the prose twin of this table (test/unit/cli checks that
// every reason here has its runbook entry).

/** What the advice may name: the pod, its VM and how to recreate it. */
export interface AdviceContext {
  readonly namespace: string;
  readonly pod: string;
  /** `vm.cocoonstack.io/name` (or `<vm-name>`). */
  readonly vmName: string;
  /** The VM id (annotation or inspect), or `<vm-id>`. */
  readonly vmId: string;
  /** NIC 0's MAC from `cocoon vm inspect`, when known. */
  readonly mac: string | undefined;
  /** `ReplicaSet web-7d9f` etc.: the controller that recreates the pod, when it has one. */
  readonly controller: string | undefined;
  /** The decoded post-clone hint is a Windows command line (else a Linux `sh -c` script). */
  readonly windowsHint: boolean;
}

export interface Advice {
  /** One line: what happened. */
  readonly meaning: string;
  /** What to do, in order (commands included). */
  readonly steps: readonly string[];
}

interface Entry {
  /** Whether the reason decides a pod's state (failOp / a permanent create failure / an
   * eviction): explain looks for these among the events to name the failure. */
  readonly decides: boolean;
  readonly advice: (c: AdviceContext) => Advice;
}

const kubectlPod = (c: AdviceContext) => `-n ${c.namespace} ${c.pod}`;

/** "Delete the pod; its controller recreates it", or what to do without a controller. */
export function recreateStep(c: AdviceContext): string {
  return c.controller
    ? `Recreate the pod through its controller: \`kubectl delete pod ${kubectlPod(c)}\` (its ${c.controller} creates a new one, which gets a new VM and a new attempt)`
    : `Recreate the pod: it has no controller, so save it first (\`kubectl get pod ${kubectlPod(c)} -o yaml > pod.yaml\`), \`kubectl delete pod ${kubectlPod(c)}\`, then re-apply it without its status, uid and resourceVersion`;
}

const leaseCheck = (c: AdviceContext) =>
  `Check cocoon-net on the host (\`systemctl status cocoon-net\`) and its lease file (VK_LEASES_PATH, default /var/lib/cocoon/net/leases.json) for ${c.mac ? `NIC 0's MAC ${c.mac}` : "NIC 0's MAC (`cocoon vm inspect <vm>` shows it)"}: no row, or an expired one, means the guest never got a DHCP answer`;

const hintStep = (c: AdviceContext) =>
  `Optional, to restore connectivity now: run the hint in the guest from the host: ${
    c.windowsHint
      ? `\`cocoon vm exec ${c.vmId} -- <the hint below>\``
      : `\`cocoon vm exec ${c.vmId} -- sh -c "$(kubectl get pod ${kubectlPod(c)} -o jsonpath='{.metadata.annotations.vm\\.cocoonstack\\.io/post-clone-hint}' | base64 -d)"\``
  }; this neither clears failed nor makes the pod Ready`;

const hibernateRetry = (c: AdviceContext): string[] => [
  'The VM keeps running with its id published; nothing is lost. The hibernate is retried by itself (15 s, doubling to every 5 min) while vm.cocoonstack.io/hibernate is "true"',
  'Fix the phase named in the message (registry reachability and credentials for a push, disk space under COCOON_ROOT_DIR for a snapshot, cocoon for a NIC drop or a removal)',
  `To give up and keep the VM running: \`kubectl annotate pod ${kubectlPod(c)} vm.cocoonstack.io/hibernate-\` (the pod is lifted back to ready)`,
];

const evicted = (why: string) => (c: AdviceContext) => ({
  meaning: `the VM died for good (${why}); vk-cocoon removed what was left, wrote the pod Failed and deleted it`,
  steps: [
    c.controller
      ? `Nothing to undo: the pod's ${c.controller} recreates it with a new VM`
      : 'The pod had no controller: re-apply its manifest to get a new VM',
    'Find out why the VM died: the host journal (OOM killer, cloud-hypervisor/firecracker crashes), cocoon logs, and the daemon log lines with this pod (`journalctl -u vk-cocoon | grep <pod>`)',
  ],
});

const RECOVERY: Readonly<Record<string, Entry>> = {
  PostCloneExecExhausted: {
    decides: true,
    advice: (c) => ({
      meaning:
        'the guest network fixup failed for its whole budget (180 s unless VK_FIXUP_BUDGET_SECONDS): the VM runs, probably without network; failed is sticky (Running, not Ready)',
      steps: [
        hintStep(c),
        'Read the attempt errors: fix their cause in the guest image or the network (the guest agent never came up, a missing systemd-networkd or cloud-init, a read-only /etc)',
        recreateStep(c),
      ],
    }),
  },
  WindowsStaticIPFailed: {
    decides: true,
    advice: (c) => ({
      meaning:
        'the Windows static IP could not be set over the serial console (SAC); the VM runs without its address; failed is sticky',
      steps: [
        `The error names the phase (dial: ${'<COCOON_ROOT_DIR>/run/cloudhypervisor/<vm-id>/console.sock'} did not answer; enum: fewer NICs listed than the VM has; set or verify: SAC refused the address)`,
        'Check that the image enables EMS/SAC on the serial console (`bcdedit /ems on`) and that the static address in the network config is valid',
        recreateStep(c),
      ],
    }),
  },
  PostCloneIPWaitTimeout: {
    decides: true,
    advice: (c) => ({
      meaning: "no DHCP lease for NIC 0's MAC was observed within 45 s after the clone (and its fixup)",
      steps: [leaseCheck(c), recreateStep(c)],
    }),
  },
  WakeIPWaitTimeout: {
    decides: true,
    advice: (c) => ({
      meaning: "no DHCP lease for NIC 0's MAC was observed within 45 s after a wake or restore",
      steps: [leaseCheck(c), recreateStep(c)],
    }),
  },
  ReadyDeadlineExceeded: {
    decides: true,
    advice: (c) => ({
      meaning:
        'no ready or failed decision within VK_READY_DEADLINE_SECONDS of the VM being bound: this should never happen and points at a bug',
      steps: [
        `Keep the daemon log lines of this pod (\`journalctl -u vk-cocoon | grep ${c.namespace}/${c.pod}\`) and report them`,
        recreateStep(c),
      ],
    }),
  },
  CreateBringUpFailed: {
    decides: true,
    advice: (c) => ({
      meaning:
        'the create failed for good before a VM was bound (the message says why: a snapshot missing, the VM name held by another pod, an unmanaged id refused, a cocoon error, or a transient failure given up at the ready deadline)',
      steps: [
        'Fix what the message names (push or pull the clone source, free the VM name, correct the annotation, fix cocoon on the host)',
        `A change of the pod's create inputs (annotations, owner, containers) or a generation bump runs a new attempt at once; otherwise: ${recreateStep(c)}`,
      ],
    }),
  },
  snapshot_cpu_class_mismatch: {
    decides: true,
    advice: (c) => ({
      meaning:
        "the pod's nodeSelector cocoonstack.io/snapshot-cpu-class differs from this node's VK_SNAPSHOT_CPU_CLASS: it never gets a VM here",
      steps: [
        `Delete the pod (\`kubectl delete pod ${kubectlPod(c)}\`): scheduled again, it lands on a node of its class`,
        "Or, if the node's setting is what is wrong, fix VK_SNAPSHOT_CPU_CLASS and restart the daemon (a mismatching pod also blocks that start until it is deleted)",
      ],
    }),
  },
  CloneFromDirRefused: {
    decides: true,
    advice: (c) => ({
      meaning:
        "the pod's vm.cocoonstack.io/clone-from-dir does not resolve under ROOT/<its namespace>/ of a root in VK_CLONE_FROM_DIR_ROOTS (or the setting is unset): it never gets a VM",
      steps: [
        "Put the snapshot export under a root of VK_CLONE_FROM_DIR_ROOTS in the directory of the pod's namespace (symlinks must resolve inside it too), and point the annotation there; the message lists the allowed places",
        `Changing the annotation runs a new attempt at once; otherwise: ${recreateStep(c)}`,
      ],
    }),
  },
  NetworkRefused: {
    decides: true,
    advice: (c) => ({
      meaning:
        "the pod's cocoonset.cocoonstack.io/network is not on the node's allow-list (VK_NAMESPACE_NETWORKS for its namespace, else VK_ALLOWED_NETWORKS): it never gets a VM",
      steps: [
        'Name a network the message lists, or remove the annotation for the default network',
        `Changing the annotation runs a new attempt at once; otherwise: ${recreateStep(c)}`,
      ],
    }),
  },
  CreateAdoptInspectFailed: {
    decides: false,
    advice: (c) => ({
      meaning:
        'a VM of this name exists from before a restart but could not be inspected; the create is retried on its backoff',
      steps: [
        `On the host: \`cocoon vm inspect ${c.vmName}\`; a cocoon that hangs or errors is the cause`,
        'Nothing else to do while it retries; it fails at the ready deadline if cocoon never answers',
      ],
    }),
  },
  HibernateEvidenceUnavailable: {
    decides: false,
    advice: (c) => ({
      meaning: `the registry did not answer whether ${c.vmName}:hibernate exists; the create waits on its backoff rather than boot fresh over saved state`,
      steps: [
        'Check that OCI_REGISTRY answers from the host (DNS, TLS, credentials); the create retries by itself',
      ],
    }),
  },
  HibernateEvidenceFailed: {
    decides: true,
    advice: (c) => ({
      meaning:
        "the pod's saved (hibernated) state conflicts with what the pod asks for, or it is lost; the message says which",
      steps: [
        'A source or image conflict: set the image back to the one named in the message to restore the state, or drop vm.cocoonstack.io/hibernate and vm.cocoonstack.io/restore-from-hibernate to boot fresh',
        `State lost: nothing can restore it: ${recreateStep(c)} to boot it fresh`,
      ],
    }),
  },
  HibernateSnapshotExists: {
    decides: false,
    advice: () => ({
      meaning:
        'a create found hibernated state for the VM name and restores it instead of booting fresh (not an error)',
      steps: ['Nothing to do; delete the saved state first if a fresh boot was meant'],
    }),
  },
  HibernateNetResizeFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'the hibernate could not drop the NIC; rolled back',
      steps: hibernateRetry(c),
    }),
  },
  HibernateSnapshotFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'the hibernate could not save the snapshot; rolled back',
      steps: hibernateRetry(c),
    }),
  },
  HibernatePushFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'the hibernate could not push the snapshot to the registry; rolled back',
      steps: hibernateRetry(c),
    }),
  },
  HibernateRemoveFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'the hibernate could not clear the VM id or remove the VM; rolled back',
      steps: hibernateRetry(c),
    }),
  },
  ResumeStartFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'after a restart, vm start of a VM whose hibernate was to resume failed',
      steps: [
        `On the host: \`cocoon vm inspect ${c.vmId}\`; the hibernate is retried by itself`,
        ...hibernateRetry(c).slice(2),
      ],
    }),
  },
  WakePullFailed: {
    decides: true,
    advice: (c) => ({
      meaning:
        'a wake or restore could not get its saved state (no local copy and no registry tag, or the pull failed)',
      steps: [
        `"no hibernated state" in the message: it is gone; drop vm.cocoonstack.io/restore-from-hibernate, or ${recreateStep(c)} to boot fresh`,
        'Otherwise a failed pull (registry reachability, credentials) is retried by itself (15 s, doubling to every 5 min)',
      ],
    }),
  },
  WakeCloneFailed: {
    decides: true,
    advice: (c) => ({
      meaning: 'a wake or restore could not clone the VM from its saved state',
      steps: [
        `On the host: \`cocoon snapshot inspect ${c.vmName}\` and the clone error; the wake is retried by itself (15 s, doubling to every 5 min)`,
      ],
    }),
  },
  SnapshotPolicyNoRegistry: {
    decides: false,
    advice: () => ({
      meaning:
        'a pod with a snapshot policy was deleted on a node without a registry: its VM was removed without a :latest snapshot',
      steps: ['Set OCI_REGISTRY on the node if delete-time snapshots are wanted'],
    }),
  },
  SnapshotPushRefused: {
    decides: false,
    advice: () => ({
      meaning:
        'the delete-time snapshot was not written: the local name or the registry tag belongs to another identity or is a base image vk-cocoon did not write (docs/security.md); the VM was removed without it',
      steps: [
        'Give the pod a vm.cocoonstack.io/name that no base image, other tenant or host VM uses, so its delete-time snapshot has a place of its own',
      ],
    }),
  },
  SnapshotPushDeferred: {
    decides: false,
    advice: () => ({
      meaning:
        'the delete-time push did not land within the grace period (the registry failed or was too slow); the VM was saved as a local snapshot on its node and removed, and the daemon pushes the snapshot when the registry takes it (docs/registry.md, "Delete during a registry outage")',
      steps: [
        'Check the registry (OCI_REGISTRY) from the node; `vk-cocoon explain` run there shows the Deferred line (tries, last error); the push lands on its own once the registry answers',
      ],
    }),
  },
  SnapshotPushDropped: {
    decides: false,
    advice: () => ({
      meaning:
        'a deferred delete-time push was dropped because newer state of the same identity exists (the rule in the message: its local snapshot replaced, the identity running again, or a newer :latest or :hibernate in the registry); nothing was overwritten',
      steps: ['Nothing to do: the newer state is the one kept'],
    }),
  },
  PostCloneExecAttemptFailed: {
    decides: false,
    advice: () => ({
      meaning:
        'one guest fixup attempt failed (usual in the first seconds, while the guest agent starts); retried every 3 s within the fixup budget (180 s unless VK_FIXUP_BUDGET_SECONDS)',
      steps: ['Nothing to do unless it ends in PostCloneExecExhausted'],
    }),
  },
  PostCloneSACDialFailed: sacPhase('dial'),
  PostCloneSACEnumFailed: sacPhase('enum'),
  PostCloneSACSetFailed: sacPhase('set'),
  PostCloneSACVerifyFailed: sacPhase('verify'),
  VMRestarted: {
    decides: false,
    advice: () => ({
      meaning: 'the VM stopped or errored behind vk-cocoon and was started again; the pod kept its state',
      steps: [
        'Find out why it stopped (host journal, OOM killer); a second death within 30 s evicts the pod (RestartCooldown)',
      ],
    }),
  },
  Evicted: { decides: true, advice: evicted('see the reason in the message') },
  VMGone: { decides: true, advice: evicted('it was deleted behind vk-cocoon') },
  RestartCooldown: { decides: true, advice: evicted('it died again within 30 s of a restart') },
  RestartFailed: { decides: true, advice: evicted('vm start failed') },
  VMInspectTimeout: { decides: true, advice: evicted('it could not be inspected for 30 min') },
  UpdateInvalidAnnotations: {
    decides: false,
    advice: (c) => ({
      meaning:
        'the pod has a VM but its annotations no longer decode: the VM is kept and the edit is not applied',
      steps: [
        `Fix the annotation named in the message (\`kubectl annotate pod ${kubectlPod(c)} <key>=<value> --overwrite\`) or in the pod's controller template`,
      ],
    }),
  },
  ManagedFlagRemoved: {
    decides: false,
    advice: (c) => ({
      meaning:
        'cocoonset.cocoonstack.io/managed was turned off on a pod whose VM vk-cocoon created; it keeps managing it',
      steps: [
        `Set it back (\`kubectl annotate pod ${kubectlPod(c)} cocoonset.cocoonstack.io/managed=true --overwrite\`); the VM is removed when the pod is deleted`,
      ],
    }),
  },
  HibernateUnmanaged: {
    decides: false,
    advice: () => ({
      meaning: "hibernate was asked on an unmanaged pod: its VM is the operator's and is not hibernated",
      steps: ['Hibernate the VM with its own tooling, or remove the annotation'],
    }),
  },
  ProviderCreateFailed: providerOutcome('create'),
  ProviderUpdateFailed: providerOutcome('update'),
  ProviderDeleteFailed: providerOutcome('delete'),
};

function sacPhase(phase: string): Entry {
  return {
    decides: false,
    advice: () => ({
      meaning: `the ${phase} phase of the Windows static-IP step over the serial console failed; WindowsStaticIPFailed follows`,
      steps: ['See WindowsStaticIPFailed'],
    }),
  };
}

function providerOutcome(op: string): Entry {
  return {
    decides: false,
    advice: () => ({
      meaning: `the pod controller's ${op} call into the provider failed (the message is the error); it is retried`,
      steps: [
        op === 'delete'
          ? 'A "kept VM <id>" error means vm rm failed: the pod stays Terminating until cocoon removes the VM (`cocoon vm rm --force <id>` on the host)'
          : 'Read the daemon log for the pod (`journalctl -u vk-cocoon | grep <pod>`)',
      ],
    }),
  };
}

/** Every reason the advice table knows (the runbook lists each). */
export const ADVICE_REASONS: readonly string[] = Object.keys(RECOVERY);

/** Reasons that decide a pod's state: the latest one in the events names the failure. */
export function decidingReason(reason: string): boolean {
  return RECOVERY[reason]?.decides === true;
}

export function adviceFor(reason: string, c: AdviceContext): Advice | undefined {
  return RECOVERY[reason]?.advice(c);
}
