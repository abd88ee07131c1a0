/** The per-attempt error chain of a fixup (docs/contracts/annotations.md "Post-clone keys", docs/contracts/post-clone.md "Execution", docs/contracts/post-clone.md "Exhaustion"). */
import { MESSAGE_MAX_BYTES } from '../contract/annotations.ts';
import { truncateUtf8 } from '../util/text.ts';

/**
 * `attempt N: <error>` entries (N from 1, in order) joined with `\n`, truncated to at most
 * `maxBytes` bytes of UTF-8 (default 4096) without splitting a code point. An over-long ASCII
 * chain is cut to exactly the cap. This is both the `post-clone-errors` value and the lifecycle
 * message on exhaustion.
 */
export function joinAttemptErrors(errors: readonly string[], maxBytes: number = MESSAGE_MAX_BYTES): string {
  return truncateUtf8(errors.map((error, i) => `attempt ${i + 1}: ${error}`).join('\n'), maxBytes);
}

/** The Warning message of one failed attempt (`PostCloneExecAttemptFailed`, docs/contracts/post-clone.md "Execution"). */
export function attemptErrorMessage(attempt: number, error: string): string {
  return `attempt ${attempt}: ${error}`;
}
