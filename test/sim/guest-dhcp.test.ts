// The simulated guest (cocoon-cli.md §7.1, §8.2–§8.4; lifecycle.md §6.3, §6.4, §7.2): lease
// file format and timing, Firecracker MAC keying and the fixup, the Windows APIPA wedge and
// ipconfig /renew, PnP rebind, agent readiness, exec rules and effects, the SAC console.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';
import { readGuest } from '../../sim/guest.ts';
import { nthPrompt } from './console.ts';

const OCI = 'ghcr.io/acme/agent:3';
const WIN = 'https://images.example.com/windows/win11-25h2.qcow2';
const PNP =
  '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false';

async function until<T>(
  what: string,
  fn: () => T | undefined | Promise<T | undefined>,
  ms = 10_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** A line-oriented client for the SAC console: send a command, read until the next `SAC>`. */
class Sac {
  private buf = '';
  private readonly sock: net.Socket;
  constructor(sock: net.Socket) {
    this.sock = sock;
    sock.on('data', (d: Buffer) => {
      this.buf += d.toString('latin1');
    });
  }
  static async connect(file: string): Promise<Sac> {
    const sock = await until('console.sock', async () => {
      try {
        return await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect(file, () => resolve(s));
          s.once('error', reject);
        });
      } catch {
        return undefined;
      }
    });
    const sac = new Sac(sock);
    await sac.command('');
    return sac;
  }
  /** Prompts the stream holds once the last command is answered (the banner's, then one per
   * command): counted, so the banner's prompt is never taken for a reply's. */
  private wanted = 1;
  private from = 0;
  async command(line: string): Promise<string> {
    this.wanted += 1;
    const want = this.wanted;
    this.sock.write(`${line}\r\n`);
    return until(`SAC> after "${line}"`, () => {
      const at = nthPrompt(this.buf, want);
      if (at < 0) return undefined;
      const out = this.buf.slice(this.from, at);
      this.from = at + 'SAC>'.length;
      return out;
    });
  }
  close(): void {
    this.sock.destroy();
  }
}

describe('simulated guest: DHCP, exec effects, SAC', { concurrency: 1 }, () => {
  let sim: SimRoot;

  before(async () => {
    sim = await newSimRoot();
    await Promise.all([
      sim.fixtureSnapshot('ch-base', { backend: 'cloud-hypervisor', image: OCI, pulled: true }),
      sim.fixtureSnapshot('fc-base', { backend: 'firecracker', image: OCI, pulled: true }),
      sim.fixtureSnapshot('win-base', { backend: 'cloud-hypervisor', os: 'windows', image: WIN, nics: 2 }),
    ]);
  });
  after(async () => {
    await sim.cleanup();
  });

  const clone = (name: string, snap: string, extra: string[] = []) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, '--pull', ...extra, snap]);
  const mac0 = (vm: VmRecord) => vm.network_configs?.[0]?.mac as string;

  test('the lease appears after dhcp.leaseDelayMs, in the exact cocoon-net format', async () => {
    await sim.mergeKnobs({ dhcp: { vms: [{ match: '^vk-delay$', leaseDelayMs: 3000 }] } });
    const vm = await clone('vk-delay', 'ch-base');
    // The simulator's own record of the boot: when the lease is due, by its clock.
    const guest = readGuest(sim.root, vm.id);
    assert.ok(guest, 'guest state');
    assert.equal(guest.leaseAt - guest.bootedAt, 3000);
    // Every look at the lease file, with the time it was done (after the read; one clock,
    // the host's, for both processes). A look done before the lease was due found none.
    const looks: { at: number; found: boolean }[] = [];
    const look = () => {
      const l = sim.leaseFor(mac0(vm));
      looks.push({ at: Date.now(), found: l !== undefined });
      return l;
    };
    look();
    // The bound only turns a hang into a failure: 30 s is 10 times the 3 s delay.
    const lease = await until('lease', look, 30_000);
    const early = looks.filter((x) => x.at < guest.leaseAt);
    assert.deepEqual(
      early.filter((x) => x.found),
      [],
      'no lease before the delay',
    );
    // A 24 h lease granted not before the delay and not after it was seen: expiry (whole
    // seconds, rounded down) - 24 h lies between the due time and the first look that found it.
    const seenAt = looks.find((x) => x.found)?.at ?? Number.NaN;
    const grantedBy = Date.parse(lease.expiry) - 86_400_000;
    assert.ok(
      grantedBy >= Math.floor(guest.leaseAt / 1000) * 1000 && grantedBy <= seenAt,
      `24 h lease granted at boot + 3 s or later (expiry ${lease.expiry}, due ${new Date(guest.leaseAt).toISOString()}, seen ${new Date(seenAt).toISOString()})`,
    );
    // From the root's guest network pool (sim/guestnet.ts), the first free address.
    assert.equal(lease.ip, sim.guestNet?.poolStart);
    assert.match(lease.expiry, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const raw = fs.readFileSync(sim.leasesPath, 'utf8');
    assert.deepEqual(JSON.parse(raw), sim.leases());
    assert.equal(raw, JSON.stringify(JSON.parse(raw), null, 2), 'pretty-printed');
    assert.equal(fs.statSync(sim.leasesPath).mode & 0o777, 0o644);
    for (const l of sim.leases()) assert.equal(l.mac, l.mac.toLowerCase());
    await sim.mergeKnobs({ dhcp: null });
  });

  test('released and expired leases; the file is the literal null when empty', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-delay']);
    const before = sim.leaseFor(mac0(vm));
    assert.ok(before);
    await sim.run(['__sim', 'expire-lease', mac0(vm)]);
    assert.equal(sim.leaseFor(mac0(vm)), undefined, 'expired');
    const row = sim.leases().find((l) => l.mac === mac0(vm));
    assert.ok(row && Date.parse(row.expiry) < Date.now(), 'an expired row may linger');
    // A renew (a Linux guest's networkd restart) re-grants the same address.
    const renew = await sim.run([
      'vm',
      'exec',
      vm.id,
      '--',
      'sh',
      '-c',
      'systemctl restart systemd-networkd',
    ]);
    assert.equal(renew.code, 0);
    assert.equal(sim.leaseFor(mac0(vm))?.ip, before.ip);
    for (const l of sim.leases()) await sim.run(['__sim', 'release-lease', l.mac]);
    assert.equal(fs.readFileSync(sim.leasesPath, 'utf8'), 'null');
  });

  test('Firecracker clone under keyByGuestMac: lease keyed by the source MAC until the fixup sets the MAC', async () => {
    await sim.mergeKnobs({ dhcp: { keyByGuestMac: true } });
    const vm = await clone('vk-fc', 'fc-base');
    const guest = JSON.parse((await sim.run(['__sim', 'guest', vm.id])).stdout) as {
      nics: { guestMac: string }[];
    };
    const sourceMac = guest.nics[0]?.guestMac as string;
    assert.notEqual(sourceMac, mac0(vm));
    await until('lease for the source MAC', () => sim.leaseFor(sourceMac));
    assert.equal(sim.leaseFor(mac0(vm)), undefined, 'nothing for the configured MAC yet');
    // A fixup that forgets the ip-link lines does not help.
    const noMac = ['echo 3 > /proc/sys/vm/drop_caches', 'systemctl restart systemd-networkd'].join('\n');
    assert.equal((await sim.run(['vm', 'exec', vm.id, '--', 'sh', '-c', noMac])).code, 0);
    assert.equal(sim.leaseFor(mac0(vm)), undefined);
    const script = [
      'echo 3 > /proc/sys/vm/drop_caches',
      'echo vk-fc > /etc/hostname',
      `ip link set dev eth0 down && ip link set dev eth0 address ${mac0(vm)} && ip link set dev eth0 up`,
      'rm -f /etc/systemd/network/10-*.network',
      `printf '[Match]\\nMACAddress=${mac0(vm)}\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n' > /etc/systemd/network/10-${mac0(vm).replaceAll(':', '')}.network`,
      'systemctl restart systemd-networkd',
    ].join('\n');
    const fix = await sim.run(['vm', 'exec', vm.id, '--', 'sh', '-c', script]);
    assert.equal(fix.code, 0);
    assert.ok(sim.leaseFor(mac0(vm)), 'the lease follows the fixed MAC');
    const host = await sim.run(['vm', 'exec', vm.id, '--', 'hostname']);
    assert.equal(host.stdout, 'vk-fc\n');
    assert.equal(sim.guestCommands().filter((g) => g.effect === 'linuxFixup' && g.vmId === vm.id).length, 2);
    await sim.mergeKnobs({ dhcp: null });
  });

  test('a knob rule with effect fixMac rekeys the lease; dhcp.never withholds it for good', async () => {
    await sim.mergeKnobs({
      dhcp: { keyByGuestMac: true, vms: [{ match: '^vk-never$', never: true }] },
      exec: [{ argv: ['fixup'], effect: 'fixMac' }],
    });
    const [fc, never] = await Promise.all([clone('vk-fc-rule', 'fc-base'), clone('vk-never', 'ch-base')]);
    assert.equal(sim.leaseFor(mac0(fc)), undefined);
    assert.equal((await sim.run(['vm', 'exec', fc.id, '--', 'fixup'])).code, 0);
    assert.ok(sim.leaseFor(mac0(fc)));
    await sim.run(['vm', 'exec', never.id, '--', 'cmd', '/c', 'ipconfig', '/renew']);
    assert.equal(sim.leaseFor(mac0(never)), undefined);
    await sim.mergeKnobs({ dhcp: null, exec: null });
  });

  test('Windows clone wedged on APIPA gets no lease until cmd /c ipconfig /renew', async () => {
    await sim.mergeKnobs({ dhcp: { windowsApipaWedge: true } });
    const vm = await clone('vk-win', 'win-base', ['--restore-mode', 'copy']);
    assert.equal(vm.config.windows, true);
    assert.deepEqual(
      vm.storage_configs?.map((s) => s.role),
      ['cow'],
      'Windows: overlay.qcow2 and no cidata',
    );
    await sleep(600);
    assert.equal(sim.leaseFor(mac0(vm)), undefined);
    const pnp = await sim.run(['vm', 'exec', vm.id, '--', 'powershell', '-nop', '-c', PNP]);
    assert.equal(pnp.code, 0);
    assert.equal(sim.leaseFor(mac0(vm)), undefined, 'a PnP rebind does not clear the wedge');
    const renew = await sim.run(['vm', 'exec', vm.id, '--', 'cmd', '/c', 'ipconfig', '/renew']);
    assert.equal(renew.code, 0);
    const lease = sim.leaseFor(mac0(vm));
    assert.ok(lease);
    assert.match(renew.stdout, new RegExp(`IPv4 Address[ .]*: ${lease.ip.replaceAll('.', '\\.')}`));
    const cmds = sim.guestCommands().filter((g) => g.vmId === vm.id);
    assert.deepEqual(
      cmds.map((c) => c.effect),
      ['pnpRebind', 'renewLease'],
    );
    assert.equal(cmds.filter((c) => c.argv.join(' ') === 'cmd /c ipconfig /renew').length, 1);
    await sim.mergeKnobs({ dhcp: null });
  });

  test('windowsNeedsPnp: no lease until the exact PnP command (a near miss does nothing)', async () => {
    await sim.mergeKnobs({ dhcp: { windowsNeedsPnp: true } });
    const vm = await clone('vk-win-pnp', 'win-base');
    await sleep(400);
    assert.equal(sim.leaseFor(mac0(vm)), undefined);
    const wrong = PNP.replace(' -PresentOnly', '');
    const miss = await sim.run(['vm', 'exec', vm.id, '--', 'powershell', '-nop', '-c', wrong]);
    assert.equal(miss.code, 127, 'a script nothing models fails');
    assert.equal(sim.leaseFor(mac0(vm)), undefined);
    const sh = await sim.run(['vm', 'exec', vm.id, '--', 'sh', '-c', 'systemctl restart systemd-networkd']);
    assert.deepEqual(
      [sh.code, sh.stderr],
      [
        127,
        "'sh' is not recognized as an internal or external command,\r\noperable program or batch file.\r\n",
      ],
      'no sh on Windows',
    );
    await sim.run(['vm', 'exec', vm.id, '--', 'powershell', '-nop', '-c', PNP]);
    assert.ok(sim.leaseFor(mac0(vm)));
    assert.ok(sim.leaseFor(vm.network_configs?.[1]?.mac as string), 'every DHCP NIC gets a lease');
    await sim.mergeKnobs({ dhcp: null });
  });

  test('SAC console: prompt, NIC list, setting an address', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-win-pnp']);
    const sock = `${sim.root}/run/cloudhypervisor/${vm.id}/console.sock`;
    const sac = await Sac.connect(sock);
    try {
      const list = await sac.command('i');
      const nets = [...list.matchAll(/Net: (\d+), Ip=(\S+)/g)];
      assert.equal(nets.length, 2);
      assert.equal(nets[0]?.[2], sim.leaseFor(mac0(vm))?.ip);
      const set = await sac.command(`i ${nets[1]?.[1]} 10.88.3.17 255.255.0.0 10.88.0.1`);
      assert.match(set, /successfully/);
      const after = await sac.command('i');
      assert.match(
        after,
        new RegExp(
          `Net: ${nets[1]?.[1]}, Ip=10\\.88\\.3\\.17\\s+Subnet=255\\.255\\.0\\.0\\s+Gateway=10\\.88\\.0\\.1`,
        ),
      );
      assert.match(await sac.command('i 99 1.2.3.4 255.0.0.0 1.2.3.1'), /invalid/);
    } finally {
      sac.close();
    }
  });

  test('guest.agentReadyAfterMs: exec fails with the agent error until the agent is up', async () => {
    await sim.mergeKnobs({ guest: { agentReadyAfterMs: 4000 } });
    const vm = await clone('vk-agent', 'ch-base');
    const early = await sim.run(['vm', 'exec', vm.id, '--', 'true']);
    assert.equal(early.code, 1);
    assert.equal(
      early.stderr,
      'Error: exec: dial agent: connection refused (cocoon-agent may still be starting; retry shortly)\n',
    );
    // started_at is stamped just after the guest booted.
    await sleep(Math.max(0, Date.parse(vm.started_at as string) + 4100 - Date.now()));
    assert.equal((await sim.run(['vm', 'exec', vm.id, '--', 'true'])).code, 0);
    const recs = sim.guestCommands().filter((g) => g.vmId === vm.id);
    assert.deepEqual(
      recs.map((r) => r.delivered),
      [false, true],
    );
    await sim.mergeKnobs({ guest: null });
  });

  test('exec rules: first match wins, times, effects; execFailures per VM', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'inspect', 'vk-agent']);
    await sim.mergeKnobs({
      exec: [
        { argvRegex: '^uname', stdout: 'Linux\n', times: 1 },
        { argv: ['uname'], stdout: 'second\n', exit: 3, stderr: 'warn\n' },
        { argvRegex: '^drop-lease$', effect: 'releaseLease' },
      ],
      guest: { execFailures: [{ match: '^vk-agent$', attempts: 2, error: 'exec: agent: transport closed' }] },
    });
    for (let i = 0; i < 2; i++) {
      const f = await sim.run(['vm', 'exec', vm.id, '--', 'uname']);
      assert.deepEqual([f.code, f.stderr], [1, 'Error: exec: agent: transport closed\n']);
    }
    const a = await sim.run(['vm', 'exec', vm.id, '--', 'uname']);
    assert.deepEqual([a.code, a.stdout], [0, 'Linux\n']);
    const b = await sim.run(['vm', 'exec', vm.id, '--', 'uname']);
    assert.deepEqual([b.code, b.stdout, b.stderr], [3, 'second\n', 'warn\n']);
    assert.ok(sim.leaseFor(mac0(vm)));
    await sim.run(['vm', 'exec', vm.id, '--', 'drop-lease']);
    assert.equal(sim.leaseFor(mac0(vm)), undefined);
    await sim.mergeKnobs({ exec: null, guest: null });
  });
});
