import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  type CpuClassPod,
  checkSnapshotCpuClass,
  cpuClassStartupError,
  SNAPSHOT_CPU_CLASS_LABEL,
} from '../../../src/vmspec/snapshot-cpu-class.ts';

const pod = (name: string, cls: string | undefined, phase?: string, extra: Record<string, string> = {}) =>
  ({
    metadata: { namespace: 'ns', name },
    spec: { nodeSelector: { ...extra, ...(cls === undefined ? {} : { [SNAPSHOT_CPU_CLASS_LABEL]: cls }) } },
    status: phase ? { phase } : undefined,
  }) satisfies CpuClassPod;

describe('checkSnapshotCpuClass (pod-to-vm.md §12)', () => {
  it('a pod without the selector passes on any node', () => {
    assert.deepEqual(checkSnapshotCpuClass(pod('a', undefined, 'Pending', { zone: 'x' }), 'skylake'), {
      ok: true,
    });
    assert.deepEqual(checkSnapshotCpuClass(pod('a', undefined), undefined), { ok: true });
    assert.deepEqual(checkSnapshotCpuClass({}, 'skylake'), { ok: true });
  });

  it('an exact match passes', () => {
    assert.deepEqual(checkSnapshotCpuClass(pod('a', 'skylake'), 'skylake'), { ok: true });
  });

  it('a different class, a different case or an unset node class is refused', () => {
    for (const [wanted, node] of [
      ['icelake', 'skylake'],
      ['Skylake', 'skylake'],
      ['skylake', undefined],
      ['', undefined],
      ['', 'skylake'],
    ] as const) {
      const v = checkSnapshotCpuClass(pod('a', wanted), node);
      assert.equal(v.ok, false, `${wanted} on ${node}`);
      if (v.ok) continue;
      assert.equal(v.wanted, wanted);
      assert.equal(v.node, node);
      assert.match(v.message, new RegExp(`${SNAPSHOT_CPU_CLASS_LABEL}=${JSON.stringify(wanted)}`));
      assert.match(v.message, node === undefined ? /\(unset\)/ : new RegExp(`"${node}"`));
    }
  });

  it('Succeeded and Failed pods are exempt; other phases are not', () => {
    assert.equal(checkSnapshotCpuClass(pod('a', 'icelake', 'Succeeded'), 'skylake').ok, true);
    assert.equal(checkSnapshotCpuClass(pod('a', 'icelake', 'Failed'), 'skylake').ok, true);
    for (const phase of ['Pending', 'Running', 'Unknown', undefined])
      assert.equal(checkSnapshotCpuClass(pod('a', 'icelake', phase), 'skylake').ok, false, String(phase));
  });
});

describe('cpuClassStartupError (pod-to-vm.md §6 step 2)', () => {
  it('undefined when every non-terminal pod passes', () => {
    assert.equal(
      cpuClassStartupError(
        [pod('a', 'skylake'), pod('b', undefined), pod('c', 'icelake', 'Failed')],
        'skylake',
      ),
      undefined,
    );
    assert.equal(cpuClassStartupError([], undefined), undefined);
  });

  it('names every mismatching pod, its class and the node class', () => {
    const msg = cpuClassStartupError(
      [pod('a', 'icelake'), pod('ok', 'skylake'), pod('b', 'zen4', 'Running'), pod('done', 'x', 'Succeeded')],
      'skylake',
    );
    assert.ok(msg);
    assert.match(msg, /2 non-terminal pod\(s\)/);
    assert.match(msg, /ns\/a \("icelake"\), ns\/b \("zen4"\)/);
    assert.match(msg, /VK_SNAPSHOT_CPU_CLASS \("skylake"\)/);
    assert.doesNotMatch(msg, /ns\/ok|ns\/done/);
    assert.match(cpuClassStartupError([pod('a', 'icelake')], undefined) ?? '', /\(unset\)/);
  });
});
