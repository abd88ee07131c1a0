/**
 * Classification and formatting of `cocoon` failures (docs/contracts/cocoon-cli.md "Output capture and error text", docs/contracts/cocoon-cli.md "Error classification").
 *
 * Classification is by case-insensitive substring of the error output. Only the listed
 * substrings are conclusive; everything else (timeouts, lock contention, bad JSON, a missing
 * binary, a generic "not found" such as `executable file not found`) is `inconclusive` and
 * must never be treated as "gone".
 */

export type CocoonErrorClass =
  /** `vm not found`, `no such vm`: authoritative — gone (inspect) or success (rm). */
  | 'vm_not_found'
  /** `snapshot not found`, `no such snapshot`: absent (inspect), success (rm). */
  | 'snapshot_not_found'
  /** `not found in any backend`: image absent (image inspect). */
  | 'image_not_found'
  /** `vm name "<n>" already exists`: plain failure. */
  | 'vm_name_taken'
  /** `is in use by an active`: retry the snapshot rm (≤ 30 s, 500 ms apart). */
  | 'snapshot_leased'
  /** `already exists`, `already in use by`: remove the holder, save once more. */
  | 'snapshot_name_taken'
  /** `cocoon-agent may still be starting`: an ordinary exec attempt failure. */
  | 'agent_not_up'
  | 'inconclusive';

const contains = (text: string, needle: string): boolean => text.toLowerCase().includes(needle);

export function isVmNotFound(text: string): boolean {
  return contains(text, 'vm not found') || contains(text, 'no such vm');
}

export function isSnapshotNotFound(text: string): boolean {
  return contains(text, 'snapshot not found') || contains(text, 'no such snapshot');
}

export function isImageNotFound(text: string): boolean {
  return contains(text, 'not found in any backend');
}

const VM_NAME_TAKEN = /vm name ".*?" already exists/i;

export function isVmNameTaken(text: string): boolean {
  return VM_NAME_TAKEN.test(text);
}

export function isSnapshotLeased(text: string): boolean {
  return contains(text, 'is in use by an active');
}

/** A snapshot name taken by another snapshot (not a VM name collision). */
export function isSnapshotNameTaken(text: string): boolean {
  if (contains(text, 'already in use by')) return true;
  return contains(text, 'already exists') && !isVmNameTaken(text);
}

export function isAgentNotUp(text: string): boolean {
  return contains(text, 'cocoon-agent may still be starting');
}

/**
 * The holder to remove before re-saving a snapshot (docs/contracts/cocoon-cli.md "Error classification" notes): the ID after
 * `already in use by `, else the name in `snapshot name "<n>" already exists`, else
 * `undefined`. Quotes and trailing punctuation around an ID are stripped.
 */
export function snapshotHolder(text: string): string | undefined {
  const inUse = /already in use by\s+["']?([^\s"',;)]+)/i.exec(text)?.[1]?.replace(/[.:]+$/, '');
  if (inUse) return inUse;
  const exists = /snapshot name "(.*?)" already exists/i.exec(text)?.[1];
  return exists || undefined;
}

/**
 * Classifies an error text. The table rows of docs/contracts/cocoon-cli.md "Error classification" overlap (a VM name collision
 * also says `already exists`), so the most specific class is checked first: not-found classes,
 * VM name taken, snapshot leased, snapshot name taken, agent not up, else inconclusive.
 */
export function classifyCocoonError(text: string): CocoonErrorClass {
  if (isVmNotFound(text)) return 'vm_not_found';
  if (isSnapshotNotFound(text)) return 'snapshot_not_found';
  if (isImageNotFound(text)) return 'image_not_found';
  if (isVmNameTaken(text)) return 'vm_name_taken';
  if (isSnapshotLeased(text)) return 'snapshot_leased';
  if (isSnapshotNameTaken(text)) return 'snapshot_name_taken';
  if (isAgentNotUp(text)) return 'agent_not_up';
  return 'inconclusive';
}

/** How a child process ended (Node's `exit` event arguments). */
export interface ChildExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | string | null;
}

/** Go's `strsignal`-style names, so error texts read like the Go implementation's. */
const SIGNAL_TEXT: Readonly<Record<string, string>> = {
  SIGKILL: 'killed',
  SIGTERM: 'terminated',
  SIGINT: 'interrupt',
  SIGHUP: 'hangup',
  SIGQUIT: 'quit',
  SIGABRT: 'aborted',
  SIGSEGV: 'segmentation fault',
  SIGPIPE: 'broken pipe',
};

/** Go's `*exec.ExitError` text: `exit status <N>` or `signal: <name>`. */
export function describeExit(exit: ChildExit): string {
  if (exit.signal !== null) {
    return `signal: ${Object.hasOwn(SIGNAL_TEXT, exit.signal) ? SIGNAL_TEXT[exit.signal] : exit.signal}`;
  }
  return `exit status ${exit.code ?? -1}`;
}

/**
 * Error text of a JSON verb (stdout and stderr captured separately):
 * `exit status <N> (stderr: <trimmed stderr>)`.
 */
export function formatJsonVerbError(exit: ChildExit, stderr: string): string {
  return `${describeExit(exit)} (stderr: ${stderr.trim()})`;
}

/**
 * Error text of a plain verb (combined stdout+stderr captured):
 * `exit status <N> (output: <trimmed output>)`.
 */
export function formatPlainVerbError(exit: ChildExit, output: string): string {
  return `${describeExit(exit)} (output: ${output.trim()})`;
}

/** JSON verbs (docs/contracts/cocoon-cli.md "Output capture and error text"); every other verb is plain. */
export function isJsonVerb(argv: readonly string[]): boolean {
  const [noun, verb] = argv;
  if (noun === 'vm') {
    return ['clone', 'run', 'inspect', 'list', 'reconcile-stale-create'].includes(verb ?? '');
  }
  if (noun === 'snapshot') return verb === 'inspect' || verb === 'list';
  if (noun === 'image') return verb === 'inspect';
  return false;
}
