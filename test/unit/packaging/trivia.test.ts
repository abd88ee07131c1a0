// packaging/trivia.ts: the release's modules without comments, every token where it was.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import { compactTrivia, type TsApi } from '../../../packaging/trivia.ts';

const ts = createRequire(import.meta.url)('typescript') as TsApi;

test('comments and line-ending blanks go; tokens keep their lines and columns', () => {
  const src = [
    '// A header → with a wide character',
    '/**',
    ' * JSDoc — also wide.',
    ' */',
    'export function f(a /* inline */, b) {   ',
    '  const re = /\\/\\/ not a comment/g; // a comment',
    "  const s = '// not a comment either';",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: JavaScript source text
    '  const t = `// kept ${a /* in a template */ + b} // kept too`;',
    '  /* a block',
    '     over lines */ return [re, s, t];',
    '}',
    '',
  ].join('\n');
  const out = compactTrivia(src, ts);
  assert.deepEqual(out.split('\n'), [
    '',
    '',
    '',
    '',
    'export function f(a             , b) {',
    '  const re = /\\/\\/ not a comment/g;',
    "  const s = '// not a comment either';",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: JavaScript source text
    '  const t = `// kept ${a                     + b} // kept too`;',
    '',
    '                   return [re, s, t];',
    '}',
    '',
  ]);
  assert.doesNotMatch(out, /[^\u0000-\u00ff]/, 'one byte a character once the comments are gone');
});

test('code without comments is unchanged', () => {
  const src = "import { x } from './x.js';\nexport const y = x + 1;\n";
  assert.equal(compactTrivia(src, ts), src);
});

test('a string that keeps a wide character keeps it', () => {
  const src = "export const arrow = '→'; // →\n";
  assert.equal(compactTrivia(src, ts), "export const arrow = '→';\n");
});

test('a file that ends in a comment, without a line break', () => {
  assert.equal(compactTrivia('export const a = 1; // the end', ts), 'export const a = 1;');
});
