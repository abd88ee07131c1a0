// The runner's two pools (issue 18): transfer verbs (snapshot import/export, image
// import/pull) take transfer slots, never the short calls' slots; a whole transfer
// (CocoonCli.transfer) holds one slot and its own import takes no second one; and the
// operation's abort signal (src/util/op-signal.ts) kills a call. A shell script stands in for
// cocoon: `<bin> <group> <verb> <tag>` logs `<tag>` when it starts, then waits for the file
// `<tag>.go` (the test lets it finish), so nothing depends on wall-clock time.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { CocoonCli, CocoonCommandError, isTransferVerb } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { runWithOpSignal } from '../../../src/util/op-signal.ts';

function fake(t: { after: (fn: () => void) => void }) {
  const dir = mkdtempSync(join(tmpdir(), 'vk-pools-'));
  const lifetime = new AbortController();
  t.after(() => {
    lifetime.abort();
    rmSync(dir, { recursive: true, force: true });
  });
  const log = join(dir, 'started.log');
  const bin = join(dir, 'cocoon');
  writeFileSync(log, '');
  writeFileSync(
    bin,
    `#!/bin/sh\necho "$3" >> '${log}'\nwhile [ ! -e '${dir}/'"$3"'.go' ]; do sleep 0.01; done\necho done\n`,
  );
  chmodSync(bin, 0o755);
  const cli = new CocoonCli(bin, lifetime.signal, silentLogger, { maxConcurrent: 1, transferSlots: 1 });
  return {
    cli,
    started: () => readFileSync(log, 'utf8').split('\n').filter(Boolean),
    go: (tag: string) => writeFileSync(join(dir, `${tag}.go`), ''),
    exists: (tag: string) => existsSync(join(dir, `${tag}.go`)),
  };
}

async function until(what: string, cond: () => boolean): Promise<void> {
  // Bounded by the test runner's timeout, not by a clock here.
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
  assert.ok(cond(), what);
}

test('transfer verbs are the moves of snapshots and images', () => {
  assert.equal(isTransferVerb(['snapshot', 'import', '--name', 'x']), true);
  assert.equal(isTransferVerb(['snapshot', 'export', 'x', '-o', '-']), true);
  assert.equal(isTransferVerb(['image', 'import', 'x']), true);
  assert.equal(isTransferVerb(['image', 'pull', 'x']), true);
  assert.equal(isTransferVerb(['snapshot', 'inspect', 'x']), false);
  assert.equal(isTransferVerb(['vm', 'clone', '--name', 'x', 's']), false);
});

test('a running transfer does not hold the call slot; a second transfer waits for the transfer slot', async (t) => {
  const f = fake(t);
  const pull = f.cli.run(['image', 'pull', 'pull1'], { timeoutMs: 60_000 });
  await until('pull1 started', () => f.started().includes('pull1'));
  const inspect = f.cli.run(['vm', 'inspect', 'inspect1'], { timeoutMs: 60_000 });
  await until('inspect1 started while pull1 runs', () => f.started().includes('inspect1'));
  const pull2 = f.cli.run(['snapshot', 'import', 'pull2'], { timeoutMs: 60_000 });
  await until('pull2 queued', () => f.cli.transfersWaiting === 1);
  assert.deepEqual(f.started(), ['pull1', 'inspect1']);
  f.go('inspect1');
  f.go('pull1');
  await Promise.all([pull, inspect]);
  await until('pull2 started once pull1 ended', () => f.started().includes('pull2'));
  f.go('pull2');
  await pull2;
});

test('a whole transfer holds one slot; its own import takes no second one (no deadlock)', async (t) => {
  const f = fake(t);
  const whole = f.cli.transfer(async () => {
    await f.cli.run(['snapshot', 'import', 'inner'], { timeoutMs: 60_000 });
    return 'ok';
  });
  await until('inner import started inside the transfer', () => f.started().includes('inner'));
  const other = f.cli.run(['image', 'import', 'other'], { timeoutMs: 60_000 });
  await until('other waits for the transfer slot', () => f.cli.transfersWaiting === 1);
  f.go('inner');
  assert.equal(await whole, 'ok');
  await until('other started', () => f.started().includes('other'));
  f.go('other');
  await other;
});

test('the operation signal kills a running call', async (t) => {
  const f = fake(t);
  const ac = new AbortController();
  const call = runWithOpSignal(ac.signal, () => f.cli.run(['vm', 'clone', 'clone1'], { timeoutMs: 60_000 }));
  await until('clone1 started', () => f.started().includes('clone1'));
  ac.abort(new Error('pod is being deleted'));
  const err = await call.catch((e: unknown) => e);
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /^cocoon vm clone: aborted/);
  assert.equal(f.exists('clone1'), false, 'it ended by the abort, not by finishing');
});
