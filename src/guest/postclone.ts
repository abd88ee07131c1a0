/**
 * Post-clone fixup plan (docs/contracts/post-clone.md "When a fixup is owed"–docs/contracts/post-clone.md "Linux script"): whether a cloned VM needs guest-side network
 * setup, and the exact guest command and hint text.
 *
 * Every value that enters a guest script is validated first (VM name, MAC, IPv4, prefix,
 * gateway); invalid input yields an error instead of a plan, so nothing a pod author writes can
 * reach `sh -c` unchecked (docs/conventions.md).
 */
import type { Backend, FixupKind, GuestOS } from '../contract/vm.ts';
import { isCloudImageUrl, VM_NAME_PATTERN } from '../contract/vm.ts';
import { guestProfile } from './profiles.ts';

export type { FixupKind };

/** Overall fixup budget by default (`VK_FIXUP_BUDGET_SECONDS`), measured from the `post-clone-state=running` write
 * (docs/contracts/post-clone.md "Execution"); a setting may only shorten it (the ready deadline's floor counts on it). */
export const FIXUP_BUDGET_MS = 180_000;
/** Pause between two failed fixup attempts (docs/contracts/post-clone.md "Execution"). */
export const FIXUP_RETRY_DELAY_MS = 3_000;

/** The PowerShell script of docs/contracts/post-clone.md "Windows" (`-PresentOnly` is load-bearing). */
export const WINDOWS_PNP_SCRIPT =
  '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false';

/** The Windows guest argv (4 elements) run through `cocoon vm exec <vmID> -- ...` (docs/contracts/post-clone.md "Windows"). */
export const WINDOWS_FIXUP_ARGV: readonly string[] = ['powershell', '-nop', '-c', WINDOWS_PNP_SCRIPT];

/** The Windows hint: the same command quoted for a shell (docs/contracts/post-clone.md "Windows"). */
export const WINDOWS_FIXUP_HINT = `powershell -nop -c '${WINDOWS_PNP_SCRIPT}'`;

/** A NIC as the fixup sees it (a `VmNic` from `cocoon/records.ts` fits). */
export interface FixupNic {
  readonly mac: string;
  /** Present for a static NIC (`network.ip` non-empty). */
  readonly static?: { readonly ip: string; readonly gateway: string; readonly prefix: number } | undefined;
}

/** What the matrix of docs/contracts/post-clone.md "When a fixup is owed" looks at. */
export interface FixupMatrixFacts {
  /** Clone, fork-from, clone-from-dir, wake/restore; not plain run mode (docs/contracts/post-clone.md "When a fixup is owed"). */
  readonly clonedBoot: boolean;
  readonly os: GuestOS;
  readonly backend: Backend;
  readonly nics: readonly FixupNic[];
}

/** A NIC is static when its `network.ip` is non-empty (docs/contracts/post-clone.md "When a fixup is owed"). */
export function isStaticNic(nic: FixupNic): boolean {
  return nic.static !== undefined && nic.static.ip !== '';
}

/**
 * The docs/contracts/post-clone.md "When a fixup is owed" matrix, first match wins: `windows` (any backend), `linux_fc` (Firecracker),
 * `linux_static` (CH with at least one static NIC), else no fixup (`undefined`; CH all-DHCP
 * re-DHCPs by itself). Not a cloned boot ⇒ `undefined`. The CH+Windows restore exception
 * (docs/contracts/pod-to-vm.md "Restore") and the managed-only rule are the caller's (owed-step rows 1 and 6).
 */
export function fixupKind(facts: FixupMatrixFacts): FixupKind | undefined {
  if (!facts.clonedBoot) return undefined;
  if (guestProfile(facts.os).fixup === 'pnp') return 'windows';
  if (facts.backend === 'firecracker') return 'linux_fc';
  if (facts.nics.some(isStaticNic)) return 'linux_static';
  return undefined;
}

/** Everything a plan needs. */
export interface FixupFacts extends FixupMatrixFacts {
  readonly vmName: string;
  /**
   * The clone source's image (the snapshot's `image` field) for a normal clone; `undefined`
   * or `''` when unknown (fork, wake, clone-from-dir) — then {@link overlayQcow2Exists} decides.
   */
  readonly sourceImage?: string;
  /** Whether `<COCOON_ROOT_DIR>/run/cloudhypervisor/<vmID>/overlay.qcow2` exists (docs/contracts/post-clone.md "cloudimg or OCI"). */
  readonly overlayQcow2Exists?: boolean;
}

/** Guest flavour of a Linux plan (docs/contracts/post-clone.md "cloudimg or OCI"). */
export type LinuxGuest = 'cloudimg' | 'oci';

/**
 * cloudimg or OCI (docs/contracts/post-clone.md "cloudimg or OCI"): a known source image decides by its `http(s)://` prefix; without one
 * the run-dir probe (`overlay.qcow2` exists) decides; with neither it is OCI.
 */
export function linuxGuestFlavour(facts: Pick<FixupFacts, 'sourceImage' | 'overlayQcow2Exists'>): LinuxGuest {
  if (facts.sourceImage !== undefined && facts.sourceImage !== '') {
    return isCloudImageUrl(facts.sourceImage) ? 'cloudimg' : 'oci';
  }
  return facts.overlayQcow2Exists === true ? 'cloudimg' : 'oci';
}

export type FixupPlan =
  | { readonly needed: false }
  | {
      readonly needed: true;
      readonly ok: true;
      readonly kind: FixupKind;
      /** Guest argv for `cocoon vm exec <vmID> -- <argv...>`. */
      readonly argv: readonly string[];
      /** The manual command text (base64-encoded into `post-clone-hint` on exhaustion). */
      readonly hint: string;
    }
  | {
      readonly needed: true;
      readonly ok: false;
      readonly kind: FixupKind;
      /** Why no plan could be built (invalid input); the fixup cannot run. */
      readonly error: string;
    };

/** Guest MAC accepted in a script: lower-case colon form. */
export const SCRIPT_MAC_PATTERN = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const IPV4_OCTET = '(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])';
/** Dotted-quad IPv4 without leading zeros. */
export const IPV4_PATTERN = new RegExp(`^${IPV4_OCTET}(?:\\.${IPV4_OCTET}){3}$`);

const quote = JSON.stringify;

/**
 * Builds the fixup plan (docs/contracts/post-clone.md "Windows", docs/contracts/post-clone.md "Linux script"). Not needed per {@link fixupKind} ⇒ `{needed: false}`.
 * Windows ⇒ the constant PnP command. Linux ⇒ `sh -c <script>` where the script is, joined by
 * `\n`: drop caches; hostname; (Firecracker) per-NIC MAC rewrite; remove `10-*.network`; then
 * the cloudimg cloud-init lines, or per-NIC networkd files plus a networkd restart (OCI).
 *
 * MACs are lower-cased before validation (cocoon reports lower case; upper-case hex is not an
 * injection risk). An empty gateway on a static NIC is written as `Gateway=` (what the Go
 * implementation emits; networkd treats it as "no gateway").
 */
export function planFixup(facts: FixupFacts): FixupPlan {
  const kind = fixupKind(facts);
  if (kind === undefined) return { needed: false };
  if (kind === 'windows')
    return { needed: true, ok: true, kind, argv: WINDOWS_FIXUP_ARGV, hint: WINDOWS_FIXUP_HINT };

  const errors: string[] = [];
  if (!VM_NAME_PATTERN.test(facts.vmName)) errors.push(`invalid VM name ${quote(facts.vmName)}`);
  const firecracker = facts.backend === 'firecracker';
  const guest = linuxGuestFlavour(facts);
  const macs = facts.nics.map((nic) => nic.mac.toLowerCase());
  if (firecracker || guest === 'oci') {
    macs.forEach((mac, i) => {
      if (!SCRIPT_MAC_PATTERN.test(mac)) errors.push(`NIC ${i}: invalid MAC ${quote(facts.nics[i]!.mac)}`);
    });
  }
  if (guest === 'oci') {
    facts.nics.forEach((nic, i) => {
      if (!isStaticNic(nic)) return;
      const { ip, prefix, gateway } = nic.static!;
      if (!IPV4_PATTERN.test(ip)) errors.push(`NIC ${i}: invalid IPv4 address ${quote(ip)}`);
      if (!Number.isInteger(prefix) || prefix < 0 || prefix > 32) {
        errors.push(`NIC ${i}: invalid prefix ${quote(prefix)} (expected 0..32)`);
      }
      if (gateway !== '' && !IPV4_PATTERN.test(gateway))
        errors.push(`NIC ${i}: invalid gateway ${quote(gateway)}`);
    });
  }
  if (errors.length > 0)
    return { needed: true, ok: false, kind, error: `post-clone plan: ${errors.join('; ')}` };

  const lines = ['echo 3 > /proc/sys/vm/drop_caches', `echo ${facts.vmName} > /etc/hostname`];
  if (firecracker) {
    macs.forEach((mac, i) => {
      lines.push(
        `ip link set dev eth${i} down && ip link set dev eth${i} address ${mac} && ip link set dev eth${i} up`,
      );
    });
  }
  lines.push('rm -f /etc/systemd/network/10-*.network');
  if (guest === 'cloudimg') {
    lines.push(
      'cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init',
      'cloud-init modules --mode=config && systemctl restart systemd-networkd',
    );
  } else {
    facts.nics.forEach((nic, i) => {
      const mac = macs[i]!;
      const network = isStaticNic(nic)
        ? `Address=${nic.static!.ip}/${nic.static!.prefix}\\nGateway=${nic.static!.gateway}\\n`
        : 'DHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n';
      const cfg = `[Match]\\nMACAddress=${mac}\\n\\n[Network]\\n${network}`;
      lines.push(`printf '${cfg}' > /etc/systemd/network/10-${mac.replaceAll(':', '')}.network`);
    });
    lines.push('systemctl restart systemd-networkd');
  }
  const script = lines.join('\n');
  return { needed: true, ok: true, kind, argv: ['sh', '-c', script], hint: script };
}

/** `post-clone-hint` value: standard base64 (RFC 4648, with padding) of the UTF-8 hint text. */
export function hintBase64(hint: string): string {
  return Buffer.from(hint, 'utf8').toString('base64');
}

/**
 * Dotted netmask for a SAC `i <net> <ip> <mask> <gw>` command (docs/contracts/post-clone.md "Windows static IP"): `/24` ⇒
 * `255.255.255.0`; a prefix outside 0..32 (or not an integer) gives `255.255.255.0`.
 */
export function prefixToMask(prefix: number): string {
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > 32) return '255.255.255.0';
  const bits = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
  return [24, 16, 8, 0].map((shift) => (bits >>> shift) & 0xff).join('.');
}
