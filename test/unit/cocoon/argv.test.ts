import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  ArgvError,
  cloneArgv,
  execArgv,
  imageImportArgv,
  imageInspectArgv,
  imagePullArgv,
  inspectArgv,
  listArgv,
  logsArgv,
  netArgv,
  reconcileStaleCreateArgv,
  removeArgv,
  runArgv,
  snapshotExportArgv,
  snapshotImportArgv,
  snapshotInspectArgv,
  snapshotListArgv,
  snapshotRemoveArgv,
  snapshotSaveArgv,
  startArgv,
  statusEventsArgv,
} from '../../../src/cocoon/argv.ts';
import { cpuPolicy } from '../../../src/vmspec/cpu-policy.ts';

const ID = 'J7QX4MZK2N5VBR3TLWD6YHPC2E';

describe('cloneArgv (cocoon-cli.md §2)', () => {
  it('minimal clone', () => {
    assert.deepEqual(
      cloneArgv({ vmName: 'vm1', backend: 'cloud-hypervisor', cpuWeight: 1, source: { snapshot: 's' } }),
      ['vm', 'clone', '--output', 'json', '--name', 'vm1', '--cpu-weight', '1', 's'],
    );
  });

  it('every flag in the emitted order', () => {
    const cpu = cpuPolicy(2000n, 4000n);
    assert.deepEqual(
      cloneArgv({
        vmName: 'vk-team-a-agent-0',
        backend: 'cloud-hypervisor',
        network: 'cocoon-dhcp',
        noDirectIO: true,
        pull: true,
        restoreMode: 'copy',
        nics: 1,
        cpuWeight: cpu.weight,
        cpuQuotaUs: cpu.quotaUs,
        cpuPeriodUs: cpu.periodUs,
        source: { snapshot: 'acme/agent:v3' },
      }),
      [
        'vm',
        'clone',
        '--output',
        'json',
        '--name',
        'vk-team-a-agent-0',
        '--network',
        'cocoon-dhcp',
        '--no-direct-io',
        '--pull',
        '--restore-mode',
        'copy',
        '--nics',
        '1',
        '--cpu-weight',
        '79',
        '--cpu-quota-us',
        '400000',
        '--cpu-period-us',
        '100000',
        'acme/agent:v3',
      ],
    );
  });

  it('never sends --restore-mode, --nics or --no-direct-io for Firecracker', () => {
    const argv = cloneArgv({
      vmName: 'vm1',
      backend: 'firecracker',
      noDirectIO: true,
      restoreMode: 'ondemand',
      nics: 1,
      cpuWeight: 20,
      source: { snapshot: 's' },
    });
    assert.deepEqual(argv, ['vm', 'clone', '--output', 'json', '--name', 'vm1', '--cpu-weight', '20', 's']);
  });

  it('--from-dir replaces the snapshot and forces --pull', () => {
    assert.deepEqual(
      cloneArgv({
        vmName: 'vm1',
        backend: 'cloud-hypervisor',
        cpuWeight: 1,
        source: { fromDir: '/srv/base' },
      }),
      [
        'vm',
        'clone',
        '--output',
        'json',
        '--name',
        'vm1',
        '--pull',
        '--cpu-weight',
        '1',
        '--from-dir',
        '/srv/base',
      ],
    );
  });

  it('refuses positionals that cocoon would read as flags', () => {
    assert.throws(
      () => cloneArgv({ vmName: '--fc', backend: 'firecracker', source: { snapshot: 's' } }),
      ArgvError,
    );
    assert.throws(
      () => cloneArgv({ vmName: 'vm', backend: 'firecracker', source: { snapshot: '-s' } }),
      ArgvError,
    );
    assert.throws(
      () => cloneArgv({ vmName: '', backend: 'firecracker', source: { snapshot: 's' } }),
      ArgvError,
    );
  });
});

describe('runArgv', () => {
  it('every flag in the emitted order', () => {
    assert.deepEqual(
      runArgv({
        vmName: 'vm1',
        cpus: 2n,
        cpuWeight: 79,
        cpuQuotaUs: 200000n,
        cpuPeriodUs: 100000,
        memoryBytes: 4294967296n,
        storageBytes: 21474836480n,
        network: 'net',
        windows: true,
        noDirectIO: true,
        image: 'https://example.com/win.qcow2',
      }),
      [
        'vm',
        'run',
        '--output',
        'json',
        '--name',
        'vm1',
        '--cpu',
        '2',
        '--cpu-weight',
        '79',
        '--cpu-quota-us',
        '200000',
        '--cpu-period-us',
        '100000',
        '--memory',
        '4294967296',
        '--storage',
        '21474836480',
        '--network',
        'net',
        '--windows',
        '--no-direct-io',
        'https://example.com/win.qcow2',
      ],
    );
  });

  it('--fc and no --no-direct-io for Firecracker; omitted flags stay omitted', () => {
    assert.deepEqual(
      runArgv({ vmName: 'vm1', cpuWeight: 1, firecracker: true, noDirectIO: true, image: 'ghcr.io/a/b' }),
      ['vm', 'run', '--output', 'json', '--name', 'vm1', '--cpu-weight', '1', '--fc', 'ghcr.io/a/b'],
    );
  });
});

describe('simple verbs', () => {
  it('builds the exact argv', () => {
    assert.deepEqual(inspectArgv('vm1'), ['vm', 'inspect', 'vm1']);
    assert.deepEqual(listArgv(), ['vm', 'list', '-o', 'json']);
    assert.deepEqual(removeArgv(ID), ['vm', 'rm', '--force', ID]);
    assert.deepEqual(startArgv(ID), ['vm', 'start', ID]);
    assert.deepEqual(logsArgv(ID), ['vm', 'logs', '--tail', '200', ID]);
    assert.deepEqual(logsArgv(ID, 50), ['vm', 'logs', '--tail', '50', ID]);
    assert.deepEqual(netArgv(ID, 0), ['vm', 'net', '--nics', '0', ID]);
    assert.deepEqual(statusEventsArgv(), ['vm', 'status', '--event', '--format', 'json']);
    assert.deepEqual(reconcileStaleCreateArgv(ID), ['vm', 'reconcile-stale-create', ID, '-o', 'json']);
    assert.deepEqual(snapshotSaveArgv('vm1', ID), ['snapshot', 'save', '--name', 'vm1', ID]);
    assert.deepEqual(snapshotInspectArgv('acme/agent:v3'), ['snapshot', 'inspect', 'acme/agent:v3']);
    assert.deepEqual(snapshotRemoveArgv('fork-vm1'), ['snapshot', 'rm', 'fork-vm1']);
    assert.deepEqual(snapshotImportArgv('s'), ['snapshot', 'import', '--name', 's']);
    assert.deepEqual(snapshotImportArgv('s', 'pulled'), [
      'snapshot',
      'import',
      '--name',
      's',
      '--description',
      'pulled',
    ]);
    assert.deepEqual(snapshotExportArgv('s'), ['snapshot', 'export', 's', '-o', '-']);
    assert.deepEqual(snapshotListArgv(), ['snapshot', 'list', '-o', 'json']);
    assert.deepEqual(imagePullArgv('ghcr.io/a/b:1'), ['image', 'pull', 'ghcr.io/a/b:1']);
    assert.deepEqual(imagePullArgv('ghcr.io/a/b:1', true), ['image', 'pull', '--force', 'ghcr.io/a/b:1']);
    assert.deepEqual(imageInspectArgv('sha256:abc'), ['image', 'inspect', 'sha256:abc']);
    assert.deepEqual(imageImportArgv('acme/img:1'), ['image', 'import', 'acme/img:1']);
  });

  it('rejects flag-like positionals', () => {
    for (const build of [
      () => inspectArgv('--all'),
      () => removeArgv('-f'),
      () => imagePullArgv('--force'),
      () => snapshotSaveArgv('ok', '-x'),
      () => logsArgv(''),
    ]) {
      assert.throws(build, ArgvError);
    }
  });
});

describe('execArgv', () => {
  it('emits [-i] [-e K=V sorted] <id> -- argv', () => {
    assert.deepEqual(
      execArgv({
        vmId: ID,
        stdin: true,
        env: { ZED: '1', ALPHA: 'a=b', MID: '' },
        command: ['sh', '-c', 'echo hi'],
      }),
      ['vm', 'exec', '-i', '-e', 'ALPHA=a=b', '-e', 'MID=', '-e', 'ZED=1', ID, '--', 'sh', '-c', 'echo hi'],
    );
  });

  it('no stdin, no env', () => {
    assert.deepEqual(execArgv({ vmId: ID, command: ['cmd', '/c', 'ipconfig', '/renew'] }), [
      'vm',
      'exec',
      ID,
      '--',
      'cmd',
      '/c',
      'ipconfig',
      '/renew',
    ]);
  });

  it('passes guest argv after -- unchanged, flags included', () => {
    const argv = execArgv({ vmId: ID, command: ['powershell', '-nop', '-c', '$x=1'] });
    assert.deepEqual(argv.slice(argv.indexOf('--') + 1), ['powershell', '-nop', '-c', '$x=1']);
  });

  it('sorts keys by code point like Go sort.Strings', () => {
    const argv = execArgv({
      vmId: ID,
      env: { b: '1', B: '2', a: '3', '\u{1F600}': '4', '\uFF21': '5' },
      command: ['x'],
    });
    assert.deepEqual(
      argv.filter((_, i) => argv[i - 1] === '-e'),
      ['B=2', 'a=3', 'b=1', '\uFF21=5', '\u{1F600}=4'],
    );
  });

  it('refuses an empty command and bad env keys', () => {
    assert.throws(() => execArgv({ vmId: ID, command: [] }), ArgvError);
    assert.throws(() => execArgv({ vmId: ID, env: { 'A=B': 'x' }, command: ['x'] }), ArgvError);
  });

  it('property: -e keys come out sorted and the command follows --', () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,8}$/), fc.string()),
        fc.array(fc.string(), { minLength: 1, maxLength: 4 }),
        (env, command) => {
          const argv = execArgv({ vmId: ID, env, command });
          const separator = argv.indexOf('--');
          assert.equal(argv[separator - 1], ID);
          assert.deepEqual(argv.slice(separator + 1), command);
          const keys = argv.filter((_, i) => argv[i - 1] === '-e').map((kv) => kv.slice(0, kv.indexOf('=')));
          assert.deepEqual(keys, [...keys].sort());
          assert.equal(keys.length, Object.keys(env).length);
        },
      ),
    );
  });
});
