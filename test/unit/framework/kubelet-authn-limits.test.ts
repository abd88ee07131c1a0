// The kubelet API's authorization verb and the bounds on failed authentication
// (docs/contracts/virtual-node.md "Authentication and authorization"): exec, attach,
// portForward and run are `create` whatever the method; a rejected token is reviewed at most
// once a minute; concurrent requests with one token share one review; a source's failed
// authentications are limited (20, then one per 3 s) and answered 429 without a TokenReview;
// valid tokens are refunded. The clock is node:test's mocked Date.
import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { afterEach, beforeEach, describe, it, mock } from 'node:test';
import type { Kube } from '../../../src/kube/client.ts';
import { type AuthDecision, KubeletAuthorizer, requestAttributes } from '../../../src/kubelet/auth.ts';
import {
  ExpiringLru,
  FAILED_AUTH_BURST,
  FAILED_AUTH_REFILL_MS,
  FailedAuthLimiter,
  REJECTED_TOKEN_TTL_MS,
  sourceKey,
  tokenKey,
} from '../../../src/kubelet/authn-limits.ts';

describe('authorization verb', () => {
  it('is create for exec, attach, portForward and run whatever the method', () => {
    for (const path of ['/exec/ns/p/c', '/attach/ns/p/c', '/portForward/ns/p', '/run/ns/p/c'])
      for (const method of ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'get'])
        assert.deepEqual(
          requestAttributes(method, path),
          { verb: 'create', subresource: 'proxy' },
          `${method} ${path}`,
        );
  });

  it('follows the method elsewhere (the kubelet mapping)', () => {
    assert.deepEqual(requestAttributes('GET', '/pods'), { verb: 'get', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('HEAD', '/runningpods/'), { verb: 'get', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('POST', '/pods'), { verb: 'create', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('PUT', '/pods'), { verb: 'update', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('PATCH', '/pods'), { verb: 'patch', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('DELETE', '/pods'), { verb: 'delete', subresource: 'proxy' });
    assert.deepEqual(requestAttributes('GET', '/containerLogs/ns/p/c'), {
      verb: 'get',
      subresource: 'proxy',
    });
    assert.deepEqual(requestAttributes('GET', '/logs/x'), { verb: 'get', subresource: 'log' });
    assert.deepEqual(requestAttributes('GET', '/stats/summary'), { verb: 'get', subresource: 'stats' });
    // A path that merely starts like one is not one of them.
    assert.deepEqual(requestAttributes('GET', '/executive'), { verb: 'get', subresource: 'proxy' });
  });
});

describe('source keys and token keys', () => {
  it('keys IPv4 as is, IPv4-mapped IPv6 as IPv4 and IPv6 by its /64', () => {
    assert.equal(sourceKey('10.1.2.3'), '10.1.2.3');
    assert.equal(sourceKey('::ffff:10.1.2.3'), '10.1.2.3');
    assert.equal(sourceKey('2001:db8:1:2:aaaa::1'), '2001:db8:1:2::/64');
    assert.equal(sourceKey('2001:db8:1:2:ffff:ffff:ffff:ffff'), '2001:db8:1:2::/64');
    assert.notEqual(sourceKey('2001:db8:1:3::1'), sourceKey('2001:db8:1:2::1'));
    assert.equal(sourceKey('::1'), '0:0:0:0::/64');
    assert.equal(sourceKey(undefined), '(unknown)');
  });

  it('hashes tokens (the key never contains the token)', () => {
    const k = tokenKey('secret-token-value');
    assert.equal(k, tokenKey('secret-token-value'));
    assert.notEqual(k, tokenKey('secret-token-valuf'));
    assert.doesNotMatch(k, /secret/);
    assert.equal(k.length, 43); // SHA-256, base64url
  });

  it('the LRU table keeps at most its size, dropping the least recently used', () => {
    const t = new ExpiringLru<number>(3);
    for (const k of ['a', 'b', 'c']) t.set(k, 1, 100);
    assert.equal(t.get('a', 0), 1); // a is now the most recent
    t.set('d', 1, 100);
    assert.equal(t.size, 3);
    assert.equal(t.get('b', 0), undefined);
    assert.equal(t.get('a', 0), 1);
    assert.equal(t.get('a', 100), undefined, 'expired at its deadline');
  });

  it('the limiter refills one failure per interval up to the burst, and refunds', () => {
    const l = new FailedAuthLimiter({ burst: 2, refillMs: 1000 });
    assert.equal(l.take('s', 0).ok, true);
    assert.equal(l.take('s', 0).ok, true);
    const refused = l.take('s', 0);
    assert.deepEqual(refused, { ok: false, retryAfterMs: 1000, firstRefusal: true });
    assert.equal((l.take('s', 500) as { firstRefusal: boolean }).firstRefusal, false);
    assert.equal(l.take('t', 0).ok, true, 'another source has its own bucket');
    assert.equal(l.take('s', 1000).ok, true);
    assert.equal(l.take('s', 1000).ok, false);
    l.refund('s', 1000);
    assert.equal(l.take('s', 1000).ok, true);
    assert.equal(l.take('s', 1_000_000).ok, true);
    assert.equal(l.take('s', 1_000_000).ok, true);
    assert.equal(l.take('s', 1_000_000).ok, false, 'never more than the burst');
  });
});

describe('KubeletAuthorizer with bearer tokens', () => {
  let reviews: string[];
  let results: string[];
  let throttled: number;
  let sars: { verb: string; subresource: string }[];
  let authz: KubeletAuthorizer;
  /** Tokens the fake apiserver accepts. */
  const VALID = /^valid-/;

  beforeEach(() => {
    mock.timers.enable({ apis: ['Date'], now: 1_000_000 });
    reviews = [];
    results = [];
    throttled = 0;
    sars = [];
    const kube = {
      authn: {
        createTokenReview: async ({ body }: { body: { spec: { token: string } } }) => {
          reviews.push(body.spec.token);
          // Answer on a later turn, so concurrent requests overlap the review.
          await new Promise((r) => setImmediate(r));
          const ok = VALID.test(body.spec.token);
          return { status: ok ? { authenticated: true, user: { username: body.spec.token } } : {} };
        },
      },
      authz: {
        createSubjectAccessReview: async ({
          body,
        }: {
          body: { spec: { resourceAttributes: { verb: string; subresource: string } } };
        }) => {
          sars.push(body.spec.resourceAttributes);
          return { status: { allowed: body.spec.resourceAttributes.verb === 'get' } };
        },
      },
    } as unknown as Kube;
    authz = new KubeletAuthorizer(kube, 'node-a', {
      onTokenReview: (r) => results.push(r),
      onThrottled: () => throttled++,
    });
  });

  afterEach(() => mock.timers.reset());

  function req(token: string, remoteAddress = '10.0.0.9', method = 'GET', url = '/pods'): IncomingMessage {
    return {
      url,
      method,
      headers: { authorization: `Bearer ${token}` },
      socket: { authorized: false, remoteAddress },
    } as unknown as IncomingMessage;
  }

  const status = (d: AuthDecision) => (d.ok ? 200 : d.status);

  it('reviews a rejected token at most once a minute', async () => {
    for (let i = 0; i < 50; i++) assert.equal(status(await authz.decide(req('garbage'))), 401);
    assert.equal(reviews.length, 1);
    mock.timers.tick(REJECTED_TOKEN_TTL_MS - 1);
    assert.equal(status(await authz.decide(req('garbage'))), 401);
    assert.equal(reviews.length, 1, 'still remembered just before the minute is up');
    mock.timers.tick(1);
    assert.equal(status(await authz.decide(req('garbage'))), 401);
    assert.equal(reviews.length, 2, 'asked again after a minute');
    assert.deepEqual(results, ['rejected', 'rejected']);
  });

  it('shares one review between concurrent requests with the same token', async () => {
    const all = await Promise.all(Array.from({ length: 200 }, () => authz.decide(req('same-garbage'))));
    assert.ok(all.every((d) => status(d) === 401));
    assert.equal(reviews.length, 1);
    assert.equal(throttled, 0, 'joined requests are not charged');
  });

  it('limits failed authentications per source: 20, then 429 without a TokenReview, then one per 3 s', async () => {
    const tokens = Array.from({ length: 1000 }, (_, i) => `garbage-${i}`);
    const answers = await Promise.all(tokens.map((t) => authz.decide(req(t))));
    assert.equal(reviews.length, FAILED_AUTH_BURST);
    assert.equal(answers.filter((d) => status(d) === 401).length, FAILED_AUTH_BURST);
    const limited = answers.filter((d) => status(d) === 429);
    assert.equal(limited.length, 1000 - FAILED_AUTH_BURST);
    assert.equal(throttled, limited.length);
    const first = limited[0];
    assert.ok(first && !first.ok);
    assert.equal(first.retryAfterSeconds, FAILED_AUTH_REFILL_MS / 1000);
    assert.match(first.message, /Too many failed authentications/);
    // Another source is not affected.
    assert.equal(status(await authz.decide(req('garbage-other', '10.0.0.10'))), 401);
    assert.equal(reviews.length, FAILED_AUTH_BURST + 1);
    // Refill: one more failure per FAILED_AUTH_REFILL_MS.
    mock.timers.tick(FAILED_AUTH_REFILL_MS);
    assert.equal(status(await authz.decide(req('garbage-late-1'))), 401);
    assert.equal(status(await authz.decide(req('garbage-late-2'))), 429);
    assert.equal(reviews.length, FAILED_AUTH_BURST + 2);
  });

  it('a limited source still gets answers for tokens it already knows, and valid tokens are refunded', async () => {
    // Valid new tokens are charged while their review runs, then refunded: 100 of them in
    // sequence never exhaust the budget.
    for (let i = 0; i < 100; i++) assert.equal(status(await authz.decide(req(`valid-${i}`))), 200);
    assert.equal(throttled, 0);
    for (let i = 0; i < FAILED_AUTH_BURST; i++) await authz.decide(req(`garbage-${i}`));
    assert.equal(status(await authz.decide(req('garbage-x'))), 429);
    // Cached answers cost the apiserver nothing and stay available.
    const before = reviews.length;
    assert.equal(status(await authz.decide(req('valid-7'))), 200, 'accepted token, cached');
    assert.equal(status(await authz.decide(req('garbage-3'))), 401, 'rejected token, cached');
    assert.equal(reviews.length, before);
  });

  it('authorizes a WebSocket exec (GET) as create on nodes/proxy', async () => {
    const d = await authz.decide(req('valid-u', '10.0.0.9', 'GET', '/exec/ns/p/c?command=ls'));
    assert.equal(status(d), 403);
    assert.ok(!d.ok);
    assert.match(d.message, /verb=create, resource=nodes, subresource=proxy/);
    assert.deepEqual(sars, [
      { verb: 'create', resource: 'nodes', name: 'node-a', group: '', subresource: 'proxy' },
    ]);
    assert.equal(status(await authz.decide(req('valid-u', '10.0.0.9', 'GET', '/pods'))), 200);
  });
});
