/**
 * The intent engine (docs/contracts/lifecycle.md "Intent rules") as pure functions over an {@link IntentRecord}.
 *
 * The provider keeps one record per pod key; it is the single source of truth for the lifecycle
 * triple, and the apiserver copy is a projection of it. These functions decide; the caller owns
 * the map of records, the flush (R1) and the per-key serialization (docs/contracts/lifecycle.md "Single writer").
 */
import {
  isLifecycleState,
  LIFECYCLE_OBSERVED_GENERATION,
  LIFECYCLE_STATE,
  LIFECYCLE_STATE_MESSAGE,
  type LifecycleState,
  MESSAGE_MAX_BYTES,
  parseGeneration,
} from '../contract/annotations.ts';
import { truncateUtf8 } from '../util/text.ts';

/** One pod key's lifecycle intent (docs/contracts/lifecycle.md "Intent rules"). */
export interface IntentRecord {
  /** `metadata.uid` of the incarnation the intent belongs to (R2). */
  readonly uid: string;
  readonly state: LifecycleState;
  /** Observed generation (int64, exact as bigint). */
  readonly generation: bigint;
  /** Failure text, `''` for every other state; at most 4096 bytes of UTF-8 (docs/contracts/annotations.md "Size limits"). */
  readonly message: string;
  /** {@link comparisonKey} of the last triple that reached the apiserver; `''` when never flushed. */
  readonly flushedKey: string;
}

/** A request to change the lifecycle triple. */
export interface StageRequest {
  readonly uid: string;
  readonly state: LifecycleState;
  /** Generation on the pod object the caller holds (may be an old copy, R3). */
  readonly generation: bigint;
  readonly message: string;
}

/** Why {@link stage} accepted or dropped a request. */
export type StageReason =
  /** The record changed (needs a flush). */
  | 'accepted'
  /** Accepted, but the triple is identical to the current one: nothing to flush (docs/contracts/lifecycle.md "Idempotency keyed by VM ID"). */
  | 'unchanged'
  /** R2: the request is for another incarnation than the current intent. */
  | 'uid_mismatch'
  /** R3: the effective generation is lower than the current intent's. */
  | 'stale_generation'
  /** R4: a non-attempt state over a same-generation `failed`. */
  | 'sticky_failed';

export type StageResult =
  | { readonly accepted: true; readonly record: IntentRecord; readonly reason: 'accepted' | 'unchanged' }
  | {
      readonly accepted: false;
      /** The current record, untouched (`undefined` when there was none). */
      readonly record: IntentRecord | undefined;
      readonly reason: 'uid_mismatch' | 'stale_generation' | 'sticky_failed';
    };

/** Change-detection key `state + "\0" + generation + "\0" + message` (docs/contracts/annotations.md "Lifecycle triple"). */
export function comparisonKey(record: Pick<IntentRecord, 'state' | 'generation' | 'message'>): string {
  return `${record.state}\0${record.generation}\0${record.message}`;
}

/** States that may replace a same-generation `failed`: a new attempt (R4). */
const REPLACES_FAILED: readonly LifecycleState[] = ['failed', 'creating', 'hibernating'];

/**
 * The message stored for a state: failures keep their text (truncated to 4096 bytes, docs/contracts/annotations.md "Size limits");
 * every other state carries no message, so a stale failure reason never survives into the next
 * state (docs/contracts/annotations.md "Lifecycle triple").
 */
/** A message is kept for `failed` (why) and for `creating` (the last error of a create that
 * retries, issue 20: the Go contract had messages for failures only); other states carry none. */
function storedMessage(state: LifecycleState, message: string): string {
  return state === 'failed' || state === 'creating' ? truncateUtf8(message, MESSAGE_MAX_BYTES) : '';
}

/**
 * Stages a lifecycle change (R1) against the current intent of the pod key.
 *
 * - R2: a current intent of another UID drops the request (`uid_mismatch`); the caller deletes
 *   a predecessor's intent when it tracks a new incarnation (R6), never here.
 * - R3: the effective generation is `max(request.generation, trackedGeneration)`; lower than
 *   the current intent's generation ⇒ dropped as `stale_generation`.
 * - R4: over a `failed` of the same effective generation only `failed`, `creating` or
 *   `hibernating` is accepted; a generation bump unsticks it.
 * - An accepted request keeps the current `flushedKey`, so the record is unflushed exactly when
 *   its triple changed (`unchanged` ⇒ nothing to patch).
 *
 * @param trackedGeneration generation on the tracked pod copy (from the watch); `0n` if unknown.
 */
export function stage(
  current: IntentRecord | undefined,
  request: StageRequest,
  trackedGeneration: bigint,
): StageResult {
  if (current !== undefined && current.uid !== request.uid) {
    return { accepted: false, record: current, reason: 'uid_mismatch' };
  }
  const generation = request.generation > trackedGeneration ? request.generation : trackedGeneration;
  if (current !== undefined) {
    if (generation < current.generation) {
      return { accepted: false, record: current, reason: 'stale_generation' };
    }
    if (
      current.state === 'failed' &&
      generation === current.generation &&
      !REPLACES_FAILED.includes(request.state)
    ) {
      return { accepted: false, record: current, reason: 'sticky_failed' };
    }
  }
  const record: IntentRecord = {
    uid: request.uid,
    state: request.state,
    generation,
    message: storedMessage(request.state, request.message),
    flushedKey: current?.flushedKey ?? '',
  };
  const unchanged = current !== undefined && comparisonKey(current) === comparisonKey(record);
  return unchanged
    ? { accepted: true, record: current, reason: 'unchanged' }
    : { accepted: true, record, reason: 'accepted' };
}

/**
 * R5 generation echo: an update carrying a higher `cocoonset.cocoonstack.io/generation`
 * re-stamps the current state and message with it (the result is unflushed and must be
 * flushed). An equal or lower generation changes nothing and MUST NOT cause a patch.
 */
export function echoGeneration(
  record: IntentRecord,
  newGeneration: bigint,
): { readonly changed: boolean; readonly record: IntentRecord } {
  if (newGeneration <= record.generation) return { changed: false, record };
  return { changed: true, record: { ...record, generation: newGeneration } };
}

/** True when the record's triple has not reached the apiserver yet (R1). */
export function isUnflushed(record: IntentRecord): boolean {
  return record.flushedKey !== comparisonKey(record);
}

/**
 * Records that a flush of the triple whose comparison key is `flushedKey` succeeded. Pass the
 * key computed when the patch was built: if the record changed meanwhile it stays unflushed.
 */
export function markFlushed(record: IntentRecord, flushedKey: string): IntentRecord {
  return record.flushedKey === flushedKey ? record : { ...record, flushedKey };
}

/**
 * R7 seed on restart: the intent of an adopted pod from its existing annotations, marked as
 * already flushed. Pods without a lifecycle state annotation are not seeded (`undefined`); a
 * state value that is not one of the five lower-case states is treated the same way (the
 * provider never wrote it, so there is nothing of ours to preserve).
 */
export function seedFromAnnotations(
  uid: string,
  annotations: Readonly<Record<string, string>> | undefined,
): IntentRecord | undefined {
  const state = annotations?.[LIFECYCLE_STATE];
  if (state === undefined || !isLifecycleState(state)) return undefined;
  const seeded = {
    uid,
    state,
    generation: parseGeneration(annotations?.[LIFECYCLE_OBSERVED_GENERATION]),
    message: storedMessage(state, annotations?.[LIFECYCLE_STATE_MESSAGE] ?? ''),
  };
  return { ...seeded, flushedKey: comparisonKey(seeded) };
}

/** The JSON merge patch of docs/contracts/annotations.md "Lifecycle triple" (all three keys together, UID fence of R2). */
export interface LifecyclePatch {
  readonly metadata: {
    readonly uid: string;
    readonly annotations: {
      readonly [LIFECYCLE_STATE]: LifecycleState;
      readonly [LIFECYCLE_OBSERVED_GENERATION]: string;
      readonly [LIFECYCLE_STATE_MESSAGE]: string | null;
    };
  };
}

/**
 * Builds the lifecycle merge patch for `record`, fenced by `uid` (R2). The message key is
 * deleted with `null` when empty. `JSON.stringify` of the result is the wire body.
 */
export function buildLifecyclePatch(uid: string, record: IntentRecord): LifecyclePatch {
  const message = truncateUtf8(record.message, MESSAGE_MAX_BYTES);
  return {
    metadata: {
      uid,
      annotations: {
        [LIFECYCLE_STATE]: record.state,
        [LIFECYCLE_OBSERVED_GENERATION]: record.generation.toString(),
        [LIFECYCLE_STATE_MESSAGE]: message === '' ? null : message,
      },
    },
  };
}

/**
 * The lifecycle annotations as they should appear on the tracked in-memory pod copy (R1, R6):
 * the message key is absent when empty.
 */
export function lifecycleAnnotations(record: IntentRecord): Record<string, string> {
  const annotations: Record<string, string> = {
    [LIFECYCLE_STATE]: record.state,
    [LIFECYCLE_OBSERVED_GENERATION]: record.generation.toString(),
  };
  if (record.message !== '') annotations[LIFECYCLE_STATE_MESSAGE] = record.message;
  return annotations;
}
