// The release's JavaScript without its comments (packaging/build.ts runs it on every stripped
// module): V8 keeps the source text of every module for the daemon's whole life (lazy
// functions compile from it), and the sources are mostly comments; one character above U+00FF
// anywhere in a file (an arrow or a dash in a comment) stores the whole text at two bytes a
// character (docs/decisions.md "Daemon memory").
//
// Every token keeps its line and column, so stack traces still name source positions: only
// trivia (the text between tokens, as the TypeScript parser sees it, so `//` inside a string, a
// template or a regular expression is never taken for a comment) changes: a comment becomes
// nothing but its line breaks, blanks that end a line go, and the blanks before a token on its
// line stay. compactTrivia checks its own output token by token and throws on any difference.

/** The part of the TypeScript compiler API used here (the build's own dev dependency). */
export interface TsApi {
  createSourceFile(
    name: string,
    text: string,
    options: { languageVersion: number; jsDocParsingMode: number },
    setParents: boolean,
    kind: number,
  ): TsNode;
  getLeadingCommentRanges(text: string, pos: number): { pos: number; end: number }[] | undefined;
  ScriptTarget: { Latest: number };
  ScriptKind: { JS: number };
  JSDocParsingMode: { ParseNone: number };
}

interface TsNode {
  kind: number;
  pos: number;
  end: number;
  getChildren(sourceFile?: TsNode): readonly TsNode[];
  getStart(sourceFile?: TsNode): number;
}

interface Token {
  kind: number;
  /** Full start (where its leading trivia starts), start of its text, end. */
  pos: number;
  start: number;
  end: number;
}

/** Every token of `js` in order, the end-of-file token last. */
function tokens(js: string, ts: TsApi): Token[] {
  // JSDoc left unparsed: comments stay trivia, never nodes.
  const options = {
    languageVersion: ts.ScriptTarget.Latest,
    jsDocParsingMode: ts.JSDocParsingMode.ParseNone,
  };
  const sf = ts.createSourceFile('module.js', js, options, false, ts.ScriptKind.JS);
  const out: Token[] = [];
  const visit = (node: TsNode) => {
    const kids = node.getChildren(sf);
    if (kids.length === 0)
      out.push({ kind: node.kind, pos: node.pos, start: node.getStart(sf), end: node.end });
    else for (const k of kids) visit(k);
  };
  visit(sf);
  return out;
}

/** One trivia run: comments and blanks out, line breaks kept; when a token follows on the run's
 * last line, that line keeps its length (in spaces) so the token keeps its column. */
function compactRun(trivia: string, ts: TsApi, tokenFollows: boolean): string {
  let blank = '';
  let at = 0;
  for (const c of ts.getLeadingCommentRanges(trivia, 0) ?? []) {
    blank += trivia.slice(at, c.pos) + trivia.slice(c.pos, c.end).replace(/[^\n]/g, ' ');
    at = c.end;
  }
  blank += trivia.slice(at);
  const lines = blank.split('\n');
  const last = lines.length - 1;
  return lines.map((l, i) => (i === last && tokenFollows ? ' '.repeat(l.length) : '')).join('\n');
}

/** Line and column of every offset in `offsets` (sorted ascending). */
function lineCols(text: string, offsets: number[]): string[] {
  const out: string[] = [];
  let line = 0;
  let lineStart = 0;
  let at = 0;
  for (const o of offsets) {
    for (; at < o; at++)
      if (text.charCodeAt(at) === 10) {
        line++;
        lineStart = at + 1;
      }
    out.push(`${line}:${o - lineStart}`);
  }
  return out;
}

/** `js` without comments and line-ending blanks; every token at its line and column. */
export function compactTrivia(js: string, ts: TsApi): string {
  const before = tokens(js, ts);
  let out = '';
  let at = 0;
  for (const t of before) {
    out += js.slice(at, t.pos);
    // The end-of-file token has no text: what precedes it ends the file, not a token's line.
    const isEof = t.start === t.end && t.end === js.length;
    out += compactRun(js.slice(t.pos, t.start), ts, !isEof);
    out += js.slice(t.start, t.end);
    at = t.end;
  }
  out += js.slice(at);
  // The check: the same tokens, the same text, at the same lines and columns (the end-of-file
  // token, which has no text, moves back when a comment ended the file).
  const textual = (list: Token[], text: string) => list.filter((t) => t.start < t.end || t.end < text.length);
  const after = textual(tokens(out, ts), out);
  const where = (text: string, ts2: Token[]) =>
    lineCols(
      text,
      ts2.map((t) => t.start),
    ).map((lc, i) => `${lc} ${ts2[i]?.kind} ${text.slice(ts2[i]?.start, ts2[i]?.end)}`);
  const a = where(js, textual(before, js));
  const b = where(out, after);
  const i = a.findIndex((x, k) => x !== b[k]);
  if (i >= 0 || a.length !== b.length)
    throw new Error(`compactTrivia changed a token: ${a[i] ?? '(end)'} became ${b[i] ?? '(end)'}`);
  return out;
}
