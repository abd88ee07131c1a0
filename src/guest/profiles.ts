// Guest profiles: every decision that depends on the guest OS, in one table keyed by
// `cocoonset.cocoonstack.io/os` (docs/contracts/post-clone.md, docs/contracts/annotations.md).
// The table is a total map over GuestOS: adding an OS to the contract does not compile until
// every field below is decided for it.
import type { GuestOS } from '../contract/vm.ts';

/** How a cloned guest's network is fixed up after the clone. */
export type FixupStyle =
  /** Plug-and-Play re-enumerate of the network devices, on every managed clone. */
  | 'pnp'
  /** MAC re-assignment on Firecracker, networkd/cloud-init for static NICs on Cloud
   * Hypervisor, nothing for an all-DHCP Cloud Hypervisor clone. */
  | 'linux';

export interface GuestProfile {
  /** Whether this release runs the guest; an unsupported guest fails its create loudly. */
  readonly supported: { readonly ok: true } | { readonly ok: false; readonly message: string };
  readonly fixup: FixupStyle;
  /** Static NICs are configured over the serial console (SAC) instead of in the fixup. */
  readonly staticIpOverSerialConsole: boolean;
  /** Guest argv of the single DHCP renew nudge sent during the IP wait, if any. */
  readonly renewNudge: readonly string[] | undefined;
  /** `kubectl logs`: the VM console log through `cocoon vm logs`, or a fixed explanation. */
  readonly consoleLogs: { readonly kind: 'cocoon' } | { readonly kind: 'none'; readonly line: string };
  /** Cloud Hypervisor clone memory restore: the configured mode, or always `copy`. */
  readonly restoreMode: 'configured' | 'copy';
  /** `cocoon vm run --windows`. */
  readonly runWindowsFlag: boolean;
}

/** `cmd /c ipconfig /renew`: the Windows DHCP renew nudge. */
export const WINDOWS_RENEW_ARGV: readonly string[] = ['cmd', '/c', 'ipconfig', '/renew'];

const LINUX: GuestProfile = {
  supported: { ok: true },
  fixup: 'linux',
  staticIpOverSerialConsole: false,
  renewNudge: undefined,
  consoleLogs: { kind: 'cocoon' },
  restoreMode: 'configured',
  runWindowsFlag: false,
};

export const GUEST_PROFILES: { readonly [os in GuestOS]: GuestProfile } = {
  linux: LINUX,
  // Android guests are Linux guests to every step vk-cocoon takes (networkd or netplan,
  // console log, restore mode): the same decisions, named here on purpose.
  android: LINUX,
  windows: {
    supported: { ok: true },
    fixup: 'pnp',
    staticIpOverSerialConsole: true,
    renewNudge: WINDOWS_RENEW_ARGV,
    consoleLogs: {
      kind: 'none',
      line: 'vk-cocoon: Windows guests have no console log; connect with RDP to the pod IP.',
    },
    // Lazy memory restore stalls a Windows guest's DHCP boot.
    restoreMode: 'copy',
    runWindowsFlag: true,
  },
  macos: {
    supported: {
      ok: false,
      message: 'macOS guests belong to a later tier and are not supported by this vk-cocoon release',
    },
    fixup: 'linux',
    staticIpOverSerialConsole: false,
    renewNudge: undefined,
    consoleLogs: { kind: 'none', line: 'vk-cocoon: macOS guests are not supported by this release.' },
    restoreMode: 'configured',
    runWindowsFlag: false,
  },
};

export function guestProfile(os: GuestOS): GuestProfile {
  return GUEST_PROFILES[os];
}
