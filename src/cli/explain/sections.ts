// The sections of an explain report, each read from the facts on its own: the VMSpec, the
// Readiness step, the events, the VM, the post-clone keys, the failure reason. Pure.
import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import {
  LIFECYCLE_STATE_MESSAGE,
  POST_CLONE_ERRORS,
  POST_CLONE_HINT,
  POST_CLONE_STATE,
  VM_ID,
} from '../../contract/annotations.ts';
import { decodeVMSpec } from '../../vmspec/decode.ts';
import { decidingReason } from './advice.ts';
import type {
  EventReport,
  ExplainFacts,
  PostCloneReport,
  SpecReport,
  StepReport,
  VmReport,
  WakeReport,
} from './facts.ts';
import { isOurs, isoTime } from './facts.ts';

export const READINESS_CONDITION = 'vm.cocoonstack.io/Readiness';

const annotationsOf = (pod: V1Pod | undefined): Record<string, string> => pod?.metadata?.annotations ?? {};

export function specSection(pod: V1Pod | undefined): SpecReport {
  if (!pod) return { ok: false, errors: [], warnings: [], decoded: null };
  const r = decodeVMSpec(pod.metadata?.annotations, {
    namespace: pod.metadata?.namespace,
    ownerReferences: pod.metadata?.ownerReferences,
    containers: pod.spec?.containers,
  });
  if (!r.ok) {
    return {
      ok: false,
      errors: r.errors.map((e) => ({ key: e.key, message: e.message })),
      warnings: [],
      decoded: null,
    };
  }
  const decoded: Record<string, string | number | boolean | null> = {};
  for (const [k, v] of Object.entries(r.spec))
    decoded[k] =
      typeof v === 'bigint' ? v.toString() : v === undefined ? null : (v as string | number | boolean);
  return {
    ok: true,
    errors: [],
    warnings: r.warnings.map((w) => ({ key: w.key, message: w.message })),
    decoded,
  };
}

const RFC3339 = String.raw`\d{4}-\d\d-\d\dT[0-9:.]+Z`;
const match = (text: string, re: string) => new RegExp(re).exec(text)?.[1] ?? null;

/** The `vm.cocoonstack.io/Readiness` condition with the times its message names. */
export function stepSection(pod: V1Pod | undefined, now: Date): StepReport | null {
  const c = pod?.status?.conditions?.find((x) => x.type === READINESS_CONDITION);
  if (!c) return null;
  const message = c.message ?? '';
  const deadline =
    match(message, `ready deadline (${RFC3339})`) ?? match(message, `pull and clone by (${RFC3339})`);
  const phaseDeadlines = message.includes('deadlines: ')
    ? [...message.matchAll(new RegExp(`(\\w+) by (${RFC3339})`, 'g'))].map((m) => ({
        phase: m[1] ?? '',
        by: m[2] ?? '',
      }))
    : [];
  return {
    reason: c.reason ?? '',
    status: c.status ?? '',
    message,
    since: isoTime(c.lastTransitionTime),
    deadline,
    deadlinePassed: deadline === null ? null : Date.parse(deadline) <= now.getTime(),
    nextRetry: match(message, `next retry (${RFC3339})`),
    givesUpAt: match(message, `gives up at (${RFC3339})`),
    phaseDeadlines,
  };
}

const eventTime = (e: CoreV1Event) =>
  isoTime(e.lastTimestamp) ??
  isoTime(e.eventTime) ??
  isoTime(e.firstTimestamp) ??
  isoTime(e.metadata?.creationTimestamp);

/** Our events, oldest first, and how many other components' events there are. */
export function eventsSection(events: readonly CoreV1Event[]): { ours: EventReport[]; others: number } {
  const ours = events
    .filter(isOurs)
    .map((e) => ({
      type: e.type ?? '',
      reason: e.reason ?? '',
      count: e.count ?? 1,
      firstTime: isoTime(e.firstTimestamp) ?? isoTime(e.eventTime),
      lastTime: eventTime(e),
      message: e.message ?? '',
    }))
    .sort((a, b) => (a.lastTime ?? '').localeCompare(b.lastTime ?? ''));
  return { ours, others: events.length - ours.length };
}

/** The last wake's source, from the `Woken` event's `cloned from …` (written by
 * src/provider/cocoon/ops/create.ts: `peer <node>`, `<vmName>:hibernate`, or `<vmName>`). */
export function wakeSection(events: readonly EventReport[]): WakeReport | null {
  const woken = events.findLast((e) => e.reason === 'Woken');
  if (!woken) return null;
  const from = woken.message.replace(/^cloned from /, '');
  const peer = /^peer (\S+)/.exec(from);
  const source: WakeReport['source'] = peer
    ? 'peer'
    : from.endsWith(':hibernate')
      ? 'registry'
      : from !== woken.message && !/\s/.test(from)
        ? 'local'
        : 'other';
  return { source, from: peer ? (peer[1] as string) : from, at: woken.lastTime };
}

export function vmSection(f: ExplainFacts): VmReport {
  const ann = annotationsOf(f.pod);
  const vm = f.vm ?? { status: 'skipped', why: 'not looked up' };
  const inspect: VmReport['inspect'] =
    vm.status === 'found'
      ? {
          status: 'found',
          ref: vm.ref,
          record: {
            id: vm.record.id,
            name: vm.record.name,
            state: vm.record.state,
            hypervisor: vm.record.hypervisor,
            pid: vm.record.pid,
            image: vm.record.image,
            nics: vm.record.nics.map((n) => ({
              mac: n.mac,
              tap: n.tap,
              static: n.static ? `${n.static.ip}/${n.static.prefix} via ${n.static.gateway || '-'}` : null,
            })),
          },
        }
      : vm;
  return {
    id: ann[VM_ID] || null,
    ip: ann['vm.cocoonstack.io/ip'] || f.pod?.status?.podIP || null,
    inspect,
    savedState: f.savedState ?? null,
  };
}

/** `sh` single quotes around any text. */
export const shQuote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

export function postCloneSection(
  f: ExplainFacts,
  vmRef: string,
  events: readonly EventReport[],
): PostCloneReport {
  const ann = annotationsOf(f.pod);
  const raw = ann[POST_CLONE_HINT];
  let hint: string | null = null;
  let hintError: string | null = null;
  if (raw !== undefined && raw !== '') {
    const text = Buffer.from(raw, 'base64').toString('utf8');
    if (Buffer.from(text, 'utf8').toString('base64') === raw) hint = text;
    else hintError = `${POST_CLONE_HINT} is not standard base64 of UTF-8 text`;
  }
  const errorsText = ann[POST_CLONE_ERRORS] ?? '';
  const errors = errorsText === '' ? [] : errorsText.split(/\n(?=attempt \d+: )/);
  const hintCommand =
    hint === null
      ? null
      : hint.startsWith('powershell ')
        ? `cocoon vm exec ${vmRef} -- ${hint}`
        : `cocoon vm exec ${vmRef} -- sh -c ${shQuote(hint)}`;
  return {
    state: ann[POST_CLONE_STATE] || null,
    hint,
    hintCommand,
    hintError,
    errors,
    failedAttempts: events
      .filter((e) => e.reason === 'PostCloneExecAttemptFailed')
      .reduce((n, e) => n + e.count, 0),
  };
}

/** The op prefix failOp puts before an event message (`create: `, `update: `). */
const OP_PREFIX = /^(create|update|delete): /;

/**
 * The Warning reason that decided a `failed` pod: the latest deciding event of ours whose
 * message (after its `<op>: `) is where the lifecycle message starts, else the latest deciding
 * event, else inferred from the message and the post-clone keys (events expire after an hour).
 */
export function failureSection(
  pod: V1Pod | undefined,
  events: readonly EventReport[],
): { reason: string; message: string; source: 'event' | 'inferred' } {
  const ann = annotationsOf(pod);
  const message = ann[LIFECYCLE_STATE_MESSAGE] ?? '';
  const deciding = events.filter((e) => e.type === 'Warning' && decidingReason(e.reason)).reverse();
  const same = deciding.find((e) => {
    const text = e.message.replace(OP_PREFIX, '');
    return text !== '' && (message.startsWith(text) || text.startsWith(message));
  });
  const found = same ?? deciding[0];
  if (found) return { reason: found.reason, message, source: 'event' };
  return {
    reason: inferReason(message, ann[POST_CLONE_STATE] ?? '', ann[POST_CLONE_ERRORS] ?? ''),
    message,
    source: 'inferred',
  };
}

function inferReason(message: string, postClone: string, errors: string): string {
  if (postClone === 'failed')
    return errors.startsWith('sac ') ? 'WindowsStaticIPFailed' : 'PostCloneExecExhausted';
  if (/: dhcp lease not observed within \d+s$/.test(message))
    return message.startsWith('wake ') ? 'WakeIPWaitTimeout' : 'PostCloneIPWaitTimeout';
  if (/^creating .*: no ready decision within \d+s$/.test(message)) return 'ReadyDeadlineExceeded';
  if (message.startsWith('hibernate: ')) {
    if (message.includes('hibernated state lost')) return 'HibernateEvidenceFailed';
    if (message.includes('before resuming the hibernate')) return 'ResumeStartFailed';
    if (message.includes('push')) return 'HibernatePushFailed';
    if (message.includes('snapshot')) return 'HibernateSnapshotFailed';
    return 'HibernateRemoveFailed';
  }
  if (message.startsWith('wake: ')) return message.includes('clone ') ? 'WakeCloneFailed' : 'WakePullFailed';
  if (message.includes('snapshot-cpu-class')) return 'snapshot_cpu_class_mismatch';
  if (message.includes('hibernated state')) return 'HibernateEvidenceFailed';
  return 'CreateBringUpFailed';
}

/** The reasons an evicted pod's `agent` container terminates with (pod-to-vm.md "Eviction"). */
export const EVICTION_REASONS: readonly string[] = [
  'VMGone',
  'RestartCooldown',
  'RestartFailed',
  'VMInspectTimeout',
];

export function controllerOf(pod: V1Pod | undefined): string | undefined {
  const owner =
    pod?.metadata?.ownerReferences?.find((o) => o.controller) ?? pod?.metadata?.ownerReferences?.[0];
  return owner ? `${owner.kind} ${owner.name}` : undefined;
}

/** The eviction reason of a pod: its terminated `agent`, else its latest `Evicted` event. */
export function evictionOf(
  pod: V1Pod | undefined,
  events: readonly EventReport[],
): { reason: string; message: string } | undefined {
  const term = pod?.status?.containerStatuses?.[0]?.state?.terminated;
  if (pod?.status?.phase === 'Failed' && term?.reason && EVICTION_REASONS.includes(term.reason))
    return { reason: term.reason, message: term.message ?? '' };
  const ev = [...events].reverse().find((e) => e.reason === 'Evicted');
  if (!ev) return undefined;
  const m = /^(\w+): ([\s\S]*)$/.exec(ev.message);
  return m && EVICTION_REASONS.includes(m[1] ?? '')
    ? { reason: m[1] ?? '', message: m[2] ?? '' }
    : { reason: 'Evicted', message: ev.message };
}
