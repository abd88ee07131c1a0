// "In use" markers for snapshots: an active clone or export holds a marker file
// <root>/sim/snapuse/<snapshotID>/<kind>.<pid>.<start>, created under the snapshot DB lock, so
// `snapshot rm` can refuse with cocoon's "is in use by an active <kind>" error.
import fs from 'node:fs';
import path from 'node:path';
import { findSnapshotIn, readSnapDb, type SnapshotRecord } from './db.ts';
import { CliError } from './errors.ts';
import { io } from './io.ts';
import { withLock } from './lock.ts';
import { snapDbLock, snapUsersDir } from './paths.ts';
import { isAlive } from './proc.ts';

function markerName(kind: string, pid: number, start: number): string {
  return `${kind}.${pid}.${start}`;
}

/** Resolves a committed snapshot and marks it in use by the invoking process. */
export function acquireSnapshotUse(root: string, ref: string, kind: string): SnapshotRecord {
  return withLock(snapDbLock(root), () => {
    const snap = findSnapshotIn(readSnapDb(root), ref, false);
    if (!snap) throw new CliError(`snapshot not found: ${ref}`);
    const { pid, start } = io().owner;
    addUse(root, snap.id, kind, pid, start);
    return snap;
  });
}

export function addUse(root: string, snapId: string, kind: string, pid: number, start: number): void {
  const dir = snapUsersDir(root, snapId);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, markerName(kind, pid, start)), '');
}

export function releaseSnapshotUse(root: string, snapId: string, kind: string): void {
  const { pid, start } = io().owner;
  fs.rmSync(path.join(snapUsersDir(root, snapId), markerName(kind, pid, start)), { force: true });
}

/** The kind of a live user of the snapshot (dead users' markers are removed), if any. */
export function activeUse(root: string, snapId: string): string | undefined {
  const dir = snapUsersDir(root, snapId);
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return undefined;
  }
  for (const n of names) {
    const [kind, pid, start] = n.split('.');
    if (isAlive(Number(pid), Number(start))) return kind;
    fs.rmSync(path.join(dir, n), { force: true });
  }
  return undefined;
}

export function dropUses(root: string, snapId: string): void {
  fs.rmSync(snapUsersDir(root, snapId), { recursive: true, force: true });
}
