// Client rate limits for a node of hundreds of pods (issue 9, docs/decisions.md "Client rate
// limits"): kubelet-like defaults, three separate budgets (pod writes, events, heartbeats),
// each configurable with strict validation naming the variable, documented in --help.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, ENV_DOCS, helpText, loadConfig } from '../../../src/config/env.ts';
import {
  DEFAULT_EVENT_BURST,
  DEFAULT_EVENT_QPS,
  DEFAULT_HEARTBEAT_BURST,
  DEFAULT_HEARTBEAT_QPS,
  DEFAULT_KUBE_BURST,
  DEFAULT_KUBE_QPS,
  Kube,
} from '../../../src/kube/client.ts';
import { fakeKubeConfig } from '../fakes/kube.ts';

test('defaults: pod writes 50/100 (kubelet kubeAPIQPS/kubeAPIBurst), events 25/50, heartbeats 5/10', () => {
  const c = loadConfig({});
  assert.deepEqual(
    [c.kubeQps, c.kubeBurst, c.kubeEventQps, c.kubeEventBurst, c.kubeHeartbeatQps, c.kubeHeartbeatBurst],
    [50, 100, 25, 50, 5, 10],
  );
  // The client's own defaults are the documented ones.
  assert.deepEqual(
    [DEFAULT_KUBE_QPS, DEFAULT_KUBE_BURST, DEFAULT_EVENT_QPS, DEFAULT_EVENT_BURST],
    [c.kubeQps, c.kubeBurst, c.kubeEventQps, c.kubeEventBurst],
  );
  assert.deepEqual(
    [DEFAULT_HEARTBEAT_QPS, DEFAULT_HEARTBEAT_BURST],
    [c.kubeHeartbeatQps, c.kubeHeartbeatBurst],
  );
  const kube = new Kube(fakeKubeConfig());
  assert.deepEqual(
    [kube.writes.qps, kube.writes.burst, kube.eventWrites.qps, kube.heartbeatWrites.qps],
    [50, 100, 25, 5],
  );
});

test('every budget is set by its variable; an unset burst is twice the rate', () => {
  const c = loadConfig({
    VK_KUBE_QPS: '200',
    VK_KUBE_BURST: '300',
    VK_KUBE_EVENT_QPS: '40',
    VK_KUBE_HEARTBEAT_QPS: '8',
    VK_KUBE_HEARTBEAT_BURST: '8',
  });
  assert.deepEqual(
    [c.kubeQps, c.kubeBurst, c.kubeEventQps, c.kubeEventBurst, c.kubeHeartbeatQps, c.kubeHeartbeatBurst],
    [200, 300, 40, 80, 8, 8],
  );
  // The old explicit settings still mean what they meant.
  const old = loadConfig({
    VK_KUBE_QPS: '20',
    VK_KUBE_BURST: '40',
    VK_KUBE_EVENT_QPS: '10',
    VK_KUBE_EVENT_BURST: '20',
  });
  assert.deepEqual([old.kubeQps, old.kubeBurst, old.kubeEventQps, old.kubeEventBurst], [20, 40, 10, 20]);
  assert.equal(loadConfig({ VK_KUBE_QPS: '10000' }).kubeBurst, 10_000, 'the doubled default stays in range');
});

test('a bad budget stops startup with a message naming the variable; all problems at once', () => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ VK_KUBE_QPS: '0' }, /VK_KUBE_QPS="0": expected an integer from 1 to 10000/],
    [{ VK_KUBE_QPS: '2.5' }, /VK_KUBE_QPS="2.5"/],
    [{ VK_KUBE_BURST: '-1' }, /VK_KUBE_BURST="-1"/],
    [{ VK_KUBE_HEARTBEAT_QPS: 'fast' }, /VK_KUBE_HEARTBEAT_QPS="fast": expected an integer/],
    [{ VK_KUBE_HEARTBEAT_BURST: '10001' }, /VK_KUBE_HEARTBEAT_BURST="10001"/],
    [
      { VK_KUBE_HEARTBEAT_QPS: '9', VK_KUBE_HEARTBEAT_BURST: '3' },
      /VK_KUBE_HEARTBEAT_BURST=3: expected at least VK_KUBE_HEARTBEAT_QPS \(9\)/,
    ],
    [{ VK_KUBE_QPS: '80', VK_KUBE_BURST: '60' }, /VK_KUBE_BURST=60: expected at least VK_KUBE_QPS \(80\)/],
  ];
  for (const [env, re] of cases) {
    assert.throws(
      () => loadConfig(env),
      (err: unknown) => err instanceof ConfigError && re.test(err.message),
      JSON.stringify(env),
    );
  }
  assert.throws(
    () => loadConfig({ VK_KUBE_QPS: 'x', VK_KUBE_EVENT_BURST: 'y', VK_KUBE_HEARTBEAT_QPS: '0' }),
    (err: unknown) =>
      err instanceof ConfigError &&
      /VK_KUBE_QPS="x"/.test(err.message) &&
      /VK_KUBE_EVENT_BURST="y"/.test(err.message) &&
      /VK_KUBE_HEARTBEAT_QPS="0"/.test(err.message),
  );
});

test('--help documents every budget variable with its default', () => {
  const help = helpText();
  for (const [name, def] of [
    ['VK_KUBE_QPS', '50'],
    ['VK_KUBE_BURST', '100'],
    ['VK_KUBE_EVENT_QPS', '25'],
    ['VK_KUBE_EVENT_BURST', '50'],
    ['VK_KUBE_HEARTBEAT_QPS', '5'],
    ['VK_KUBE_HEARTBEAT_BURST', '10'],
  ] as const) {
    assert.equal(ENV_DOCS.find((d) => d.name === name)?.default, def, name);
    assert.match(help, new RegExp(`${name} .*\\[default: ${def}\\]`));
  }
});
