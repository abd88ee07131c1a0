// `vk-cocoon explain`, the pure half: facts (the pod, its events, its node, the VM record)
// in, the report out: what state the pod is in, why, and what the contract prescribes.
import {
  GENERATION,
  isLifecycleState,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  MANAGED,
  VM_ID,
  VM_NAME,
} from '../../contract/annotations.ts';
import type { AdviceContext } from './advice.ts';
import type { EventReport, ExplainFacts, ExplainKind, ExplainReport } from './facts.ts';
import {
  controllerOf,
  eventsSection,
  evictionOf,
  failureSection,
  postCloneSection,
  specSection,
  stepSection,
  vmSection,
  wakeSection,
} from './sections.ts';
import { verdict } from './verdict.ts';

function kindOf(f: ExplainFacts, ok: boolean, events: readonly EventReport[]): ExplainKind {
  const pod = f.pod;
  if (!pod) return evictionOf(undefined, events) ? 'evicted' : 'not-found';
  if (evictionOf(pod, []) !== undefined) return 'evicted';
  if (pod.metadata?.deletionTimestamp) return 'deleting';
  const ann = pod.metadata?.annotations ?? {};
  const state = ann[LIFECYCLE_STATE] ?? '';
  if (!ok && !ann[VM_ID]) return 'invalid-annotations';
  if (isLifecycleState(state)) return state;
  if (!ann[VM_NAME] && !ann[VM_ID] && ann[MANAGED] !== 'true') return 'not-a-vm-pod';
  return 'pending';
}

export function explain(f: ExplainFacts): ExplainReport {
  const pod = f.pod;
  const ann = pod?.metadata?.annotations ?? {};
  const spec = specSection(pod);
  const { ours: events, others } = eventsSection(f.events);
  const vm = vmSection(f);
  const vmName = String(spec.decoded?.vmName || ann[VM_NAME] || '<vm-name>');
  const vmRef = vm.id ?? (vm.inspect.status === 'found' ? vm.inspect.record.id : vmName);
  const postClone = postCloneSection(f, vmRef, events);
  const kind = kindOf(f, spec.ok, events);
  const failure = kind === 'failed' || kind === 'invalid-annotations' ? failureSection(pod, events) : null;
  const step = stepSection(pod, f.now);
  const ctx: AdviceContext = {
    namespace: f.namespace,
    pod: f.name,
    vmName,
    vmId: vmRef,
    mac: vm.inspect.status === 'found' ? vm.inspect.record.nics[0]?.mac : undefined,
    controller: controllerOf(pod),
    windowsHint: postClone.hint?.startsWith('powershell ') === true,
  };
  const report: Omit<ExplainReport, 'headline' | 'recovery'> = {
    pod: {
      namespace: f.namespace,
      name: f.name,
      found: pod !== undefined,
      uid: pod?.metadata?.uid ?? null,
      node: pod?.spec?.nodeName ?? null,
      phase: pod?.status?.phase ?? null,
      ready: pod?.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false,
      podIP: pod?.status?.podIP ?? null,
      deleting: pod?.metadata?.deletionTimestamp !== undefined && pod?.metadata?.deletionTimestamp !== null,
      controller: ctx.controller ?? null,
    },
    kind,
    spec,
    lifecycle: {
      state: ann[LIFECYCLE_STATE] ?? null,
      observedGeneration: ann[LIFECYCLE_OBSERVED_GENERATION] ?? null,
      message: ann[LIFECYCLE_STATE_MESSAGE] ?? null,
      generation: ann[GENERATION] ?? null,
    },
    step,
    vm,
    wake: wakeSection(events),
    postClone,
    failure,
    events,
    otherEvents: others,
    eventsError: f.eventsError ?? null,
    node: f.node ?? null,
    deferredPushes: f.deferred?.status === 'read' ? f.deferred.pushes : [],
    deferredError: f.deferred?.status === 'error' ? f.deferred.error : null,
  };
  return { ...report, ...verdict(report, f, ctx) };
}
