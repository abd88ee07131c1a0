// The kubeconfig loader of the hand-written client (src/kube/kubeconfig.ts): data vs file
// fields (relative paths against the kubeconfig's directory), tokens and token files, the
// KUBECONFIG list merge, in-cluster config, and a startup error naming whatever is not
// supported (exec plugins, auth-provider, impersonation, proxy-url).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileToken, inClusterAccess, KubeConfigError, loadKubeConfig } from '../../../src/kube/kubeconfig.ts';

const CA = '-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n';
const CERT = '-----BEGIN CERTIFICATE-----\nCLIENT\n-----END CERTIFICATE-----\n';
const KEY = '-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n';
const b64 = (s: string) => Buffer.from(s).toString('base64');

function tmp(t: { after: (fn: () => void) => void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'vk-kubeconfig-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function kubeconfig(cluster: string, user: string, extra = ''): string {
  return `apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster:
${cluster}
users:
- name: u1
  user:
${user}
contexts:
- name: ctx
  context: {cluster: c1, user: u1, namespace: ignored}
current-context: ctx
${extra}`;
}

test('data fields: server, CA, client certificate and key inline; a static token', (t) => {
  const dir = tmp(t);
  const file = join(dir, 'config');
  writeFileSync(
    file,
    kubeconfig(
      `    server: https://10.0.0.1:6443/\n    certificate-authority-data: ${b64(CA)}\n    tls-server-name: api.internal`,
      `    client-certificate-data: ${b64(CERT)}\n    client-key-data: ${b64(KEY)}\n    token: abc.def`,
    ),
  );
  const a = loadKubeConfig(file, {}, dir);
  assert.equal(a.server, 'https://10.0.0.1:6443');
  assert.equal(a.ca, CA);
  assert.equal(a.cert, CERT);
  assert.equal(a.key, KEY);
  assert.equal(a.tlsServerName, 'api.internal');
  assert.equal(a.insecureSkipTLSVerify, undefined);
  assert.equal(a.token?.(), 'abc.def');
  assert.match(a.source, /config \(context ctx\)/);
});

test('file fields resolve against the kubeconfig directory; data wins over a file', (t) => {
  const dir = tmp(t);
  mkdirSync(join(dir, 'pki'));
  writeFileSync(join(dir, 'pki', 'ca.crt'), CA);
  writeFileSync(join(dir, 'pki', 'client.crt'), CERT);
  writeFileSync(join(dir, 'pki', 'client.key'), KEY);
  const file = join(dir, 'config');
  writeFileSync(
    file,
    kubeconfig(
      '    server: https://h:6443\n    certificate-authority: pki/ca.crt',
      `    client-certificate: pki/client.crt\n    client-key: ${join(dir, 'pki', 'client.key')}`,
    ),
  );
  const a = loadKubeConfig(file, {}, dir);
  assert.equal(a.ca, CA);
  assert.equal(a.cert, CERT);
  assert.equal(a.key, KEY);
  assert.equal(a.token, undefined);

  writeFileSync(
    file,
    kubeconfig(
      `    server: https://h:6443\n    certificate-authority: pki/missing.crt\n    certificate-authority-data: ${b64('DATA')}`,
      '    token: x',
    ),
  );
  assert.equal(loadKubeConfig(file, {}, dir).ca, 'DATA');
  // A missing file is an error naming the field and the path.
  writeFileSync(
    file,
    kubeconfig('    server: https://h:6443\n    certificate-authority: pki/missing.crt', '    token: x'),
  );
  assert.throws(
    () => loadKubeConfig(file, {}, dir),
    /certificate-authority: cannot read .*pki\/missing\.crt: ENOENT/,
  );
});

test('insecure-skip-tls-verify, http servers, basic auth, a context without a user', (t) => {
  const dir = tmp(t);
  const file = join(dir, 'config');
  writeFileSync(
    file,
    kubeconfig(
      '    server: https://h:6443\n    insecure-skip-tls-verify: true',
      '    username: admin\n    password: pw',
    ),
  );
  const a = loadKubeConfig(file, {}, dir);
  assert.equal(a.insecureSkipTLSVerify, true);
  assert.deepEqual(a.basicAuth, { username: 'admin', password: 'pw' });
  writeFileSync(
    file,
    `clusters:\n- name: c\n  cluster: {server: "http://127.0.0.1:8080"}\ncontexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n`,
  );
  const b = loadKubeConfig(file, {}, dir);
  assert.equal(b.server, 'http://127.0.0.1:8080');
  assert.equal(b.token, undefined);
});

test('tokenFile is read at load and re-read after the refresh interval (rotation)', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, 'token'), 'first\n');
  const file = join(dir, 'config');
  writeFileSync(file, kubeconfig('    server: https://h:6443', '    tokenFile: token\n    token: static'));
  const a = loadKubeConfig(file, {}, dir);
  assert.equal(a.token?.(), 'first', 'tokenFile wins over token');
  const tok = fileToken(join(dir, 'token'), 30);
  writeFileSync(join(dir, 'token'), 'second\n');
  assert.equal(tok(), 'first', 'cached within the interval');
  await new Promise((r) => setTimeout(r, 40));
  assert.equal(tok(), 'second');
  // A failed re-read keeps the last token.
  rmSync(join(dir, 'token'));
  await new Promise((r) => setTimeout(r, 40));
  assert.equal(tok(), 'second');
  // A token file that does not exist at load is an error.
  writeFileSync(file, kubeconfig('    server: https://h:6443', '    tokenFile: nope'));
  assert.throws(() => loadKubeConfig(file, {}, dir), /user u1: tokenFile: cannot read .*nope: ENOENT/);
});

test('unsupported settings are errors naming them: exec, auth-provider, impersonation, proxy-url', (t) => {
  const dir = tmp(t);
  const file = join(dir, 'config');
  const cases: [string, string, RegExp][] = [
    [
      '    server: https://h',
      '    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws',
      /user u1: exec: exec credential plugins are not supported by vk-cocoon/,
    ],
    [
      '    server: https://h',
      '    auth-provider:\n      name: gcp',
      /user u1: auth-provider: auth-provider plugins are not supported/,
    ],
    ['    server: https://h', '    token: t\n    as: someone', /user u1: as: impersonation is not supported/],
    [
      '    server: https://h\n    proxy-url: http://proxy:3128',
      '    token: t',
      /cluster c1: proxy-url is not supported/,
    ],
    ['    server: ftp://h', '    token: t', /only https:\/\/ and http:\/\//],
    ['    certificate-authority-data: eA==', '    token: t', /cluster c1: no server/],
    [
      '    server: https://h',
      `    client-certificate-data: ${b64(CERT)}`,
      /needs both the certificate and its key/,
    ],
  ];
  for (const [cluster, user, re] of cases) {
    writeFileSync(file, kubeconfig(cluster, user));
    assert.throws(
      () => loadKubeConfig(file, {}, dir),
      (err: unknown) => err instanceof KubeConfigError && re.test(err.message),
      re.source,
    );
  }
  writeFileSync(
    file,
    kubeconfig('    server: https://h', '    token: t').replace(
      'current-context: ctx',
      'current-context: nope',
    ),
  );
  assert.throws(() => loadKubeConfig(file, {}, dir), /context "nope" not found/);
  writeFileSync(file, 'clusters: [unclosed');
  assert.throws(() => loadKubeConfig(file, {}, dir), /not valid YAML/);
});

test('a KUBECONFIG list merges as kubectl does: the first file naming something wins', (t) => {
  const dir = tmp(t);
  const one = join(dir, 'one');
  const two = join(dir, 'two');
  writeFileSync(one, `clusters:\n- name: c1\n  cluster: {server: "https://first"}\ncurrent-context: ctx2\n`);
  writeFileSync(
    two,
    `clusters:
- name: c1
  cluster: {server: "https://second"}
- name: c2
  cluster: {server: "https://c2"}
users:
- name: u2
  user: {token: from-two}
contexts:
- name: ctx2
  context: {cluster: c1, user: u2}
current-context: other
`,
  );
  const a = loadKubeConfig(`${one}:${join(dir, 'missing')}:${two}`, {}, dir);
  assert.equal(a.server, 'https://first');
  assert.equal(a.token?.(), 'from-two');
  assert.throws(() => loadKubeConfig(join(dir, 'missing'), {}, dir), /cannot read .*missing: ENOENT/);
});

test('without KUBECONFIG: ~/.kube/config, else in-cluster, else an error', (t) => {
  const dir = tmp(t);
  const home = join(dir, 'home');
  mkdirSync(join(home, '.kube'), { recursive: true });
  writeFileSync(join(home, '.kube', 'config'), kubeconfig('    server: https://home', '    token: t'));
  assert.equal(loadKubeConfig(undefined, {}, home).server, 'https://home');
  assert.throws(
    () => loadKubeConfig(undefined, {}, join(dir, 'nohome')),
    /no Kubernetes cluster configured \(set KUBECONFIG/,
  );

  const sa = join(dir, 'sa');
  mkdirSync(sa);
  writeFileSync(join(sa, 'token'), 'sa-token\n');
  writeFileSync(join(sa, 'ca.crt'), CA);
  const ic = inClusterAccess({ KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' }, sa);
  assert.equal(ic.server, 'https://10.96.0.1:443');
  assert.equal(ic.ca, CA);
  assert.equal(ic.token?.(), 'sa-token');
  assert.equal(ic.source, 'in-cluster');
  assert.equal(
    inClusterAccess({ KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' }, sa).server,
    'https://[fd00::1]:443',
  );
  assert.throws(
    () =>
      inClusterAccess(
        { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' },
        join(dir, 'none'),
      ),
    /in-cluster: cannot read .*token: ENOENT/,
  );
  assert.throws(() => inClusterAccess({}, sa), /KUBERNETES_SERVICE_HOST/);
});
