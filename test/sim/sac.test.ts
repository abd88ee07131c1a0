// The SAC emulator on a Windows VM's console.sock (cocoon-cli.md §8.2; lifecycle.md §6.6) and
// its knobs `guest.sac`: the prompt, the `i` listing and set, a console that never shows the
// prompt, an enumeration that lists fewer NICs at first, a set that is refused and a set that
// does not take, per-VM overrides, the sac.jsonl log, and `vm run` of a Windows cloud image
// with a static NIC.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';
import { readGuest } from '../../sim/guest.ts';
import { validateKnobs } from '../../sim/knob-schema.ts';
import { nthPrompt } from './console.ts';

const WIN = 'https://images.example.com/windows/win11-25h2.qcow2';

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

/** A raw console client: everything received is kept; `command` reads until the next `SAC>`. */
class Console {
  buf = '';
  private readonly sock: net.Socket;
  private constructor(sock: net.Socket) {
    this.sock = sock;
    sock.on('data', (d: Buffer) => {
      this.buf += d.toString('latin1');
    });
  }
  static async connect(file: string): Promise<Console> {
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
    return new Console(sock);
  }
  send(line: string): void {
    this.sock.write(`${line}\r\n`);
  }
  /** Prompts the stream must hold once the last command is answered: the banner's, then one
   * per command. Counting them (not clearing the buffer) keeps a reply from being taken for the
   * next one's when the banner and the first reply arrive apart. */
  private wanted = 1;
  /** Where the text after the last answered prompt starts. */
  private from = 0;
  async command(line: string, ms = 5000): Promise<string> {
    this.wanted += 1;
    const want = this.wanted;
    this.send(line);
    return until(
      `SAC> after "${line}"`,
      () => {
        const at = nthPrompt(this.buf, want);
        if (at < 0) return undefined;
        const out = this.buf.slice(this.from, at);
        this.from = at + 'SAC>'.length;
        return out;
      },
      ms,
    );
  }
  close(): void {
    this.sock.destroy();
  }
}

const nets = (listing: string) =>
  [...listing.matchAll(/Net: (\d+), Ip=(\S+)/g)].map((m) => ({ net: Number(m[1]), ip: m[2] }));

describe('simulated SAC console', { concurrency: 1 }, () => {
  let sim: SimRoot;
  let gw0 = '';
  let gw1 = '';

  before(async () => {
    sim = await newSimRoot();
    // Two /24s of the guest network's static range (the simulator refuses others).
    const [a, b, c] = (sim.guestNet?.staticSubnet ?? '').split('.');
    gw0 = `${a}.${b}.${c}.1`;
    gw1 = `${a}.${b}.${Number(c) + 1}.1`;
    await sim.fixtureSnapshot('win-two', {
      backend: 'cloud-hypervisor',
      os: 'windows',
      image: WIN,
      nics: 2,
      staticIps: [`${a}.${b}.${c}.17/22,${gw0}`, `${a}.${b}.${Number(c) + 1}.5/24,${gw1}`],
    });
  });
  after(async () => {
    await sim.cleanup();
  });

  const clone = (name: string) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, '--pull', 'win-two']);
  const consoleOf = (vm: VmRecord) =>
    Console.connect(path.join(sim.root, 'run', 'cloudhypervisor', vm.id, 'console.sock'));
  const staticIp = (vm: VmRecord, i: number) => vm.network_configs?.[i]?.network?.ip as string;
  const sacLog = () =>
    fs
      .readFileSync(path.join(sim.root, 'sim', 'sac.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { vm: string; line: string; silent: boolean });

  test('static NICs show APIPA until set over SAC; set then list shows the address', async () => {
    const vm = await clone('vk-sac-ok');
    const con = await consoleOf(vm);
    try {
      assert.match(await con.command(''), /SAC started and initialized/);
      const listed = nets(await con.command('i'));
      assert.deepEqual(
        listed.map((n) => n.net),
        [10, 11],
      );
      for (const n of listed) assert.match(n.ip as string, /^169\.254\./);
      const ip = staticIp(vm, 1);
      assert.match(await con.command(`i 11 ${ip} 255.255.255.0 ${gw1}`), /SAC successfully set/);
      assert.deepEqual(nets(await con.command('i'))[1], { net: 11, ip });
    } finally {
      con.close();
    }
    const lines = sacLog()
      .filter((e) => e.vm === 'vk-sac-ok')
      .map((e) => e.line);
    assert.deepEqual(lines, ['', 'i', `i 11 ${staticIp(vm, 1)} 255.255.255.0 ${gw1}`, 'i']);
  });

  test('guest.sac.noPrompt: the console accepts the connection and never shows SAC>', async () => {
    await sim.mergeKnobs({ guest: { sac: { vms: [{ match: '^vk-sac-silent$', noPrompt: true }] } } });
    const vm = await clone('vk-sac-silent');
    const con = await consoleOf(vm);
    try {
      con.send('');
      con.send('i');
      await sleep(1500);
      assert.equal(con.buf, '', 'nothing at all, not even the banner');
    } finally {
      con.close();
    }
    assert.deepEqual(
      sacLog()
        .filter((e) => e.vm === 'vk-sac-silent')
        .map((e) => [e.line, e.silent]),
      [
        ['', true],
        ['i', true],
      ],
      'what it was sent is still logged',
    );
  });

  test('guest.sac.nicsVisibleAfterMs: only the first NIC is listed until boot + the delay', async () => {
    await sim.mergeKnobs({ guest: { sac: { vms: [{ match: '^vk-sac-late$', nicsVisibleAfterMs: 3000 }] } } });
    const vm = await clone('vk-sac-late');
    // The simulator's own record of the boot (one clock, the host's, for both processes).
    const guest = readGuest(sim.root, vm.id);
    assert.ok(guest, 'guest state');
    const { bootedAt } = guest;
    const due = bootedAt + 3000;
    const con = await consoleOf(vm);
    // Every listing with when it was asked for and when it came back: the console answered
    // in between. Each is checked against the boot time, not against how long the test took.
    const listings: { sent: number; got: number; nets: number[] }[] = [];
    const list = async () => {
      const sent = Date.now();
      const listed = nets(await con.command('i')).map((n) => n.net);
      listings.push({ sent, got: Date.now(), nets: listed });
      return listed;
    };
    try {
      await con.command('');
      await list();
      // The bound only turns a hang into a failure: 30 s is 10 times the 3 s delay.
      await until('both NICs listed', async () => ((await list()).length === 2 ? true : undefined), 30_000);
    } finally {
      con.close();
    }
    for (const l of listings) {
      // Answered before boot + the delay: only the first NIC.
      if (l.got < due) assert.deepEqual(l.nets, [10], `listed ${l.got - bootedAt} ms after boot`);
      // Asked for after it: both.
      if (l.sent >= due) assert.deepEqual(l.nets, [10, 11], `listed ${l.sent - bootedAt} ms after boot`);
      // Both NICs only once boot + the delay had passed (not before the delay).
      if (l.nets.length === 2) assert.ok(l.got >= due, `both listed ${l.got - bootedAt} ms after boot`);
      else assert.deepEqual(l.nets, [10]);
    }
  });

  test('guest.sac.readyAfterMs: nothing is listed before boot + the delay', async () => {
    await sim.mergeKnobs({ guest: { sac: { vms: [{ match: '^vk-sac-boot$', readyAfterMs: 60_000 }] } } });
    const vm = await clone('vk-sac-boot');
    const con = await consoleOf(vm);
    try {
      await con.command('');
      assert.deepEqual(nets(await con.command('i')), []);
    } finally {
      con.close();
    }
  });

  test('guest.sac.setFails: the set is refused and nothing changes', async () => {
    await sim.mergeKnobs({ guest: { sac: { vms: [{ match: '^vk-sac-refuse$', setFails: true }] } } });
    const vm = await clone('vk-sac-refuse');
    const con = await consoleOf(vm);
    try {
      await con.command('');
      const before = nets(await con.command('i'));
      assert.match(
        await con.command(`i 10 ${staticIp(vm, 0)} 255.255.252.0 ${gw0}`),
        /SAC could not set the IP Address\./,
      );
      assert.deepEqual(nets(await con.command('i')), before);
    } finally {
      con.close();
    }
  });

  test('guest.sac.setIgnored: the set answers success but the listing keeps the old address', async () => {
    await sim.mergeKnobs({ guest: { sac: { vms: [{ match: '^vk-sac-deaf$', setIgnored: true }] } } });
    const vm = await clone('vk-sac-deaf');
    const con = await consoleOf(vm);
    try {
      await con.command('');
      const before = nets(await con.command('i'));
      assert.match(await con.command(`i 10 ${staticIp(vm, 0)} 255.255.252.0 ${gw0}`), /SAC successfully set/);
      assert.deepEqual(nets(await con.command('i')), before);
      assert.notEqual(before[0]?.ip, staticIp(vm, 0));
    } finally {
      con.close();
    }
  });

  test('per-VM entries: for each field the first matching entry that sets it wins, else the global value', async () => {
    await sim.setKnobs({
      guest: {
        sac: {
          setIgnored: true,
          vms: [
            { match: '^vk-sac-mix', setIgnored: false },
            { match: '^vk-sac-mix', setIgnored: true, nicsVisibleAfterMs: 60_000 },
          ],
        },
      },
    });
    const vm = await clone('vk-sac-mix');
    const con = await consoleOf(vm);
    try {
      await con.command('');
      assert.equal(nets(await con.command('i')).length, 1, 'nicsVisibleAfterMs from the second entry');
      await con.command(`i 10 ${staticIp(vm, 0)} 255.255.252.0 ${gw0}`);
      assert.equal(
        nets(await con.command('i'))[0]?.ip,
        staticIp(vm, 0),
        'setIgnored=false from the first entry',
      );
    } finally {
      con.close();
    }
    await sim.setKnobs({});
  });

  test('vm run of a Windows cloud image on a static network serves SAC for its static NIC', async () => {
    // A static network of the guest network's static range (sim/guestnet.ts refuses others).
    const [a, b, c] = (sim.guestNet?.staticSubnet ?? '').split('.');
    const net = `${a}.${b}.${c}`;
    await sim.setKnobs({ networks: { 'static-net': { subnet: `${net}.0/24`, gateway: `${net}.1` } } });
    await sim.fixtureImage(WIN);
    const vm = await sim.json<VmRecord>([
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-sac-run',
      '--network',
      'static-net',
      '--windows',
      WIN,
    ]);
    const ip = staticIp(vm, 0);
    assert.equal(ip, `${net}.10`);
    const con = await consoleOf(vm);
    try {
      await con.command('');
      // A CI run on a loaded machine once got an empty first listing here (cause not pinned: the
      // reply pairing with the prompt of the line before is the likeliest); a SAC client retries
      // `i`, as the product's enumeration does (60 tries).
      let listed = nets(await con.command('i'));
      for (let i = 0; i < 100 && listed.length === 0; i++) {
        await sleep(100);
        listed = nets(await con.command('i'));
      }
      assert.match(listed[0]?.ip as string, /^169\.254\./);
      await con.command(`i 10 ${ip} 255.255.255.0 ${net}.1`);
      assert.equal(nets(await con.command('i'))[0]?.ip, ip);
    } finally {
      con.close();
    }
  });

  test('the knob schema takes the SAC fields and rejects unknown ones', () => {
    validateKnobs({
      guest: {
        sac: {
          readyAfterMs: 0,
          nicsVisibleAfterMs: 5000,
          noPrompt: false,
          setFails: false,
          setIgnored: false,
          vms: [{ match: '^vk-', noPrompt: true }],
        },
      },
    });
    assert.throws(() => validateKnobs({ guest: { sac: { noprompt: true } } }), /guest\.sac/);
    assert.throws(() => validateKnobs({ guest: { sac: { vms: [{ noPrompt: true }] } } }), /match/);
    assert.throws(() => validateKnobs({ guest: { sac: { nicsVisibleAfterMs: -1 } } }), /nicsVisibleAfterMs/);
  });
});
