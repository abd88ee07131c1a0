// The settings table (src/config/settings.ts) is one consistent source: one row per variable
// and per Config field, documented defaults that are the parser's, rules across settings that
// name settings of the table, and renderings (--help, README, env example) grouped alike.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { envExample } from '../../../packaging/env-example.ts';
import { configTable } from '../../../scripts/config-table.ts';
import { ConfigError, CROSS_CHECKS, ENV_DOCS, helpText, loadConfig } from '../../../src/config/env.ts';
import { GROUPS, isFieldSetting } from '../../../src/config/setting.ts';
import { SETTINGS } from '../../../src/config/settings.ts';

test('one row per variable and per Config field, each documented', () => {
  const names = SETTINGS.map((s) => s.name);
  assert.equal(new Set(names).size, names.length, 'variables');
  const fields = SETTINGS.filter(isFieldSetting).map((s) => s.field);
  assert.equal(new Set(fields).size, fields.length, 'fields');
  for (const s of SETTINGS) assert.ok(s.doc.length > 10, s.name);
  assert.deepEqual(
    ENV_DOCS.map((d) => d.name),
    names,
  );
});

test('the rows are grouped in GROUPS order', () => {
  const order = Object.keys(GROUPS);
  const seen = SETTINGS.map((s) => order.indexOf(s.group));
  assert.deepEqual(
    seen,
    [...seen].sort((a, b) => a - b),
  );
});

test('every documented default is the parser default: setting it changes nothing', () => {
  const defaults = loadConfig({});
  for (const d of ENV_DOCS) {
    if (d.default.startsWith('(')) continue;
    const { ignoredLaterTier: _, ...set } = loadConfig({ [d.name]: d.default });
    const { ignoredLaterTier: __, ...unset } = defaults;
    assert.deepEqual(set, unset, d.name);
  }
});

test('an empty value is the default, except for the rows where it disables', () => {
  const defaults = loadConfig({});
  const emptied = Object.fromEntries(SETTINGS.map((s) => [s.name, '']));
  const c = loadConfig(emptied);
  assert.deepEqual(
    { ...c, metricsAddr: defaults.metricsAddr, netControlSocket: defaults.netControlSocket },
    { ...defaults, peer: { ...defaults.peer, listen: undefined } },
  );
  assert.deepEqual([c.metricsAddr, c.netControlSocket, c.peer.listen], ['', '', undefined]);
  assert.deepEqual(
    ENV_DOCS.filter((d) => d.emptyIsValue).map((d) => d.name),
    ['VK_METRICS_ADDR', 'VK_COCOON_NET_CONTROL_SOCKET', 'VK_PEER_ADDR'],
  );
});

test('every rule across settings names settings of the table', () => {
  const names = new Set(SETTINGS.map((s) => s.name));
  for (const rule of CROSS_CHECKS) for (const n of rule.settings) assert.ok(names.has(n), n);
});

test('a bad value of a setting in a rule is reported once, by its own parser, not again by the rule', () => {
  assert.throws(
    () => loadConfig({ VK_KUBELET_AUTH: 'none', VK_NODE_IP: 'localhost' }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.message === 'invalid configuration:\n  VK_NODE_IP="localhost": expected an IPv4 address',
  );
});

test('--help, the README table and the env example list the groups in the same order', () => {
  const titles = Object.values(GROUPS);
  const at = (text: string) => titles.map((t) => text.indexOf(t));
  for (const [what, text] of [
    ['--help', helpText()],
    ['README', configTable()],
    ['env example', envExample()],
  ] as const) {
    const positions = at(text);
    assert.ok(
      positions.every((p) => p >= 0),
      what,
    );
    assert.deepEqual(
      positions,
      [...positions].sort((a, b) => a - b),
      what,
    );
  }
});

test('compat rows say so wherever they are documented', () => {
  const help = helpText();
  for (const s of SETTINGS)
    if ('compat' in s) {
      assert.match(help, new RegExp(`${s.name} .*Compatibility only: `), s.name);
      assert.ok(configTable().includes(s.compat), s.name);
    }
});
