// The benchmarks' pure helpers: percentiles, audit-log counting, calls by verb, /proc parsing.
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  AuditTail,
  countWrites,
  DAEMON_USER,
  isDaemonUser,
  otherWrites,
  parseAuditLine,
  parseAuditLog,
  selectWrites,
} from '../../../bench/lib/audit.ts';
import { countCalls, verbOf } from '../../../bench/lib/calls.ts';
import { parseStatTimes, parseStatusMem } from '../../../bench/lib/procfs.ts';
import { fmtCounts, markdownTable, max, mean, pct } from '../../../bench/lib/stats.ts';

function auditLine(o: {
  verb: string;
  user?: string;
  resource: string;
  sub?: string;
  ns?: string;
  name?: string;
  code?: number;
  at?: string;
  stage?: string;
}): string {
  return JSON.stringify({
    kind: 'Event',
    apiVersion: 'audit.k8s.io/v1',
    level: 'Metadata',
    auditID: 'x',
    stage: o.stage ?? 'ResponseComplete',
    requestURI: '/api/v1/...',
    verb: o.verb,
    user: { username: o.user ?? DAEMON_USER, groups: ['system:authenticated'] },
    objectRef: {
      resource: o.resource,
      ...(o.ns ? { namespace: o.ns } : {}),
      ...(o.name ? { name: o.name } : {}),
      apiVersion: 'v1',
      ...(o.sub ? { subresource: o.sub } : {}),
    },
    responseStatus: { metadata: {}, code: o.code ?? 200 },
    requestReceivedTimestamp: o.at ?? '2026-11-30T10:00:00.123456Z',
    stageTimestamp: o.at ?? '2026-11-30T10:00:00.223456Z',
  });
}

test('pct is the nearest rank; max and mean; NaN for no values', () => {
  const v = [5, 1, 4, 2, 3, 6, 7, 8, 9, 10];
  assert.equal(pct(v, 50), 5);
  assert.equal(pct(v, 99), 10);
  assert.equal(pct(v, 90), 9);
  assert.equal(pct(v, 0), 1);
  assert.equal(pct([42], 99), 42);
  assert.ok(Number.isNaN(pct([], 50)));
  assert.equal(max(v), 10);
  assert.equal(mean([1, 2, 3]), 2);
  assert.ok(Number.isNaN(max([])));
});

test('parseAuditLine keeps completed writes with user, kind, time; drops the rest', () => {
  const w = parseAuditLine(auditLine({ verb: 'patch', resource: 'pods', sub: 'status', ns: 'a', name: 'p' }));
  assert.deepEqual(w, {
    verb: 'patch',
    user: DAEMON_USER,
    kind: 'pods/status',
    namespace: 'a',
    name: 'p',
    code: 200,
    at: Date.parse('2026-11-30T10:00:00.123Z'),
  });
  assert.equal(parseAuditLine(auditLine({ verb: 'get', resource: 'pods' })), undefined);
  assert.equal(
    parseAuditLine(auditLine({ verb: 'watch', resource: 'pods', stage: 'ResponseStarted' })),
    undefined,
  );
  assert.equal(
    parseAuditLine(auditLine({ verb: 'create', resource: 'pods', stage: 'RequestReceived' })),
    undefined,
  );
  assert.equal(parseAuditLine('{not json'), undefined);
  assert.equal(parseAuditLine(''), undefined);
});

test('countWrites by kind and verb, failures and distinct pods; selectWrites filters user and window', () => {
  const text = [
    auditLine({ verb: 'patch', resource: 'pods', ns: 'a', name: 'p1', at: '2026-11-30T10:00:01Z' }),
    auditLine({
      verb: 'patch',
      resource: 'pods',
      sub: 'status',
      ns: 'a',
      name: 'p1',
      at: '2026-11-30T10:00:02Z',
    }),
    auditLine({
      verb: 'patch',
      resource: 'pods',
      sub: 'status',
      ns: 'a',
      name: 'p2',
      code: 409,
      at: '2026-11-30T10:00:03Z',
    }),
    auditLine({ verb: 'create', resource: 'events', ns: 'a', at: '2026-11-30T10:00:04Z' }),
    auditLine({
      verb: 'update',
      resource: 'leases',
      ns: 'kube-node-lease',
      name: 'n',
      at: '2026-11-30T10:00:05Z',
    }),
    auditLine({ verb: 'patch', resource: 'nodes', sub: 'status', name: 'n', at: '2026-11-30T10:00:06Z' }),
    auditLine({
      verb: 'create',
      resource: 'pods',
      ns: 'a',
      name: 'p3',
      user: 'admin',
      at: '2026-11-30T10:00:07Z',
    }),
    'garbage',
  ].join('\n');
  const all = parseAuditLog(text);
  assert.equal(all.length, 7);
  const mine = selectWrites(all, { user: DAEMON_USER });
  // A daemon running as its node identity counts as the daemon too; the admin does not.
  const asNode = parseAuditLog(
    auditLine({ verb: 'delete', resource: 'pods', ns: 'a', name: 'p1', user: 'system:node:n' }),
  );
  assert.equal(selectWrites([...all, ...asNode], { user: isDaemonUser }).length, 7);
  const c = countWrites(mine);
  assert.equal(c.total, 6);
  assert.deepEqual(c.byKind, { pods: 1, 'pods/status': 2, events: 1, leases: 1, 'nodes/status': 1 });
  assert.equal(c.byKindVerb['pods/status patch'], 2);
  assert.equal(c.byKindVerb['leases update'], 1);
  assert.equal(c.failed, 1);
  assert.equal(c.podsWritten, 2);
  assert.equal(otherWrites(c), 1);
  const window = selectWrites(all, {
    user: DAEMON_USER,
    from: Date.parse('2026-11-30T10:00:02Z'),
    to: Date.parse('2026-11-30T10:00:04Z'),
  });
  assert.equal(window.length, 3);
  assert.equal(selectWrites(all, { namespace: 'a' }).length, 5);
});

test('AuditTail reads appended lines once and keeps a partial line for the next poll', () => {
  const dir = mkdtempSync(join(tmpdir(), 'audit-tail-'));
  try {
    const file = join(dir, 'audit.log');
    const tail = new AuditTail(file);
    assert.equal(tail.poll(), 0); // not there yet
    const l1 = auditLine({ verb: 'patch', resource: 'pods', ns: 'a', name: 'p1' });
    const l2 = auditLine({ verb: 'create', resource: 'events', ns: 'a', name: 'é-event' });
    writeFileSync(file, `${l1}\n${l2.slice(0, 40)}`);
    assert.equal(tail.poll(), 1);
    // The rest of the line.
    appendFileSync(file, `${l2.slice(40)}\n`);
    assert.equal(tail.poll(), 1);
    assert.equal(tail.poll(), 0);
    assert.deepEqual(
      tail.writes.map((w) => w.kind),
      ['pods', 'events'],
    );
    assert.equal(tail.writes[1]?.name, 'é-event');
    assert.equal(tail.count({ user: DAEMON_USER }).total, 2);
    assert.equal(tail.lastAt({ user: DAEMON_USER }, ['events']), Date.parse('2026-11-30T10:00:00.123Z'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('AuditTail does not corrupt a UTF-8 character split across two polls', () => {
  const dir = mkdtempSync(join(tmpdir(), 'audit-tail-'));
  try {
    const file = join(dir, 'audit.log');
    const tail = new AuditTail(file);
    const line = Buffer.from(`${auditLine({ verb: 'create', resource: 'events', ns: 'a', name: 'ü' })}\n`);
    const at = line.indexOf(Buffer.from('ü')) + 1; // inside the two-byte sequence
    writeFileSync(file, line.subarray(0, at));
    assert.equal(tail.poll(), 0);
    appendFileSync(file, line.subarray(at));
    assert.equal(tail.poll(), 1);
    assert.equal(tail.writes[0]?.name, 'ü');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('verbOf and countCalls: group and verb, flags excluded, window on startedAt', () => {
  assert.equal(verbOf(['vm', 'clone', '--name', 'x', 'snap']), 'vm clone');
  assert.equal(verbOf(['vm', 'list', '-o', 'json']), 'vm list');
  assert.equal(verbOf(['snapshot', 'inspect', 'a/b']), 'snapshot inspect');
  assert.equal(verbOf(['--help']), '(none)');
  const calls = [
    { argv: ['vm', 'clone', 'a'], startedAt: '2026-11-30T10:00:01.000Z' },
    { argv: ['vm', 'clone', 'b'], startedAt: '2026-11-30T10:00:02.000Z' },
    { argv: ['vm', 'list'], startedAt: '2026-11-30T10:00:03.000Z' },
    { argv: ['vm', 'list'], startedAt: '2026-11-30T10:00:09.000Z' },
  ];
  assert.deepEqual(
    countCalls(calls, Date.parse('2026-11-30T10:00:01Z'), Date.parse('2026-11-30T10:00:05Z')),
    {
      'vm clone': 2,
      'vm list': 1,
    },
  );
});

test('parseStatTimes reads utime+stime and cutime+cstime past a command with spaces and parens', () => {
  // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
  const stat = '1234 (node (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 700 300 20 0 11 0 5000 0 0';
  assert.deepEqual(parseStatTimes(stat, 100), { selfMs: 3000, childrenMs: 10_000 });
  const status =
    'Name:\tnode\nVmPeak:\t 999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t   60000 kB\nRssFile:\t   42400 kB\n';
  assert.deepEqual(parseStatusMem(status), {
    rssKiB: 102400,
    hwmKiB: 204800,
    anonKiB: 60000,
    fileKiB: 42400,
  });
});

test('markdownTable and fmtCounts', () => {
  assert.equal(
    markdownTable(['a', 'b'], [['1', 'x|y'], ['2']]),
    ['| a | b |', '|---|---|', '| 1 | x\\|y |', '| 2 |  |'].join('\n'),
  );
  assert.equal(
    fmtCounts({ 'vm list': 2, 'vm clone': 4, 'image inspect': 4 }, 2, 1),
    'image inspect 2.0, vm clone 2.0, vm list 1.0',
  );
  assert.equal(fmtCounts({}), '0');
});
