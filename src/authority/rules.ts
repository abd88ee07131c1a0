// The authority rules (docs/security.md, "Rules"): who may adopt, replace, clone or destroy a
// VM or a snapshot. Pure: facts in (the pod's owner identity, the provenance ledger's entry,
// what cocoon or the registry shows), one verdict out. Every refusal names its rule; the
// provider turns it into `failed` with that message. One function per rule row, tested one
// block per row (test/unit/authority/rules.test.ts).
import { describeOwner, type Owner, sameOwner } from './owner.ts';

/** What the ledger knows of one VM or local snapshot the daemon made (or took over). */
export interface LedgerEntry {
  readonly name: string;
  /** The cocoon ID once confirmed; `''` while only the intent is written. */
  readonly id: string;
  readonly state: 'intent' | 'confirmed';
  readonly owner: Owner;
  /** `namespace/name` and UID of the pod it was made for. */
  readonly pod: string;
  readonly podUid: string;
  readonly node: string;
  /** RFC 3339: when the intent was first written (kept across retries of one identity). */
  readonly at: string;
  /** `created` by this daemon, taken over by the one-time `upgrade` rule, or `pulled` from the
   * registry as a clone source (owner: the manifest's namespace stamp, `''` = shared). */
  readonly origin: 'created' | 'upgrade' | 'pulled';
  /** A confirmed entry whose identity is making a new one of the same name (the old one
   * gone, or about to be found by the clone): a thing made after this time is its too. */
  readonly intentAt?: string;
}

export type RuleName =
  | 'reserved-name'
  | 'name-owned'
  | 'name-unowned'
  | 'adopt-foreign'
  | 'adopt-unowned'
  | 'attach-foreign'
  | 'snapshot-foreign'
  | 'snapshot-unowned'
  | 'source-foreign'
  | 'source-reserved'
  | 'state-foreign'
  | 'state-unstamped'
  | 'tag-foreign'
  | 'tag-unstamped'
  | 'push-superseded'
  | 'push-recreated'
  | 'push-newer-state';

export type Verdict =
  | { readonly ok: true }
  | { readonly ok: false; readonly rule: RuleName; readonly message: string };

const OK: Verdict = { ok: true };
const no = (rule: RuleName, message: string): Verdict => ({
  ok: false,
  rule,
  message: `${message} (rule ${rule})`,
});

/** A VM made after its intent was written is the intent's; clocks of one host, so only the
 * write-to-clone latency matters. A VM without a creation time cannot be attributed. */
const INTENT_SKEW_MS = 0;

/** Names the daemon makes for itself: never a pod's VM name, never a pod's clone source
 * unless the ledger gives it to the pod's namespace. */
export function isReservedName(name: string): boolean {
  return name.startsWith('fork-') || name.endsWith('-hibernate-import');
}

/** True when `entry` gives the thing to `owner` (and, for a VM, when `vm` is the one the
 * entry was written for: the confirmed ID, or made after the intent). */
export function entryOwns(
  entry: LedgerEntry | undefined,
  owner: Owner,
  vm?: { readonly id: string; readonly createdAt: string },
): boolean {
  if (!entry || !sameOwner(entry.owner, owner)) return false;
  if (!vm) return true;
  if (entry.id !== '' && entry.id === vm.id) return true;
  const since = entry.state === 'intent' ? entry.at : entry.intentAt;
  if (since === undefined) return false;
  const made = Date.parse(vm.createdAt);
  const intent = Date.parse(since);
  return Number.isFinite(made) && Number.isFinite(intent) && made >= intent - INTENT_SKEW_MS;
}

/** Row 1, adopt: a managed pod adopts an existing VM (by name, by ID, salvage after a failed
 * clone, startup) only when the ledger gives that very VM to its identity. */
export function mayAdopt(
  owner: Owner,
  vm: { readonly name: string; readonly id: string; readonly createdAt: string },
  entry: LedgerEntry | undefined,
): Verdict {
  if (entryOwns(entry, owner, vm)) return OK;
  if (entry && !sameOwner(entry.owner, owner)) {
    return no(
      'adopt-foreign',
      `VM ${vm.name} (${vm.id}) belongs to ${describeOwner(entry.owner)}, not to ${describeOwner(owner)}: a pod never adopts another identity's VM`,
    );
  }
  return no(
    'adopt-unowned',
    `VM ${vm.name} (${vm.id}) was not created by vk-cocoon for ${describeOwner(owner)}: a managed pod never adopts a VM made outside it; use another vm.cocoonstack.io/name`,
  );
}

/** Row 2, attach: an unmanaged pod keeps its explicit `vm.cocoonstack.io/id` path (the VM
 * made by its operator), refused for a VM the ledger gives to another identity. */
export function mayAttachUnmanaged(owner: Owner, vmId: string, entry: LedgerEntry | undefined): Verdict {
  if (!entry || sameOwner(entry.owner, owner)) return OK;
  return no(
    'attach-foreign',
    `VM ${vmId} belongs to ${describeOwner(entry.owner)}: an unmanaged pod never attaches to a VM vk-cocoon made for another identity`,
  );
}

/** Row 3, the VM name a managed pod claims: not a reserved shape, not a VM or snapshot of
 * another identity, not a local snapshot vk-cocoon did not write (a base image). */
export function mayClaimName(
  owner: Owner,
  facts: {
    readonly vm: LedgerEntry | undefined;
    readonly snapshot: LedgerEntry | undefined;
    readonly localSnapshotExists: boolean;
  },
): Verdict {
  const name = owner.vmName;
  if (isReservedName(name)) {
    return no(
      'reserved-name',
      `VM name ${name} has a shape vk-cocoon reserves for its own snapshots (fork-*, *-hibernate-import): use another vm.cocoonstack.io/name`,
    );
  }
  for (const entry of [facts.vm, facts.snapshot]) {
    if (entry && !sameOwner(entry.owner, owner)) {
      return no(
        'name-owned',
        `VM name ${name} is owned by ${describeOwner(entry.owner)} (a ${entry === facts.vm ? 'VM' : 'snapshot'} of that name exists for it): use another vm.cocoonstack.io/name`,
      );
    }
  }
  if (facts.localSnapshotExists && !facts.snapshot) {
    return no(
      'name-unowned',
      `VM name ${name} is the name of a local snapshot vk-cocoon did not write (a shared base image): use another vm.cocoonstack.io/name`,
    );
  }
  return OK;
}

/** Row 4, snapshot write: a save may replace a snapshot of that name only when the ledger
 * gives it to the same identity; a name that exists without an entry is never replaced. */
export function mayWriteSnapshot(
  owner: Owner,
  name: string,
  entry: LedgerEntry | undefined,
  exists: boolean,
): Verdict {
  if (entry && !sameOwner(entry.owner, owner)) {
    return no(
      'snapshot-foreign',
      `snapshot ${name} belongs to ${describeOwner(entry.owner)}: never replaced`,
    );
  }
  if (!entry && exists) {
    return no(
      'snapshot-unowned',
      `snapshot ${name} was not written by vk-cocoon for ${describeOwner(owner)}: never replaced`,
    );
  }
  return OK;
}

/** Row 5, removal: a VM or snapshot is removed for an identity only when the ledger gives it
 * to that identity (base images, another tenant's state and host VMs never are). */
export function mayRemove(owner: Owner, entry: LedgerEntry | undefined): boolean {
  return entry !== undefined && entry.origin !== 'pulled' && sameOwner(entry.owner, owner);
}

/** Row 6, a local clone source: refused when the ledger gives it to another namespace, or when
 * it has a reserved shape without an entry of the pod's namespace. An unlisted snapshot is a
 * shared base image. */
export function mayUseLocalSource(namespace: string, name: string, entry: LedgerEntry | undefined): Verdict {
  if (entry && entry.owner.namespace !== '' && entry.owner.namespace !== namespace) {
    return no(
      'source-foreign',
      `snapshot ${name} belongs to namespace ${entry.owner.namespace}: a pod never clones, forks or restores another namespace's state`,
    );
  }
  if (!entry && isReservedName(name)) {
    return no('source-reserved', `snapshot ${name} is vk-cocoon's own working copy, not a clone source`);
  }
  return OK;
}

/** What a registry manifest says about who pushed it. */
export interface Stamp {
  /** `vm.cocoonstack.io/namespace`; `''` when absent (older writers, base images). */
  readonly namespace: string;
  /** `vm.cocoonstack.io/controller-uid`; `''` when absent. */
  readonly controllerUid: string;
  /** `cocoonstack.snapshot.from-node`: set by vk hosts, absent on base images. */
  readonly fromNode: string;
}

/** Row 7, a registry clone source: stamped with another namespace is refused; unstamped is a
 * shared base image. */
export function mayCloneRegistrySource(namespace: string, ref: string, stamp: Stamp): Verdict {
  if (stamp.namespace === '' || stamp.namespace === namespace) return OK;
  return no(
    'source-foreign',
    `${ref} was pushed for a pod of namespace ${stamp.namespace}: a pod never clones another namespace's state`,
  );
}

/** Row 8, hibernated state to wake or restore (`<vmName>:hibernate`, evidence on create):
 * stamped with the pod's namespace, or unstamped (a Go host's push) while
 * `VK_ACCEPT_UNSTAMPED_STATE` allows it, for the pod whose VM name is the repository. */
export function mayRestoreState(
  namespace: string,
  ref: string,
  stamp: Stamp,
  acceptUnstamped: boolean,
): Verdict {
  if (stamp.namespace === namespace) return OK;
  if (stamp.namespace !== '') {
    return no(
      'state-foreign',
      `${ref} belongs to a pod of namespace ${stamp.namespace}, not ${namespace}: a pod never restores another namespace's VM; use another vm.cocoonstack.io/name`,
    );
  }
  if (acceptUnstamped) return OK;
  return no(
    'state-unstamped',
    `${ref} carries no owner stamp (written by a host without provenance) and VK_ACCEPT_UNSTAMPED_STATE=false refuses it: delete the tag, or allow unstamped state`,
  );
}

/** Row 9, push: a tag is overwritten only when absent, stamped with the same identity, or an
 * unstamped hibernate/latest state of this VM name written by a vk host (from-node set) while
 * unstamped state is accepted. Base images (unstamped, no from-node) never are. */
export function mayOverwriteTag(
  owner: Owner,
  repo: string,
  tag: string,
  existing: Stamp | 'absent',
  acceptUnstamped: boolean,
): Verdict {
  if (existing === 'absent') return OK;
  const ref = `${repo}:${tag}`;
  if (existing.namespace !== '') {
    // A namespace-only stamp (vk-cocoon before owner stamps) is the namespace's.
    const sameController = existing.controllerUid === '' || existing.controllerUid === owner.controllerUid;
    if (existing.namespace === owner.namespace && sameController) return OK;
    return no(
      'tag-foreign',
      `${ref} belongs to ${describeOwner({ namespace: existing.namespace, vmName: repo, controllerUid: existing.controllerUid })}: never overwritten by ${describeOwner(owner)}`,
    );
  }
  const ownState =
    repo === owner.vmName && (tag === 'hibernate' || tag === 'latest') && existing.fromNode !== '';
  if (ownState && acceptUnstamped) return OK;
  return no(
    'tag-unstamped',
    `${ref} exists without an owner stamp (a shared base image, or state no setting lets this pod claim): never overwritten`,
  );
}

/** A registry tag's stamp and its `org.opencontainers.image.created` (`''`: undated). */
export interface DatedStamp extends Stamp {
  readonly created: string;
}

/** The deferred push being tried (src/authority/ledger.ts PendingPush fits). */
export interface DeferredPush {
  readonly name: string;
  readonly repo: string;
  readonly tag: string;
  readonly snapshotId: string;
  readonly owner: Owner;
  /** RFC 3339: when the state was saved. */
  readonly savedAt: string;
}

/** What a deferred push meets when it is tried. */
export interface DeferredPushFacts {
  /** The ledger's entry of the local snapshot now. */
  readonly snapshot: LedgerEntry | undefined;
  /** The ledger's entry of a VM of that name on this host now. */
  readonly vm: LedgerEntry | undefined;
  /** The registry's target tag, and the repo's `hibernate` tag. */
  readonly target: DatedStamp | 'absent';
  readonly hibernate: DatedStamp | 'absent';
  readonly acceptUnstamped: boolean;
}

/** Later than `savedAt`, both times of this host's ledger (milliseconds); an unreadable time
 * counts as later (a state nobody can date is never overwritten). */
function writtenAfter(at: string, savedAt: string): boolean {
  const t = Date.parse(at);
  const saved = Date.parse(savedAt);
  return !Number.isFinite(t) || !Number.isFinite(saved) || t > saved;
}

/** A manifest's `created` (whole seconds, RFC 3339) at or after the second of `savedAt`: a tag
 * written in the same second as the save cannot be ordered against it, so it counts as newer,
 * as does an undated one. */
function taggedSinceSave(created: string, savedAt: string): boolean {
  const t = Date.parse(created);
  const saved = Date.parse(savedAt);
  return !Number.isFinite(t) || !Number.isFinite(saved) || t >= Math.floor(saved / 1000) * 1000;
}

/** Row 10, a deferred delete-time push (docs/security.md): it writes the state it saved only
 * while that state is still the identity's newest. Refused (and dropped) when the local
 * snapshot is no longer the one saved for it, when the identity runs again on this host in a
 * VM made after the save, when the target tag is another identity's, or when a tag of this
 * identity was written after the save (it was re-created, ran and saved elsewhere). */
export function mayPushDeferred(p: DeferredPush, f: DeferredPushFacts): Verdict {
  const ref = `${p.repo}:${p.tag}`;
  const snap = f.snapshot;
  if (!snap || !sameOwner(snap.owner, p.owner) || (p.snapshotId !== '' && snap.id !== p.snapshotId)) {
    return no(
      'push-superseded',
      `the local snapshot ${p.name} is no longer the state saved for ${describeOwner(p.owner)} at ${p.savedAt}: ${ref} not written`,
    );
  }
  if (f.vm && sameOwner(f.vm.owner, p.owner) && writtenAfter(f.vm.at, p.savedAt)) {
    return no(
      'push-recreated',
      `${describeOwner(p.owner)} runs again on this host (VM ${f.vm.id || f.vm.name} made ${f.vm.at}, after the save at ${p.savedAt}): ${ref} not written`,
    );
  }
  const target = mayOverwriteTag(p.owner, p.repo, p.tag, f.target, f.acceptUnstamped);
  if (!target.ok) return target;
  const newer = (tag: string, s: DatedStamp | 'absent') => {
    if (s === 'absent') return false;
    // Only this identity's state counts (another's `hibernate` is no evidence about it).
    if (!mayOverwriteTag(p.owner, p.repo, tag, s, f.acceptUnstamped).ok) return false;
    return taggedSinceSave(s.created, p.savedAt);
  };
  for (const [tag, s] of [
    [p.tag, f.target],
    ['hibernate', f.hibernate],
  ] as const) {
    if (!newer(tag, s)) continue;
    const when = s !== 'absent' && s.created ? `written ${s.created}` : 'undated';
    return no(
      'push-newer-state',
      `${p.repo}:${tag} of ${describeOwner(p.owner)} (${when}) is newer than the state saved at ${p.savedAt}: ${ref} not written`,
    );
  }
  return OK;
}
