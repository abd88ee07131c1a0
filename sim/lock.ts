// Cross-process mutual exclusion and crash-safe file writes for the simulator.
//
// Hand-written on purpose: Node has no flock(2), and the lock libraries on npm are async,
// mtime-based (stale after N seconds rather than "owner dead") and far heavier than the few
// syscalls needed here. The simulator runs as hundreds of short-lived processes (or as many
// requests of one server process plus a few helper processes) that may be SIGKILLed at any
// instruction, so the rules are:
//   - a lock is a file created atomically *with its content* (write a private temp file, then
//     link(2) it to the lock name: EEXIST means someone else holds it);
//   - the content is "<pid> <starttime>" so a lock whose owner died (or whose pid was reused by
//     another process) is recognised as stale;
//   - a stale lock is broken only while holding "<lock>.break", so two breakers cannot remove a
//     lock that a third process has just acquired;
//   - data files are written to a temp file and renamed over the target, so readers never need
//     a lock and a kill at any point leaves either the old or the new content.
import fs from 'node:fs';
import path from 'node:path';
import { CliError } from './errors.ts';
import { isAlive, selfStart } from './proc.ts';

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** Blocks the thread for `ms` milliseconds (used between lock retries; critical sections are tiny). */
export function sleepSync(ms: number): void {
  Atomics.wait(sleeper, 0, 0, ms);
}

let tmpCounter = 0;
function tmpName(target: string): string {
  tmpCounter += 1;
  return `${target}.tmp.${process.pid}.${tmpCounter}`;
}

/** Writes `data` to `file` atomically (temp file + rename). Creates the parent directory. */
export function writeAtomic(file: string, data: string | Uint8Array, mode = 0o644): void {
  const tmp = tmpName(file);
  try {
    fs.writeFileSync(tmp, data, { mode });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(tmp, data, { mode });
  }
  if (mode !== 0o600) fs.chmodSync(tmp, mode); // defeat the umask: the lease file must be 0644
  fs.renameSync(tmp, file);
}

/** Reads and parses a JSON file; a missing file yields `fallback`. */
export function readJson<T>(file: string, fallback: T): T {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return fallback;
    throw e;
  }
  if (text.trim() === '') return fallback;
  return JSON.parse(text) as T;
}

function ownerToken(): string {
  return `${process.pid} ${selfStart()}\n`;
}

function ownerDead(content: string): boolean {
  const [pidText, startText] = content.trim().split(' ');
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0) return true;
  return !isAlive(pid, Number(startText));
}

function tryLink(lockPath: string, token: string): boolean {
  const tmp = tmpName(lockPath);
  try {
    fs.writeFileSync(tmp, token);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    fs.mkdirSync(path.dirname(lockPath), { recursive: true });
    fs.writeFileSync(tmp, token);
  }
  try {
    fs.linkSync(tmp, lockPath);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw e;
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}

function readOrEmpty(file: string): string | null {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
}

/** Removes `lockPath` if its owner is dead; the removal itself is serialised by `<lock>.break`. */
function breakIfStale(lockPath: string, token: string): void {
  const seen = readOrEmpty(lockPath);
  if (seen === null || !ownerDead(seen)) return;
  const breakPath = `${lockPath}.break`;
  if (!tryLink(breakPath, token)) {
    // A breaker that died while holding the break lock: remove it once it is clearly abandoned.
    const holder = readOrEmpty(breakPath);
    if (holder !== null && ownerDead(holder)) {
      const st = fs.statSync(breakPath, { throwIfNoEntry: false });
      if (st && Date.now() - st.mtimeMs > 1000) fs.rmSync(breakPath, { force: true });
    }
    return;
  }
  try {
    if (readOrEmpty(lockPath) === seen) fs.rmSync(lockPath, { force: true });
  } finally {
    fs.rmSync(breakPath, { force: true });
  }
}

// Locks held by the current synchronous call stack. Critical sections are synchronous (`fn`
// may not return a promise), so in the simulator server, where many requests share one pid,
// a lock is never held while another request runs: re-entrancy can only be the same request
// nesting its own locks, and a request never waits for a lock its own process holds.
const held = new Set<string>();

function isThenable(v: unknown): boolean {
  return typeof (v as { then?: unknown } | null)?.then === 'function';
}

/**
 * Runs `fn` while holding the lock file `lockPath`. Re-entrant within one call stack. Gives up
 * after `timeoutMs` with cocoon's inconclusive "database is locked" error. `fn` must be
 * synchronous: holding a lock across an await would let another request of the simulator
 * server (same pid, so the same owner token) wait for it with a blocking sleep, forever.
 */
export function withLock<T>(lockPath: string, fn: () => T, timeoutMs = 60_000): T {
  if (held.has(lockPath)) return fn();
  const token = ownerToken();
  const deadline = Date.now() + timeoutMs;
  let attempt = 0;
  // Cheap existence probe first: under heavy contention most attempts would fail anyway.
  while (fs.existsSync(lockPath) || !tryLink(lockPath, token)) {
    attempt += 1;
    if (attempt === 1 || attempt % 8 === 0) {
      // Held by this very process but not by this call stack: only a lock leaked across an
      // await could do that. Fail loudly instead of sleeping until the deadline.
      if (readOrEmpty(lockPath) === token) {
        throw new Error(`${path.basename(lockPath)} is held by this process outside the current call`);
      }
      if (attempt > 1) breakIfStale(lockPath, token);
    }
    if (Date.now() > deadline) throw new CliError(`acquire ${path.basename(lockPath)}: database is locked`);
    sleepSync(1 + Math.floor(Math.random() * Math.min(16, 1 + attempt)));
  }
  held.add(lockPath);
  try {
    const result = fn();
    if (isThenable(result)) throw new Error(`withLock(${path.basename(lockPath)}): fn returned a promise`);
    return result;
  } finally {
    held.delete(lockPath);
    // Only remove the lock if it is still ours (it cannot have been broken while we live).
    if (readOrEmpty(lockPath) === token) fs.rmSync(lockPath, { force: true });
  }
}

/** Reads a JSON document, lets `fn` mutate it, and writes it back, all under `lockPath`. */
export function updateJson<D, T>(file: string, lockPath: string, fallback: () => D, fn: (doc: D) => T): T {
  return withLock(lockPath, () => {
    const doc = readJson<D>(file, fallback());
    const result = fn(doc);
    writeAtomic(file, JSON.stringify(doc, null, 2));
    return result;
  });
}
