/** Restore mode selection for clones (docs/contracts/pod-to-vm.md "Restore mode"). */
import type { Backend, GuestOS } from '../contract/vm.ts';
import { guestProfile } from './profiles.ts';

export type RestoreMode = 'copy' | 'ondemand' | 'mmap';

export const RESTORE_MODES: readonly RestoreMode[] = ['copy', 'ondemand', 'mmap'];

/** `VK_RESTORE_MODE` default (see the README open point: upstream also used `mmap`). */
export const DEFAULT_RESTORE_MODE: RestoreMode = 'ondemand';

/**
 * Validates the `VK_RESTORE_MODE` setting: empty ⇒ the default; anything but `copy`,
 * `ondemand` or `mmap` (exact, lower case) is an error that aborts startup.
 */
export function parseRestoreModeSetting(
  value: string | undefined,
): { readonly ok: true; readonly mode: RestoreMode } | { readonly ok: false; readonly error: string } {
  if (value === undefined || value === '') return { ok: true, mode: DEFAULT_RESTORE_MODE };
  if ((RESTORE_MODES as readonly string[]).includes(value)) return { ok: true, mode: value as RestoreMode };
  return {
    ok: false,
    error: `VK_RESTORE_MODE: expected one of copy, ondemand, mmap, got ${JSON.stringify(value)}`,
  };
}

/**
 * `--restore-mode` for a clone (docs/contracts/pod-to-vm.md "Restore mode"): never for Firecracker (`undefined`);
 * Windows is always `copy` (lazy memory restore stalls the DHCP boot); otherwise the
 * configured mode.
 */
export function restoreModeFor(
  backend: Backend,
  os: GuestOS,
  configured: RestoreMode,
): RestoreMode | undefined {
  if (backend === 'firecracker') return undefined;
  return guestProfile(os).restoreMode === 'copy' ? 'copy' : configured;
}
