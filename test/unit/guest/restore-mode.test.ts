import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseRestoreModeSetting, restoreModeFor } from '../../../src/guest/restore-mode.ts';

describe('restore mode (pod-to-vm.md §3.2)', () => {
  it('never for Firecracker', () => {
    assert.equal(restoreModeFor('firecracker', 'linux', 'mmap'), undefined);
  });

  it('Windows is always copy', () => {
    assert.equal(restoreModeFor('cloud-hypervisor', 'windows', 'ondemand'), 'copy');
    assert.equal(restoreModeFor('cloud-hypervisor', 'windows', 'mmap'), 'copy');
  });

  it('otherwise the configured mode', () => {
    assert.equal(restoreModeFor('cloud-hypervisor', 'linux', 'ondemand'), 'ondemand');
    assert.equal(restoreModeFor('cloud-hypervisor', 'android', 'mmap'), 'mmap');
  });

  it('VK_RESTORE_MODE: default ondemand, invalid values rejected', () => {
    assert.deepEqual(parseRestoreModeSetting(undefined), { ok: true, mode: 'ondemand' });
    assert.deepEqual(parseRestoreModeSetting(''), { ok: true, mode: 'ondemand' });
    assert.deepEqual(parseRestoreModeSetting('copy'), { ok: true, mode: 'copy' });
    assert.deepEqual(parseRestoreModeSetting('mmap'), { ok: true, mode: 'mmap' });
    const bad = parseRestoreModeSetting('Copy');
    assert.equal(bad.ok, false);
    assert.match(bad.ok ? '' : bad.error, /VK_RESTORE_MODE.*"Copy"/);
  });
});
