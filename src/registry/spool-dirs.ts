/**
 * The temporary directories of transfers (docs/registry.md "Spool directories"): a push's spool
 * (`vk-push-…`) and a pull's spill (`vk-pull-…`) are named after the daemon that made them,
 * `vk-<kind>-<pid>-<start>-XXXXXX` (`start`: the process's start time in clock ticks since
 * boot, /proc/<pid>/stat field 22, so that a reused pid is not taken for the same daemon).
 * A transfer removes its directory when it ends; a daemon killed in the middle of one cannot,
 * so a starting daemon removes those whose daemon is gone. Another live daemon's (tests run
 * several on one machine) and anything it cannot name an owner for are left alone.
 */
import { readFileSync } from 'node:fs';
import { lstat, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../log.ts';
import { pidStatFields } from '../util/proc-stat.ts';

export type SpoolKind = 'push' | 'pull';

export interface SpoolOwner {
  readonly pid: number;
  /** Start time in clock ticks since boot; 0 when /proc could not say. */
  readonly start: number;
}

/** The start time (field 22) of a /proc/<pid>/stat text; undefined when it does not parse. */
export function statStartTime(stat: string): number | undefined {
  const start = Number(pidStatFields(stat)[19] ?? Number.NaN);
  return Number.isSafeInteger(start) && start >= 0 ? start : undefined;
}

/** The start time of a live process, undefined when there is none (or /proc says nothing). */
function startTimeOf(pid: number): number | undefined {
  try {
    return statStartTime(readFileSync(`/proc/${pid}/stat`, 'latin1'));
  } catch {
    return undefined;
  }
}

let self: SpoolOwner | undefined;

/** This daemon as the owner of the directories it makes. */
export function ownSpoolOwner(): SpoolOwner {
  self ??= { pid: process.pid, start: startTimeOf(process.pid) ?? 0 };
  return self;
}

/** The `mkdtemp` prefix of a transfer directory of this daemon. */
export function spoolPrefix(kind: SpoolKind, owner: SpoolOwner = ownSpoolOwner()): string {
  return `vk-${kind}-${owner.pid}-${owner.start}-`;
}

const NAME = /^vk-(push|pull)-(\d{1,10})-(\d{1,20})-[A-Za-z0-9]{6}$/;

/** The owner a directory name gives (pure); undefined for any other name, the older unnamed
 * `vk-push-XXXXXX` included. */
export function parseSpoolName(name: string): (SpoolOwner & { kind: SpoolKind }) | undefined {
  const m = NAME.exec(name);
  if (!m) return undefined;
  const pid = Number(m[2]);
  const start = Number(m[3]);
  if (!Number.isSafeInteger(pid) || pid <= 0 || !Number.isSafeInteger(start)) return undefined;
  return { kind: m[1] as SpoolKind, pid, start };
}

/** Whether the daemon that made a directory is gone (pure): its pid is not running, or runs a
 * process that started at another time. An owner whose start /proc did not give is never gone. */
export function ownerGone(owner: SpoolOwner, liveStart: number | undefined): boolean {
  if (owner.start === 0) return false;
  return liveStart !== owner.start;
}

/**
 * Removes the transfer directories in `dir` left by a daemon that is gone: only directories
 * (never a symlink), only this user's, only names that say their owner. Returns the names
 * removed; a failure to remove one is logged and the rest go on.
 */
export async function sweepStaleSpoolDirs(dir: string, log: Logger): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (error) {
    log.warn(
      { dir, err: (error as Error).message },
      'could not list the temporary directory for stale transfer directories',
    );
    return [];
  }
  const uid = process.getuid?.();
  const removed: string[] = [];
  for (const name of names) {
    const owner = parseSpoolName(name);
    if (!owner || !ownerGone(owner, startTimeOf(owner.pid))) continue;
    const path = join(dir, name);
    try {
      const st = await lstat(path);
      if (!st.isDirectory() || (uid !== undefined && st.uid !== uid)) continue;
      await rm(path, { recursive: true, force: true });
      removed.push(name);
      log.info({ path, ownerPid: owner.pid }, 'removed a transfer directory left by a daemon that is gone');
    } catch (error) {
      log.warn({ path, err: (error as Error).message }, 'could not remove a stale transfer directory');
    }
  }
  return removed;
}
