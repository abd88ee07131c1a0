// Kubelet API authentication over a real TLS handshake (in-process HTTPS server configured like
// the kubelet server: client CA, requestCert, rejectUnauthorized false): a client certificate
// from another CA is answered 401 and logged once per (subject, issuer) with the subject and
// issuer seen and the CA expected; anonymous callers and verified certificates are not.
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, request, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import type { Kube } from '../../../src/kube/client.ts';
import { CLIENT_CERT_REJECTED, KubeletAuthorizer } from '../../../src/kubelet/auth.ts';
import { bundleSubjects, oneLineName } from '../../../src/kubelet/tls.ts';
import { createLogger } from '../../../src/log.ts';
import { issue, makeCa, type Pair } from '../fakes/pki.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('framework/kubelet-auth', () => {
  let clusterCa: Pair;
  let trusted: Pair;
  let rogue: Pair;
  let rogueOther: Pair;
  let server: Server;
  let port: number;
  const lines: Record<string, unknown>[] = [];

  before(async () => {
    clusterCa = await makeCa('CN=cluster-ca');
    const rogueCa = await makeCa('CN=rogue-ca');
    const serving = await issue(clusterCa, 'CN=kubelet', 'server', [{ type: 'ip', value: '127.0.0.1' }]);
    trusted = await issue(clusterCa, 'O=system:masters, CN=kube-apiserver-kubelet-client', 'client');
    rogue = await issue(rogueCa, 'O=system:masters, CN=rogue', 'client');
    rogueOther = await issue(rogueCa, 'CN=rogue-2', 'client');
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l));
        done();
      },
    });
    // The API must not be reached on these paths: a call means the request got past authentication.
    const kube = {
      authn: {
        createTokenReview: () => Promise.reject(new Error('TokenReview called')),
      },
      authz: {
        createSubjectAccessReview: () => Promise.reject(new Error('SubjectAccessReview called')),
      },
    } as unknown as Kube;
    const authorizer = new KubeletAuthorizer(kube, 'node-a', {
      clientCa: clusterCa.cert,
      log: createLogger('info', sink),
    });
    server = createServer(
      {
        cert: serving.cert,
        key: serving.key,
        ca: clusterCa.cert,
        requestCert: true,
        rejectUnauthorized: false,
      },
      (req: IncomingMessage, res: ServerResponse) => {
        void authorizer.decide(req).then((d) => {
          res.writeHead(d.ok ? 200 : d.status);
          res.end(d.ok ? 'ok' : d.message);
        });
      },
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });

  after(() => {
    server.closeAllConnections();
    server.close();
  });

  function get(client?: Pair): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port,
          path: '/pods',
          ca: clusterCa.cert,
          cert: client?.cert,
          key: client?.key,
          agent: false,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }),
          );
        },
      );
      req.on('error', reject);
      req.end();
    });
  }

  const rejections = () => lines.filter((l) => l.msg === CLIENT_CERT_REJECTED);

  test('certificate names are one line; a CA bundle lists every subject', () => {
    assert.equal(oneLineName('O=system:masters\nCN=rogue'), 'O=system:masters, CN=rogue');
    assert.deepEqual(bundleSubjects(`${clusterCa.cert}\n${trusted.cert}`), [
      'CN=cluster-ca',
      'O=system:masters, CN=kube-apiserver-kubelet-client',
    ]);
    assert.deepEqual(bundleSubjects('not a bundle'), []);
  });

  test('anonymous callers get 401 and no certificate line', async () => {
    assert.equal((await get()).status, 401);
    assert.deepEqual(rejections(), []);
  });

  test('a certificate from another CA gets 401, logged once with subject, issuer and the expected CA', async () => {
    for (let i = 0; i < 3; i++) assert.equal((await get(rogue)).status, 401);
    const seen = rejections();
    assert.equal(seen.length, 1, JSON.stringify(seen));
    const line = seen[0] as Record<string, unknown>;
    assert.equal(line.level, 'warn');
    assert.equal(line.subject, 'O=system:masters, CN=rogue');
    assert.equal(line.issuer, 'CN=rogue-ca');
    assert.deepEqual(line.expectedCa, ['CN=cluster-ca']);
    assert.match(String(line.reason), /ISSUER|SELF_SIGNED|VERIFY/);
    assert.match(String(line.hint), /VK_TLS_CLIENT_CA/);
    // Another subject from the same CA is a new pair: one more line.
    assert.equal((await get(rogueOther)).status, 401);
    assert.equal((await get(rogueOther)).status, 401);
    assert.deepEqual(
      rejections().map((l) => l.subject),
      ['O=system:masters, CN=rogue', 'CN=rogue-2'],
    );
  });

  test('a certificate of the client CA is authenticated (reaches authorization) and not logged', async () => {
    const before = rejections().length;
    const r = await get(trusted);
    assert.equal(r.status, 500);
    assert.match(r.body, /authorization error: .*SubjectAccessReview called/);
    assert.equal(rejections().length, before);
  });

  test('without a client CA the line says none is configured', async () => {
    const seen: Record<string, unknown>[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString().split('\n').filter(Boolean)) seen.push(JSON.parse(l));
        done();
      },
    });
    const authorizer = new KubeletAuthorizer({} as Kube, 'node-a', { log: createLogger('info', sink) });
    const peer = rogue.x.rawData;
    const req = {
      url: '/pods',
      method: 'GET',
      headers: {},
      socket: {
        authorized: false,
        authorizationError: 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
        getPeerCertificate: () => ({ raw: Buffer.from(peer) }),
      },
    } as unknown as IncomingMessage;
    const d = await authorizer.decide(req);
    assert.equal(d.ok, false);
    assert.equal(d.ok ? 0 : d.status, 401);
    await new Promise((r) => setImmediate(r));
    assert.equal(seen.length, 1);
    assert.deepEqual(seen[0]?.expectedCa, ['(none configured)']);
    assert.equal(seen[0]?.reason, 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY');
  });
});
