// The snapshot verbs every caller shares (docs/contracts/cocoon-cli.md, "Error
// classification"): `snapshot inspect` with "not found" as a value, and `snapshot rm` with
// "not found" as success and a leased snapshot retried on the monotonic clock. The provider's
// bookkeeping around a removal (index, ledger) is src/provider/cocoon/snapshots.ts.
import { delay, pause } from '../util/deadline.ts';
import { monoNow } from '../util/mono-clock.ts';
import { snapshotInspectArgv, snapshotRemoveArgv } from './argv.ts';
import { parseSnapshotRecord, type SnapshotRecord } from './records.ts';
import { type CliCallOptions, type CocoonCli, CocoonCommandError } from './runner.ts';

/** Deadline of the short snapshot calls (inspect, and rm unless the caller sets its own). */
const SHORT_CALL_MS = 60_000;
/** A leased snapshot (an export, clone or restore reads it): `snapshot rm` is retried this
 * long, this often (docs/contracts/cocoon-cli.md "Error classification"). */
const LEASED_RETRY_MS = 30_000;
const LEASED_RETRY_EVERY_MS = 500;

/** `snapshot inspect <name>`: the record, or `undefined` when cocoon says it does not exist. */
export async function inspectSnapshot(
  cli: CocoonCli,
  name: string,
  signal: AbortSignal | undefined,
  opts: Pick<CliCallOptions, 'queueTimeoutMs'> = {},
): Promise<SnapshotRecord | undefined> {
  let stdout: string;
  try {
    ({ stdout } = await cli.run(snapshotInspectArgv(name), { timeoutMs: SHORT_CALL_MS, signal, ...opts }));
  } catch (error) {
    if (error instanceof CocoonCommandError && error.errorClass === 'snapshot_not_found') return undefined;
    throw error;
  }
  const record = parseSnapshotRecord(stdout);
  if (!record.ok) throw new Error(record.error);
  return record.value;
}

export interface RemoveSnapshotOptions {
  /** Caller-side abort: ends each `snapshot rm` and the wait between them. */
  readonly signal?: AbortSignal;
  /** How long a leased snapshot is retried (default 30 s; 0: once, no retry). */
  readonly leasedRetryMs?: number;
  /** Deadline of each `snapshot rm` call (default 60 s). */
  readonly timeoutMs?: number;
  /** Bound of each call's wait for a slot, apart from its deadline (CliCallOptions). */
  readonly queueTimeoutMs?: number;
}

/** `snapshot rm <ref>`: not found is success; a leased snapshot is retried for up to
 * `leasedRetryMs` (30 s), 500 ms apart. Other failures throw. An abort during the wait ends
 * it at once; the next `snapshot rm`, bound to the same signal, then fails. */
export async function removeSnapshot(
  cli: CocoonCli,
  ref: string,
  opts: RemoveSnapshotOptions = {},
): Promise<void> {
  const until = monoNow() + (opts.leasedRetryMs ?? LEASED_RETRY_MS);
  for (;;) {
    try {
      await cli.run(snapshotRemoveArgv(ref), {
        timeoutMs: opts.timeoutMs ?? SHORT_CALL_MS,
        queueTimeoutMs: opts.queueTimeoutMs,
        signal: opts.signal,
      });
      return;
    } catch (error) {
      if (!(error instanceof CocoonCommandError)) throw error;
      if (error.errorClass === 'snapshot_not_found') return;
      if (error.errorClass !== 'snapshot_leased' || monoNow() >= until) throw error;
    }
    if (opts.signal) await pause(LEASED_RETRY_EVERY_MS, opts.signal);
    else await delay(LEASED_RETRY_EVERY_MS);
  }
}
