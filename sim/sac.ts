// Serial console emulation on console.sock (cocoon-cli.md §8.2, lifecycle.md §6.6).
// Windows guests: a Special Administration Console with the `SAC>` prompt; `i` lists
// `Net: <n>, Ip=<ip>  Subnet=<mask>  Gateway=<gw>` (one line per NIC, net numbers 10, 11, ...),
// `i <n> <ip> <mask> <gw>` sets a NIC's address. Knobs `guest.sac` (per VM name in `vms`):
// nothing listed before readyAfterMs, only the first NIC before nicsVisibleAfterMs; noPrompt
// (the console stays silent), setFails (the set is refused), setIgnored (the set answers
// success but the listing keeps the old address). Every line received is logged to
// <root>/sim/sac.jsonl. Linux cloud-image guests: a login prompt that echoes what it is sent.
import fs from 'node:fs';
import type net from 'node:net';
import path from 'node:path';
import { guestAddress, readGuest, updateGuest } from './guest.ts';
import { type Knobs, loadKnobs, re } from './knobs.ts';

const BANNER =
  '\r\nComputer is booting, SAC started and initialized.\r\n\r\n' +
  'Use the "ch -?" command for information about using channels.\r\n' +
  'Use the "?" command for general help.\r\n\r\n';
const PROMPT = '\r\nSAC>';
const HELP = [
  'ch                   Channel management commands.',
  'cmd                  Create a Command Prompt channel.',
  'i                    List all IP network numbers and their IP addresses.',
  'i <#> <ip> <subnet> <gateway> Set IP address, subnet and gateway.',
  '?                    Display this list.',
].join('\r\n');

const FIRST_NET = 10;
const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
function validIp(s: string | undefined): boolean {
  const m = s ? IPV4.exec(s) : null;
  return m?.slice(1).every((o) => Number(o) <= 255) === true;
}

export interface ConsoleTarget {
  root: string;
  vmId: string;
  windows: boolean;
  name: string;
}

export interface SacPolicy {
  readyAfterMs: number;
  nicsVisibleAfterMs: number;
  noPrompt: boolean;
  setFails: boolean;
  setIgnored: boolean;
}

/** The SAC behaviour for a VM name: the first `guest.sac.vms` entry that matches and sets a field wins. */
export function sacPolicy(knobs: Knobs, vmName: string): SacPolicy {
  const s = knobs.guest?.sac ?? {};
  const out: SacPolicy = {
    readyAfterMs: s.readyAfterMs ?? 0,
    nicsVisibleAfterMs: s.nicsVisibleAfterMs ?? 0,
    noPrompt: s.noPrompt ?? false,
    setFails: s.setFails ?? false,
    setIgnored: s.setIgnored ?? false,
  };
  const seen = new Set<string>();
  for (const rule of s.vms ?? []) {
    if (!re(rule.match).test(vmName)) continue;
    for (const k of Object.keys(out) as (keyof SacPolicy)[]) {
      const val = rule[k];
      if (val !== undefined && !seen.has(k)) {
        seen.add(k);
        (out as unknown as Record<string, unknown>)[k] = val;
      }
    }
  }
  return out;
}

async function policyFor(t: ConsoleTarget): Promise<SacPolicy> {
  return sacPolicy(await loadKnobs(t.root).catch((): Knobs => ({})), t.name);
}

function logLine(t: ConsoleTarget, line: string, policy: SacPolicy): void {
  const entry = { at: new Date().toISOString(), vm: t.name, vmId: t.vmId, line, silent: policy.noPrompt };
  try {
    fs.appendFileSync(path.join(t.root, 'sim', 'sac.jsonl'), `${JSON.stringify(entry)}\n`);
  } catch {
    // the root is going away
  }
}

async function sacCommand(t: ConsoleTarget, line: string, policy: SacPolicy): Promise<string> {
  const words = line.trim().split(/\s+/).filter(Boolean);
  const cmd = words[0]?.toLowerCase();
  if (cmd === undefined) return '';
  if (cmd === '?' || cmd === 'help') return HELP;
  if (cmd === 'i' && words.length === 1) {
    const g = readGuest(t.root, t.vmId);
    if (!g) return '';
    const age = Date.now() - g.bootedAt;
    if (age < policy.readyAfterMs) return '';
    const nics = age < policy.nicsVisibleAfterMs ? g.nics.slice(0, 1) : g.nics;
    return nics
      .map((nic, i) => {
        const a = guestAddress(nic, i, true);
        return `Net: ${FIRST_NET + i}, Ip=${a.ip}  Subnet=${a.mask}  Gateway=${a.gateway}`;
      })
      .join('\r\n');
  }
  if (cmd === 'i') {
    if (words.length !== 5) return 'The parameters are incorrect. Usage: i <#> <ip> <subnet> <gateway>';
    const [, netText, ip, mask, gw] = words;
    if (!validIp(ip) || !validIp(mask) || !validIp(gw)) return 'The specified IP address is invalid.';
    const index = Number(netText) - FIRST_NET;
    if (policy.setFails) return 'SAC could not set the IP Address.';
    const ok = updateGuest(t.root, t.vmId, (g) => {
      const nic = Number.isInteger(index) ? g.nics[index] : undefined;
      if (!nic) return false;
      if (!policy.setIgnored) nic.sac = { ip: ip as string, mask: mask as string, gateway: gw as string };
      return true;
    });
    return ok
      ? 'SAC successfully set the IP address, subnet mask, and gateway.'
      : 'The specified network interface number is invalid.';
  }
  if (cmd === 'ch')
    return 'Channel List\r\n\r\n(Use "ch -?" for information on using channels)\r\n\r\n# Status  Channel Name\r\n0 (AV)    SAC';
  if (cmd === 'cmd') return 'The Command Prompt session was successfully launched.';
  return `Unrecognized command.  Try 'help' or '?'.`;
}

/** Serves one console connection. */
export function serveConsole(sock: net.Socket, t: ConsoleTarget): void {
  let buf = '';
  let busy = Promise.resolve();
  let flushTimer: NodeJS.Timeout | undefined;
  sock.on('error', () => sock.destroy());
  busy = busy.then(async () => {
    if (sock.destroyed) return;
    if (!t.windows) sock.write(`\r\n${t.name} login: `);
    else if (!(await policyFor(t)).noPrompt) sock.write(`${BANNER}SAC>`);
  });
  const handle = (line: string) => {
    busy = busy.then(async () => {
      if (sock.destroyed) return;
      if (!t.windows) {
        sock.write(line.trim() === '' ? `\r\n${t.name} login: ` : `${line}\r\nPassword: `);
        return;
      }
      const policy = await policyFor(t);
      logLine(t, line, policy);
      if (policy.noPrompt) return; // a console that never answers
      const out = await sacCommand(t, line, policy);
      sock.write(`${line}\r\n${out}${out ? '\r\n' : ''}${PROMPT}`);
    });
  };
  const drain = (final: boolean) => {
    for (;;) {
      const m = /\r\n|\n|\r(?=[^\n])/.exec(buf);
      if (!m) break;
      const line = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      handle(line);
    }
    if (buf.endsWith('\r')) {
      // A lone CR at the end of a chunk: wait briefly for a following LF.
      if (final) {
        handle(buf.slice(0, -1));
        buf = '';
      } else {
        clearTimeout(flushTimer);
        flushTimer = setTimeout(() => drain(true), 30);
      }
    }
  };
  sock.on('data', (d: Buffer) => {
    buf += d.toString('latin1');
    drain(false);
  });
}
