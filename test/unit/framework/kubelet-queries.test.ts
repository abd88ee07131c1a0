import assert from 'node:assert/strict';
import { test } from 'node:test';
import { requestAttributes } from '../../../src/kubelet/auth.ts';
import { parseExecQuery, parseLogQuery, podRoute } from '../../../src/kubelet/queries.ts';

const q = (s: string) => new URLSearchParams(s);

test('log query: valid values', () => {
  const r = parseLogQuery(q('tailLines=10&follow=true&timestamps=1&limitBytes=5&sinceSeconds=3'));
  assert.ok(r.ok);
  assert.equal(r.value.tailLines, 10);
  assert.equal(r.value.follow, true);
  assert.equal(r.value.timestamps, true);
  assert.equal(r.value.limitBytes, 5);
  assert.equal(r.value.sinceSeconds, 3);
});

test('log query: bad values are 400 messages', () => {
  for (const s of [
    'tailLines=-1',
    'limitBytes=0',
    'sinceSeconds=0',
    'sinceTime=yesterday',
    'sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z',
    'tailLines=x',
  ]) {
    const r = parseLogQuery(q(s));
    assert.equal(r.ok, false, s);
  }
});

test('exec query: commands, streams, tty rules', () => {
  const r = parseExecQuery(q('command=sh&command=-c&command=exit%203&input=1&output=1&tty=1'));
  assert.ok(r.ok);
  assert.deepEqual(r.value.command, ['sh', '-c', 'exit 3']);
  assert.equal(r.value.stdin, true);
  assert.equal(r.value.tty, true);
  assert.equal(parseExecQuery(q('command=ls&tty=1&error=1&output=1')).ok, false);
  assert.equal(parseExecQuery(q('command=ls')).ok, false);
  assert.equal(parseExecQuery(q('output=1')).ok, false);
});

test('pod routes with and without the uid segment', () => {
  assert.deepEqual(podRoute('/exec/ns/pod/agent', 'exec'), {
    namespace: 'ns',
    pod: 'pod',
    container: 'agent',
  });
  assert.deepEqual(podRoute('/exec/ns/pod/uid-1/agent', 'exec'), {
    namespace: 'ns',
    pod: 'pod',
    container: 'agent',
  });
  assert.equal(podRoute('/exec/ns/pod', 'exec'), undefined);
  assert.equal(podRoute('/containerLogs/ns/pod/agent', 'exec'), undefined);
});

test('SubjectAccessReview attributes per path and method', () => {
  assert.deepEqual(requestAttributes('GET', '/stats/summary'), { verb: 'get', subresource: 'stats' });
  assert.deepEqual(requestAttributes('GET', '/metrics/resource'), { verb: 'get', subresource: 'metrics' });
  assert.deepEqual(requestAttributes('GET', '/logs/x'), { verb: 'get', subresource: 'log' });
  assert.deepEqual(requestAttributes('POST', '/exec/a/b/c'), { verb: 'create', subresource: 'proxy' });
  assert.deepEqual(requestAttributes('GET', '/containerLogs/a/b/c'), { verb: 'get', subresource: 'proxy' });
  assert.deepEqual(requestAttributes('GET', '/pods'), { verb: 'get', subresource: 'proxy' });
});
