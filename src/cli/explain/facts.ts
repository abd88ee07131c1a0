// The facts `vk-cocoon explain` reads (the pod, its events, its node, and on the VM's host the
// `cocoon vm inspect` record) and the report it turns them into. Types only, plus the small
// pure readers of the facts both halves of the report share.
import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { VmRecord } from '../../cocoon/records.ts';

/** What `cocoon vm inspect <ref>` answered on this host (or why it was not asked). */
export type VmLookup =
  | { readonly status: 'found'; readonly ref: string; readonly record: VmRecord }
  | { readonly status: 'absent'; readonly ref: string }
  | { readonly status: 'error'; readonly ref: string; readonly error: string }
  | { readonly status: 'skipped'; readonly why: string };

/** What `cocoon snapshot inspect <vmName>` answered (hibernating and hibernated pods). */
export type SnapshotLookup =
  | { readonly status: 'found'; readonly name: string; readonly id: string }
  | { readonly status: 'absent'; readonly name: string }
  | { readonly status: 'error'; readonly name: string; readonly error: string };

/** The node the pod is bound to, as its Ready condition shows it. */
export interface NodeFacts {
  readonly name: string;
  /** `True`, `False`, `Unknown`; undefined when the node object is missing or unreadable. */
  readonly ready: string | undefined;
  readonly since: string | undefined;
  readonly message: string | undefined;
}

/** A delete-time push the VM's host deferred for this pod (its provenance ledger). */
export interface DeferredPushFact {
  readonly repo: string;
  readonly tag: string;
  readonly savedAt: string;
  readonly attempts: number;
  readonly lastError: string;
  readonly lastAttemptAt: string;
}

/** What the ledger on this host says of the pod's deferred pushes (or why it was not read). */
export type DeferredLookup =
  | { readonly status: 'read'; readonly pushes: readonly DeferredPushFact[] }
  | { readonly status: 'error'; readonly error: string };

export interface ExplainFacts {
  readonly namespace: string;
  readonly name: string;
  /** undefined: no such pod (deleted, evicted, or a typo). */
  readonly pod: V1Pod | undefined;
  /** The events whose involved object is the pod (every source; the report keeps ours). */
  readonly events: readonly CoreV1Event[];
  /** Why the events could not be listed (RBAC, a timeout); the report goes on without them. */
  readonly eventsError?: string | undefined;
  readonly node?: NodeFacts | undefined;
  readonly vm?: VmLookup | undefined;
  readonly savedState?: SnapshotLookup | undefined;
  /** undefined: no ledger on this host (not the VM's host). */
  readonly deferred?: DeferredLookup | undefined;
  readonly now: Date;
}

export type ExplainKind =
  | 'ready'
  | 'creating'
  | 'failed'
  | 'invalid-annotations'
  | 'hibernating'
  | 'hibernated'
  | 'evicted'
  | 'deleting'
  | 'pending'
  | 'not-a-vm-pod'
  | 'not-found';

export interface Issue {
  readonly key: string;
  readonly message: string;
}

export interface SpecReport {
  readonly ok: boolean;
  readonly errors: readonly Issue[];
  readonly warnings: readonly Issue[];
  /** The decoded VMSpec (bigints as decimal strings); null when it does not decode. */
  readonly decoded: Readonly<Record<string, string | number | boolean | null>> | null;
}

export interface StepReport {
  /** The `vm.cocoonstack.io/Readiness` condition's reason: the current step. */
  readonly reason: string;
  readonly status: string;
  readonly message: string;
  readonly since: string | null;
  /** The ready deadline (creating with a VM), or a wake's `pull and clone by`. */
  readonly deadline: string | null;
  readonly deadlinePassed: boolean | null;
  /** A create backoff: the next retry and the give-up time. */
  readonly nextRetry: string | null;
  readonly givesUpAt: string | null;
  /** A hibernate in flight: every phase and its deadline. */
  readonly phaseDeadlines: readonly { readonly phase: string; readonly by: string }[];
}

export interface EventReport {
  readonly type: string;
  readonly reason: string;
  readonly count: number;
  readonly firstTime: string | null;
  readonly lastTime: string | null;
  readonly message: string;
}

/** The source of a wake (docs/peer-restore.md): the verified local copy, the pushing host (a
 * peer restore) or the registry's `<vmName>:hibernate`. */
export interface WakeReport {
  readonly source: 'local' | 'peer' | 'registry' | 'other';
  /** The local snapshot, the peer node or the registry reference. */
  readonly from: string;
  readonly at: string | null;
}

export interface VmReport {
  readonly id: string | null;
  readonly ip: string | null;
  readonly inspect:
    | {
        readonly status: 'found';
        readonly ref: string;
        readonly record: {
          readonly id: string;
          readonly name: string;
          readonly state: string;
          readonly hypervisor: string;
          readonly pid: number;
          readonly image: string;
          readonly nics: readonly {
            readonly mac: string;
            readonly tap: string;
            readonly static: string | null;
          }[];
        };
      }
    | { readonly status: 'absent'; readonly ref: string }
    | { readonly status: 'error'; readonly ref: string; readonly error: string }
    | { readonly status: 'skipped'; readonly why: string };
  readonly savedState: SnapshotLookup | null;
}

export interface PostCloneReport {
  readonly state: string | null;
  /** The decoded `post-clone-hint`: the exact guest commands. */
  readonly hint: string | null;
  /** How to run the hint from the VM's host (`cocoon vm exec <id> -- …`). */
  readonly hintCommand: string | null;
  readonly hintError: string | null;
  /** `post-clone-errors`, one entry per attempt (`attempt N: …`) or the SAC error. */
  readonly errors: readonly string[];
  /** Failed fixup attempts counted by the PostCloneExecAttemptFailed events. */
  readonly failedAttempts: number;
}

export interface ExplainReport {
  readonly pod: {
    readonly namespace: string;
    readonly name: string;
    readonly found: boolean;
    readonly uid: string | null;
    readonly node: string | null;
    readonly phase: string | null;
    readonly ready: boolean;
    readonly podIP: string | null;
    readonly deleting: boolean;
    readonly controller: string | null;
  };
  readonly kind: ExplainKind;
  /** One line: the state and why. */
  readonly headline: string;
  readonly spec: SpecReport;
  readonly lifecycle: {
    readonly state: string | null;
    readonly observedGeneration: string | null;
    readonly message: string | null;
    /** The pod's `cocoonset.cocoonstack.io/generation`. */
    readonly generation: string | null;
  };
  readonly step: StepReport | null;
  readonly vm: VmReport;
  /** Where the last wake cloned from (its `Woken` event), or null when none is on record. */
  readonly wake: WakeReport | null;
  readonly postClone: PostCloneReport;
  /** The Warning reason that decided a failure (an event of ours, else inferred from the message). */
  readonly failure: {
    readonly reason: string;
    readonly message: string;
    readonly source: 'event' | 'inferred';
  } | null;
  /** Our (vk-cocoon's) events for this pod incarnation, oldest first. */
  readonly events: readonly EventReport[];
  /** Events of other components (scheduler, kubelet API users), not listed. */
  readonly otherEvents: number;
  readonly eventsError: string | null;
  readonly node: NodeFacts | null;
  /** Delete-time pushes of this pod still waiting for the registry (the ledger on this host). */
  readonly deferredPushes: readonly DeferredPushFact[];
  readonly deferredError: string | null;
  /** What the contract prescribes for this state. */
  readonly recovery: { readonly meaning: string; readonly steps: readonly string[] };
}

/** An API timestamp (the hand-written client leaves them as strings) as ISO text. */
export function isoTime(v: unknown): string | null {
  if (v instanceof Date) return Number.isNaN(v.getTime()) ? null : v.toISOString();
  if (typeof v === 'string' && v !== '') return v;
  return null;
}

/** Whether an event was written by vk-cocoon. */
export function isOurs(e: CoreV1Event): boolean {
  return e.source?.component === 'vk-cocoon' || e.reportingComponent === 'vk-cocoon';
}
