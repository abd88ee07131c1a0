// The provenance ledger (docs/security.md, "The provenance ledger"): every VM the daemon
// creates and every local snapshot it writes, with its owner identity, pod, node and time,
// plus the in-flight facts a restart needs (a CH+Windows wake's restore flag, the delete-time
// pushes the registry has not taken yet). Durable: an
// intent is written before the cocoon call that makes the thing and confirmed after it; each
// write replaces the file atomically (temp file, fsync, rename, fsync of the directory) with
// mode 0600. Concurrent writes are group-committed: one file write carries every change made
// before it started. Reconciled at startup against `cocoon vm list` / `snapshot list`.
//
// Hand-written: a JSON document of a few hundred entries rewritten atomically needs no
// database; the maintained embedded stores (sqlite bindings) would add a native module to
// the release for what `rename(2)` gives.
import { chmod, mkdir, open, readFile, rename, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import * as v from 'valibot';
import type { SnapshotRecord, VmRecord } from '../cocoon/records.ts';
import type { Logger } from '../log.ts';
import { describeOwner, type Owner } from './owner.ts';
import { entryOwns, type LedgerEntry } from './rules.ts';

/** The ledger's file name in VK_STATE_DIR. */
export const LEDGER_FILE = 'ledger.json';
const FILE_VERSION = 1;
const FILE_MODE = 0o600;

const OwnerSchema = v.object({ namespace: v.string(), vmName: v.string(), controllerUid: v.string() });
const EntrySchema = v.object({
  name: v.string(),
  id: v.string(),
  state: v.picklist(['intent', 'confirmed']),
  owner: OwnerSchema,
  pod: v.string(),
  podUid: v.string(),
  node: v.string(),
  at: v.string(),
  origin: v.picklist(['created', 'upgrade', 'pulled']),
  intentAt: v.optional(v.string()),
});
/** A delete-time push the registry did not take in time (docs/registry.md, "Delete during a
 * registry outage"): the local snapshot it pushes, and who and when it was saved for. */
const PushSchema = v.object({
  /** The local snapshot (the VM name) and the tag it goes to. */
  name: v.string(),
  repo: v.string(),
  tag: v.string(),
  /** The local snapshot's cocoon ID at the save: a different one is newer state. */
  snapshotId: v.string(),
  baseImage: v.string(),
  owner: OwnerSchema,
  pod: v.string(),
  podUid: v.string(),
  /** RFC 3339: when the state was saved (a registry tag created later is newer). */
  savedAt: v.string(),
  /** keep-snapshot-on-delete: the local snapshot stays after the push. */
  keep: v.boolean(),
  attempts: v.pipe(v.number(), v.safeInteger(), v.minValue(0)),
  lastError: v.string(),
  lastAttemptAt: v.string(),
});
export type PendingPush = v.InferOutput<typeof PushSchema>;

const FileSchema = v.object({
  version: v.literal(FILE_VERSION),
  node: v.string(),
  vms: v.record(v.string(), EntrySchema),
  snapshots: v.record(v.string(), EntrySchema),
  /** VM names whose bring-up is a CH+Windows restore (no PnP fixup after a restart). */
  restores: v.record(v.string(), v.object({ vmId: v.string(), at: v.string() })),
  /** Deferred delete-time pushes by local snapshot name (absent in files written before them). */
  pushes: v.optional(v.record(v.string(), PushSchema), () => ({})),
});
type LedgerFile = v.InferOutput<typeof FileSchema>;

export type LedgerKind = 'vm' | 'snapshot';

/** The pod a write is made for. */
export interface LedgerPod {
  readonly key: string;
  readonly uid: string;
}

export class LedgerError extends Error {
  override name = 'LedgerError';
}

export class Ledger {
  readonly #path: string | undefined;
  readonly #node: string;
  readonly #log: Logger;
  readonly #data: LedgerFile;
  /** True when no ledger file existed at open (first start, or an upgrade from the Go daemon). */
  readonly firstStart: boolean;
  #version = 0;
  #written = 0;
  #chain: Promise<void> = Promise.resolve();

  private constructor(path: string | undefined, node: string, log: Logger, data: LedgerFile, first: boolean) {
    this.#path = path;
    this.#node = node;
    this.#log = log;
    this.#data = data;
    this.firstStart = first;
  }

  /** A ledger kept in memory only (unit tests): a first start. */
  static memory(node: string, log: Logger): Ledger {
    return new Ledger(
      undefined,
      node,
      log,
      { version: FILE_VERSION, node, vms: {}, snapshots: {}, restores: {}, pushes: {} },
      true,
    );
  }

  /** Opens (or, when absent, starts) the ledger at `path`; `undefined` keeps it in memory
   * (unit tests). A file that does not decode stops the startup: an empty ledger would hand
   * every VM to the first claimant. */
  static async open(opts: { path: string | undefined; node: string; log: Logger }): Promise<Ledger> {
    const empty = (): LedgerFile => ({
      version: FILE_VERSION,
      node: opts.node,
      vms: {},
      snapshots: {},
      restores: {},
      pushes: {},
    });
    if (!opts.path) return new Ledger(undefined, opts.node, opts.log, empty(), true);
    let text: string;
    try {
      text = await readFile(opts.path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
        throw new LedgerError(`cannot read the provenance ledger ${opts.path}: ${(err as Error).message}`);
      }
      await mkdir(dirname(opts.path), { recursive: true, mode: 0o700 });
      const ledger = new Ledger(opts.path, opts.node, opts.log, empty(), true);
      ledger.#version++;
      await ledger.flush();
      return ledger;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      throw new LedgerError(
        `provenance ledger ${opts.path} is not JSON: ${(err as Error).message}; restore it from a backup or move it away (docs/operations.md)`,
      );
    }
    const decoded = v.safeParse(FileSchema, parsed);
    if (!decoded.success) {
      const issue = decoded.issues[0];
      throw new LedgerError(
        `provenance ledger ${opts.path} does not decode (${v.getDotPath(issue) ?? ''}: ${issue.message}); restore it from a backup or move it away (docs/operations.md)`,
      );
    }
    const mode = (await stat(opts.path)).mode & 0o777;
    if (mode !== FILE_MODE) {
      await chmod(opts.path, FILE_MODE);
      opts.log.warn(
        { path: opts.path, mode: mode.toString(8) },
        'provenance ledger had a wider mode; set to 0600',
      );
    }
    if (decoded.output.node !== opts.node) {
      opts.log.warn(
        { path: opts.path, was: decoded.output.node, node: opts.node },
        'provenance ledger was written under another node name',
      );
    }
    return new Ledger(opts.path, opts.node, opts.log, { ...decoded.output, node: opts.node }, false);
  }

  vm(name: string): LedgerEntry | undefined {
    return this.#data.vms[name];
  }

  vmById(id: string): LedgerEntry | undefined {
    if (!id) return undefined;
    return Object.values(this.#data.vms).find((e) => e.id === id);
  }

  snapshot(name: string): LedgerEntry | undefined {
    return this.#data.snapshots[name];
  }

  /** The VM name's bring-up is a CH+Windows restore (kept until the VM is bound and settled). */
  restoreFlag(vmName: string): boolean {
    return this.#data.restores[vmName] !== undefined;
  }

  /** Writes the intent to make `name` for `owner` before the cocoon call. A repeated intent
   * of the same identity keeps its first time (a VM made by an earlier attempt stays its). */
  async intend(kind: LedgerKind, name: string, owner: Owner, pod: LedgerPod): Promise<void> {
    const table = this.#table(kind);
    const was = table[name];
    if (was && !entryOwns(was, owner)) {
      // The callers check the rules first; this is the last line (never re-label a thing).
      throw new LedgerError(
        `${kind} ${name} belongs to ${describeOwner(was.owner)} in the ledger; not re-labelled for ${describeOwner(owner)}`,
      );
    }
    if (was?.state === 'intent' || was?.intentAt !== undefined) return;
    table[name] = was
      ? { ...was, intentAt: new Date().toISOString() }
      : this.#entry(name, '', 'intent', owner, pod, 'created');
    await this.#commit();
  }

  /** Confirms `name` as made, with its cocoon ID. */
  async confirm(kind: LedgerKind, name: string, id: string, owner: Owner, pod: LedgerPod): Promise<void> {
    const table = this.#table(kind);
    const was = table[name];
    if (was?.state === 'confirmed' && was.id === id && was.intentAt === undefined && entryOwns(was, owner))
      return;
    table[name] = {
      ...this.#entry(name, id, 'confirmed', owner, pod, was?.origin ?? 'created'),
      at: was?.at ?? new Date().toISOString(),
    };
    await this.#commit();
  }

  /** Records a clone source pulled from the registry, owned by the manifest's namespace stamp
   * (`''`: a shared base image). */
  async recordPulled(name: string, id: string, namespace: string): Promise<void> {
    const was = this.#data.snapshots[name];
    if (was && was.origin !== 'pulled') return; // never re-labels state the daemon wrote
    if (was?.id === id && was.owner.namespace === namespace) return;
    this.#data.snapshots[name] = this.#entry(
      name,
      id,
      'confirmed',
      { namespace, vmName: '', controllerUid: '' },
      { key: '', uid: '' },
      'pulled',
    );
    await this.#commit();
  }

  async forget(kind: LedgerKind, name: string): Promise<void> {
    const table = this.#table(kind);
    if (!(name in table) && !(kind === 'vm' && name in this.#data.restores)) return;
    delete table[name];
    if (kind === 'vm') delete this.#data.restores[name];
    await this.#commit();
  }

  async setRestore(vmName: string, vmId: string | undefined): Promise<void> {
    if (vmId === undefined) {
      if (!(vmName in this.#data.restores)) return;
      delete this.#data.restores[vmName];
    } else {
      this.#data.restores[vmName] = { vmId, at: new Date().toISOString() };
    }
    await this.#commit();
  }

  /** The deferred pushes, oldest save first. */
  pendingPushes(): PendingPush[] {
    return Object.values(this.#data.pushes).sort((a, b) => a.savedAt.localeCompare(b.savedAt));
  }

  pendingPush(name: string): PendingPush | undefined {
    return this.#data.pushes[name];
  }

  /** Records a deferred push (replacing one of the same local snapshot: a later save of it). */
  async deferPush(push: Omit<PendingPush, 'attempts' | 'lastAttemptAt'>): Promise<void> {
    this.#data.pushes[push.name] = { ...push, attempts: 0, lastAttemptAt: '' };
    await this.#commit();
  }

  /** Counts a failed attempt of a deferred push and keeps its error. */
  async pushFailed(name: string, error: string): Promise<void> {
    const was = this.#data.pushes[name];
    if (!was) return;
    this.#data.pushes[name] = {
      ...was,
      attempts: was.attempts + 1,
      lastError: error,
      lastAttemptAt: new Date().toISOString(),
    };
    await this.#commit();
  }

  /** Ends a deferred push (pushed, or dropped as superseded). */
  async endPush(name: string): Promise<void> {
    if (!(name in this.#data.pushes)) return;
    delete this.#data.pushes[name];
    await this.#commit();
  }

  /** The one-time upgrade rule: entries taken over from a node that had no ledger. */
  async takeOver(
    entries: readonly { kind: LedgerKind; name: string; id: string; owner: Owner; pod: LedgerPod }[],
  ): Promise<void> {
    for (const e of entries)
      this.#table(e.kind)[e.name] = this.#entry(e.name, e.id, 'confirmed', e.owner, e.pod, 'upgrade');
    if (entries.length > 0) await this.#commit();
  }

  /** Startup: confirms intents whose VM or snapshot exists and was made after the intent,
   * drops entries whose thing is gone and intents that never turned into one. `snapshots`
   * undefined (the list failed) leaves the snapshot table as it is. */
  async reconcile(
    vms: readonly VmRecord[],
    snapshots: readonly SnapshotRecord[] | undefined,
  ): Promise<{ confirmed: number; dropped: number }> {
    let confirmed = 0;
    let dropped = 0;
    const byName = new Map(vms.map((vm) => [vm.name, vm]));
    for (const [name, entry] of Object.entries(this.#data.vms)) {
      const vm = byName.get(name);
      if (vm && entryOwns(entry, entry.owner, vm)) {
        if (entry.state === 'intent' || entry.id !== vm.id) {
          const { intentAt: _, ...rest } = entry;
          this.#data.vms[name] = { ...rest, id: vm.id, state: 'confirmed' };
          confirmed++;
        }
        continue;
      }
      this.#log.info(
        { vm: name, vmId: entry.id, state: entry.state, present: vm?.id ?? '' },
        'ledger: VM entry without its VM; dropped',
      );
      delete this.#data.vms[name];
      dropped++;
    }
    if (snapshots) {
      const snaps = new Map(snapshots.map((s) => [s.name, s]));
      for (const [name, entry] of Object.entries(this.#data.snapshots)) {
        const snap = snaps.get(name);
        if (
          snap &&
          (entry.state === 'intent'
            ? entryOwns(entry, entry.owner, snap)
            : entry.id === '' || entry.id === snap.id)
        ) {
          if (entry.state === 'intent' || entry.id === '') {
            this.#data.snapshots[name] = { ...entry, id: snap.id, state: 'confirmed' };
            confirmed++;
          }
          continue;
        }
        delete this.#data.snapshots[name];
        dropped++;
      }
      // A deferred push whose local snapshot is gone has nothing left to push.
      for (const [name, push] of Object.entries(this.#data.pushes)) {
        if (snaps.has(name)) continue;
        this.#log.warn(
          { snapshot: name, repo: push.repo, tag: push.tag, savedAt: push.savedAt },
          'ledger: deferred push without its local snapshot; dropped (the state it held is lost)',
        );
        delete this.#data.pushes[name];
        dropped++;
      }
    }
    for (const name of Object.keys(this.#data.restores))
      if (!this.#data.vms[name]) delete this.#data.restores[name];
    this.#version++;
    await this.flush();
    return { confirmed, dropped };
  }

  /** Counts by table (metrics, explain). */
  size(): { vms: number; snapshots: number; pushes: number } {
    return {
      vms: Object.keys(this.#data.vms).length,
      snapshots: Object.keys(this.#data.snapshots).length,
      pushes: Object.keys(this.#data.pushes).length,
    };
  }

  /** Waits until every change made so far is on disk. */
  flush(): Promise<void> {
    // A failed write fails its callers, never the writes after it.
    const next = this.#chain.catch(() => {}).then(() => this.#write());
    this.#chain = next;
    return next;
  }

  #table(kind: LedgerKind): Record<string, LedgerEntry> {
    return kind === 'vm' ? this.#data.vms : this.#data.snapshots;
  }

  #entry(
    name: string,
    id: string,
    state: LedgerEntry['state'],
    owner: Owner,
    pod: LedgerPod,
    origin: LedgerEntry['origin'],
  ): LedgerEntry {
    return {
      name,
      id,
      state,
      owner: { ...owner },
      pod: pod.key,
      podUid: pod.uid,
      node: this.#node,
      at: new Date().toISOString(),
      origin,
    };
  }

  #commit(): Promise<void> {
    this.#version++;
    return this.flush();
  }

  async #write(): Promise<void> {
    const version = this.#version;
    if (!this.#path || version === this.#written) return;
    const tmp = `${this.#path}.tmp`;
    const fh = await open(tmp, 'w', FILE_MODE);
    try {
      await fh.writeFile(`${JSON.stringify(this.#data)}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, this.#path);
    const dir = await open(dirname(this.#path), 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
    this.#written = version;
  }
}
