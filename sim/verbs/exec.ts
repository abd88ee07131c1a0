// `vm exec [-i] [-e K=V]... <vm> -- <argv...>` (cocoon-cli.md §2, §8.4): guest commands are
// answered by knob rules, then built-in rules for the provider's exact fixup commands
// (lifecycle.md §6.3, §6.4, §7.2) and a few plain commands. Any other command fails as a
// guest's shell fails a command it does not have: exit 127, `<cmd>: command not found` on
// stderr (`notFound`). Every command is recorded in <root>/sim/guest.jsonl. The exit status is
// the guest's.
import fs from 'node:fs';
import { bool, type CommandSpec, type Parsed, strs } from '../cli.ts';
import { type Ctx, hangForever, type Verb } from '../ctx.ts';
import { mustFindVm, reconciledState, type VmRecord } from '../db.ts';
import { CliError } from '../errors.ts';
import { dhcpRelease, dhcpSync, type GuestState, guestAddress, readGuest, updateGuest } from '../guest.ts';
import { agentReadyAfterMs, consumeTimes, type Effect, matchesAny, re, ruleKey } from '../knobs.ts';
import { guestLogFile } from '../paths.ts';

export const AGENT_NOT_READY =
  'exec: dial agent: connection refused (cocoon-agent may still be starting; retry shortly)';

/** lifecycle.md §6.3, byte for byte. */
export const PNP_SCRIPT =
  '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false';

const spec: CommandSpec = {
  path: 'vm exec',
  usage: 'vm exec [-i] [-e KEY=VAL]... VM -- COMMAND [ARG...]',
  flags: [
    { name: 'interactive', short: 'i', type: 'bool' },
    { name: 'env', short: 'e', type: 'strings' },
  ],
  minArgs: 1,
  maxArgs: Infinity,
};

interface Outcome {
  exit: number;
  stdout: string;
  stderr: string;
  effect: Effect;
  /** Output computed after the effect ran (ipconfig shows the new address). */
  late?: (g: GuestState | undefined) => string;
}

async function readStdin(ctx: Ctx): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of ctx.io.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

function ipconfigText(g: GuestState | undefined): string {
  const lines = ['', 'Windows IP Configuration', ''];
  (g?.nics ?? []).forEach((nic, i) => {
    const a = guestAddress(nic, i, true);
    const auto = a.ip.startsWith('169.254.');
    lines.push(
      `Ethernet adapter Ethernet${i === 0 ? '' : ` ${i + 1}`}:`,
      '',
      '   Connection-specific DNS Suffix  . :',
      `   ${auto ? 'Autoconfiguration ' : ''}IPv4 Address. . . . . . . . . . . : ${a.ip}`,
      `   Subnet Mask . . . . . . . . . . . : ${a.mask}`,
      `   Default Gateway . . . . . . . . . : ${a.gateway === '0.0.0.0' ? '' : a.gateway}`,
      '',
    );
  });
  return `${lines.join('\r\n')}\r\n`;
}

/** Built-in guest behaviour; undefined means "not a built-in command". */
function builtin(
  argv: string[],
  vm: VmRecord,
  g: GuestState | undefined,
  stdin: Buffer,
): Outcome | undefined {
  const ok = (stdout = '', effect: Effect = 'none'): Outcome => ({ exit: 0, stdout, stderr: '', effect });
  const [cmd, ...rest] = argv;
  // A Linux guest has no powershell or cmd, a Windows guest no sh: the fixup of the other
  // OS fails there as the guest's shell fails it (notFound).
  const windows = g?.windows ?? vm.config.windows === true;
  if (windows && cmd === 'sh') return undefined;
  if (!windows && (cmd === 'powershell' || cmd?.toLowerCase() === 'cmd' || cmd?.toLowerCase() === 'ipconfig'))
    return undefined;
  if (
    cmd === 'powershell' &&
    rest.length === 3 &&
    rest[0] === '-nop' &&
    rest[1] === '-c' &&
    rest[2] === PNP_SCRIPT
  ) {
    return ok('', 'pnpRebind');
  }
  if (
    cmd === 'sh' &&
    rest[0] === '-c' &&
    rest.length === 2 &&
    (rest[1] ?? '').includes('systemctl restart systemd-networkd')
  ) {
    return ok('', 'linuxFixup');
  }
  if (
    cmd?.toLowerCase() === 'cmd' &&
    rest.length === 3 &&
    rest[0]?.toLowerCase() === '/c' &&
    rest[1]?.toLowerCase() === 'ipconfig'
  ) {
    const verb = rest[2]?.toLowerCase();
    if (verb === '/renew' || verb === '/renew6') return { ...ok('', 'renewLease'), late: ipconfigText };
    if (verb === '/release' || verb === '/release6') return { ...ok('', 'releaseLease'), late: ipconfigText };
  }
  if (cmd?.toLowerCase() === 'ipconfig' && rest.length === 0) return { ...ok(), late: ipconfigText };
  switch (cmd) {
    case 'echo':
      return ok(`${rest.join(' ')}\n`);
    case 'cat':
      return rest.length === 0 ? ok(stdin.toString('utf8')) : undefined;
    case 'hostname':
      return rest.length === 0 ? ok(`${g?.hostname ?? vm.config.name}\n`) : undefined;
    case 'true':
      return ok();
    case 'false':
      return { exit: 1, stdout: '', stderr: '', effect: 'none' };
    default:
      return undefined;
  }
}

function record(ctx: Ctx, vm: VmRecord, entry: Record<string, unknown>): void {
  const line = `${JSON.stringify({ ts: new Date().toISOString(), vmId: vm.id, name: vm.config.name, ...entry })}\n`;
  fs.appendFileSync(guestLogFile(ctx.root), line);
}

/** Applies a guest effect to the simulated guest (and, through DHCP, to the lease file). */
export function applyEffect(ctx: Ctx, vm: VmRecord, effect: Effect, argv: string[]): void {
  const { root, leasesPath, knobs } = ctx;
  switch (effect) {
    case 'none':
      return;
    case 'pnpRebind':
      updateGuest(root, vm.id, (g) => {
        g.needsPnp = false;
      });
      break;
    case 'renewLease':
      updateGuest(root, vm.id, (g) => {
        g.wedged = false;
        g.released = false;
      });
      break;
    case 'releaseLease':
      dhcpRelease(root, leasesPath, vm.id, knobs);
      return;
    case 'fixMac':
      updateGuest(root, vm.id, (g) => {
        for (const nic of g.nics) nic.guestMac = nic.mac;
      });
      break;
    case 'linuxFixup': {
      // Apply what the script actually says: a wrong MAC keeps the lease keyed wrongly.
      const script = argv.slice(2).join(' ');
      updateGuest(root, vm.id, (g) => {
        for (const m of script.matchAll(/ip link set dev eth(\d+) address ([0-9A-Fa-f:]{17})/g)) {
          const nic = g.nics[Number(m[1])];
          if (nic) nic.guestMac = (m[2] as string).toLowerCase();
        }
        const host = /echo (\S+) > \/etc\/hostname/.exec(script);
        if (host) g.hostname = host[1];
      });
      break;
    }
  }
  dhcpSync(root, leasesPath, vm.id, knobs);
}

async function exec(ctx: Ctx, p: Parsed): Promise<number> {
  if (p.dashAt < 0) throw new CliError('vm exec requires "--" before the guest command');
  if (p.dashAt !== 1) throw new CliError(`accepts 1 arg(s) before "--", received ${p.dashAt}`);
  const argv = p.args.slice(1);
  if (argv.length === 0) throw new CliError('vm exec requires a guest command after "--"');
  const env = strs(p, 'env');
  for (const e of env) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*=/.test(e)) throw new CliError(`invalid --env "${e}": expected KEY=VALUE`);
  }
  const interactive = bool(p, 'interactive');
  const { vm } = mustFindVm(ctx.root, p.args[0] as string);
  const base = { argv, env, interactive };
  const fail = (message: string): never => {
    record(ctx, vm, { ...base, stdinBytes: 0, exit: 1, delivered: false, error: message });
    throw new CliError(message);
  };
  const state = reconciledState(ctx.root, vm);
  if (state !== 'running') fail(`vm ${vm.id} is not running (state: ${state})`);
  const guest = readGuest(ctx.root, vm.id);
  const readyAfter = agentReadyAfterMs(ctx.knobs, vm.config.name);
  if (guest && Date.now() - guest.bootedAt < readyAfter) fail(AGENT_NOT_READY);
  for (const [i, f] of (ctx.knobs.guest?.execFailures ?? []).entries()) {
    if (!matchesAny(f.match, [vm.config.name])) continue;
    if (consumeTimes(ctx.root, `execfail:${vm.id}:${ruleKey('execFailures', i, f)}`, f.attempts)) {
      fail(f.error ?? AGENT_NOT_READY);
    }
  }
  const stdin = interactive ? await readStdin(ctx) : Buffer.alloc(0);
  ctx.stdinBytes = stdin.length;
  const argvText = argv.join(' ');
  let outcome: Outcome | undefined;
  let ruleIndex: number | undefined;
  for (const [i, r] of (ctx.knobs.exec ?? []).entries()) {
    if (!matchesAny(r.match, [vm.config.name])) continue;
    if (r.argv && (r.argv.length !== argv.length || r.argv.some((a, j) => a !== argv[j]))) continue;
    if (r.argvRegex !== undefined && !re(r.argvRegex).test(argvText)) continue;
    if (r.times !== undefined && !consumeTimes(ctx.root, ruleKey('exec', i, r), r.times)) continue;
    ruleIndex = i;
    if (r.error !== undefined) {
      record(ctx, vm, {
        ...base,
        stdinBytes: stdin.length,
        exit: 1,
        delivered: false,
        error: r.error,
        rule: i,
      });
      throw new CliError(r.error);
    }
    if (r.delayMs) await ctx.io.sleep(r.delayMs);
    if (r.hang) await hangForever(ctx.io);
    const echoed = r.echoStdin ? stdin.toString('utf8') : '';
    outcome = {
      exit: r.exit ?? 0,
      stdout: (r.stdout ?? '') + echoed,
      stderr: r.stderr ?? '',
      effect: r.effect ?? 'none',
    };
    break;
  }
  outcome ??= builtin(argv, vm, guest, stdin) ?? notFound(argv, guest?.windows ?? vm.config.windows === true);
  applyEffect(ctx, vm, outcome.effect, argv);
  const stdout = outcome.stdout + (outcome.late ? outcome.late(readGuest(ctx.root, vm.id)) : '');
  if (stdout) ctx.io.stdout.write(stdout);
  if (outcome.stderr) ctx.io.stderr.write(outcome.stderr);
  record(ctx, vm, {
    ...base,
    stdinBytes: stdin.length,
    exit: outcome.exit,
    delivered: true,
    effect: outcome.effect,
    ...(ruleIndex !== undefined ? { rule: ruleIndex } : {}),
  });
  return outcome.exit;
}

/** The interpreters each guest OS has (the fixups run through them). */
const INTERPRETERS = { linux: ['sh'], windows: ['powershell', 'cmd'] } as const;

/** A command no knob rule or built-in models: exit 127, never a quiet success. A command the
 * guest does not have gets what its shell says (cmd.exe on a Windows guest, a POSIX shell on a
 * Linux one); a script for an interpreter it has, one the simulator cannot run, says so. */
export function notFound(argv: readonly string[], windows: boolean): Outcome {
  const cmd = argv[0] ?? '';
  const has = (INTERPRETERS[windows ? 'windows' : 'linux'] as readonly string[]).includes(cmd.toLowerCase());
  const stderr = has
    ? `${cmd}: the simulated guest cannot run this (no knob rule or built-in models it; docs/simulator.md)\n`
    : windows
      ? `'${cmd}' is not recognized as an internal or external command,\r\noperable program or batch file.\r\n`
      : `sh: 1: ${cmd}: not found\n`;
  return { exit: 127, stdout: '', stderr, effect: 'none' };
}

export const verbs: Record<string, Verb> = { exec: { spec, run: exec } };
