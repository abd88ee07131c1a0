// Every setting of the table is read by the daemon, or marked as kept for compatibility with
// the Go daemon and why (src/config/settings.ts); the check itself is shown to fail.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SETTINGS } from '../../../src/config/settings.ts';
import { daemonReads, propertyReads, unreadSettings } from './settings-read.ts';

test('every setting is read outside src/config, or marked compat with its reason', () => {
  assert.deepEqual(unreadSettings(SETTINGS, daemonReads()), []);
});

test('the compat rows are the Go daemon settings nothing reads, each with its reason', () => {
  const compat = SETTINGS.filter((s) => 'compat' in s);
  assert.deepEqual(
    compat.map((s) => s.name),
    ['VK_COCOON_MACOS_BIN', 'COCOON_MACOS_VNC_PASSWORD', 'EPOCH_URL', 'EPOCH_TOKEN', 'EPOCH_CA_CERT'],
  );
  for (const s of compat) assert.ok('compat' in s && s.compat.length > 20, s.name);
});

test('the check fails on a field nothing reads, an unread environment variable and a compat without a reason', () => {
  const reads = new Set(['nodeName', 'peer', 'listen', 'GOOGLE_APPLICATION_CREDENTIALS']);
  const rows = [
    { name: 'VK_NODE_NAME', field: 'nodeName' },
    { name: 'VK_PEER_ADDR', field: 'peer.listen' },
    { name: 'GOOGLE_APPLICATION_CREDENTIALS', readFromEnv: 'google-auth-library' },
    { name: 'VK_COCOON_MACOS_BIN', compat: 'a later tier: accepted and ignored' },
  ];
  assert.deepEqual(unreadSettings(rows, reads), []);
  assert.deepEqual(
    unreadSettings(
      [
        ...rows,
        { name: 'VK_DEAD', field: 'deadField' },
        { name: 'VK_PEER_DEAD', field: 'peer.deadField' },
        { name: 'VK_FROM_ENV', readFromEnv: 'nobody' },
        { name: 'VK_SHRUG', compat: ' ' },
        { name: 'VK_NOWHERE' },
      ],
      reads,
    ).map((line) => line.split(':')[0]),
    ['VK_DEAD', 'VK_PEER_DEAD', 'VK_FROM_ENV', 'VK_SHRUG', 'VK_NOWHERE'],
  );
});

test('the check fails on a row of the real table whose field the real sources never read', () => {
  const reads = daemonReads();
  const fake = { name: 'VK_NEVER_READ', field: 'settingNothingReadsAnywhere' };
  assert.deepEqual(
    unreadSettings([...SETTINGS, fake], reads).map((line) => line.split(':')[0]),
    ['VK_NEVER_READ'],
  );
  // Without the field, the row of a setting read only here is caught too.
  const kubeletPort = SETTINGS.find((s) => s.name === 'VK_KUBELET_PORT')!;
  const without = new Set([...reads].filter((r) => r !== 'kubeletPort'));
  assert.deepEqual(unreadSettings([kubeletPort], without).length, 1);
});

test('a read is a property read in code: not a comment, a type member or an object literal key', () => {
  const source = `
    // config.inComment
    /** config.inDoc */
    interface C { declared: string; }
    const made = { literalKey: 1 };
    const s = 'config.inString';
    const a = config.dotted + config?.optional + config['bracketed'];
    const { destructured, renamed: other } = config.peer;
    function f({ parameter }: C) { return parameter; }
    const e = process.env.VK_SOMETHING;
  `;
  const reads = propertyReads('x.ts', source);
  for (const r of [
    'dotted',
    'optional',
    'bracketed',
    'destructured',
    'renamed',
    'peer',
    'parameter',
    'VK_SOMETHING',
  ])
    assert.ok(reads.has(r), r);
  for (const r of ['inComment', 'inDoc', 'declared', 'literalKey', 'inString', 'other'])
    assert.ok(!reads.has(r), r);
});
