// The headline and the recovery of an explain report, by kind: a failure's advice comes from
// the table in advice.ts; the other states (creating by step, hibernating, hibernated, ready,
// evicted, deleting) are explained here. Pure.
import { HIBERNATE, KEEP_SNAPSHOT_ON_DELETE } from '../../contract/annotations.ts';
import { type Advice, type AdviceContext, adviceFor, recreateStep } from './advice.ts';
import type { ExplainFacts, ExplainReport } from './facts.ts';
import { evictionOf } from './sections.ts';

type ReportBody = Omit<ExplainReport, 'headline' | 'recovery'>;
export interface Verdict {
  readonly headline: string;
  readonly recovery: Advice;
}

/** `4m10s`, `35s`, `2h3m`. */
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/** `at <time> (in 4m10s)` / `at <time> (2m ago)`. */
export function when(iso: string, now: Date): string {
  const d = Date.parse(iso) - now.getTime();
  return `${iso} (${d >= 0 ? `in ${duration(d)}` : `${duration(-d)} ago`})`;
}

function nodeDown(r: ReportBody): string | undefined {
  const n = r.node;
  if (!n || n.ready === 'True') return undefined;
  const state = n.ready === undefined ? 'unknown (no node object)' : `NotReady (Ready=${n.ready})`;
  return `Node ${n.name} is ${state}${n.since ? ` since ${n.since}` : ''}: its vk-cocoon daemon is not running or cannot reach the apiserver; nothing about this pod changes until it is back (\`systemctl status vk-cocoon\` on that host); what is shown is its last published state`;
}

function withNode(r: ReportBody, a: Advice): Advice {
  const down = nodeDown(r);
  return down ? { meaning: a.meaning, steps: [down, ...a.steps] } : a;
}

const STEP_MEANING: Readonly<Record<string, string>> = {
  BringingUp: 'cocoon is cloning or booting the VM',
  Starting: 'the VM is bound; the readiness reconcile decides the next step',
  Waiting: 'the VM is bound; waiting for the job in flight',
  Publishing: 'publishing the decision',
  PostCloneFixup:
    'running the guest network fixup (cocoon vm exec, an attempt every 3 s within its budget, 180 s unless VK_FIXUP_BUDGET_SECONDS); exhausted, the pod is failed (PostCloneExecExhausted) with a hint',
  WindowsStaticIP:
    'setting the Windows static IP over the serial console (dial 60 s, enumerate 125 s, 30 s per static NIC); a failure fails the pod (WindowsStaticIPFailed)',
  WaitingForLease:
    "waiting for a DHCP lease of NIC 0's MAC in the cocoon-net lease file: 45 s from the start of the wait, then failed (PostCloneIPWaitTimeout)",
  Resuming: 'a withdrawn hibernate left the VM running; the readiness reconcile publishes ready again',
};

function creating(r: ReportBody, f: ExplainFacts): Verdict {
  const step = r.step;
  const steps: string[] = [];
  let meaning: string;
  if (!step) {
    meaning =
      'the VM is being brought up and is not bound yet (a snapshot or image pull may take many minutes; that time is not counted against the ready deadline)';
    steps.push(
      `On the host: \`cocoon vm inspect ${r.spec.decoded?.vmName || '<vm-name>'}\` shows the VM once the clone or run has started; the events show failed attempts`,
    );
  } else if (step.reason === 'CreateBackoff') {
    meaning = `a transient create failure is retried on a backoff: ${step.message.replace(/^step CreateBackoff; /, '')}`;
    if (step.nextRetry) steps.push(`Next retry ${when(step.nextRetry, f.now)}`);
    if (step.givesUpAt)
      steps.push(
        `Gives up (failed, "gave up after <n> attempts") ${when(step.givesUpAt, f.now)} unless an attempt succeeds`,
      );
    steps.push(
      'Fix what the error names (cocoon on the host, the registry); nothing else to do while it retries',
    );
  } else if (step.reason === 'Waking') {
    meaning = 'restoring the hibernated state (pull and clone)';
    if (step.deadline)
      steps.push(
        `The pull and clone must finish ${when(step.deadline, f.now)}; a failure is failed with a wake: message and retried`,
      );
  } else {
    meaning = STEP_MEANING[step.reason] ?? `step ${step.reason}`;
    if (step.reason === 'PostCloneFixup' && r.postClone.failedAttempts > 0)
      steps.push(
        `${r.postClone.failedAttempts} failed fixup attempt(s) so far (the events show the last error)`,
      );
    if (step.deadline) {
      steps.push(
        step.deadlinePassed
          ? `The ready deadline passed: ${when(step.deadline, f.now)}; a live daemon would have failed the pod (ReadyDeadlineExceeded)`
          : `Decided by the ready deadline at the latest, ${when(step.deadline, f.now)}: ready, or failed with the reason of the step`,
      );
    }
  }
  return { headline: `creating: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
}

function hibernateWhere(r: ReportBody): string {
  const name = String(r.spec.decoded?.vmName || '<vm-name>');
  const pushed = r.events.some((e) => e.reason === 'Hibernated' && e.message.startsWith('snapshot pushed'));
  return pushed ? `${name}:hibernate in the registry` : `the local snapshot ${name}`;
}

export function verdict(r: ReportBody, f: ExplainFacts, ctx: AdviceContext): Verdict {
  const kubectlPod = `-n ${r.pod.namespace} ${r.pod.name}`;
  switch (r.kind) {
    case 'ready': {
      const ip = r.pod.podIP ?? r.vm.ip;
      const probe = r.spec.decoded?.probePort;
      const meaning = r.pod.ready
        ? `the VM is up${ip ? ` with IP ${ip}` : ''} and the pod is Ready`
        : `the VM is up${ip ? ` with IP ${ip}` : ''} but the pod is not Ready: its probe is failing (${probe ? `TCP ${probe}` : 'an IP resolved'})`;
      const steps = r.pod.ready
        ? ['Nothing to do']
        : ['Check the guest service the probe targets; Ready follows the probe by itself'];
      if (r.spec.decoded?.managed === false)
        steps.push("Unmanaged: the VM is the operator's; vk-cocoon only reports it");
      const warned = r.events.filter((e) => e.type === 'Warning').map((e) => e.reason);
      if (warned.length > 0)
        steps.push(`Earlier warnings (events below): ${[...new Set(warned)].join(', ')}`);
      return { headline: `ready: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'creating':
      return creating(r, f);
    case 'failed': {
      const reason = r.failure?.reason ?? 'CreateBringUpFailed';
      const a = adviceFor(reason, ctx) ?? { meaning: 'the pod failed', steps: [recreateStep(ctx)] };
      const vmNote =
        r.vm.id !== null
          ? [`Its VM ${r.vm.id} stays until the pod is deleted (failed is sticky: no retry in place)`]
          : [];
      return {
        headline: `failed (${reason}): ${a.meaning}`,
        recovery: withNode(r, { meaning: a.meaning, steps: [...a.steps, ...vmNote] }),
      };
    }
    case 'invalid-annotations': {
      const keys = [...new Set(r.spec.errors.map((e) => e.key))];
      const meaning = `the VMSpec annotations do not decode (${keys.join(', ')}): the pod never gets a VM`;
      const steps = [
        ...r.spec.errors.map(
          (e) =>
            `Fix ${e.key}: ${e.message.startsWith(`${e.key}: `) ? e.message.slice(e.key.length + 2) : e.message}`,
        ),
        "Fix them in the pod's controller template (a new pod gets them), or on this pod with `kubectl annotate --overwrite`: a changed annotation runs a new create attempt at once",
      ];
      return { headline: `invalid annotations: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'hibernating': {
      const meaning = `a hibernate is in flight${r.step?.reason === 'Hibernating' ? ` (${r.step.message.replace(/^step Hibernating /, '')})` : ''}`;
      const steps = [
        ...(r.step?.phaseDeadlines ?? []).map((p) => `Phase ${p.phase} by ${when(p.by, f.now)}`),
        'It ends hibernated, or rolled back (the VM kept, failed with a hibernate: message, retried by itself)',
        `To cancel: \`kubectl annotate pod ${kubectlPod} ${HIBERNATE}-\` (the VM is kept and lifted back to ready)`,
      ];
      return { headline: `hibernating: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'hibernated': {
      const meaning = `the VM is removed and its state is saved in ${hibernateWhere(r)}`;
      const steps = [
        `To wake it: \`kubectl annotate pod ${kubectlPod} ${HIBERNATE}-\` (the pod goes creating, step Waking, then ready from the saved state)`,
        `Deleting the pod also removes the local snapshot ${ctx.vmName} unless ${KEEP_SNAPSHOT_ON_DELETE} is "true"; registry tags are the operator's to delete`,
      ];
      return { headline: `hibernated: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'evicted': {
      const ev = evictionOf(f.pod, r.events);
      const reason = ev?.reason ?? 'Evicted';
      const a = adviceFor(reason, ctx) ?? { meaning: 'the pod was evicted', steps: [] };
      return {
        headline: `evicted (${reason}${ev?.message ? `: ${ev.message}` : ''}): ${a.meaning}`,
        recovery: a,
      };
    }
    case 'deleting': {
      const meaning = 'the pod is being deleted: vk-cocoon removes its VM, releases its leases and snapshots';
      const steps = [
        'Stuck Terminating: look for ProviderDeleteFailed events ("kept VM <id>": cocoon could not remove the VM; it is retried)',
        `With the daemon down for good: \`kubectl delete pod ${kubectlPod} --grace-period=0 --force\`, then on the host \`cocoon vm rm --force ${ctx.vmId}\``,
      ];
      return { headline: `deleting: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'pending': {
      const meaning = `vk-cocoon has not claimed the pod yet (no lifecycle state; node ${r.pod.node ?? '(none)'})`;
      const steps = [
        r.pod.node
          ? `Is ${r.pod.node} a vk-cocoon node whose daemon runs? (\`kubectl get node ${r.pod.node}\`)`
          : 'The pod is not scheduled: it needs the virtual-kubelet.io/provider toleration and a vk-cocoon node',
      ];
      return { headline: `pending: ${meaning}`, recovery: withNode(r, { meaning, steps }) };
    }
    case 'not-a-vm-pod': {
      const meaning =
        'the pod has no VM annotations (vm.cocoonstack.io/name or id, cocoonset.cocoonstack.io/managed)';
      return {
        headline: `not a VM pod: ${meaning}`,
        recovery: { meaning, steps: ['Nothing for vk-cocoon to explain'] },
      };
    }
    case 'not-found': {
      const pending = r.deferredPushes.map((d) => `${d.repo}:${d.tag}`);
      const meaning = `no pod ${r.pod.namespace}/${r.pod.name}${r.events.length > 0 ? '; the events of a pod of that name are listed' : ''}${pending.length > 0 ? `; its delete-time snapshot ${pending.join(', ')} waits for the registry` : ''}`;
      const steps =
        pending.length > 0
          ? [
              'The state is kept on this node as a local snapshot and pushed when the registry answers: check the registry (OCI_REGISTRY) and the Deferred line above; never remove the local snapshot by hand while it waits (docs/registry.md, "Delete during a registry outage")',
            ]
          : ['Check the namespace and the name (`kubectl get pods -n <namespace>`)'];
      return { headline: `not found: ${meaning}`, recovery: { meaning, steps } };
    }
  }
}
