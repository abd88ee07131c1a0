/**
 * Pod annotation keys and value encodings (docs/contracts/annotations.md, docs/contracts/annotations.md).
 *
 * Every key the provider reads or writes is a constant here so that no other module spells an
 * annotation key by hand. Keys are part of the external contract and reproduced byte for byte.
 */

// --- Lifecycle triple, written by the provider (docs/contracts/annotations.md "Lifecycle triple") -------------------------

/** `creating` | `ready` | `hibernating` | `hibernated` | `failed`, always lower case. */
export const LIFECYCLE_STATE = 'vm.cocoonstack.io/lifecycle-state';
/** Decimal int64; missing or unparseable reads as `0`. */
export const LIFECYCLE_OBSERVED_GENERATION = 'vm.cocoonstack.io/lifecycle-observed-generation';
/** Free text, failures only; an empty message removes the key. */
export const LIFECYCLE_STATE_MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';

// --- Post-clone keys, written by the provider (docs/contracts/annotations.md "Post-clone keys") ---------------------------

/** `running` | `done` | `failed` (sticky for the incarnation). */
export const POST_CLONE_STATE = 'vm.cocoonstack.io/post-clone-state';
/** Standard base64 (with padding) of the manual fixup command text; written only on exhaustion. */
export const POST_CLONE_HINT = 'vm.cocoonstack.io/post-clone-hint';
/** `attempt N: <error>` joined with `\n`, ≤ 4096 bytes; written only on exhaustion. */
export const POST_CLONE_ERRORS = 'vm.cocoonstack.io/post-clone-errors';

// --- Runtime keys (docs/contracts/annotations.md "Runtime keys") -------------------------------------------------------

/** Cocoon VM id; cleared before the VM is removed on hibernate. */
export const VM_ID = 'vm.cocoonstack.io/id';
/** Current primary guest IPv4, kept in sync with the lease file. */
export const VM_IP = 'vm.cocoonstack.io/ip';
/** macOS only (later tier); never written for CH/FC VMs. */
export const VNC_PORT = 'vm.cocoonstack.io/vnc-port';

// --- Read-only VMSpec keys (docs/contracts/annotations.md, docs/contracts/annotations.md "VMSpec keys"). The provider never writes these.

export const VM_NAME = 'vm.cocoonstack.io/name';
export const IMAGE = 'cocoonset.cocoonstack.io/image';
export const MODE = 'cocoonset.cocoonstack.io/mode';
export const OS = 'cocoonset.cocoonstack.io/os';
export const STORAGE = 'cocoonset.cocoonstack.io/storage';
export const NETWORK = 'cocoonset.cocoonstack.io/network';
export const SNAPSHOT_POLICY = 'cocoonset.cocoonstack.io/snapshot-policy';
export const MANAGED = 'cocoonset.cocoonstack.io/managed';
export const FORCE_PULL = 'cocoonset.cocoonstack.io/force-pull';
export const GENERATION = 'cocoonset.cocoonstack.io/generation';
export const BACKEND = 'vm.cocoonstack.io/backend';
export const NO_DIRECT_IO = 'vm.cocoonstack.io/no-direct-io';
export const PROBE_PORT = 'vm.cocoonstack.io/probe-port';
export const CONN_TYPE = 'vm.cocoonstack.io/conn-type';
export const FORK_FROM = 'vm.cocoonstack.io/fork-from';
export const CLONE_FROM_DIR = 'vm.cocoonstack.io/clone-from-dir';
export const HIBERNATE = 'vm.cocoonstack.io/hibernate';
export const RESTORE_FROM_HIBERNATE = 'vm.cocoonstack.io/restore-from-hibernate';
export const KEEP_SNAPSHOT_ON_DELETE = 'vm.cocoonstack.io/keep-snapshot-on-delete';

/** Every VMSpec key; the provider MUST NEVER write any of them (docs/contracts/annotations.md "VMSpec keys"). */
export const VMSPEC_KEYS: readonly string[] = [
  VM_NAME,
  IMAGE,
  MODE,
  OS,
  STORAGE,
  NETWORK,
  SNAPSHOT_POLICY,
  MANAGED,
  FORCE_PULL,
  GENERATION,
  BACKEND,
  NO_DIRECT_IO,
  PROBE_PORT,
  CONN_TYPE,
  FORK_FROM,
  CLONE_FROM_DIR,
  HIBERNATE,
  RESTORE_FROM_HIBERNATE,
  KEEP_SNAPSHOT_ON_DELETE,
];

// --- Value types ----------------------------------------------------------------------------

/** Lifecycle states (docs/contracts/annotations.md "Lifecycle triple", docs/contracts/lifecycle.md "State machine"). */
export type LifecycleState = 'creating' | 'ready' | 'hibernating' | 'hibernated' | 'failed';

export const LIFECYCLE_STATES: readonly LifecycleState[] = [
  'creating',
  'ready',
  'hibernating',
  'hibernated',
  'failed',
];

/** Terminal states, the ones clients wait for (docs/contracts/annotations.md "Lifecycle triple"). */
export const TERMINAL_LIFECYCLE_STATES: readonly LifecycleState[] = ['ready', 'hibernated', 'failed'];

export function isLifecycleState(value: string): value is LifecycleState {
  return (LIFECYCLE_STATES as readonly string[]).includes(value);
}

/** Values of `vm.cocoonstack.io/post-clone-state` (docs/contracts/annotations.md "Post-clone keys"); `''` means absent. */
export type PostCloneState = '' | 'running' | 'done' | 'failed';

/**
 * Reads `post-clone-state`. Absent ⇒ `''`. An unknown value also reads as `''` (absent): the
 * owed-step table (docs/contracts/lifecycle.md "Owed steps" row 6) then re-runs the idempotent fixup, which is the
 * safe reading of a marker the provider never writes.
 */
export function parsePostCloneState(value: string | undefined): PostCloneState {
  return value === 'running' || value === 'done' || value === 'failed' ? value : '';
}

/** Exact-`"true"` boolean rule (docs/contracts/annotations.md): `True`, `1`, `yes` and absence are false. */
export function isTrue(value: string | undefined): boolean {
  return value === 'true';
}

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/**
 * Parses a decimal int64 the way Go's `strconv.ParseInt(s, 10, 64)` does: optional `+`/`-`
 * sign, ASCII digits only, no whitespace, within the int64 range. Returns `undefined` when the
 * text is not such a number. `bigint` keeps values above 2^53 exact.
 */
export function parseInt64(value: string | undefined): bigint | undefined {
  if (value === undefined || !/^[+-]?[0-9]+$/.test(value)) return undefined;
  const parsed = BigInt(value);
  return parsed < INT64_MIN || parsed > INT64_MAX ? undefined : parsed;
}

/** A generation annotation: missing or unparseable reads as `0` (docs/contracts/annotations.md "Lifecycle triple"). */
export function parseGeneration(value: string | undefined): bigint {
  return parseInt64(value) ?? 0n;
}

// --- Size limits (docs/contracts/annotations.md "Size limits") --------------------------------------------------------

/** Lifecycle message and `post-clone-errors` cap, in bytes of UTF-8. */
export const MESSAGE_MAX_BYTES = 4096;
/** Event message cap, in bytes of UTF-8. */
export const EVENT_MESSAGE_MAX_BYTES = 512;
