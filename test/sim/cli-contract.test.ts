// Contract tests of the cocoon simulator: argv parsing, JSON shapes, error strings, exit
// codes, reference resolution and the invocation log (cocoon-cli.md §1–§5, §8.1, §8.8).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  CLIENT_BIN,
  imageDigest,
  newSimRoot,
  SIM_BIN,
  type SimRoot,
  type VmRecord,
} from '../../sim/client.ts';

const IMAGE = 'ghcr.io/acme/agent:1.0';
const ID_RE = /^[A-Z2-7]{26}$/;

describe('cocoon simulator CLI contract', { concurrency: 1 }, () => {
  let sim: SimRoot;
  let vm: VmRecord;

  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('acme/agent', { backend: 'cloud-hypervisor', os: 'linux', image: IMAGE });
  });
  after(async () => {
    await sim.cleanup();
  });

  test('an empty VM list prints "No VMs found." by default, [] or nothing by knob', async () => {
    const r = await sim.run(['vm', 'list', '-o', 'json']);
    assert.equal(r.code, 0);
    assert.equal(r.stdout, 'No VMs found.\n');
    await sim.mergeKnobs({ list: { empty: '[]' } });
    assert.equal((await sim.run(['vm', 'list', '-o', 'json'])).stdout, '[]\n');
    await sim.mergeKnobs({ list: { empty: 'nothing' } });
    assert.equal((await sim.run(['vm', 'list', '-o', 'json'])).stdout, '');
    await sim.mergeKnobs({ list: null });
  });

  test('vm clone prints the running VM record of §3.1', async () => {
    vm = await sim.json<VmRecord>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-ns-agent-0',
      '--network',
      'cocoon-dhcp',
      '--pull',
      '--restore-mode',
      'ondemand',
      '--cpu-weight',
      '79',
      '--cpu-quota-us',
      '200000',
      '--cpu-period-us',
      '100000',
      'acme/agent',
    ]);
    assert.match(vm.id, ID_RE);
    assert.equal(vm.hypervisor, 'cloud-hypervisor');
    assert.equal(vm.state, 'running');
    assert.ok(vm.pid > 0);
    assert.equal(vm.config.name, 'vk-ns-agent-0');
    assert.equal(vm.config.image, IMAGE);
    assert.equal(vm.config.image_type, 'oci');
    assert.equal(vm.config.image_digest, imageDigest(IMAGE));
    assert.equal(vm.config.network, 'cocoon-dhcp');
    const nic = vm.network_configs?.[0];
    assert.ok(nic);
    assert.match(nic.mac, /^02(:[0-9a-f]{2}){5}$/);
    assert.equal(nic.tap, `tap${vm.id.slice(0, 8)}-0`);
    assert.equal(nic.netns_path, `/var/run/netns/cocoon-${vm.id}`);
    assert.equal(nic.network, undefined, 'a DHCP NIC has no network object');
    const runDir = `${sim.root}/run/cloudhypervisor/${vm.id}`;
    assert.deepEqual(
      vm.storage_configs?.map((s) => s.role),
      ['layer', 'cow'],
    );
    assert.equal(vm.storage_configs?.[1]?.path, `${runDir}/cow.raw`);
    assert.equal(vm.vsock_socket, `${runDir}/vsock.uds`);
  });

  test('vm inspect resolves id, name and unique id prefix; prints the same record', async () => {
    for (const ref of [vm.id, 'vk-ns-agent-0', vm.id.slice(0, 3)]) {
      const got = await sim.json<VmRecord>(['vm', 'inspect', ref]);
      assert.equal(got.id, vm.id);
      assert.equal(got.state, 'running');
      assert.equal(got.pid, vm.pid);
      assert.deepEqual(got.network_configs, vm.network_configs);
    }
  });

  test('the installed cocoon symlink (thin client or bash shim) is the same CLI; only cocoon-sim has helper verbs', async () => {
    const { existsSync, mkdtempSync, realpathSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(`${tmpdir()}/cocoon-bin-`);
    try {
      const bin = await sim.installBin(dir);
      assert.equal(bin, `${dir}/cocoon`);
      const target = existsSync(CLIENT_BIN) ? CLIENT_BIN : SIM_BIN;
      assert.equal(realpathSync(bin), realpathSync(target));
      const viaShim = await sim.run(['vm', 'inspect', vm.id], { viaShim: true });
      assert.equal(viaShim.code, 0, viaShim.stderr);
      assert.equal((JSON.parse(viaShim.stdout) as VmRecord).id, vm.id);
      const helper = await sim.helper(['knobs', 'get'], { viaShim: true });
      assert.equal(helper.code, 0, helper.stderr);
      const asCocoon = await sim.run(['fixture', 'image', 'x'], { viaShim: true });
      assert.equal(asCocoon.stderr, 'Error: unknown command "fixture" for "cocoon"\n');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('not-found and name-taken errors are verbatim, exit 1, stderr only', async () => {
    const miss = await sim.run(['vm', 'inspect', 'nope']);
    assert.equal(miss.code, 1);
    assert.equal(miss.stdout, '');
    assert.equal(miss.stderr, 'Error: vm not found: nope\n');
    const shortPrefix = await sim.run(['vm', 'inspect', vm.id.slice(0, 2)]);
    assert.equal(shortPrefix.code, 1, 'a prefix shorter than 3 characters never resolves');
    const taken = await sim.run(['vm', 'clone', '--output', 'json', '--name', 'vk-ns-agent-0', 'acme/agent']);
    assert.equal(taken.code, 1);
    assert.equal(taken.stderr, 'Error: vm name "vk-ns-agent-0" already exists\n');
    const snap = await sim.run(['snapshot', 'inspect', 'missing/snap']);
    assert.equal(snap.code, 1);
    assert.match(snap.stderr, /^Error: snapshot not found: missing\/snap\n$/);
    const img = await sim.run(['image', 'inspect', 'sha256:0000']);
    assert.equal(img.code, 1);
    assert.match(img.stderr, /not found in any backend/);
    const rm = await sim.run(['vm', 'rm', '--force', 'gone-vm']);
    assert.equal(rm.code, 1);
    assert.match(rm.stderr, /vm not found/);
  });

  test('unknown flags, missing values and wrong argument counts are rejected like cobra', async () => {
    const cases: [string[], string][] = [
      [['vm', 'list', '-o', 'json', '--wide'], 'Error: unknown flag: --wide\n'],
      [['vm', 'inspect', '-o', 'json', vm.id], `Error: unknown shorthand flag: 'o' in -o\n`],
      [['vm', 'inspect'], 'Error: accepts 1 arg(s), received 0\n'],
      [['vm', 'inspect', 'a', 'b'], 'Error: accepts 1 arg(s), received 2\n'],
      [['vm', 'rm', '--force'], 'Error: requires at least 1 arg(s), only received 0\n'],
      [['vm', 'clone', '--output', 'json', '--name'], 'Error: flag needs an argument: --name\n'],
      [
        ['vm', 'run', '--cpu', 'two', IMAGE],
        'Error: invalid argument "two" for "--cpu" flag: strconv.ParseInt: parsing "two": invalid syntax\n',
      ],
      [['vm', 'frobnicate'], 'Error: unknown command "frobnicate" for "cocoon vm"\n'],
      [['vm', 'list', 'extra'], 'Error: unknown command "extra" for "cocoon vm list"\n'],
      [['knobs', 'get'], 'Error: unknown command "knobs" for "cocoon"\n'],
    ];
    const results = await Promise.all(cases.map(([argv]) => sim.run(argv)));
    results.forEach((r, i) => {
      assert.equal(r.code, 1, cases[i]?.[0].join(' '));
      assert.equal(r.stderr, cases[i]?.[1]);
      assert.equal(r.stdout, '');
    });
  });

  test('older clone flags are accepted as no-ops; flags may follow positionals', async () => {
    const r = await sim.json<VmRecord>([
      'vm',
      'clone',
      'acme/agent',
      '--output=json',
      '--name',
      'vk-ns-legacy',
      '--cpu',
      '8',
      '--memory',
      '16G',
      '--storage',
      '100G',
      '--on-demand',
      '--dns',
      '1.1.1.1',
    ]);
    assert.equal(r.config.cpu, 2, 'topology comes from the snapshot');
    assert.equal(r.state, 'running');
  });

  test('vm list -o json lists every VM with the reconciled state', async () => {
    const list = await sim.json<VmRecord[]>(['vm', 'list', '-o', 'json']);
    assert.deepEqual(list.map((v) => v.config.name).sort(), ['vk-ns-agent-0', 'vk-ns-legacy']);
    assert.ok(list.every((v) => v.state === 'running'));
  });

  test('vm rm without --force refuses a running VM; with --force removes it and its dirs', async () => {
    const legacy = await sim.json<VmRecord>(['vm', 'inspect', 'vk-ns-legacy']);
    const refused = await sim.run(['vm', 'rm', legacy.id]);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /is running/);
    const ok = await sim.run(['vm', 'rm', '--force', legacy.id]);
    assert.equal(ok.code, 0);
    const gone = await sim.run(['vm', 'inspect', legacy.id]);
    assert.match(gone.stderr, /vm not found/);
    const { existsSync } = await import('node:fs');
    assert.equal(existsSync(`${sim.root}/run/cloudhypervisor/${legacy.id}`), false);
    assert.throws(() => process.kill(legacy.pid, 0), 'the stand-in was killed and reaped');
  });

  test('vm logs --tail N prints the last N console lines', async () => {
    const r = await sim.run(['vm', 'logs', '--tail', '2', vm.id]);
    assert.equal(r.code, 0);
    const lines = r.stdout.replace(/\n$/, '').split('\n');
    assert.equal(lines.length, 2);
    assert.equal(lines[1], 'vk-ns-agent-0 login: ');
    const all = await sim.run(['vm', 'logs', '--tail', '200', vm.id]);
    assert.match(all.stdout, /Linux version/);
  });

  test('vm exec streams output, propagates the guest exit code without an Error line, needs --', async () => {
    const echo = await sim.run(['vm', 'exec', vm.id, '--', 'echo', 'hello', 'world']);
    assert.deepEqual([echo.code, echo.stdout, echo.stderr], [0, 'hello world\n', '']);
    const fail = await sim.run(['vm', 'exec', '-e', 'A=1', '-e', 'B=2', vm.id, '--', 'false']);
    assert.deepEqual([fail.code, fail.stderr], [1, '']);
    const cat = await sim.run(['vm', 'exec', '-i', vm.id, '--', 'cat'], { stdin: 'piped input' });
    assert.equal(cat.stdout, 'piped input');
    // What no rule or built-in models fails (127), never a quiet success.
    const unknown = await sim.run(['vm', 'exec', vm.id, '--', 'uname', '-a']);
    assert.deepEqual([unknown.code, unknown.stdout, unknown.stderr], [127, '', 'sh: 1: uname: not found\n']);
    const pwsh = await sim.run(['vm', 'exec', vm.id, '--', 'powershell', '-nop', '-c', 'Get-Date']);
    assert.deepEqual(
      [pwsh.code, pwsh.stderr],
      [127, 'sh: 1: powershell: not found\n'],
      'no powershell on Linux',
    );
    const script = await sim.run(['vm', 'exec', vm.id, '--', 'sh', '-c', 'ls /']);
    assert.equal(script.code, 127);
    assert.match(script.stderr, /^sh: the simulated guest cannot run this/);
    const noDash = await sim.run(['vm', 'exec', vm.id, 'echo']);
    assert.equal(noDash.code, 1);
    assert.match(noDash.stderr, /^Error: .*"--"/);
    const guest = sim.guestCommands();
    const cmd = guest.find((g) => g.argv[0] === 'false');
    assert.deepEqual(cmd?.env, ['A=1', 'B=2']);
    assert.equal(cmd?.exit, 1);
    assert.equal(guest.find((g) => g.argv[0] === 'cat')?.stdinBytes, 11);
  });

  test('calls.jsonl has one line per cocoon invocation with exact argv, exit and stdin bytes', async () => {
    const calls = sim.calls();
    const inspect = calls.find((c) => c.argv.join(' ') === 'vm inspect nope');
    assert.ok(inspect);
    assert.equal(inspect.exit, 1);
    assert.equal(inspect.stdinBytes, 0);
    assert.ok(Number.isInteger(inspect.durationMs) && inspect.durationMs >= 0, String(inspect.durationMs));
    assert.ok(!Number.isNaN(Date.parse(inspect.startedAt)));
    assert.deepEqual(Object.keys(inspect), ['argv', 'exit', 'startedAt', 'durationMs', 'stdinBytes']);
    const cat = calls.find((c) => c.argv.includes('cat'));
    assert.equal(cat?.stdinBytes, 11);
    assert.ok(
      !calls.some((c) => c.argv[0] === '__sim' || c.argv.join(' ').startsWith('fixture snapshot')),
      'cocoon-sim helper verbs and __sim are not logged',
    );
    assert.ok(
      calls.some((c) => c.argv.join(' ') === 'fixture image x' && c.exit === 1),
      'an unknown command sent to cocoon is logged',
    );
  });

  test('image pull is idempotent; inspect by name and digest; vm run needs a resolved image', async () => {
    const notResolved = await sim.run([
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-run',
      'docker.io/library/alpine:3',
    ]);
    assert.equal(notResolved.code, 1);
    assert.equal(notResolved.stderr, 'Error: image "docker.io/library/alpine:3" not resolved\n');
    for (let i = 0; i < 2; i++)
      assert.equal((await sim.run(['image', 'pull', 'docker.io/library/alpine:3'])).code, 0);
    const byName = await sim.json<{ id: string; type: string; name: string }>([
      'image',
      'inspect',
      'docker.io/library/alpine:3',
    ]);
    assert.equal(byName.type, 'oci');
    assert.equal(byName.id, imageDigest('docker.io/library/alpine:3'));
    const byDigest = await sim.json<{ name: string }>(['image', 'inspect', byName.id]);
    assert.equal(byDigest.name, 'docker.io/library/alpine:3');
    const url = 'https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img';
    assert.equal((await sim.run(['image', 'pull', url])).code, 0);
    assert.equal((await sim.json<{ type: string }>(['image', 'inspect', url])).type, 'cloudimg');
    const run = await sim.json<VmRecord>([
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-run',
      '--cpu',
      '4',
      '--cpu-weight',
      '20',
      '--memory',
      '4294967296',
      '--storage',
      '21474836480',
      'docker.io/library/alpine:3',
    ]);
    assert.equal(run.state, 'running');
    assert.equal(run.config.cpu, 4);
    assert.equal(run.config.memory, 4294967296);
    assert.equal(run.config.storage, 21474836480);
    const cloud = await sim.json<VmRecord>(['vm', 'run', '--output', 'json', '--name', 'vk-run-cloud', url]);
    assert.deepEqual(
      cloud.storage_configs?.map((s) => s.path.split('/').pop()),
      ['overlay.qcow2', 'cidata.img'],
    );
    const win = await sim.run([
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-win',
      '--windows',
      'docker.io/library/alpine:3',
    ]);
    assert.equal(win.code, 1);
    assert.match(win.stderr, /--windows requires a cloud image/);
    const fcwin = await sim.run([
      'vm',
      'run',
      '--output',
      'json',
      '--name',
      'vk-fcwin',
      '--windows',
      '--fc',
      url,
    ]);
    assert.equal(fcwin.code, 1);
    const fccloud = await sim.run(['vm', 'run', '--output', 'json', '--name', 'vk-fccloud', '--fc', url]);
    assert.match(fccloud.stderr, /firecracker requires an OCI image/);
  });

  test('image import reads a disk stream from stdin', async () => {
    const r = await sim.run(['image', 'import', 'acme/win11:25h2'], { stdin: Buffer.alloc(4096, 1) });
    assert.equal(r.code, 0, r.stderr);
    const img = await sim.json<{ type: string; size: number }>(['image', 'inspect', 'acme/win11:25h2']);
    assert.deepEqual([img.type, img.size], ['cloudimg', 4096]);
    assert.equal(sim.calls().find((c) => c.argv[1] === 'import')?.stdinBytes, 4096);
  });
});
