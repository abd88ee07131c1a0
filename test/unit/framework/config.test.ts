import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ConfigError, ENV_DOCS, helpText, loadConfig } from '../../../src/config/env.ts';

test('defaults match the Go implementation', () => {
  const c = loadConfig({});
  assert.equal(c.nodeName, 'cocoon-pool');
  assert.equal(c.kubeletPort, 10250);
  assert.equal(c.metricsAddr, ':9091');
  assert.equal(c.orphanPolicy, 'destroy');
  assert.equal(c.restoreMode, 'ondemand');
  assert.equal(c.reservePercent, 20);
  assert.equal(c.nodePods, 256);
  assert.equal(c.readyDeadlineSeconds, 600);
  assert.equal(c.reconcileIntervalSeconds, 15);
  assert.equal(c.netControlSocket, '/run/cocoon-net/control.sock');
  assert.equal(c.leasesPath, '/var/lib/cocoon/net/leases.json');
  assert.equal(c.kubeletAuth, 'webhook');
  assert.equal(c.streamIdleTimeoutSeconds, 14400);
  assert.deepEqual(c.ignoredLaterTier, []);
});

test('an explicitly empty control socket disables lease release; unset keeps the default', () => {
  assert.equal(loadConfig({ VK_COCOON_NET_CONTROL_SOCKET: '' }).netControlSocket, '');
  assert.equal(loadConfig({}).netControlSocket, '/run/cocoon-net/control.sock');
});

test('a bad value stops startup naming the variable and the accepted values', () => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ VK_ORPHAN_POLICY: 'nuke' }, /VK_ORPHAN_POLICY="nuke": expected one of destroy, alert, keep/],
    [{ VK_RESTORE_MODE: 'lazy' }, /VK_RESTORE_MODE="lazy": expected one of copy, ondemand, mmap/],
    [{ VK_READY_DEADLINE_SECONDS: '300' }, /VK_READY_DEADLINE_SECONDS="300": expected an integer from 480/],
    [
      { VK_RECONCILE_INTERVAL_SECONDS: '0' },
      /VK_RECONCILE_INTERVAL_SECONDS="0": expected an integer from 1 to 60/,
    ],
    [{ VK_KUBELET_PORT: '70000' }, /VK_KUBELET_PORT/],
    [{ VK_RESERVE_PERCENT: '-1' }, /VK_RESERVE_PERCENT/],
    [{ VK_NODE_IP: '10.0.0' }, /VK_NODE_IP="10.0.0": expected an IPv4 address/],
    [{ VK_NODE_NAME: 'Bad_Name' }, /VK_NODE_NAME/],
    [{ VK_NODE_CPU: 'lots' }, /VK_NODE_CPU="lots": expected a Kubernetes quantity/],
    [{ VK_KUBELET_AUTH: 'off' }, /VK_KUBELET_AUTH/],
    [{ VK_REGISTRY_PLAIN_HTTP: 'yes' }, /VK_REGISTRY_PLAIN_HTTP="yes": expected true or false/],
    [{ VK_SNAPSHOT_CPU_CLASS: 'not a label' }, /VK_SNAPSHOT_CPU_CLASS/],
    [{ VK_METRICS_ADDR: 'nope' }, /VK_METRICS_ADDR/],
    [{ VK_KUBE_QPS: '50', VK_KUBE_BURST: '10' }, /VK_KUBE_BURST=10: expected at least VK_KUBE_QPS/],
  ];
  for (const [env, re] of cases) {
    assert.throws(
      () => loadConfig(env),
      (err: unknown) => err instanceof ConfigError && re.test(err.message),
      JSON.stringify(env),
    );
  }
});

test('every problem is reported at once', () => {
  assert.throws(
    () => loadConfig({ VK_ORPHAN_POLICY: 'x', VK_RESTORE_MODE: 'y' }),
    (err: unknown) =>
      err instanceof ConfigError &&
      /VK_ORPHAN_POLICY/.test(err.message) &&
      /VK_RESTORE_MODE/.test(err.message),
  );
});

test('later-tier variables are accepted and listed for the startup log', () => {
  const c = loadConfig({ VK_COCOON_MACOS_BIN: '/opt/cocoon-macos', VK_STAGING_DIR: '/tmp/x' });
  assert.deepEqual(c.ignoredLaterTier.sort(), ['VK_COCOON_MACOS_BIN']);
});

test('settings this build cannot honour refuse the startup, each naming what to set instead', () => {
  const refused = (env: Record<string, string>) => {
    try {
      loadConfig(env);
      return '';
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      return err.message;
    }
  };
  // The v2 writer's settings are read (the v2 push), within cocoon-common's ranges.
  assert.equal(refused({ SNAPSHOT_ZSTD_LEVEL: '3', SNAPSHOT_CHUNK_SIZE_MIB: '64' }), '');
  assert.match(refused({ SNAPSHOT_ZSTD_LEVEL: '23' }), /SNAPSHOT_ZSTD_LEVEL/);
  assert.match(refused({ SNAPSHOT_CHUNK_SIZE_MIB: '4097' }), /SNAPSHOT_CHUNK_SIZE_MIB/);
  assert.match(refused({ EPOCH_URL: 'https://epoch.example' }), /EPOCH_URL: .*set OCI_REGISTRY=/);
  assert.match(refused({ EPOCH_TOKEN: 't' }), /EPOCH_TOKEN: .*docker config/);
  assert.match(refused({ EPOCH_CA_CERT: '/etc/ca.pem' }), /EPOCH_CA_CERT: .*set OCI_REGISTRY_CA_FILE=/);
  // 0 (or empty) is v1 and the Go daemon's own default: accepted.
  assert.equal(refused({ SNAPSHOT_ZSTD_LEVEL: '0', SNAPSHOT_CHUNK_SIZE_MIB: '0', EPOCH_URL: '' }), '');
});

test('peer settings: defaults like the Go daemon, empty VK_PEER_ADDR disables, bad values named', () => {
  const d = loadConfig({}).peer;
  assert.deepEqual(d.listen, { host: '', port: 12501 });
  assert.equal(d.stagingDir, '/var/lib/cocoon/vk-staging');
  assert.equal(d.snapshotDir, '/var/lib/cocoon/snapshot/localfile');
  assert.deepEqual(d.plainHttp, []);
  assert.equal(d.maxStreams, 128);
  assert.equal(d.bandwidth, 0);
  assert.equal(loadConfig({ VK_PEER_ADDR: '' }).peer.listen, undefined);
  assert.deepEqual(loadConfig({ VK_PEER_ADDR: '[::1]:9' }).peer.listen, { host: '::1', port: 9 });
  const c = loadConfig({
    VK_PEER_ADDR: '127.0.0.7:7000',
    VK_PEER_PLAIN_HTTP: '10.0.0.0/16, 10.9.9.9',
    VK_PEER_BANDWIDTH: '500Mi',
  });
  assert.deepEqual(c.peer.listen, { host: '127.0.0.7', port: 7000 });
  assert.deepEqual(c.peer.plainHttp, ['10.0.0.0/16', '10.9.9.9/32']);
  assert.equal(c.peer.bandwidth, 500 * 2 ** 20);
  assert.throws(
    () =>
      loadConfig({
        VK_PEER_ADDR: 'nope',
        VK_PEER_PLAIN_HTTP: '10.0.0.0/40',
        VK_PEER_MAX_STREAMS: '0',
        VK_PEER_BANDWIDTH: 'fast',
        VK_STAGING_DIR: 'relative',
      }),
    (err: unknown) =>
      err instanceof ConfigError &&
      [
        'VK_PEER_ADDR',
        'VK_PEER_PLAIN_HTTP',
        'VK_PEER_MAX_STREAMS',
        'VK_PEER_BANDWIDTH',
        'VK_STAGING_DIR',
      ].every((n) => err.message.includes(n)),
  );
});

test('--help documents every variable', () => {
  const text = helpText();
  for (const d of ENV_DOCS) assert.match(text, new RegExp(`\\b${d.name}\\b`));
});

test('the README configuration table matches the parser', async () => {
  const { readFileSync } = await import('node:fs');
  const { configTable, readmeTable } = await import('../../../scripts/config-table.ts');
  const readme = readFileSync(new URL('../../../README.md', import.meta.url), 'utf8');
  assert.equal(readmeTable(readme), configTable());
});

test('a clone-from-dir root may not overlap the staging or snapshot dirs', () => {
  assert.throws(
    () =>
      loadConfig({
        VK_CLONE_FROM_DIR_ROOTS: '/var/lib/cocoon',
        VK_STAGING_DIR: '/var/lib/cocoon/vk-staging',
      }),
    (err: unknown) =>
      err instanceof ConfigError &&
      /overlaps VK_STAGING_DIR/.test(err.message) &&
      /overlaps VK_COCOON_SNAPSHOT_DIR/.test(err.message),
  );
  assert.deepEqual(loadConfig({ VK_CLONE_FROM_DIR_ROOTS: '/srv/exports' }).cloneFromDirRoots, [
    '/srv/exports',
  ]);
});

test('VK_FIXUP_BUDGET_SECONDS may only shorten the 180 s fixup budget', () => {
  assert.equal(loadConfig({}).fixupBudgetSeconds, 180);
  assert.equal(loadConfig({ VK_FIXUP_BUDGET_SECONDS: '45' }).fixupBudgetSeconds, 45);
  for (const bad of ['29', '181', 'soon'])
    assert.throws(() => loadConfig({ VK_FIXUP_BUDGET_SECONDS: bad }), /VK_FIXUP_BUDGET_SECONDS/);
});

test('OCI_REGISTRY_CA_FILE: a PEM bundle read at startup; a missing file or one without a certificate refuses it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vk-ca-'));
  try {
    const pem = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';
    writeFileSync(join(dir, 'ca.pem'), pem);
    writeFileSync(join(dir, 'junk.pem'), 'not a certificate');
    assert.equal(loadConfig({ OCI_REGISTRY_CA_FILE: join(dir, 'ca.pem') }).registryCa, pem);
    assert.equal(loadConfig({}).registryCa, undefined);
    assert.throws(
      () => loadConfig({ OCI_REGISTRY_CA_FILE: join(dir, 'junk.pem') }),
      /OCI_REGISTRY_CA_FILE=.*no PEM certificate/,
    );
    assert.throws(
      () => loadConfig({ OCI_REGISTRY_CA_FILE: join(dir, 'absent.pem') }),
      /OCI_REGISTRY_CA_FILE=.*ENOENT/,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('GOOGLE_APPLICATION_CREDENTIALS: a file that exists; never sent to a registry that is not Google unless VK_REGISTRY_GOOGLE_ADC=true', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vk-adc-'));
  try {
    const key = join(dir, 'key.json');
    writeFileSync(key, '{}');
    const ok = loadConfig({
      GOOGLE_APPLICATION_CREDENTIALS: key,
      OCI_REGISTRY: 'europe-docker.pkg.dev/acme/cocoon',
    });
    assert.equal(ok.registryGoogleAdc, 'auto');
    assert.throws(
      () => loadConfig({ GOOGLE_APPLICATION_CREDENTIALS: key, OCI_REGISTRY: 'registry.acme.test/cocoon' }),
      /OCI_REGISTRY registry\.acme\.test is not a Google registry .*set VK_REGISTRY_GOOGLE_ADC=true/,
    );
    assert.equal(
      loadConfig({
        GOOGLE_APPLICATION_CREDENTIALS: key,
        OCI_REGISTRY: 'registry.acme.test',
        VK_REGISTRY_GOOGLE_ADC: 'true',
      }).registryGoogleAdc,
      'true',
    );
    assert.throws(
      () => loadConfig({ GOOGLE_APPLICATION_CREDENTIALS: join(dir, 'absent.json') }),
      /no such file/,
    );
    assert.throws(() => loadConfig({ VK_REGISTRY_GOOGLE_ADC: 'maybe' }), /VK_REGISTRY_GOOGLE_ADC/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
