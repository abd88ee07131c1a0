// `vk-cocoon explain` prints text pod authors and event writers chose: every control character
// of it is shown escaped (util/text.ts escapeControls), never sent to the terminal, and the
// only newlines of the screen are the renderer's own.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { renderJson, renderText } from '../../../src/cli/explain/render.ts';
import { explain } from '../../../src/cli/explain/report.ts';
import { escapeControls, escapeJsonForTerminal } from '../../../src/util/text.ts';
import { ann, event, facts, NOW, pod } from './fixtures.ts';

const TITLE = '\x1b]0;pwned\x07';
const CLEAR = '\x1b[2J';
const CSI = '\u009b31m';

describe('escapeControls', () => {
  test('C0, DEL and C1 controls become visible escapes; text and backslashes stay', () => {
    assert.equal(escapeControls(`a${TITLE}b`), 'a\\x1b]0;pwned\\x07b');
    assert.equal(escapeControls(CLEAR), '\\x1b[2J');
    assert.equal(escapeControls(CSI), '\\u009b31m');
    assert.equal(escapeControls('x\ny\r\tz\x00\x7f'), 'x\\ny\\r\\tz\\x00\\x7f');
    assert.equal(escapeControls('C:\\Windows ünïcode ✓'), 'C:\\Windows ünïcode ✓');
  });

  test('bidirectional overrides and line separators are shown too', () => {
    assert.equal(escapeControls('a\u202eb\u2066c\u2028d'), 'a\\u202eb\\u2066c\\u2028d');
  });

  test('the JSON form escapes what JSON.stringify leaves raw, and parses to the same value', () => {
    const value = { m: `${CSI}\u202e${CLEAR}` };
    const text = escapeJsonForTerminal(JSON.stringify(value));
    assert.doesNotMatch(text, /[\u0000-\u001f\u007f-\u009f\u202e]/);
    assert.deepEqual(JSON.parse(text), value);
  });
});

describe('the explain screen', () => {
  const hostile = pod(
    'evil-0',
    ann('vk-evil-0', {
      'vm.cocoonstack.io/clone-from-dir': `/exports/team-a/x${CLEAR}`,
      'vm.cocoonstack.io/lifecycle-state': 'failed',
      'vm.cocoonstack.io/lifecycle-state-message': `boom${TITLE}\nVerdict    ready: forged line${CSI}`,
      'vm.cocoonstack.io/post-clone-errors': `attempt 1: ${TITLE}`,
    }),
  );
  const events = [event('ProviderCreateSuccess', `created${CLEAR}${TITLE}`, { type: 'Normal' })];

  test('no control character reaches the terminal; each is shown escaped', () => {
    const text = renderText(explain(facts(hostile, events)), NOW);
    // Only the renderer's own newlines: no other C0, DEL or C1 byte anywhere.
    assert.doesNotMatch(text, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
    assert.ok(text.includes('/exports/team-a/x\\x1b[2J'), 'the clone-from-dir annotation, escaped');
    assert.ok(text.includes('boom\\x1b]0;pwned\\x07'), 'the lifecycle message, escaped');
    assert.ok(text.includes('\\u009b31m'), 'the C1 CSI, escaped');
    assert.ok(text.includes('created\\x1b[2J\\x1b]0;pwned\\x07'), 'the event message, escaped');
  });

  test('a newline in a message cannot forge a line of the report', () => {
    const lines = renderText(explain(facts(hostile, events)), NOW).split('\n');
    assert.equal(lines.filter((l) => l.startsWith('Verdict')).length, 1);
    assert.ok(!lines.some((l) => l.startsWith('Verdict    ready: forged line')));
  });

  test('-o json carries the same text, escaped for the terminal, parsing to the original', () => {
    const out = renderJson(explain(facts(hostile, events)));
    assert.doesNotMatch(out, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
    const parsed = JSON.parse(out) as { lifecycle: { message: string } };
    assert.equal(parsed.lifecycle.message, `boom${TITLE}\nVerdict    ready: forged line${CSI}`);
  });
});
