// The runbook (docs/operations.md "Runbook") and explain's advice table cover every Warning
// reason the daemon emits; the explain command's arguments and its line in `--help`.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ADVICE_REASONS } from '../../../src/cli/explain/advice.ts';
import { EXPLAIN_USAGE, parseExplainArgs, withExplainUsage } from '../../../src/cli/explain/command.ts';
import { helpText } from '../../../src/config/env.ts';
import { SAC_PHASE_REASONS, WINDOWS_STATIC_IP_FAILED } from '../../../src/guest/sac.ts';
import {
  ipWaitTimeoutReason,
  POST_CLONE_EXHAUSTED_REASON,
  READY_DEADLINE_REASON,
} from '../../../src/lifecycle/owed.ts';
import { CPU_CLASS_MISMATCH } from '../../../src/vmspec/snapshot-cpu-class.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Every Warning reason written by the provider and the pod controller: literal call sites
 * (events, failOp, createFailed, warnOnce, evictions, LifecycleError, the hibernate phase
 * map) and the reasons that live in constants. */
function emittedWarningReasons(): Set<string> {
  const found = new Set<string>([
    ...Object.values(SAC_PHASE_REASONS),
    WINDOWS_STATIC_IP_FAILED,
    POST_CLONE_EXHAUSTED_REASON,
    READY_DEADLINE_REASON,
    ipWaitTimeoutReason('create'),
    ipWaitTimeoutReason('wake'),
    CPU_CLASS_MISMATCH,
  ]);
  const patterns = [
    /\.event\(\s*[\w.]+,\s*'Warning',\s*'(\w+)'/g,
    /\bfailOp\(\s*ctx,\s*rec,\s*'\w+',\s*'(\w+)'/g,
    /\b(?:createFailed|warnOnce|removeThenEvict|evict)\(\s*ctx,\s*rec,\s*'(\w+)'/g,
    /new LifecycleError\(\s*'(\w+)'/g,
    /:\s*'(Hibernate\w+Failed)'/g,
  ];
  for (const f of [...files(join(root, 'src', 'provider')), join(root, 'src', 'pods', 'controller.ts')]) {
    const text = readFileSync(f, 'utf8');
    for (const re of patterns) for (const m of text.matchAll(re)) found.add(m[1] ?? '');
  }
  return found;
}

function runbook(): string {
  const doc = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');
  const start = doc.indexOf('\n## Runbook\n');
  assert.ok(start >= 0, 'docs/operations.md has a Runbook section');
  const end = doc.indexOf('\n## ', start + 1);
  return doc.slice(start, end < 0 ? undefined : end);
}

test('the scan finds the reasons (it is not silently empty)', () => {
  const r = emittedWarningReasons();
  for (const known of [
    'CreateBringUpFailed',
    'PostCloneExecExhausted',
    'VMGone',
    'HibernatePushFailed',
    'Evicted',
  ])
    assert.ok(r.has(known), known);
  assert.ok(r.size >= 30, `${r.size} reasons`);
});

test('every Warning reason the daemon emits has a runbook entry and explain advice', () => {
  const text = runbook();
  const missingDoc = [...emittedWarningReasons()].filter((r) => !text.includes(`\`${r}\``));
  assert.deepEqual(missingDoc, [], 'reasons without a runbook entry');
  const missingAdvice = [...emittedWarningReasons()].filter((r) => !ADVICE_REASONS.includes(r));
  assert.deepEqual(missingAdvice, [], 'reasons without explain advice');
});

test('every reason of the advice table is in the runbook', () => {
  const text = runbook();
  assert.deepEqual(
    ADVICE_REASONS.filter((r) => !text.includes(`\`${r}\``)),
    [],
  );
});

test('explain arguments: ns/pod, -n, -o json, --output=json, --kubeconfig; usage errors', () => {
  assert.deepEqual(parseExplainArgs(['team-a/db-0']), {
    namespace: 'team-a',
    name: 'db-0',
    output: 'text',
    kubeconfig: undefined,
  });
  assert.deepEqual(parseExplainArgs(['-n', 'team-a', 'db-0', '-o', 'json', '--kubeconfig', '/k']), {
    namespace: 'team-a',
    name: 'db-0',
    output: 'json',
    kubeconfig: '/k',
  });
  assert.deepEqual(parseExplainArgs(['--output=json', 'a/b']), {
    namespace: 'a',
    name: 'b',
    output: 'json',
    kubeconfig: undefined,
  });
  assert.equal((parseExplainArgs(['-ojson', 'a/b']) as { output: string }).output, 'json');
  assert.equal(parseExplainArgs(['--help']), 'help');
  assert.equal(parseExplainArgs([]), 'expected one pod: <namespace>/<pod>');
  assert.equal(parseExplainArgs(['db-0']), 'expected <namespace>/<pod> (or -n <namespace> <pod>)');
  assert.equal(parseExplainArgs(['a/b', '-o', 'yaml']), 'unknown output format "yaml" (text or json)');
  assert.equal(parseExplainArgs(['a/b', '--watch']), 'unknown flag "--watch"');
});

test('--help lists explain in its usage block', () => {
  const help = withExplainUsage(helpText());
  const usage = help.slice(help.indexOf('Usage:'), help.indexOf('Environment:'));
  assert.match(usage, /vk-cocoon explain <namespace>\/<pod> \[-o json\]/);
  assert.ok(usage.indexOf('explain') < usage.indexOf('--help'), 'before --help');
  assert.match(EXPLAIN_USAGE, /^Usage: vk-cocoon explain <namespace>\/<pod>/);
});
