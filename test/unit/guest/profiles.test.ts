// Guest profiles (src/guest/profiles.ts): one decided row per guest OS of the contract.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GUEST_OSES } from '../../../src/contract/vm.ts';
import { GUEST_PROFILES, guestProfile, WINDOWS_RENEW_ARGV } from '../../../src/guest/profiles.ts';

test('every guest OS of the contract has a profile, and no profile names another OS', () => {
  assert.deepEqual(Object.keys(GUEST_PROFILES).sort(), [...GUEST_OSES].sort());
});

test('Windows: PnP fixup, serial-console static IP, renew nudge, no console log, copy restore, run --windows', () => {
  const w = guestProfile('windows');
  assert.equal(w.fixup, 'pnp');
  assert.equal(w.staticIpOverSerialConsole, true);
  assert.deepEqual(w.renewNudge, WINDOWS_RENEW_ARGV);
  assert.deepEqual(WINDOWS_RENEW_ARGV, ['cmd', '/c', 'ipconfig', '/renew']);
  assert.equal(w.consoleLogs.kind, 'none');
  assert.equal(w.restoreMode, 'copy');
  assert.equal(w.runWindowsFlag, true);
});

test('Android is decided like Linux, explicitly', () => {
  assert.deepEqual(guestProfile('android'), guestProfile('linux'));
  assert.equal(guestProfile('linux').fixup, 'linux');
  assert.equal(guestProfile('linux').consoleLogs.kind, 'cocoon');
});

test('macOS is not supported by this release and says so', () => {
  const m = guestProfile('macos');
  assert.equal(m.supported.ok, false);
  assert.match(m.supported.ok ? '' : m.supported.message, /macOS guests belong to a later tier/);
});
