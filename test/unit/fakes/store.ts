// A fake of the provider's SnapshotStore port (src/provider/cocoon/context.ts) for in-process
// tests: an in-memory registry of `<repo>:<tag>` identities that reads and creates snapshots in
// a FakeCocoon, every call recorded, with switches for an unreachable registry and refused
// pushes. The real push, pull and identity read are tested against the ground's registry and crane
// (test/integration/registry-push.test.ts).
import type { SnapshotIdentity, SnapshotStore } from '../../../src/provider/cocoon/context.ts';
import { SnapshotPullError } from '../../../src/registry/pull.ts';
import type { FakeCocoon } from './cocoon.ts';

export class FakeStore implements SnapshotStore {
  readonly tags = new Map<string, SnapshotIdentity>();
  readonly calls: string[] = [];
  /** Every call fails as an unreachable registry. */
  down = false;
  /** Pushes fail (the registry refuses the manifest). */
  refusePush = false;
  /** Resolves pushes only when released (to act while a push is in flight). */
  hold: Promise<void> | undefined;
  readonly #cocoon: FakeCocoon;
  #seq = 0;

  constructor(cocoon: FakeCocoon) {
    this.#cocoon = cocoon;
  }

  #check(what: string): void {
    this.calls.push(what);
    if (this.down) throw new Error(`${what}: connect ECONNREFUSED 127.0.0.1:5000`);
  }

  async push(args: {
    localName: string;
    repo: string;
    tag: string;
    baseImage: string;
    fromNode?: string;
    namespace?: string;
    controllerUid?: string;
    signal?: AbortSignal;
  }): Promise<{ digest: string; snapshotId: string; bytes: number }> {
    this.#check(`push ${args.repo}:${args.tag}`);
    if (this.hold) {
      // A held push ends when released or when its signal aborts, as the real one does.
      const signal = args.signal;
      await (signal
        ? Promise.race([
            this.hold,
            new Promise<never>((_, reject) => {
              if (signal.aborted) reject(signal.reason);
              signal.addEventListener('abort', () => reject(signal.reason), { once: true });
            }),
          ])
        : this.hold);
    }
    if (this.down) throw new Error(`push ${args.repo}:${args.tag}: connect ECONNREFUSED 127.0.0.1:5000`);
    if (this.refusePush)
      throw new Error(`push ${args.repo}:${args.tag}: manifest PUT refused: 400 MANIFEST_INVALID`);
    const snap = this.#cocoon.snapshots.get(args.localName);
    if (!snap) throw new Error(`snapshot export ${args.localName}: snapshot not found`);
    const id: SnapshotIdentity = {
      digest: `sha256:${(++this.#seq).toString(16).padStart(64, '0')}`,
      snapshotId: `snap-${args.localName}`,
      baseImage: args.baseImage,
      fromNode: args.fromNode ?? '',
      namespace: args.namespace ?? '',
      controllerUid: args.controllerUid ?? '',
      created: new Date().toISOString(),
    };
    this.tags.set(`${args.repo}:${args.tag}`, id);
    return { digest: id.digest, snapshotId: id.snapshotId, bytes: 1024 };
  }

  async identity(repo: string, tag: string): Promise<SnapshotIdentity | 'absent'> {
    this.#check(`identity ${repo}:${tag}`);
    return this.tags.get(`${repo}:${tag}`) ?? 'absent';
  }

  async deleteTag(repo: string, tag: string): Promise<'deleted' | 'absent'> {
    this.#check(`delete ${repo}:${tag}`);
    return this.tags.delete(`${repo}:${tag}`) ? 'deleted' : 'absent';
  }

  async pull(args: { repo: string; tag: string; localName: string }) {
    this.#check(`pull ${args.repo}:${args.tag}`);
    const id = this.tags.get(`${args.repo}:${args.tag}`);
    if (!id) throw new SnapshotPullError(`${args.repo}:${args.tag} is absent`, { absent: true });
    this.#cocoon.snapshot(args.localName, { image: '' });
    return {
      id: id.snapshotId,
      name: args.localName,
      image: '',
      imageDigest: '',
      imageType: '',
      imageBlobIds: [],
      hypervisor: 'cloud-hypervisor',
      createdAt: '',
    };
  }
}
