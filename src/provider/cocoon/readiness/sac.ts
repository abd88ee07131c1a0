// Windows static IP over the serial console (docs/contracts/post-clone.md, "Windows static IP"):
// the `sac` job. It dials the VM's console.sock, reaches a `SAC>` prompt, enumerates the NICs
// with `i`, sets each static NIC's address and verifies it shows. Like the fixup it only records
// its outcome (progress `sacDone`, or `post-clone-state=failed` with the reason
// `WindowsStaticIPFailed`); the reconcile decides (owed-step rows 5 and 7). The dialogue's pure
// half (parsing, commands, budgets) is src/guest/sac.ts.

import { join } from 'node:path';
import {
  EVENT_MESSAGE_MAX_BYTES,
  MESSAGE_MAX_BYTES,
  POST_CLONE_ERRORS,
  POST_CLONE_STATE,
} from '../../../contract/annotations.ts';
import { isStaticNic } from '../../../guest/postclone.ts';
import {
  listedNets,
  parseNetList,
  planSacSets,
  SAC_COMMAND_TIMEOUT_MS,
  SAC_DIAL_BUDGET_MS,
  SAC_DIAL_RETRY_MS,
  SAC_ENUM_BUDGET_MS,
  SAC_ENUM_INTERVAL_MS,
  SAC_ENUM_TRIES,
  SAC_NIC_BUDGET_MS,
  SAC_PHASE_REASONS,
  SAC_PROMPT,
  SAC_VERIFY_INTERVAL_MS,
  SAC_VERIFY_TRIES,
  type SacPhase,
  type SacSet,
  sacBudgetMs,
  sacErrorMessage,
  setReplyError,
  shownFor,
  showsIp,
  WINDOWS_STATIC_IP_FAILED,
} from '../../../guest/sac.ts';
import { pause } from '../../../util/deadline.ts';
import { monoNow } from '../../../util/mono-clock.ts';
import { truncateUtf8 } from '../../../util/text.ts';
import { logFor, type ProviderContext } from '../context.ts';
import { patchAnnotations } from '../publication/held.ts';
import type { Job } from '../record-types.ts';
import { applyAnnotations, type PodRecord, recordProgress, setPostCloneFailureReason } from '../state.ts';
import { nicsOf } from './facts.ts';
import { ifStillOwner, jobSignal } from './jobs.ts';
import { connectConsole, SacConsole } from './sac-console.ts';

class SacFailure extends Error {
  readonly phase: SacPhase;
  constructor(phase: SacPhase, detail: string) {
    super(detail);
    this.phase = phase;
  }
}

const text = (err: unknown) => (err instanceof Error ? err.message : String(err));
/** What is left of a phase's deadline, at least 1 ms: no wait runs past its phase. */
const left = (deadline: number) => Math.max(1, deadline - monoNow());

/** The job's budget for the bound VM: dial + enumeration + set/verify per static NIC. */
export function sacJobBudgetMs(rec: PodRecord): number {
  return sacBudgetMs(nicsOf(rec).filter(isStaticNic).length);
}

/** `<COCOON_ROOT_DIR>/run/cloudhypervisor/<vmID>/console.sock` (docs/contracts/cocoon-cli.md, "Files read under COCOON_ROOT_DIR"). */
export function consoleSocketPath(rootDir: string, vmId: string): string {
  return join(rootDir, 'run', 'cloudhypervisor', vmId, 'console.sock');
}

/** Connects (retried every 2 s) and reaches a prompt within the dial budget. */
async function dial(path: string, deadline: number, signal: AbortSignal): Promise<SacConsole> {
  let last = 'not dialled';
  while (!signal.aborted && monoNow() < deadline) {
    const started = monoNow();
    try {
      const con = new SacConsole(await connectConsole(path, left(deadline), signal));
      if (await con.hunt(deadline, signal)) return con;
      last = con.closed ?? `no ${SAC_PROMPT} prompt`;
      con.close();
    } catch (err) {
      last = text(err);
    }
    await pause(Math.min(left(deadline), started + SAC_DIAL_RETRY_MS - monoNow()), signal);
  }
  throw new SacFailure('dial', `${path}: ${last} (within ${SAC_DIAL_BUDGET_MS / 1000}s)`);
}

/** `i` until at least `count` nets are listed (60 tries, started 2 s apart). */
async function enumerate(con: SacConsole, count: number, signal: AbortSignal): Promise<number[]> {
  const deadline = monoNow() + SAC_ENUM_BUDGET_MS;
  let last = '';
  let tries = 0;
  while (tries < SAC_ENUM_TRIES && monoNow() < deadline && !signal.aborted) {
    tries++;
    const started = monoNow();
    try {
      const out = await con.command('i', Math.min(SAC_COMMAND_TIMEOUT_MS, left(deadline)), signal);
      const nets = listedNets(parseNetList(out));
      if (nets.length >= count) return nets;
      last = `listed ${nets.length} of ${count} NICs`;
    } catch (err) {
      if (con.closed !== undefined) throw new SacFailure('enum', con.closed);
      last = text(err);
    }
    if (tries < SAC_ENUM_TRIES)
      await pause(Math.min(left(deadline), started + SAC_ENUM_INTERVAL_MS - monoNow()), signal);
  }
  throw new SacFailure('enum', `${last} after ${tries} tries`);
}

/** Sets one static NIC, then verifies with `i` that its net shows the IP (10 tries, started 2 s apart). */
async function setAndVerify(con: SacConsole, set: SacSet, signal: AbortSignal): Promise<void> {
  const deadline = monoNow() + SAC_NIC_BUDGET_MS;
  const which = `NIC ${set.nic} (net ${set.net})`;
  let reply: string;
  try {
    reply = await con.command(set.command, Math.min(SAC_COMMAND_TIMEOUT_MS, left(deadline)), signal);
  } catch (err) {
    throw new SacFailure('set', `${which}: "${set.command}": ${text(err)}`);
  }
  const refused = setReplyError(reply);
  if (refused !== undefined) throw new SacFailure('set', `${which}: "${set.command}": ${refused}`);
  let last = '';
  let tries = 0;
  while (tries < SAC_VERIFY_TRIES && monoNow() < deadline && !signal.aborted) {
    tries++;
    const started = monoNow();
    try {
      const out = await con.command('i', Math.min(SAC_COMMAND_TIMEOUT_MS, left(deadline)), signal);
      const entries = parseNetList(out);
      if (showsIp(entries, set.net, set.ip)) return;
      last = `shows ${shownFor(entries, set.net)}`;
    } catch (err) {
      if (con.closed !== undefined) throw new SacFailure('verify', `${which}: ${con.closed}`);
      last = text(err);
    }
    if (tries < SAC_VERIFY_TRIES)
      await pause(Math.min(left(deadline), started + SAC_VERIFY_INTERVAL_MS - monoNow()), signal);
  }
  throw new SacFailure('verify', `${which}: ${last}, not ${set.ip}, after ${tries} tries`);
}

/** The `sac` job (startJob kind `sac`): one pass over the bound VM's console. */
export async function runSac(ctx: ProviderContext, rec: PodRecord, job: Job): Promise<void> {
  const signal = jobSignal(ctx, job);
  const log = logFor(ctx, rec).child({ job: 'sac' });
  const nics = nicsOf(rec);
  const path = consoleSocketPath(ctx.config.cocoonRootDir, job.vmId);
  let phase: SacPhase = 'dial';
  let con: SacConsole | undefined;
  try {
    con = await dial(path, job.startedAt + SAC_DIAL_BUDGET_MS, signal);
    phase = 'enum';
    const nets = await enumerate(con, nics.length, signal);
    phase = 'set';
    const plan = planSacSets(nics, nets);
    if (!plan.ok) throw new SacFailure('set', plan.error);
    for (const set of plan.sets) await setAndVerify(con, set, signal);
  } catch (err) {
    if (signal.aborted) return; // superseded or shutdown: the next owner re-derives
    const failure = err instanceof SacFailure ? err : new SacFailure(phase, text(err));
    await recordFailure(ctx, rec, job, failure);
    return;
  } finally {
    con?.close();
  }
  if (signal.aborted) return;
  log.info({ nics: nics.length }, 'Windows static IP set over the serial console');
  await ifStillOwner(ctx, rec, job, () => {
    recordProgress(rec, job.vmId, { sacDone: true });
    ctx.metrics.postclone('sac', 'ok');
  });
}

/** Phase Warning, metric, `post-clone-state=failed` + errors and the reason the reconcile's
 * row 5 decides with (`WindowsStaticIPFailed`). */
async function recordFailure(
  ctx: ProviderContext,
  rec: PodRecord,
  job: Job,
  failure: SacFailure,
): Promise<void> {
  const message = truncateUtf8(sacErrorMessage(failure.phase, failure.message), MESSAGE_MAX_BYTES);
  logFor(ctx, rec).warn({ job: 'sac', phase: failure.phase, err: message }, 'Windows static IP failed');
  await ifStillOwner(ctx, rec, job, async () => {
    ctx.events.event(
      rec.pod,
      'Warning',
      SAC_PHASE_REASONS[failure.phase],
      truncateUtf8(message, EVENT_MESSAGE_MAX_BYTES),
    );
    ctx.metrics.postclone('sac', 'failed');
    const changes = { [POST_CLONE_STATE]: 'failed', [POST_CLONE_ERRORS]: message };
    applyAnnotations(rec, changes);
    setPostCloneFailureReason(rec, WINDOWS_STATIC_IP_FAILED);
    await patchAnnotations(ctx, rec, changes);
  });
}
