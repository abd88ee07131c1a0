import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { register as globalRegister } from 'prom-client';
import {
  BOOT_DURATION_BUCKETS,
  createMetrics,
  type Metrics,
  POSTCLONE_RETRY_ATTEMPT_BUCKETS,
} from '../../../src/metrics/registry.ts';
import { familyOf, parsePromText } from './prom-text.ts';

type Type = 'counter' | 'gauge' | 'histogram';

/**
 * pod-to-vm.md §11, one row per metric name (the `_x` shorthands of the spec table expanded
 * with the `cocoon_vk` prefix). Per-VM gauges are the two non-cumulative ones.
 */
const VM = ['vm', 'pod', 'namespace', 'backend'];
const SPEC: ReadonlyArray<readonly [string, Type, readonly string[]]> = [
  ['cocoon_vk_pod_lifecycle_total', 'counter', ['op', 'result', 'reason']],
  ['cocoon_vk_snapshot_pull_total', 'counter', ['result']],
  ['cocoon_vk_snapshot_save_total', 'counter', ['result']],
  ['cocoon_vk_snapshot_push_total', 'counter', ['result']],
  // Beyond §11: the delete-time pushes deferred past a registry outage (docs/registry.md).
  ['cocoon_vk_snapshot_deferred_push_total', 'counter', ['result']],
  ['cocoon_vk_snapshot_deferred_pushes', 'gauge', []],
  ['cocoon_vk_snapshot_verify_total', 'counter', ['result']],
  ['cocoon_vk_snapshot_peer_restore_total', 'counter', ['result']],
  ['cocoon_vk_clone_from_dir_total', 'counter', ['result']],
  ['cocoon_vk_orphan_vm_total', 'counter', []],
  ['cocoon_vk_vm_inspect_transient_fail_total', 'counter', []],
  ['cocoon_vk_pod_evict_failure_total', 'counter', []],
  ['cocoon_vk_reconcile_adopt_by_name_total', 'counter', []],
  ['cocoon_vk_stale_create_reconcile_total', 'counter', ['outcome']],
  ['cocoon_vk_startup_resume_total', 'counter', ['op']],
  ['cocoon_vk_hibernate_evidence_total', 'counter', ['verdict']],
  ['cocoon_vk_vm_boot_duration_seconds', 'histogram', ['namespace', 'mode', 'backend']],
  ['cocoon_vk_snapshot_save_duration_seconds', 'histogram', ['namespace']],
  ['cocoon_vk_snapshot_push_duration_seconds', 'histogram', ['namespace']],
  ['cocoon_vk_snapshot_peer_restore_duration_seconds', 'histogram', ['namespace']],
  ['cocoon_vk_probe_duration_seconds', 'histogram', ['namespace']],
  ['cocoon_vk_snapshot_pull_duration_seconds', 'histogram', []],
  ['cocoon_vk_hibernate_total', 'counter', ['namespace', 'phase', 'result']],
  ['cocoon_vk_lease_release_total', 'counter', ['result']],
  ['cocoon_vk_wake_total', 'counter', ['result']],
  ['cocoon_vk_wake_renew_nudge_total', 'counter', ['result']],
  ['cocoon_vk_wake_ip_wait_total', 'counter', ['namespace', 'result']],
  ['cocoon_vk_postclone_total', 'counter', ['kind', 'result']],
  ['cocoon_vk_postclone_retry_attempts', 'histogram', ['result']],
  ['cocoon_vk_vm_cpu_seconds_total', 'counter', VM],
  ['cocoon_vk_vm_cpu_throttled_seconds_total', 'counter', VM],
  ['cocoon_vk_vm_cpu_throttled_periods_total', 'counter', VM],
  ['cocoon_vk_vm_memory_rss_bytes', 'gauge', VM],
  ['cocoon_vk_vm_disk_cow_bytes', 'gauge', VM],
  ['cocoon_vk_vm_network_rx_bytes_total', 'counter', VM],
  ['cocoon_vk_vm_network_tx_bytes_total', 'counter', VM],
  ['cocoon_vk_vm_cpu_source', 'gauge', ['source']],
  ['cocoon_vk_node_cpu_seconds_total', 'counter', []],
  ['cocoon_vk_node_memory_used_bytes', 'gauge', []],
  ['cocoon_vk_node_storage_available_bytes', 'gauge', []],
  ['cocoon_vk_node_storage_total_bytes', 'gauge', []],
  ['cocoon_vk_ready_deadline_exceeded_total', 'counter', []],
  ['cocoon_vk_readiness_reconcile_total', 'counter', ['step']],
  // TS additions: the peer server and client (docs/peer-restore.md).
  ['cocoon_vk_peer_server_streams', 'gauge', []],
  ['cocoon_vk_peer_server_bytes_total', 'counter', []],
  ['cocoon_vk_peer_server_requests_total', 'counter', ['route', 'result']],
  ['cocoon_vk_peer_server_refusals_total', 'counter', ['reason']],
  ['cocoon_vk_peer_restores_active', 'gauge', []],
  ['cocoon_vk_peer_restore_bytes_total', 'counter', []],
];

/** Touches every family once through its typed handle so each one has a sample. */
function touchAll(m: Metrics): void {
  m.podLifecycle.inc({ op: 'create', result: 'skipped', reason: 'missing_vmname' });
  m.snapshotPull.inc({ result: 'ok' });
  m.snapshotSave.inc({ result: 'ok' });
  m.snapshotPush.inc({ result: 'failed' });
  m.deferredPush.inc({ result: 'deferred' });
  m.deferredPushesPending.set(1);
  m.snapshotVerify.inc({ result: 'stale' });
  m.snapshotPeerRestore.inc({ result: 'ok' });
  m.cloneFromDir.inc({ result: 'ok' });
  m.orphanVm.inc();
  m.vmInspectTransientFail.inc();
  m.podEvictFailure.inc();
  m.reconcileAdoptByName.inc();
  m.staleCreateReconcile.inc({ outcome: 'collected' });
  m.startupResume.inc({ op: 'post_clone' });
  m.hibernateEvidence.inc({ verdict: 'restored' });
  m.vmBootDuration.observe({ namespace: 'ns', mode: 'clone', backend: 'cloud-hypervisor' }, 3);
  m.snapshotSaveDuration.observe({ namespace: 'ns' }, 3);
  m.snapshotPushDuration.observe({ namespace: 'ns' }, 3);
  m.snapshotPeerRestoreDuration.observe({ namespace: 'ns' }, 3);
  m.probeDuration.observe({ namespace: 'ns' }, 0.02);
  m.snapshotPullDuration.observe(3);
  m.hibernate.inc({ namespace: 'ns', phase: 'snapshot', result: 'ok' });
  m.leaseRelease.inc({ result: 'ok' });
  m.wake.inc({ result: 'ok' });
  m.wakeRenewNudge.inc({ result: 'ok' });
  m.wakeIpWait.inc({ namespace: 'ns', result: 'timeout' });
  m.postclone.inc({ kind: 'linux_static', result: 'ok' });
  m.postcloneRetryAttempts.observe({ result: 'ok' }, 3);
  m.readyDeadlineExceeded.inc();
  m.readinessReconcile.inc({ step: 'fixup' });
  const vm = { vm: 'vk-ns-a', pod: 'a', namespace: 'ns', backend: 'firecracker' };
  m.vm.cpuSeconds.inc(vm, 1);
  m.vm.cpuThrottledSeconds.inc(vm, 1);
  m.vm.cpuThrottledPeriods.inc(vm, 1);
  m.vm.memoryRssBytes.set(vm, 1);
  m.vm.diskCowBytes.set(vm, 1);
  m.vm.networkRxBytes.inc(vm, 1);
  m.vm.networkTxBytes.inc(vm, 1);
  m.vm.cpuSource.set({ source: 'cgroup' }, 1);
  m.node.cpuSeconds.inc(1);
  m.node.memoryUsedBytes.set(1);
  m.node.storageAvailableBytes.set(1);
  m.node.storageTotalBytes.set(1);
  m.peer.serverStreams.set(1);
  m.peer.serverBytes.inc(1);
  m.peer.serverRequests.inc({ route: 'slice', result: 'ok' });
  m.peer.serverRefusals.inc({ reason: 'unauthorized' });
  m.peer.restoresActive.inc();
  m.peer.restoreBytes.inc(1);
}

describe('createMetrics', () => {
  it('declares exactly the §11 families with the right type, even before any observation', async () => {
    const text = parsePromText(await createMetrics().render());
    const declared = [...text.families.values()].map((f) => [f.name, f.type]).sort();
    const expected = SPEC.map(([name, type]) => [name, type]).sort();
    assert.deepEqual(declared, expected);
    for (const f of text.families.values()) {
      assert.ok(f.help && f.help.length > 0, `${f.name} has HELP`);
      assert.match(f.name, /^cocoon_vk_/);
    }
  });

  it('emits every family with exactly the spec labels', async () => {
    const m = createMetrics();
    touchAll(m);
    const text = parsePromText(await m.render());
    for (const [name, type, labels] of SPEC) {
      const samples = text.samples.filter((s) => familyOf(text, s.name)?.name === name);
      assert.ok(samples.length > 0, `${name} has samples`);
      for (const s of samples) {
        const keys = Object.keys(s.labels)
          .filter((k) => !(type === 'histogram' && k === 'le'))
          .sort();
        assert.deepEqual(keys, [...labels].sort(), `labels of ${s.line}`);
      }
    }
  });

  it('uses the spec buckets for boot duration and post-clone retry attempts', async () => {
    const m = createMetrics();
    m.vmBootDuration.observe({ namespace: 'ns', mode: 'run', backend: 'firecracker' }, 7);
    m.postcloneRetryAttempts.observe({ result: 'failed' }, 40);
    const text = parsePromText(await m.render());
    const les = (name: string) =>
      text.samples.filter((s) => s.name === `${name}_bucket`).map((s) => s.labels.le as string);
    assert.deepEqual(les('cocoon_vk_vm_boot_duration_seconds'), [
      ...BOOT_DURATION_BUCKETS.map(String),
      '+Inf',
    ]);
    assert.equal(BOOT_DURATION_BUCKETS[0], 0.5);
    assert.equal(BOOT_DURATION_BUCKETS.at(-1), 300);
    assert.deepEqual(les('cocoon_vk_postclone_retry_attempts'), [
      '1',
      '2',
      '5',
      '10',
      '20',
      '40',
      '60',
      '+Inf',
    ]);
    assert.deepEqual([...POSTCLONE_RETRY_ATTEMPT_BUCKETS], [1, 2, 5, 10, 20, 40, 60]);
    const bucket = (name: string, le: string) =>
      text.samples.find((s) => s.name === `${name}_bucket` && s.labels.le === le)?.value;
    assert.equal(bucket('cocoon_vk_vm_boot_duration_seconds', '5'), 0);
    assert.equal(bucket('cocoon_vk_vm_boot_duration_seconds', '10'), 1);
    assert.equal(bucket('cocoon_vk_postclone_retry_attempts', '20'), 0);
    assert.equal(bucket('cocoon_vk_postclone_retry_attempts', '40'), 1);
  });

  it('counts through the typed handles', async () => {
    const m = createMetrics();
    m.podLifecycle.inc({ op: 'delete', result: 'failed', reason: 'DeleteFailed' });
    m.podLifecycle.inc({ op: 'delete', result: 'failed', reason: 'DeleteFailed' });
    m.orphanVm.inc(3);
    const end = m.probeDuration.startTimer({ namespace: 'ns' });
    const seconds = end();
    const text = parsePromText(await m.render());
    const v = (name: string, labels: Record<string, string> = {}) =>
      text.samples.find((s) => s.name === name && Object.entries(labels).every(([k, x]) => s.labels[k] === x))
        ?.value;
    assert.equal(
      v('cocoon_vk_pod_lifecycle_total', { op: 'delete', result: 'failed', reason: 'DeleteFailed' }),
      2,
    );
    assert.equal(v('cocoon_vk_orphan_vm_total'), 3);
    assert.equal(v('cocoon_vk_probe_duration_seconds_count', { namespace: 'ns' }), 1);
    // The observed value is the one returned. `< 5` is a unit check, not a speed check: the
    // timer ran for microseconds, so ms or ns would exceed it, and 5 s is far more than 10
    // times what even a stalled machine takes between two statements.
    assert.equal(v('cocoon_vk_probe_duration_seconds_sum', { namespace: 'ns' }), seconds);
    assert.ok(seconds >= 0 && seconds < 5);
  });

  it('keeps registries isolated from each other and from the global default', async () => {
    const a = createMetrics();
    const b = createMetrics();
    a.orphanVm.inc();
    const bt = parsePromText(await b.render());
    assert.equal(bt.samples.find((s) => s.name === 'cocoon_vk_orphan_vm_total')?.value, 0);
    assert.equal(globalRegister.getSingleMetric('cocoon_vk_orphan_vm_total'), undefined);
  });

  it('runs the collect hook once per scrape and renders what it set', async () => {
    const m = createMetrics();
    let calls = 0;
    m.setCollectHook(async () => {
      calls++;
      await new Promise((r) => setTimeout(r, 5));
      m.node.memoryUsedBytes.set(calls * 100);
    });
    const t1 = parsePromText(await m.render());
    assert.equal(calls, 1);
    assert.equal(t1.samples.find((s) => s.name === 'cocoon_vk_node_memory_used_bytes')?.value, 100);
    const t2 = parsePromText(await m.render());
    assert.equal(calls, 2);
    assert.equal(t2.samples.find((s) => s.name === 'cocoon_vk_node_memory_used_bytes')?.value, 200);
  });

  it('still renders when the collect hook throws', async () => {
    const m = createMetrics();
    m.podEvictFailure.inc();
    m.setCollectHook(() => {
      throw new Error('boom');
    });
    const text = parsePromText(await m.render());
    assert.equal(text.samples.find((s) => s.name === 'cocoon_vk_pod_evict_failure_total')?.value, 1);
    m.setCollectHook(undefined);
    await m.render();
  });
});
