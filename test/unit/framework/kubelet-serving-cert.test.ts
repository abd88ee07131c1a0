// The self-signed kubelet serving certificate (src/kubelet/tls.ts): DER-encoded with node:crypto
// alone; a TLS client that trusts it reaches the server by node name and by IP.
import assert from 'node:assert/strict';
import { createPrivateKey, createPublicKey, X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { loadOrCreateServingCert } from '../../../src/kubelet/tls.ts';

const sans = { dns: ['node-a', 'localhost'], ips: ['127.0.0.1', '10.0.0.7', 'fd00::1:2'] };

test('a missing pair yields a self-signed P-256 certificate with the SANs, 10 years, serverAuth', async () => {
  const now = new Date('2030-01-02T03:04:05Z');
  const s = await loadOrCreateServingCert('/no/such.crt', '/no/such.key', sans, now);
  assert.equal(s.selfSigned, true);
  assert.match(s.reason ?? '', /cannot use \/no\/such\.crt/);
  const c = new X509Certificate(s.cert);
  assert.equal(c.subject, 'CN=node-a');
  assert.equal(c.issuer, 'CN=node-a');
  assert.equal(
    c.subjectAltName,
    'DNS:node-a, DNS:localhost, IP Address:127.0.0.1, IP Address:10.0.0.7, IP Address:FD00:0:0:0:0:0:1:2',
  );
  assert.equal(new Date(c.validFrom).getTime(), now.getTime() - 60_000 - (now.getTime() % 1000));
  assert.equal(new Date(c.validTo).getTime(), now.getTime() + 3650 * 86_400_000 - (now.getTime() % 1000));
  assert.deepEqual(c.keyUsage, ['1.3.6.1.5.5.7.3.1']);
  assert.equal(c.ca, false);
  assert.equal(c.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1');
  assert.equal(c.verify(createPublicKey(s.key)), true);
  assert.equal(c.checkPrivateKey(createPrivateKey(s.key)), true);
  assert.match(s.key, /^-----BEGIN PRIVATE KEY-----\n/);
});

test('a readable unexpired pair is used; an expired one is replaced with a reason', async (t) => {
  const made = await loadOrCreateServingCert('/no/such.crt', '/no/such.key', sans);
  const dir = mkdtempSync(join(tmpdir(), 'vk-tls-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'tls.crt'), made.cert);
  writeFileSync(join(dir, 'tls.key'), made.key);
  const used = await loadOrCreateServingCert(join(dir, 'tls.crt'), join(dir, 'tls.key'), sans);
  assert.deepEqual(used, { cert: made.cert, key: made.key, selfSigned: false });
  const later = await loadOrCreateServingCert(
    join(dir, 'tls.crt'),
    join(dir, 'tls.key'),
    sans,
    new Date(Date.now() + 3651 * 86_400_000),
  );
  assert.equal(later.selfSigned, true);
  assert.match(later.reason ?? '', /expired on/);
});

test('a TLS client trusting the certificate verifies it by node name and by IP', async () => {
  const s = await loadOrCreateServingCert('/no/such.crt', '/no/such.key', sans);
  const server = createServer({ cert: s.cert, key: s.key }, (_req, res) => res.end('ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  try {
    for (const servername of ['node-a', undefined]) {
      const body = await new Promise<string>((resolve, reject) => {
        const req = request({ host: '127.0.0.1', port, path: '/', ca: s.cert, servername }, (res) => {
          let b = '';
          res.on('data', (c) => {
            b += c;
          });
          res.on('end', () => resolve(b));
        });
        req.on('error', reject);
        req.end();
      });
      assert.equal(body, 'ok');
    }
  } finally {
    server.close();
  }
});
