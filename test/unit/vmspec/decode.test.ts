import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import fc from 'fast-check';
import {
  BACKEND,
  CLONE_FROM_DIR,
  FORK_FROM,
  GENERATION,
  IMAGE,
  MANAGED,
  MODE,
  OS,
  PROBE_PORT,
  SNAPSHOT_POLICY,
  STORAGE,
  VM_NAME,
} from '../../../src/contract/annotations.ts';
import {
  decodeVMSpec,
  isClonedBootSpec,
  parseProbePort,
  runMemoryBytes,
  type VMSpec,
  type VMSpecDecodeResult,
  type VMSpecPodInput,
} from '../../../src/vmspec/decode.ts';

const POD: VMSpecPodInput = {
  namespace: 'team-a',
  ownerReferences: [{ kind: 'CocoonSet', name: 'agents' }],
  containers: [{ resources: { requests: { cpu: '2', memory: '2Gi' }, limits: { cpu: '4', memory: '4Gi' } } }],
};

const MANAGED_CLONE = {
  [MANAGED]: 'true',
  [VM_NAME]: 'vk-team-a-agents-0',
  [IMAGE]: 'acme/agent:v3',
};

function decodeOk(annotations: Record<string, string>, pod: VMSpecPodInput = POD) {
  const result = decodeVMSpec(annotations, pod);
  assert.ok(result.ok, JSON.stringify(!result.ok && result.errors));
  return result;
}

function errorsOf(result: VMSpecDecodeResult) {
  assert.equal(result.ok, false);
  return result.ok ? [] : result.errors;
}

describe('decodeVMSpec defaults (pod-to-vm.md §1)', () => {
  it('applies the reader defaults', () => {
    const { spec, warnings } = decodeOk(MANAGED_CLONE);
    const expected: VMSpec = {
      vmName: 'vk-team-a-agents-0',
      image: 'acme/agent:v3',
      mode: 'clone',
      os: 'linux',
      storageBytes: undefined,
      network: '',
      snapshotPolicy: 'always',
      managed: true,
      forcePull: false,
      backend: 'cloud-hypervisor',
      noDirectIO: false,
      probePort: undefined,
      connType: '',
      forkFrom: '',
      cloneFromDir: '',
      hibernate: false,
      restoreFromHibernate: false,
      keepSnapshotOnDelete: false,
      generation: 0n,
      role: 'main',
      cpuRequestMilli: 2000n,
      cpuLimitMilli: 4000n,
      memoryRequestBytes: 2n ** 31n,
      memoryLimitBytes: 2n ** 32n,
    };
    assert.deepEqual(spec, expected);
    assert.deepEqual(warnings, []);
  });

  it('decodes every key', () => {
    const { spec } = decodeOk({
      ...MANAGED_CLONE,
      [MODE]: 'RUN',
      [OS]: 'windows',
      [STORAGE]: '20Gi',
      'cocoonset.cocoonstack.io/network': 'cocoon-dhcp',
      [SNAPSHOT_POLICY]: 'main-only',
      'cocoonset.cocoonstack.io/force-pull': 'true',
      [BACKEND]: 'cloud-hypervisor',
      'vm.cocoonstack.io/no-direct-io': 'true',
      [PROBE_PORT]: '3389',
      'vm.cocoonstack.io/conn-type': 'rdp',
      'vm.cocoonstack.io/hibernate': 'true',
      'vm.cocoonstack.io/restore-from-hibernate': 'true',
      'vm.cocoonstack.io/keep-snapshot-on-delete': 'true',
      [GENERATION]: '9223372036854775807',
    });
    assert.equal(spec.mode, 'run');
    assert.equal(spec.os, 'windows');
    assert.equal(spec.storageBytes, 21474836480n);
    assert.equal(spec.network, 'cocoon-dhcp');
    assert.equal(spec.snapshotPolicy, 'main-only');
    assert.equal(spec.forcePull, true);
    assert.equal(spec.noDirectIO, true);
    assert.equal(spec.probePort, 3389);
    assert.equal(spec.connType, 'rdp');
    assert.equal(spec.hibernate, true);
    assert.equal(spec.restoreFromHibernate, true);
    assert.equal(spec.keepSnapshotOnDelete, true);
    assert.equal(spec.generation, 9223372036854775807n);
  });

  it('booleans are true only for the exact string "true"', () => {
    for (const value of ['True', 'TRUE', '1', 'yes', 'false', '']) {
      const result = decodeVMSpec({ [MANAGED]: value, 'vm.cocoonstack.io/hibernate': value }, POD);
      assert.ok(result.ok);
      assert.equal(result.spec.managed, false, value);
      assert.equal(result.spec.hibernate, false, value);
    }
  });

  it('mode is case-insensitive; empty ⇒ clone', () => {
    for (const [raw, mode] of [
      ['Clone', 'clone'],
      ['RUN', 'run'],
      ['Static', 'static'],
      ['', 'clone'],
    ] as const) {
      assert.equal(decodeOk({ ...MANAGED_CLONE, [MODE]: raw }).spec.mode, mode);
    }
  });

  it('snapshot policy: empty or unknown ⇒ always (unknown warns)', () => {
    assert.equal(decodeOk({ ...MANAGED_CLONE, [SNAPSHOT_POLICY]: 'never' }).spec.snapshotPolicy, 'never');
    const unknown = decodeOk({ ...MANAGED_CLONE, [SNAPSHOT_POLICY]: 'sometimes' });
    assert.equal(unknown.spec.snapshotPolicy, 'always');
    assert.equal(unknown.warnings[0]?.key, SNAPSHOT_POLICY);
  });

  it('probe port: invalid ⇒ ICMP with a warning naming the key', () => {
    for (const bad of ['0', '65536', 'http', '-1', '+80', ' 80', '8080x']) {
      const result = decodeOk({ ...MANAGED_CLONE, [PROBE_PORT]: bad });
      assert.equal(result.spec.probePort, undefined, bad);
      assert.equal(result.warnings[0]?.key, PROBE_PORT);
      assert.match(
        result.warnings[0]?.message ?? '',
        /vm\.cocoonstack\.io\/probe-port: expected a decimal port/,
      );
    }
    assert.equal(parseProbePort('1'), 1);
    assert.equal(parseProbePort('65535'), 65535);
    assert.equal(parseProbePort('080'), 80);
  });

  it('storage: unparsable or zero ⇒ omitted with a warning', () => {
    for (const bad of ['lots', '0', '-1Gi', '20GB']) {
      const result = decodeOk({ ...MANAGED_CLONE, [STORAGE]: bad });
      assert.equal(result.spec.storageBytes, undefined, bad);
      assert.equal(result.warnings[0]?.key, STORAGE);
    }
  });

  it('generation: unparsable ⇒ 0 with a warning', () => {
    const result = decodeOk({ ...MANAGED_CLONE, [GENERATION]: '7x' });
    assert.equal(result.spec.generation, 0n);
    assert.equal(result.warnings[0]?.key, GENERATION);
    assert.equal(decodeOk({ ...MANAGED_CLONE, [GENERATION]: '42' }).spec.generation, 42n);
  });
});

describe('decodeVMSpec errors', () => {
  it('a managed pod without a VM name fails with missing_vmname', () => {
    const errors = errorsOf(decodeVMSpec({ [MANAGED]: 'true', [IMAGE]: 'a' }, POD));
    assert.deepEqual(errors, [
      { key: VM_NAME, message: 'vm.cocoonstack.io/name: required for managed pods', code: 'missing_vmname' },
    ]);
  });

  it('an unmanaged pod may omit the VM name', () => {
    const { spec } = decodeOk({});
    assert.equal(spec.managed, false);
    assert.equal(spec.vmName, '');
  });

  it('VM names must match the regex', () => {
    for (const bad of ['-bad', '.bad', 'has space', 'a/b', 'a'.repeat(64), 'ü']) {
      const errors = errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [VM_NAME]: bad }, POD));
      assert.equal(errors[0]?.key, VM_NAME, bad);
      assert.match(errors[0]?.message ?? '', /^vm\.cocoonstack\.io\/name: expected a VM name matching/);
    }
    assert.ok(decodeVMSpec({ ...MANAGED_CLONE, [VM_NAME]: `A${'b'.repeat(62)}` }, POD).ok);
    assert.ok(decodeVMSpec({ ...MANAGED_CLONE, [VM_NAME]: '0a._-Z' }, POD).ok);
  });

  it('backend: exactly cloud-hypervisor or firecracker, else unsupported backend "<v>"', () => {
    assert.equal(decodeOk({ ...MANAGED_CLONE, [BACKEND]: 'firecracker' }).spec.backend, 'firecracker');
    for (const bad of ['Firecracker', 'qemu', 'ch']) {
      const errors = errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [BACKEND]: bad }, POD));
      assert.deepEqual(errors, [
        { key: BACKEND, message: `unsupported backend "${bad}"`, code: 'unsupported_backend' },
      ]);
    }
  });

  it('unknown mode and OS are errors naming the key', () => {
    const mode = errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [MODE]: 'fork' }, POD));
    assert.equal(mode[0]?.key, MODE);
    assert.match(mode[0]?.message ?? '', /cocoonset\.cocoonstack\.io\/mode: expected clone, run or static/);
    const os = errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [OS]: 'Windows' }, POD));
    assert.equal(os[0]?.key, OS);
    assert.match(os[0]?.message ?? '', /expected linux, windows, android or macos, got "Windows"/);
  });

  it('Firecracker constraints: no windows; no http(s) image in run mode', () => {
    const windows = errorsOf(
      decodeVMSpec({ ...MANAGED_CLONE, [BACKEND]: 'firecracker', [OS]: 'windows' }, POD),
    );
    assert.deepEqual(
      windows.map((e) => [e.key, e.code]),
      [[OS, 'firecracker_constraint']],
    );
    const url = 'https://cloud-images.ubuntu.com/jammy.img';
    const run = errorsOf(
      decodeVMSpec({ ...MANAGED_CLONE, [BACKEND]: 'firecracker', [MODE]: 'run', [IMAGE]: url }, POD),
    );
    assert.deepEqual(
      run.map((e) => [e.key, e.code]),
      [[IMAGE, 'firecracker_constraint']],
    );
    assert.ok(
      decodeVMSpec(
        { ...MANAGED_CLONE, [BACKEND]: 'firecracker', [MODE]: 'run', [IMAGE]: 'ghcr.io/a/b:1' },
        POD,
      ).ok,
    );
    assert.ok(decodeVMSpec({ ...MANAGED_CLONE, [MODE]: 'run', [IMAGE]: url }, POD).ok);
  });

  it('managed pods need an image (except with a clone source) that cannot pass for a flag', () => {
    const missing = errorsOf(decodeVMSpec({ [MANAGED]: 'true', [VM_NAME]: 'vm1' }, POD));
    assert.deepEqual(
      missing.map((e) => e.key),
      [IMAGE],
    );
    assert.ok(decodeVMSpec({ [MANAGED]: 'true', [VM_NAME]: 'vm1', [FORK_FROM]: 'vm0' }, POD).ok);
    for (const bad of ['--fc', 'acme/a b', 'acme\n']) {
      assert.equal(errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [IMAGE]: bad }, POD))[0]?.key, IMAGE);
    }
  });

  it('fork-from must be a VM name; clone-from-dir an absolute clean path, not with run or fork-from', () => {
    assert.equal(errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [FORK_FROM]: '--x' }, POD))[0]?.key, FORK_FROM);
    for (const bad of ['relative/dir', '/a/../b', '/a/', '/a//b', '/a/./b']) {
      assert.equal(
        errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [CLONE_FROM_DIR]: bad }, POD))[0]?.key,
        CLONE_FROM_DIR,
        bad,
      );
    }
    assert.equal(
      decodeOk({ ...MANAGED_CLONE, [CLONE_FROM_DIR]: '/srv/vm/base' }).spec.cloneFromDir,
      '/srv/vm/base',
    );
    assert.ok(decodeVMSpec({ ...MANAGED_CLONE, [CLONE_FROM_DIR]: '/' }, POD).ok);
    assert.match(
      errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [CLONE_FROM_DIR]: '/d', [MODE]: 'run' }, POD))[0]?.message ??
        '',
      /cannot be combined with mode=run/,
    );
    assert.match(
      errorsOf(decodeVMSpec({ ...MANAGED_CLONE, [CLONE_FROM_DIR]: '/d', [FORK_FROM]: 'vm0' }, POD))[0]
        ?.message ?? '',
      /cannot be combined with vm\.cocoonstack\.io\/fork-from/,
    );
  });

  it('reports every error at once', () => {
    const errors = errorsOf(
      decodeVMSpec({ [MANAGED]: 'true', [BACKEND]: 'qemu', [MODE]: 'x', [IMAGE]: 'a' }, POD),
    );
    assert.deepEqual(errors.map((e) => e.key).sort(), [BACKEND, MODE, VM_NAME].sort());
  });

  it('property: never throws, and errors always name a key with a message', () => {
    const keys = [
      MANAGED,
      VM_NAME,
      IMAGE,
      MODE,
      OS,
      BACKEND,
      STORAGE,
      PROBE_PORT,
      GENERATION,
      FORK_FROM,
      CLONE_FROM_DIR,
    ];
    fc.assert(
      fc.property(
        fc.dictionary(fc.constantFrom(...keys), fc.oneof(fc.string(), fc.constant('true'))),
        (annotations) => {
          const result = decodeVMSpec(annotations, POD);
          if (!result.ok) {
            assert.ok(result.errors.length > 0);
            for (const error of result.errors) {
              assert.ok(keys.includes(error.key));
              assert.ok(error.message.length > 0);
            }
          }
        },
      ),
    );
  });
});

describe('decodeVMSpec resources and role', () => {
  it('sums requests over containers; a limit needs every container to set one', () => {
    const { spec } = decodeOk(MANAGED_CLONE, {
      containers: [
        { resources: { requests: { cpu: '500m', memory: '1Gi' }, limits: { cpu: '1' } } },
        { resources: { requests: { cpu: '250m' }, limits: { cpu: '1', memory: '1Gi' } } },
      ],
    });
    assert.equal(spec.cpuRequestMilli, 750n);
    assert.equal(spec.cpuLimitMilli, 2000n);
    assert.equal(spec.memoryRequestBytes, 2n ** 30n);
    assert.equal(spec.memoryLimitBytes, undefined);
  });

  it('BestEffort pods have no resources', () => {
    const { spec } = decodeOk(MANAGED_CLONE, { containers: [{}] });
    assert.equal(spec.cpuRequestMilli, undefined);
    assert.equal(spec.cpuLimitMilli, undefined);
    assert.equal(runMemoryBytes(spec), undefined);
  });

  it('run --memory: request, else limit', () => {
    assert.equal(runMemoryBytes({ memoryRequestBytes: 1n, memoryLimitBytes: 2n }), 1n);
    assert.equal(runMemoryBytes({ memoryRequestBytes: undefined, memoryLimitBytes: 2n }), 2n);
  });

  it('derives the role from the CocoonSet owner', () => {
    assert.equal(decodeOk({ ...MANAGED_CLONE, [VM_NAME]: 'vk-team-a-agents-2' }).spec.role, 'sub-agent');
    assert.equal(decodeOk({ ...MANAGED_CLONE, [VM_NAME]: 'vk-team-a-agents-0' }, {}).spec.role, 'toolbox');
  });

  it('accepts the parts of a V1Pod directly', () => {
    const pod: V1Pod = {
      metadata: {
        namespace: 'team-a',
        annotations: MANAGED_CLONE,
        ownerReferences: [{ apiVersion: 'cocoonstack.io/v1', kind: 'CocoonSet', name: 'agents', uid: 'u' }],
      },
      spec: { containers: [{ name: 'agent', resources: { requests: { cpu: '2' } } }] },
    };
    const result = decodeVMSpec(pod.metadata?.annotations, {
      namespace: pod.metadata?.namespace,
      ownerReferences: pod.metadata?.ownerReferences,
      containers: pod.spec?.containers,
    });
    assert.ok(result.ok);
    assert.equal(result.spec.role, 'main');
    assert.equal(result.spec.cpuRequestMilli, 2000n);
  });
});

describe('isClonedBootSpec (lifecycle.md §6.1)', () => {
  it('run mode without a clone source is not a cloned boot', () => {
    assert.equal(isClonedBootSpec({ mode: 'run', forkFrom: '', cloneFromDir: '' }), false);
    assert.equal(isClonedBootSpec({ mode: 'clone', forkFrom: '', cloneFromDir: '' }), true);
    assert.equal(isClonedBootSpec({ mode: 'run', forkFrom: 'vm0', cloneFromDir: '' }), true);
  });
});
