/**
 * What is under a snapshot tag: the identity read (docs/registry.md "Identity read": manifest and
 * config, validated) and the tag delete (docs/registry.md "Tag delete").
 */
import { MAX_CONFIG_BYTES, validateSnapshotManifest } from './artifact.ts';
import { parseSnapshotConfig, type SnapshotConfig } from './artifact-config.ts';
import { ANNOTATION } from './artifact-write.ts';
import type { RegistryClient } from './client.ts';
import { RegistryError } from './errors.ts';
import { parseReference } from './reference.ts';

/**
 * Deletes `<repo>:<tag>` (rollback of a failed hibernate, docs/registry.md "Tag delete"):
 * `'deleted'`, or `'absent'` when there was nothing to delete. Any other outcome throws
 * {@link RegistryError}.
 */
export async function deleteSnapshotTag(
  registry: RegistryClient,
  repo: string,
  tag: string,
  signal?: AbortSignal,
): Promise<'deleted' | 'absent'> {
  const name = registry.repository(repo);
  const ref = parseReference(tag);
  return await registry.deleteManifest(name, ref, signal);
}

/** What identifies a pushed snapshot (docs/registry.md "Identity read"). */
export interface SnapshotIdentity {
  /** Digest of the manifest under the tag. */
  digest: string;
  /** The config's `snapshotId`. */
  snapshotId: string;
  /** `cocoonstack.snapshot.baseimage` (`''` when absent). */
  baseImage: string;
  /** `cocoonstack.snapshot.from-node` (`''` when absent). */
  fromNode: string;
  /** `vm.cocoonstack.io/namespace` (`''` when absent: an older writer, the Go daemon). */
  namespace: string;
  /** `vm.cocoonstack.io/controller-uid` (`''` when absent). */
  controllerUid: string;
  /** `vm.cocoonstack.io/peer-address` and `-cert-sha256` (`''` when absent: a Go pusher). */
  peerAddress: string;
  peerPin: string;
  /** `org.opencontainers.image.created` (RFC 3339); `''` when absent: which state is newer
   * (a deferred delete-time push, docs/registry.md). */
  created: string;
  /** The validated config blob: what a peer restore checks the peer against and stages as
   * `snapshot.json` (docs/peer-restore.md). */
  config: SnapshotConfig;
}

/**
 * Reads the manifest (GET, index resolved) and config of `repo:tag`: `'absent'` on 404; throws
 * {@link RegistryError} on any other failure — unreachable registry, 5xx, a document that is
 * not a valid v1 snapshot — so a caller never mistakes "cannot tell" for "not there".
 */
export async function readSnapshotIdentity(
  registry: RegistryClient,
  repo: string,
  tag: string,
  signal?: AbortSignal,
): Promise<SnapshotIdentity | 'absent'> {
  const name = registry.repository(repo);
  const ref = parseReference(tag);
  const display = registry.display(name, ref);
  const fetched = await registry.getManifest(name, ref, signal);
  if (fetched === 'absent') return 'absent';
  const manifest = validateSnapshotManifest(fetched.document);
  if (!manifest.ok) throw new RegistryError('invalid', `${display}: ${manifest.error}`);
  const configBytes = await registry.getBlobBytes(name, manifest.value.config, MAX_CONFIG_BYTES, signal);
  const config = parseSnapshotConfig(configBytes, manifest.value);
  if (!config.ok) throw new RegistryError('invalid', `${display}: ${config.error}`);
  const a = manifest.value.annotations;
  return {
    digest: fetched.digest,
    snapshotId: config.value.snapshotId,
    baseImage: a[ANNOTATION.baseImage] ?? '',
    fromNode: a[ANNOTATION.fromNode] ?? '',
    namespace: a[ANNOTATION.namespace] ?? '',
    controllerUid: a[ANNOTATION.controllerUid] ?? '',
    peerAddress: a[ANNOTATION.peerAddress] ?? '',
    peerPin: a[ANNOTATION.peerPin] ?? '',
    created: a[ANNOTATION.created] ?? '',
    config: config.value,
  };
}
