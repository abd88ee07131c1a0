import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, loadConfig } from '../../../src/config/env.ts';
import { DEFAULT_EVENT_BURST, DEFAULT_EVENT_QPS } from '../../../src/kube/client.ts';

test('events have their own write budget: VK_KUBE_EVENT_QPS / VK_KUBE_EVENT_BURST', () => {
  const c = loadConfig({});
  assert.equal(c.kubeEventQps, 25);
  assert.equal(c.kubeEventBurst, 50);
  // The Kube client's defaults are the documented ones.
  assert.equal(DEFAULT_EVENT_QPS, c.kubeEventQps);
  assert.equal(DEFAULT_EVENT_BURST, c.kubeEventBurst);
  const set = loadConfig({ VK_KUBE_EVENT_QPS: '50', VK_KUBE_EVENT_BURST: '100' });
  assert.equal(set.kubeEventQps, 50);
  assert.equal(set.kubeEventBurst, 100);
});

test('bad event budgets stop startup naming the variable', () => {
  for (const [env, re] of [
    [{ VK_KUBE_EVENT_QPS: '0' }, /VK_KUBE_EVENT_QPS="0": expected an integer from 1 to 10000/],
    [{ VK_KUBE_EVENT_BURST: 'lots' }, /VK_KUBE_EVENT_BURST="lots"/],
    [
      { VK_KUBE_EVENT_QPS: '30', VK_KUBE_EVENT_BURST: '10' },
      /VK_KUBE_EVENT_BURST=10: expected at least VK_KUBE_EVENT_QPS \(30\)/,
    ],
  ] as const) {
    assert.throws(
      () => loadConfig(env),
      (err: unknown) => err instanceof ConfigError && re.test(err.message),
    );
  }
});
