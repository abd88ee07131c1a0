import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import {
  basicAuthorization,
  DEFAULT_TOKEN_SECONDS,
  dockerConfigCredential,
  parseTokenResponse,
  parseWwwAuthenticate,
  repositoryScope,
  tokenExpiresAt,
  tokenUrl,
} from '../../../src/registry/auth.ts';
import { dockerConfigPath, dockerConfigSource, lookupCredential } from '../../../src/registry/credentials.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');

describe('parseWwwAuthenticate (registry.md §3.1)', () => {
  it('parses a Bearer challenge with a comma inside the quoted scope', () => {
    assert.deepEqual(
      parseWwwAuthenticate(
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:acme/agent:pull,push"',
      ),
      [
        {
          scheme: 'bearer',
          params: {
            realm: 'https://auth.example.com/token',
            service: 'registry.example.com',
            scope: 'repository:acme/agent:pull,push',
          },
        },
      ],
    );
  });

  it('parses Basic, spaces around separators, unquoted values and escapes', () => {
    assert.deepEqual(parseWwwAuthenticate('Basic realm="Registry Realm"'), [
      { scheme: 'basic', params: { realm: 'Registry Realm' } },
    ]);
    assert.deepEqual(parseWwwAuthenticate('bearer  realm = "r\\"x" , service=svc'), [
      { scheme: 'bearer', params: { realm: 'r"x', service: 'svc' } },
    ]);
  });

  it('splits several challenges in one header', () => {
    const got = parseWwwAuthenticate('Basic realm="a", Bearer realm="https://t/token",service="s"');
    assert.equal(got.length, 2);
    assert.deepEqual(got[0], { scheme: 'basic', params: { realm: 'a' } });
    assert.deepEqual(got[1], { scheme: 'bearer', params: { realm: 'https://t/token', service: 's' } });
    assert.deepEqual(
      parseWwwAuthenticate('Negotiate, Basic realm=x').map((c) => c.scheme),
      ['negotiate', 'basic'],
    );
  });

  it('never throws on garbage', () => {
    for (const h of ['', '"', '=', ',,,', 'Bearer realm="unterminated', '===x', 'Bearer ,realm']) {
      assert.doesNotThrow(() => parseWwwAuthenticate(h), h);
    }
    assert.deepEqual(parseWwwAuthenticate(''), []);
  });
});

describe('token request and answer', () => {
  it('builds <realm>?service=<s>&scope=repository:<name>:<actions>', () => {
    const ch = { scheme: 'bearer', params: { realm: 'https://auth.test/token?x=1', service: 'reg.test' } };
    const url = tokenUrl(ch, repositoryScope('acme/agent', ['pull']));
    assert.equal(url.origin, 'https://auth.test');
    assert.equal(url.searchParams.get('x'), '1');
    assert.equal(url.searchParams.get('service'), 'reg.test');
    assert.equal(url.searchParams.get('scope'), 'repository:acme/agent:pull');
    assert.equal(repositoryScope('a', ['pull', 'push']), 'repository:a:pull,push');
    assert.throws(() => tokenUrl({ scheme: 'bearer', params: {} }, 's'), /without realm/);
    assert.throws(() => tokenUrl({ scheme: 'bearer', params: { realm: 'ftp://x/' } }, 's'), /not http/);
  });

  it('takes token, else access_token; expires_in defaults to 60 s', () => {
    assert.deepEqual(parseTokenResponse('{"token":"t1","expires_in":300}'), {
      token: 't1',
      expiresInSeconds: 300,
    });
    assert.deepEqual(parseTokenResponse('{"access_token":"t2"}'), {
      token: 't2',
      expiresInSeconds: DEFAULT_TOKEN_SECONDS,
    });
    assert.deepEqual(parseTokenResponse('{"token":"","access_token":"t3","expires_in":-5}'), {
      token: 't3',
      expiresInSeconds: 60,
    });
    assert.throws(() => parseTokenResponse('{}'), /neither token nor access_token/);
    assert.throws(() => parseTokenResponse('nope'), /non-JSON/);
    assert.throws(() => parseTokenResponse('[]'), /neither/);
  });

  it('a cached token is retired a little before it expires', () => {
    assert.equal(tokenExpiresAt(0, 60), 54_000); // 10% early
    assert.equal(tokenExpiresAt(1000, 3600), 1000 + 3_600_000 - 30_000); // at most 30 s early
    assert.ok(tokenExpiresAt(0, 1) > 0);
  });

  it('Basic authorization is base64 of user:password', () => {
    assert.equal(basicAuthorization({ username: 'u', password: 'p:w' }), `Basic ${b64('u:p:w')}`);
  });
});

describe('docker config credentials', () => {
  const config = {
    auths: {
      'reg.test:5000': { auth: b64('alice:s3cret:x') },
      'https://other.test/v1/': { auth: b64('bob:pw') },
      'plain.test': { username: 'carol', password: 'pw2' },
      'broken.test': { auth: b64('nocolon') },
    },
  };

  it('reads auths.<host>.auth (password may contain ":")', () => {
    assert.deepEqual(dockerConfigCredential(config, 'reg.test:5000'), {
      username: 'alice',
      password: 's3cret:x',
    });
  });

  it('matches a key with scheme and path, and username/password fields', () => {
    assert.deepEqual(dockerConfigCredential(config, 'other.test'), { username: 'bob', password: 'pw' });
    assert.deepEqual(dockerConfigCredential(config, 'plain.test'), { username: 'carol', password: 'pw2' });
  });

  it('no credential for unknown hosts, a port mismatch or malformed entries', () => {
    assert.equal(dockerConfigCredential(config, 'reg.test'), undefined);
    assert.equal(dockerConfigCredential(config, 'broken.test'), undefined);
    assert.equal(dockerConfigCredential({}, 'reg.test:5000'), undefined);
    assert.equal(dockerConfigCredential(null, 'reg.test:5000'), undefined);
    assert.equal(dockerConfigCredential({ auths: 'x' }, 'reg.test:5000'), undefined);
  });

  it('reads $DOCKER_CONFIG/config.json at lookup time; a missing file means none', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vk-dockercfg-'));
    try {
      const env = { DOCKER_CONFIG: dir };
      assert.equal(dockerConfigPath(env), join(dir, 'config.json'));
      assert.match(dockerConfigPath({}), /\.docker\/config\.json$/);
      const source = dockerConfigSource(env);
      assert.equal(await source('reg.test:5000'), undefined);
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
      assert.deepEqual(await lookupCredential([source], 'reg.test:5000'), {
        username: 'alice',
        password: 's3cret:x',
      });
      writeFileSync(join(dir, 'config.json'), '{not json');
      assert.equal(await source('reg.test:5000'), undefined);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('lookupCredential takes the first source that has one', async () => {
    const none = async () => undefined;
    const a = async () => ({ username: 'a', password: '1' });
    const b = async () => ({ username: 'b', password: '2' });
    assert.deepEqual(await lookupCredential([none, a, b], 'h'), { username: 'a', password: '1' });
    assert.equal(await lookupCredential([], 'h'), undefined);
  });
});
