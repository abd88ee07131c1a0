// The plain-HTTP credential rule (registry/auth.ts plainHttpCredentialRefusal): no Basic
// credential, and no bearer token bought with one, goes over plain HTTP to a host that is not
// loopback; a token realm that is plain HTTP and not loopback gets no credential either. The
// client tests run a registry on this machine's non-loopback IPv4 address (and on 127.0.0.1
// for the cases that must still send), and check what it received.
import assert from 'node:assert/strict';
import http from 'node:http';
import { networkInterfaces } from 'node:os';
import { after, describe, test } from 'node:test';
import { silentLogger } from '../../../src/log.ts';
import { plainHttpCredentialRefusal } from '../../../src/registry/auth.ts';
import { RegistryClient } from '../../../src/registry/client.ts';
import { RegistryError } from '../../../src/registry/errors.ts';

describe('plainHttpCredentialRefusal', () => {
  test('plain HTTP to a non-loopback host is refused, naming the host and the rule', () => {
    const m = plainHttpCredentialRefusal('http', 'registry.internal:5000', 'Basic credentials');
    assert.equal(
      m,
      'Basic credentials: refusing to send registry credentials over plain HTTP to registry.internal:5000: credentials go over plain HTTP only to a loopback host (127.0.0.0/8, ::1, localhost); use https:// for registry.internal:5000, or remove its credentials for anonymous access',
    );
    for (const host of ['10.0.0.5:5000', '192.0.2.2', '[fe80::1]:5000', '128.0.0.1', 'localhost.example.com'])
      assert.notEqual(plainHttpCredentialRefusal('http:', host, 'x'), undefined, host);
  });

  test('loopback hosts and HTTPS are fine', () => {
    for (const host of ['127.0.0.1:5000', '127.0.0.2', 'localhost:5000', 'LOCALHOST', '[::1]:5000'])
      assert.equal(plainHttpCredentialRefusal('http', host, 'x'), undefined, host);
    assert.equal(plainHttpCredentialRefusal('https', 'registry.internal:5000', 'x'), undefined);
    assert.equal(plainHttpCredentialRefusal('https:', '10.0.0.5', 'x'), undefined);
  });
});

/** This machine's first non-loopback IPv4 address, if it has one. */
const external = Object.values(networkInterfaces())
  .flat()
  .find((i) => i?.family === 'IPv4' && !i.internal)?.address;

interface Seen {
  path: string;
  authorization: string | undefined;
}

/** A registry answering `/v2/` with a 401 challenge until it gets an Authorization header,
 * and a token endpoint at `/token`. */
function registry(challenge: (self: string) => string) {
  const seen: Seen[] = [];
  let self = '';
  const server = http.createServer((req, res) => {
    seen.push({ path: req.url ?? '', authorization: req.headers.authorization });
    if (req.url?.startsWith('/token')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ token: 'tok', expires_in: 300 }));
      return;
    }
    if (req.headers.authorization === undefined) {
      res.writeHead(401, { 'www-authenticate': challenge(self) });
      res.end();
      return;
    }
    res.writeHead(200);
    res.end();
  });
  return {
    seen,
    async listen(address: string): Promise<string> {
      await new Promise<void>((resolve) => server.listen(0, address, resolve));
      self = `${address}:${(server.address() as { port: number }).port}`;
      return self;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const cred = [async () => ({ username: 'robot', password: 's3cret' })];
const client = (base: string, credentials = cred) =>
  new RegistryClient({ base: `http://${base}`, credentials, log: silentLogger });

describe('the client', { skip: external ? false : 'no non-loopback IPv4 address on this machine' }, () => {
  const servers: { close(): Promise<void> }[] = [];
  after(async () => {
    for (const s of servers) await s.close();
  });
  const start = async (address: string, challenge: (self: string) => string) => {
    const r = registry(challenge);
    servers.push(r);
    return { r, host: await r.listen(address) };
  };

  test('Basic: refused for a non-loopback plain-HTTP registry; nothing sent', async () => {
    const { r, host } = await start(external!, () => 'Basic realm="reg"');
    const c = client(host);
    await assert.rejects(c.ping(), (err: unknown) => {
      assert.ok(err instanceof RegistryError);
      assert.equal(err.kind, 'auth');
      assert.match(err.message, new RegExp(`plain HTTP to ${host.replaceAll('.', '\\.')}: .*loopback`));
      return true;
    });
    c.close();
    assert.ok(r.seen.length >= 1, 'the anonymous request went out');
    assert.ok(
      r.seen.every((s) => s.authorization === undefined),
      'no Authorization header ever arrived',
    );
  });

  test('Basic: sent to a loopback plain-HTTP registry (the rule does not over-refuse)', async () => {
    const { r, host } = await start('127.0.0.1', () => 'Basic realm="reg"');
    const c = client(host);
    await c.ping();
    c.close();
    assert.equal(r.seen.at(-1)?.authorization, `Basic ${Buffer.from('robot:s3cret').toString('base64')}`);
  });

  test('Bearer: a plain-HTTP non-loopback token realm gets no credential', async () => {
    const realm = await start(external!, () => 'Bearer realm="unused"');
    const { r, host } = await start(
      '127.0.0.1',
      () => `Bearer realm="http://${realm.host}/token",service="reg"`,
    );
    const c = client(host);
    await assert.rejects(c.ping(), /token realm .*: refusing to send registry credentials over plain HTTP/);
    c.close();
    assert.equal(realm.r.seen.length, 0, 'the token endpoint was never called');
    assert.ok(r.seen.every((s) => s.authorization === undefined));
  });

  test('Bearer: no token bought with credentials for a non-loopback plain-HTTP registry', async () => {
    const realm = await start('127.0.0.1', () => 'Bearer realm="unused"');
    const { r, host } = await start(
      external!,
      () => `Bearer realm="http://${realm.host}/token",service="reg"`,
    );
    const c = client(host);
    await assert.rejects(c.ping(), /a bearer token obtained with credentials: refusing .* plain HTTP to /);
    c.close();
    assert.equal(realm.r.seen.length, 0, 'no credential went to the realm either');
    assert.ok(r.seen.every((s) => s.authorization === undefined));
  });

  test('Bearer without credentials: an anonymous token is no secret of ours and is used', async () => {
    const realm = await start('127.0.0.1', () => 'Bearer realm="unused"');
    const { r, host } = await start(
      external!,
      () => `Bearer realm="http://${realm.host}/token",service="reg"`,
    );
    const c = client(host, []);
    await c.ping();
    c.close();
    assert.equal(realm.r.seen[0]?.authorization, undefined, 'the token was fetched anonymously');
    assert.equal(r.seen.at(-1)?.authorization, 'Bearer tok');
  });
});
