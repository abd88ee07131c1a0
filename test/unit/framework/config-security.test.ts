// The settings of issue 18's kubelet and metrics hardening (README.md "Configuration"):
// debug endpoints only on a loopback metrics listener, VK_KUBELET_AUTH=none only with a
// loopback node IP, the connection cap and the per-VM metric labels; each refusal names the
// settings involved.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig } from '../../../src/config/env.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/registry.ts';
import { startMetricsServer } from '../../../src/metrics/server.ts';

describe('VK_DEBUG_ENDPOINTS', () => {
  it('is refused with a metrics listener on every interface or a non-loopback host, naming both settings', () => {
    for (const addr of [
      ':9091',
      '0.0.0.0:9091',
      '[::]:9091',
      '10.0.0.5:9091',
      'node-a.example:9091',
      undefined,
    ]) {
      const env = { VK_DEBUG_ENDPOINTS: 'true', ...(addr === undefined ? {} : { VK_METRICS_ADDR: addr }) };
      assert.throws(
        () => loadConfig(env),
        (err: Error) =>
          /VK_DEBUG_ENDPOINTS=true needs VK_METRICS_ADDR on a loopback host/.test(err.message) &&
          err.message.includes(JSON.stringify(addr ?? ':9091')),
        String(addr),
      );
    }
  });

  it('is accepted on a loopback listener, and off or with the listener disabled anywhere', () => {
    for (const addr of ['127.0.0.1:9091', '127.0.0.2:9091', '[::1]:9091', 'localhost:9091', ''])
      assert.equal(
        loadConfig({ VK_DEBUG_ENDPOINTS: 'true', VK_METRICS_ADDR: addr }).debugEndpoints,
        true,
        addr,
      );
    assert.equal(loadConfig({ VK_METRICS_ADDR: ':9091' }).debugEndpoints, false);
  });

  it('the listener itself refuses the debug endpoints on every interface', async () => {
    await assert.rejects(
      startMetricsServer({ addr: ':0', metrics: createMetrics(), log: silentLogger, debugEndpoints: true }),
      /VK_DEBUG_ENDPOINTS=true needs VK_METRICS_ADDR on a loopback host, not ":0"/,
    );
  });
});

describe('VK_KUBELET_AUTH=none', () => {
  it('is refused unless VK_NODE_IP is a loopback address', () => {
    assert.throws(
      () => loadConfig({ VK_KUBELET_AUTH: 'none' }),
      /VK_KUBELET_AUTH=none needs VK_NODE_IP to be a loopback address.*\(unset/,
    );
    assert.throws(
      () => loadConfig({ VK_KUBELET_AUTH: 'none', VK_NODE_IP: '10.0.0.7' }),
      /VK_KUBELET_AUTH=none needs VK_NODE_IP to be a loopback address \(e.g. 127.0.0.1\), not "10.0.0.7"/,
    );
    const c = loadConfig({ VK_KUBELET_AUTH: 'none', VK_NODE_IP: '127.0.0.1' });
    assert.equal(c.kubeletAuth, 'none');
    assert.equal(loadConfig({ VK_NODE_IP: '10.0.0.7' }).kubeletAuth, 'webhook');
  });

  it('is refused for every non-loopback listen address, naming both settings and where the API listens', () => {
    for (const ip of ['10.0.0.7', '0.0.0.0', '192.168.1.1', '128.0.0.1', '172.16.0.1'])
      assert.throws(
        () => loadConfig({ VK_KUBELET_AUTH: 'none', VK_NODE_IP: ip }),
        (err: Error) =>
          err instanceof ConfigError &&
          err.message.includes(`VK_KUBELET_AUTH=none needs VK_NODE_IP to be a loopback address`) &&
          err.message.includes(`not ${JSON.stringify(ip)}`) &&
          /the kubelet API then listens on VK_NODE_IP alone/.test(err.message),
        ip,
      );
    // Case and spacing of the value do not get it past the rule.
    assert.throws(
      () => loadConfig({ VK_KUBELET_AUTH: ' NONE ', VK_NODE_IP: '10.0.0.7' }),
      /VK_KUBELET_AUTH=none/,
    );
  });

  it('is accepted on any loopback listen address (127.0.0.0/8), and webhook anywhere', () => {
    for (const ip of ['127.0.0.1', '127.0.0.7', '127.255.255.254'])
      assert.equal(loadConfig({ VK_KUBELET_AUTH: 'none', VK_NODE_IP: ip }).kubeletAuth, 'none', ip);
    for (const ip of ['10.0.0.7', '127.0.0.1'])
      assert.equal(loadConfig({ VK_KUBELET_AUTH: 'webhook', VK_NODE_IP: ip }).kubeletAuth, 'webhook', ip);
  });
});

describe('VK_KUBELET_MAX_CONNECTIONS and VK_METRICS_VM_LABELS', () => {
  it('default to 256 and true, and are validated', () => {
    const c = loadConfig({});
    assert.equal(c.kubeletMaxConnections, 256);
    assert.equal(c.metricsVmLabels, true);
    assert.equal(loadConfig({ VK_KUBELET_MAX_CONNECTIONS: '1024' }).kubeletMaxConnections, 1024);
    assert.equal(loadConfig({ VK_METRICS_VM_LABELS: 'false' }).metricsVmLabels, false);
    assert.throws(() => loadConfig({ VK_KUBELET_MAX_CONNECTIONS: '0' }), /VK_KUBELET_MAX_CONNECTIONS="0"/);
    assert.throws(() => loadConfig({ VK_METRICS_VM_LABELS: 'no' }), /VK_METRICS_VM_LABELS="no"/);
  });
});
