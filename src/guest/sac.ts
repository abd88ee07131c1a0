/**
 * Windows static IP over the serial console (docs/contracts/post-clone.md "Windows static IP"):
 * the pure half of the SAC dialogue — prompt detection, parsing of the `i` listing, the set
 * command and its reply, verification, and the budgets. The socket side is
 * src/provider/cocoon/readiness/sac.ts.
 *
 * Every value that enters a console command is validated first (IPv4 without leading zeros, a
 * net number from the listing): a command line is typed into a console that also opens command
 * prompts, so nothing a pod author writes reaches it unchecked (docs/conventions.md).
 */
import type { FixupNic } from './postclone.ts';
import { IPV4_PATTERN, isStaticNic, prefixToMask } from './postclone.ts';

/** The SAC prompt; a command's output runs until the next one. */
export const SAC_PROMPT = 'SAC>';
/** Every line sent to the console ends with CR LF. */
export const SAC_EOL = '\r\n';

/** Dial (connect and reach a prompt) budget and retry interval. */
export const SAC_DIAL_BUDGET_MS = 60_000;
export const SAC_DIAL_RETRY_MS = 2_000;
/** How long one command waits for the next `SAC>`. */
export const SAC_COMMAND_TIMEOUT_MS = 5_000;
/** `i` enumeration: tries and the pause between two. */
export const SAC_ENUM_TRIES = 60;
export const SAC_ENUM_INTERVAL_MS = 2_000;
/** Verification of one set: tries and the pause between two. */
export const SAC_VERIFY_TRIES = 10;
export const SAC_VERIFY_INTERVAL_MS = 2_000;

/** The enumeration phase's time bound: its tries plus one command timeout of slack. */
export const SAC_ENUM_BUDGET_MS = SAC_ENUM_TRIES * SAC_ENUM_INTERVAL_MS + SAC_COMMAND_TIMEOUT_MS;
/** One static NIC's time bound: the set command, then the verify tries plus one command timeout. */
export const SAC_NIC_BUDGET_MS =
  SAC_COMMAND_TIMEOUT_MS + SAC_VERIFY_TRIES * SAC_VERIFY_INTERVAL_MS + SAC_COMMAND_TIMEOUT_MS;

/** The whole pass for a VM with `staticNics` static NICs: dial + enumeration + per-NIC set/verify. */
export function sacBudgetMs(staticNics: number): number {
  return SAC_DIAL_BUDGET_MS + SAC_ENUM_BUDGET_MS + Math.max(0, staticNics) * SAC_NIC_BUDGET_MS;
}

/** The phase a SAC pass failed in, and the Warning reason of each. */
export type SacPhase = 'dial' | 'enum' | 'set' | 'verify';
export const SAC_PHASE_REASONS: Readonly<Record<SacPhase, string>> = {
  dial: 'PostCloneSACDialFailed',
  enum: 'PostCloneSACEnumFailed',
  set: 'PostCloneSACSetFailed',
  verify: 'PostCloneSACVerifyFailed',
};
/** The reason of the lifecycle failure that follows any SAC failure. */
export const WINDOWS_STATIC_IP_FAILED = 'WindowsStaticIPFailed';

/** `sac <phase>: <detail>`: the `post-clone-errors` value and lifecycle message of a failed pass. */
export function sacErrorMessage(phase: SacPhase, detail: string): string {
  return `sac ${phase}: ${detail}`;
}

/** Whether console output holds a prompt. */
export function hasPrompt(text: string): boolean {
  return text.includes(SAC_PROMPT);
}

/** The output before the first prompt, or `undefined` while no prompt has arrived. */
export function outputBeforePrompt(text: string): string | undefined {
  const at = text.indexOf(SAC_PROMPT);
  return at < 0 ? undefined : text.slice(0, at);
}

/** One `Net: <n>, Ip=<ip> ...` entry of an `i` listing. */
export interface SacNetEntry {
  readonly net: number;
  readonly ip: string;
}

const NET_LINE = /Net:\s*(\d+)\s*,\s*Ip=([^\s,]+)/i;

/** Every `Net: <n>, Ip=<ip>` entry of an `i` listing, in order (one per line; other lines ignored). */
export function parseNetList(output: string): SacNetEntry[] {
  const out: SacNetEntry[] = [];
  for (const line of output.split(/\r\n|\r|\n/)) {
    const m = NET_LINE.exec(line);
    if (m) out.push({ net: Number(m[1]), ip: m[2] as string });
  }
  return out;
}

/**
 * The distinct net numbers in order of first appearance: the i-th belongs to NIC i. A guest
 * that lists a net twice (an IPv6 line, say) still counts it once.
 */
export function listedNets(entries: readonly SacNetEntry[]): number[] {
  const out: number[] = [];
  for (const e of entries) if (!out.includes(e.net)) out.push(e.net);
  return out;
}

/** Dotted netmask of a prefix (`/24` ⇒ `255.255.255.0`; an invalid prefix gives `255.255.255.0`). */
export function sacMask(prefix: number): string {
  return prefixToMask(prefix);
}

/** One static NIC to set: its index in `network_configs`, the net number SAC listed for it, the command. */
export interface SacSet {
  readonly nic: number;
  readonly net: number;
  readonly ip: string;
  /** `i <net> <ip> <mask> <gateway>` (without the line end). */
  readonly command: string;
}

export type SacPlan =
  | { readonly ok: true; readonly sets: SacSet[] }
  | { readonly ok: false; readonly error: string };

/**
 * The set commands for every static NIC, pairing NIC i with the i-th listed net number. An
 * empty gateway is sent as `0.0.0.0` (SAC needs all four values). Invalid input (an address
 * that is not a plain dotted quad, a NIC without a listed net) gives an error, no commands.
 */
export function planSacSets(nics: readonly FixupNic[], nets: readonly number[]): SacPlan {
  const sets: SacSet[] = [];
  const problems: string[] = [];
  nics.forEach((nic, i) => {
    if (!isStaticNic(nic) || !nic.static) return;
    const net = nets[i];
    const { ip, prefix } = nic.static;
    const gateway = nic.static.gateway === '' ? '0.0.0.0' : nic.static.gateway;
    if (net === undefined) problems.push(`NIC ${i}: no net number listed`);
    if (!IPV4_PATTERN.test(ip)) problems.push(`NIC ${i}: invalid IPv4 address ${JSON.stringify(ip)}`);
    if (!IPV4_PATTERN.test(gateway)) problems.push(`NIC ${i}: invalid gateway ${JSON.stringify(gateway)}`);
    if (net === undefined || problems.length > 0) return;
    sets.push({ nic: i, net, ip, command: `i ${net} ${ip} ${sacMask(prefix)} ${gateway}` });
  });
  return problems.length > 0 ? { ok: false, error: problems.join('; ') } : { ok: true, sets };
}

const SET_ERROR =
  /\b(could not|cannot|can't|failed|failure|invalid|incorrect|not recognized|unrecognized|error)\b/i;

/**
 * The error a set reply carries, if any (SAC's own wording: `SAC could not set the IP
 * Address.`, `The specified network interface number is invalid.`, …). A reply without one is
 * not taken as proof: verification decides.
 */
export function setReplyError(output: string): string | undefined {
  for (const line of output.split(/\r\n|\r|\n/)) {
    const text = line.trim();
    if (text !== '' && SET_ERROR.test(text)) return text;
  }
  return undefined;
}

/** Verification: the listing shows `ip` for `net`. */
export function showsIp(entries: readonly SacNetEntry[], net: number, ip: string): boolean {
  return entries.some((e) => e.net === net && e.ip === ip);
}

/** What the listing shows for `net` (for error messages): its addresses, or `nothing`. */
export function shownFor(entries: readonly SacNetEntry[], net: number): string {
  const ips = entries.filter((e) => e.net === net).map((e) => e.ip);
  return ips.length > 0 ? ips.join(', ') : 'nothing';
}
