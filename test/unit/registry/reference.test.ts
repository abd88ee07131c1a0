import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  blobPath,
  displayReference,
  InvalidReferenceError,
  isLoopbackHost,
  joinReference,
  manifestPath,
  parseReference,
  parseRegistryBase,
  registryOrigin,
  repositoryName,
} from '../../../src/registry/reference.ts';

const DIGEST = `sha256:${'ab'.repeat(32)}`;

describe('parseRegistryBase (registry.md §1, §2)', () => {
  it('splits host and path prefix; HTTPS for a remote host', () => {
    assert.deepEqual(parseRegistryBase('europe-docker.pkg.dev/acme/cocoon'), {
      scheme: 'https',
      host: 'europe-docker.pkg.dev',
      prefix: 'acme/cocoon',
    });
    assert.deepEqual(parseRegistryBase('registry.example.com:5000'), {
      scheme: 'https',
      host: 'registry.example.com:5000',
      prefix: '',
    });
  });

  it('plain HTTP for loopback (localhost, 127.0.0.0/8, [::1]) with any port', () => {
    assert.equal(parseRegistryBase('127.0.0.1:5000/cocoon').scheme, 'http');
    assert.equal(parseRegistryBase('localhost/cocoon').scheme, 'http');
    assert.equal(parseRegistryBase('[::1]:5000').scheme, 'http');
    assert.equal(parseRegistryBase('[::1]:5000').host, '[::1]:5000');
    assert.equal(parseRegistryBase('127.0.0.2:5000').scheme, 'http');
    assert.equal(parseRegistryBase('128.0.0.1:5000').scheme, 'https');
  });

  it('VK_REGISTRY_PLAIN_HTTP forces HTTP; an explicit scheme wins', () => {
    assert.equal(parseRegistryBase('reg.test:5000', { plainHttp: true }).scheme, 'http');
    assert.equal(parseRegistryBase('http://reg.test/x').scheme, 'http');
    assert.equal(parseRegistryBase('https://127.0.0.1:5000').scheme, 'https');
    assert.equal(registryOrigin(parseRegistryBase('https://reg.test:443/a/')), 'https://reg.test:443');
  });

  it('drops trailing slashes and rejects malformed bases', () => {
    assert.equal(parseRegistryBase('reg.test/a/b///').prefix, 'a/b');
    assert.throws(() => parseRegistryBase(''), InvalidReferenceError);
    assert.throws(() => parseRegistryBase('reg test/a'), InvalidReferenceError);
    assert.throws(() => parseRegistryBase('reg.test/Upper'), InvalidReferenceError);
    assert.throws(() => parseRegistryBase('reg.test/a//b'), InvalidReferenceError);
  });

  it('isLoopbackHost ignores the port and case', () => {
    assert.equal(isLoopbackHost('LOCALHOST:80'), true);
    assert.equal(isLoopbackHost('localhost.example.com'), false);
  });
});

describe('repositoryName', () => {
  const base = parseRegistryBase('reg.test/acme/cocoon');
  it('joins the prefix and the registry-relative repo', () => {
    assert.equal(repositoryName(base, 'agent'), 'acme/cocoon/agent');
    assert.equal(repositoryName(base, 'team/agent-x_1.2'), 'acme/cocoon/team/agent-x_1.2');
    assert.equal(repositoryName(parseRegistryBase('reg.test'), 'vm-a'), 'vm-a');
  });

  it('rejects names the distribution grammar rejects', () => {
    for (const bad of ['', 'Agent', 'a//b', '../x', 'a/./b', '-a', 'a-', 'a b', 'a:b', 'a@b']) {
      assert.throws(() => repositoryName(base, bad), InvalidReferenceError, bad);
    }
    assert.throws(() => repositoryName(base, 'a'.repeat(250)), /longer than 255/);
  });
});

describe('parseReference (registry.md §1)', () => {
  it('sha256:<hex> is a digest, anything else a tag; empty means latest', () => {
    assert.deepEqual(parseReference(DIGEST), { kind: 'digest', value: DIGEST });
    assert.deepEqual(parseReference('v3'), { kind: 'tag', value: 'v3' });
    assert.deepEqual(parseReference('hibernate'), { kind: 'tag', value: 'hibernate' });
    assert.deepEqual(parseReference(''), { kind: 'tag', value: 'latest' });
  });

  it('rejects a malformed digest and invalid tags', () => {
    assert.throws(() => parseReference('sha256:abc'), /invalid sha256 digest/);
    assert.throws(() => parseReference(`sha256:${'AB'.repeat(32)}`), /invalid sha256 digest/);
    assert.throws(() => parseReference('.hidden'), /invalid tag/);
    assert.throws(() => parseReference('a/b'), /invalid tag/);
    assert.throws(() => parseReference('x'.repeat(129)), /invalid tag/);
  });

  it('joins tags with ":" and digests with "@"', () => {
    assert.equal(joinReference('a/b', parseReference('v1')), 'a/b:v1');
    assert.equal(joinReference('a/b', parseReference(DIGEST)), `a/b@${DIGEST}`);
    assert.equal(manifestPath('a/b', parseReference('v1')), '/v2/a/b/manifests/v1');
    assert.equal(manifestPath('a/b', parseReference(DIGEST)), `/v2/a/b/manifests/${DIGEST}`);
    assert.equal(blobPath('a/b', DIGEST), `/v2/a/b/blobs/${DIGEST}`);
    assert.throws(() => blobPath('a/b', 'sha512:00'), InvalidReferenceError);
    assert.equal(
      displayReference(parseRegistryBase('127.0.0.1:1/c'), 'c/x', parseReference('t')),
      '127.0.0.1:1/c/x:t',
    );
  });

  it('property: every valid tag parses to itself and round-trips through joinReference', () => {
    const tag = fc.stringMatching(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/);
    fc.assert(
      fc.property(tag, (t) => {
        const ref = parseReference(t);
        return ref.kind === 'tag' && ref.value === t && joinReference('r', ref) === `r:${t}`;
      }),
    );
  });
});
