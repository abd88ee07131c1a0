/** Value types of the decoded VMSpec (docs/contracts/annotations.md "Role derivation"). */

export type Backend = 'cloud-hypervisor' | 'firecracker';
export type GuestOS = 'linux' | 'windows' | 'android' | 'macos';
export type VMMode = 'clone' | 'run' | 'static';
export type SnapshotPolicy = 'always' | 'main-only' | 'never';
/** Role for the `main-only` snapshot policy (docs/contracts/annotations.md "Role derivation", last paragraph). */
export type VMRole = 'main' | 'sub-agent' | 'toolbox';

export const BACKENDS: readonly Backend[] = ['cloud-hypervisor', 'firecracker'];
export const GUEST_OSES: readonly GuestOS[] = ['linux', 'windows', 'android', 'macos'];
export const VM_MODES: readonly VMMode[] = ['clone', 'run', 'static'];

/** VM names (docs/contracts/annotations.md "Role derivation", docs/contracts/cocoon-cli.md "Invocation"). */
export const VM_NAME_PATTERN = /^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$/;
/** Snapshot names also allow `:` and `/` (docs/contracts/cocoon-cli.md "Invocation"). */
export const SNAPSHOT_NAME_PATTERN = /^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$/;

/**
 * True for an `http://` or `https://` cloud-image URL. Case-sensitive, like cocoon's own
 * `image pull` classification (docs/contracts/cocoon-cli.md "Verbs and argv" notes).
 */
export function isCloudImageUrl(image: string): boolean {
  return image.startsWith('http://') || image.startsWith('https://');
}

/** Kind of a post-clone network fixup (label `kind` of `cocoon_vk_postclone_total`, with
 * `sac` for the Windows serial-console pass). */
export type FixupKind = 'windows' | 'linux_fc' | 'linux_static';
export type PostCloneKind = FixupKind | 'sac';
