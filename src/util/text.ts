// Text helpers shared by every layer (pure).

function utf8Length(codePoint: number): number {
  if (codePoint < 0x80) return 1;
  if (codePoint < 0x800) return 2;
  if (codePoint < 0x10000) return 3;
  return 4;
}

/**
 * Truncates `text` to at most `maxBytes` bytes of UTF-8 without splitting a code point
 * (docs/contracts/annotations.md "Size limits"). The result is always well formed: a lone surrogate (which UTF-8 cannot
 * encode) is replaced by U+FFFD, exactly what `TextEncoder` and the apiserver would store.
 * A pure-ASCII text longer than the cap is cut to exactly `maxBytes` bytes.
 */
export function truncateUtf8(text: string, maxBytes: number): string {
  const wellFormed = text.toWellFormed();
  if (maxBytes <= 0) return '';
  if (Buffer.byteLength(wellFormed, 'utf8') <= maxBytes) return wellFormed;
  let bytes = 0;
  let end = 0;
  for (const char of wellFormed) {
    const size = utf8Length(char.codePointAt(0)!);
    if (bytes + size > maxBytes) break;
    bytes += size;
    end += char.length;
  }
  return wellFormed.slice(0, end);
}

/** C0 controls, DEL, C1 controls (U+0080–U+009F: U+009B is a one-character CSI on terminals
 * that honour C1), the line and paragraph separators and the bidirectional overrides and
 * isolates (which reorder what a reader sees, "Trojan Source"). */
const UNSAFE_FOR_TERMINAL = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const SHORT_ESCAPES: Readonly<Record<string, string>> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

/**
 * Text someone else wrote (a pod author's annotation, an event message), made safe to print
 * on a terminal: every control character becomes a visible escape, `\x1b` for C0 and DEL,
 * `\u009b` for C1 and the other invisible formatters, `\n`/`\r`/`\t` for those three. So an
 * escape sequence can neither retitle the window, clear the screen, move the cursor nor
 * forge lines; the caller puts its own newlines between the escaped pieces. Backslashes are
 * left alone so commands shown stay copyable.
 */
export function escapeControls(text: string): string {
  return text.replace(UNSAFE_FOR_TERMINAL, (c) => {
    const short = SHORT_ESCAPES[c];
    if (short !== undefined) return short;
    const code = c.charCodeAt(0);
    return code <= 0x7f
      ? `\\x${code.toString(16).padStart(2, '0')}`
      : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}

/** The same characters outside C0 (which JSON.stringify already escapes) as JSON `\uXXXX`
 * escapes: the JSON parses to the same value and prints safely. */
export function escapeJsonForTerminal(json: string): string {
  return json.replace(
    /[\u007f-\u009f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}
