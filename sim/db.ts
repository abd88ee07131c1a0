// The VM, snapshot and image databases (cocoon-cli.md §6) and reference resolution (§1).
// Readers never lock (writes are atomic renames); writers go through updateJson.
import { CliError } from './errors.ts';
import { readJson, updateJson, withLock } from './lock.ts';
import {
  BACKENDS,
  type BackendDir,
  backendDir,
  imageDbFile,
  imageDbLock,
  snapDbFile,
  snapDbLock,
  vmDbFile,
  vmDbLock,
} from './paths.ts';
import { trackedAlive } from './pids.ts';

export interface StaticNetwork {
  ip: string;
  gateway: string;
  prefix: number;
}

export interface NetworkConfig {
  tap: string;
  mac: string;
  num_queues: number;
  queue_size: number;
  backend?: string;
  netns_path?: string;
  network?: StaticNetwork;
}

export interface StorageConfig {
  path: string;
  ro: boolean;
  serial: string;
  role: string;
}

export interface VmConfig {
  name: string;
  cpu?: number;
  memory?: number;
  storage?: number;
  image?: string;
  image_digest?: string;
  image_type?: string;
  network?: string;
  windows?: boolean;
  cpu_weight?: number;
  cpu_quota_us?: number;
  cpu_period_us?: number;
  restore_mode?: string;
  no_direct_io?: boolean;
  snapshot?: string;
}

export type VmState = 'creating' | 'created' | 'running' | 'stopped' | 'error';

export interface VmRecord {
  id: string;
  hypervisor: string;
  state: VmState;
  config: VmConfig;
  pid: number;
  socket_path?: string;
  vsock_socket?: string;
  network_configs?: NetworkConfig[];
  storage_configs?: StorageConfig[];
  first_booted?: boolean;
  created_at: string;
  updated_at: string;
  started_at?: string;
  stopped_at?: string;
}

export interface VmDb {
  vms: Record<string, VmRecord>;
  names: Record<string, string>;
}

export interface SnapshotRecord {
  id: string;
  name: string;
  description?: string;
  cpu: number;
  memory: number;
  storage: number;
  image: string;
  image_digest: string;
  image_type: string;
  network?: string;
  image_blob_ids: Record<string, Record<string, never>>;
  hypervisor: string;
  nics: number;
  windows?: boolean;
  created_at: string;
  /** Present (true) while a save or import is in progress; hidden from inspect and list. */
  pending?: boolean;
}

export interface SnapshotDb {
  snapshots: Record<string, SnapshotRecord>;
  names: Record<string, string>;
}

export interface ImageRecord {
  id: string;
  name: string;
  type: 'oci' | 'cloudimg';
  size: number;
  created_at: string;
}

export interface ImageDb {
  images: Record<string, ImageRecord>;
  names: Record<string, string>;
}

export const VM_NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$/;
export const SNAPSHOT_NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$/;
export const ID_RE = /^[A-Z2-7]{26}$/;

// node:crypto is loaded only by verbs that need it (read-only verbs stay a few ms cheaper).
const crypto = () => process.getBuiltinModule('node:crypto');

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
/** A new 26-character `[A-Z2-7]` id. */
export function newId(): string {
  const bytes = crypto().randomBytes(26);
  let out = '';
  for (const b of bytes) out += B32[b & 31];
  return out;
}

/** A locally administered unicast MAC (`02:xx:xx:xx:xx:xx`). */
export function newMac(): string {
  const b = crypto().randomBytes(5);
  return ['02', ...[...b].map((x) => x.toString(16).padStart(2, '0'))].join(':');
}

export function nowIso(): string {
  return new Date().toISOString();
}

const emptyVmDb = (): VmDb => ({ vms: {}, names: {} });

export function readVmDb(root: string, dir: BackendDir): VmDb {
  const db = readJson<VmDb>(vmDbFile(root, dir), emptyVmDb());
  db.vms ??= {};
  db.names ??= {};
  return db;
}

export function updateVmDb<T>(root: string, dir: BackendDir, fn: (db: VmDb) => T): T {
  return updateJson(vmDbFile(root, dir), vmDbLock(root, dir), emptyVmDb, (db) => {
    db.vms ??= {};
    db.names ??= {};
    return fn(db);
  });
}

/** Runs `fn` holding both VM DB locks (fixed order), for cross-backend name reservation. */
export function withBothVmLocks<T>(root: string, fn: () => T): T {
  return withLock(vmDbLock(root, 'cloudhypervisor'), () => withLock(vmDbLock(root, 'firecracker'), fn));
}

export interface LocatedVm {
  dir: BackendDir;
  vm: VmRecord;
}

export function allVms(root: string): LocatedVm[] {
  const out: LocatedVm[] = [];
  for (const dir of BACKENDS) {
    for (const vm of Object.values(readVmDb(root, dir).vms)) out.push({ dir, vm });
  }
  out.sort((a, b) => a.vm.created_at.localeCompare(b.vm.created_at) || a.vm.id.localeCompare(b.vm.id));
  return out;
}

function resolveIn<T extends { id: string }>(
  items: T[],
  nameOf: (t: T) => string,
  ref: string,
  ambiguous: (n: number) => string,
): T | undefined {
  const byId = items.find((t) => t.id === ref);
  if (byId) return byId;
  const byName = items.find((t) => nameOf(t) === ref);
  if (byName) return byName;
  if (ref.length >= 3) {
    const hits = items.filter((t) => t.id.startsWith(ref));
    if (hits.length === 1) return hits[0];
    if (hits.length > 1) throw new CliError(ambiguous(hits.length));
  }
  return undefined;
}

/** Exact id, then exact name, then unique id prefix (≥ 3 characters). Undefined when absent. */
export function findVm(root: string, ref: string): LocatedVm | undefined {
  const all = allVms(root);
  const hit = resolveIn(
    all.map((l) => ({ id: l.vm.id, l })),
    (x) => x.l.vm.config.name,
    ref,
    (n) => `ambiguous vm reference "${ref}": matches ${n} VMs`,
  );
  return hit?.l;
}

export function mustFindVm(root: string, ref: string): LocatedVm {
  const hit = findVm(root, ref);
  if (!hit) throw new CliError(`vm not found: ${ref}`);
  return hit;
}

/** The state cocoon reports: a `running` record whose process is dead is `stopped (stale)`. */
export function reconciledState(root: string, vm: VmRecord): string {
  if (vm.state === 'running' && !trackedAlive(root, vm.pid)) return 'stopped (stale)';
  return vm.state;
}

const VM_KEY_ORDER = [
  'id',
  'hypervisor',
  'state',
  'config',
  'pid',
  'socket_path',
  'vsock_socket',
  'network_configs',
  'storage_configs',
  'first_booted',
  'created_at',
  'updated_at',
  'started_at',
  'stopped_at',
];

/** A copy of the record as printed by inspect/list/events (state reconciled, cocoon's key order). */
export function presentVm(root: string, vm: VmRecord): VmRecord {
  const src: Record<string, unknown> = { ...vm, state: reconciledState(root, vm) };
  const out: Record<string, unknown> = {};
  for (const k of VM_KEY_ORDER) if (src[k] !== undefined) out[k] = src[k];
  for (const [k, v] of Object.entries(src)) if (!(k in out) && v !== undefined) out[k] = v;
  return out as unknown as VmRecord;
}

const emptySnapDb = (): SnapshotDb => ({ snapshots: {}, names: {} });

export function readSnapDb(root: string): SnapshotDb {
  const db = readJson<SnapshotDb>(snapDbFile(root), emptySnapDb());
  db.snapshots ??= {};
  db.names ??= {};
  return db;
}

export function updateSnapDb<T>(root: string, fn: (db: SnapshotDb) => T): T {
  return updateJson(snapDbFile(root), snapDbLock(root), emptySnapDb, (db) => {
    db.snapshots ??= {};
    db.names ??= {};
    return fn(db);
  });
}

/** Resolves a snapshot reference in a DB; pending records only when `includePending`. */
export function findSnapshotIn(
  db: SnapshotDb,
  ref: string,
  includePending: boolean,
): SnapshotRecord | undefined {
  const items = Object.values(db.snapshots).filter((s) => includePending || !s.pending);
  return resolveIn(
    items,
    (s) => s.name,
    ref,
    (n) => `ambiguous snapshot reference "${ref}": matches ${n} snapshots`,
  );
}

export function mustFindSnapshot(root: string, ref: string): SnapshotRecord {
  const hit = findSnapshotIn(readSnapDb(root), ref, false);
  if (!hit) throw new CliError(`snapshot not found: ${ref}`);
  return hit;
}

const emptyImageDb = (): ImageDb => ({ images: {}, names: {} });

export function readImageDb(root: string, kind: 'oci' | 'cloudimg'): ImageDb {
  const db = readJson<ImageDb>(imageDbFile(root, kind), emptyImageDb());
  db.images ??= {};
  db.names ??= {};
  return db;
}

export function updateImageDb<T>(root: string, kind: 'oci' | 'cloudimg', fn: (db: ImageDb) => T): T {
  return updateJson(imageDbFile(root, kind), imageDbLock(root, kind), emptyImageDb, (db) => {
    db.images ??= {};
    db.names ??= {};
    return fn(db);
  });
}

/** Finds an image by name or digest (`sha256:<hex>` or bare hex) in either backend. */
export function findImage(root: string, ref: string): ImageRecord | undefined {
  const digest = /^[0-9a-f]{64}$/.test(ref) ? `sha256:${ref}` : ref;
  for (const kind of ['oci', 'cloudimg'] as const) {
    const db = readImageDb(root, kind);
    const byDigest = db.images[digest];
    if (byDigest) return byDigest;
    const id = db.names[ref];
    if (id && db.images[id]) return db.images[id];
  }
  return undefined;
}

/** True when `image` names a cloud image (an http(s) URL) rather than an OCI reference. */
export function isCloudImage(image: string): boolean {
  return /^https?:\/\//.test(image);
}

/** The digest the simulator "pulls" for a reference: deterministic, overridable by knob. */
export function imageDigestFor(ref: string, overrides?: Record<string, string>): string {
  const o = overrides?.[ref];
  if (o) return o.startsWith('sha256:') ? o : `sha256:${o}`;
  return `sha256:${crypto().createHash('sha256').update(`cocoon-sim:${ref}`).digest('hex')}`;
}

export { backendDir };
