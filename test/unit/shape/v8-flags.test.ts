// The daemon's V8 flags live in three places that must agree: the checkout's launcher
// (bin/vk-cocoon), the release's (packaging/launcher.sh) and the benches' transfer children
// (bench/lib/child.ts DAEMON_V8_FLAGS, so a transfer is measured with the daemon's memory, GC
// and compiler settings). docs/decisions.md "Daemon memory" says why each flag is there.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { DAEMON_V8_FLAGS } from '../../../bench/lib/child.ts';

const root = join(import.meta.dirname, '..', '..', '..');

test('bin/vk-cocoon, packaging/launcher.sh and the benches run the daemon with the same V8 flags', () => {
  const checkout = readFileSync(join(root, 'bin', 'vk-cocoon'), 'utf8').match(/^flags=\(([^)]*)\)$/m);
  assert.ok(checkout, 'bin/vk-cocoon has a flags=(…) line');
  assert.deepEqual(checkout[1]!.split(/\s+/), DAEMON_V8_FLAGS, 'bin/vk-cocoon');
  const release = readFileSync(join(root, 'packaging', 'launcher.sh'), 'utf8').match(
    /^exec "\$here\/runtime\/node" ((?:--\S+ )+)"\$here\/lib\/bundle\/vk-cocoon\.js" "\$@"$/m,
  );
  assert.ok(release, 'packaging/launcher.sh execs the runtime on the bundle');
  assert.deepEqual(release[1]!.trim().split(' '), DAEMON_V8_FLAGS, 'packaging/launcher.sh');
  // Bytecode only: no optimizing (TurboFan, Maglev) and no baseline (Sparkplug) compiler.
  for (const f of ['--no-opt', '--no-maglev', '--no-sparkplug']) assert.ok(DAEMON_V8_FLAGS.includes(f), f);
});
