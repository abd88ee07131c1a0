// The few pieces of Go's standard library whose exact output the peer wire format depends on
// (docs/peer-restore.md "Wire contract"): encoding/json's string escaping (HTML-safe, as
// json.Encoder and json.MarshalIndent write it), net/url's QueryEscape and ParseQuery, and
// fmt's %q. Pure; no I/O.

/**
 * A JSON value as Go's encoding/json writes it with HTML escaping on (the default of
 * json.Marshal, json.MarshalIndent and json.Encoder). Strings: `<`, `>`, `&`, U+2028 and
 * U+2029 become `\u003c`, `\u003e`, `\u0026`, `\u2028`, `\u2029`; the rest as JSON.stringify
 * writes them (the same short escapes `\b \f \n \r \t \" \\`, other control characters as
 * lowercase `\u00XX`); a lone surrogate (no Go string has one) as U+FFFD. Objects keep their
 * key order, and a `Map` is written as an object in its own order (JavaScript puts
 * integer-like keys of a plain object first, a Go map sorts them as strings: pass a sorted
 * Map for those). `indent` gives MarshalIndent's layout: one entry per line, `"key": value`,
 * empty `{}` and `[]` kept compact.
 */
export function goJson(value: unknown, indent = 0): string {
  return encode(value, indent > 0 ? ' '.repeat(indent) : '', '');
}

function goString(s: string): string {
  return JSON.stringify(s.toWellFormed()).replace(
    /[<>&\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

function encode(v: unknown, step: string, pad: string): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'string') return goString(v);
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new TypeError(`unsupported value ${v}`);
    return JSON.stringify(v);
  }
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  const inner = pad + step;
  const join = (items: string[], open: string, close: string) => {
    if (items.length === 0) return open + close;
    if (step === '') return open + items.join(',') + close;
    return `${open}\n${inner}${items.join(`,\n${inner}`)}\n${pad}${close}`;
  };
  const colon = step === '' ? ':' : ': ';
  if (Array.isArray(v))
    return join(
      v.map((x) => encode(x, step, inner)),
      '[',
      ']',
    );
  const entries =
    v instanceof Map ? [...v.entries()] : Object.entries(v as object).filter(([, x]) => x !== undefined);
  return join(
    entries.map(([k, x]) => `${goString(String(k))}${colon}${encode(x, step, inner)}`),
    '{',
    '}',
  );
}

const UNRESERVED = /^[A-Za-z0-9\-_.~]$/;

/** Go's `url.QueryEscape`: UTF-8 bytes, `[A-Za-z0-9-_.~]` kept, space as `+`, the rest `%XX` (upper case). */
export function goQueryEscape(s: string): string {
  let out = '';
  for (const ch of s.toWellFormed()) {
    if (UNRESERVED.test(ch)) out += ch;
    else if (ch === ' ') out += '+';
    else for (const b of Buffer.from(ch, 'utf8')) out += `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** Go's `url.QueryUnescape`: `+` is a space, `%XX` must be two hex digits; undefined when malformed. */
export function goQueryUnescape(s: string): string | undefined {
  if (!s.includes('%') && !s.includes('+')) return s;
  const bytes: number[] = [];
  for (let i = 0; i < s.length; i++) {
    const c = s[i] as string;
    if (c === '%') {
      const hex = s.slice(i + 1, i + 3);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined;
      bytes.push(Number.parseInt(hex, 16));
      i += 2;
    } else if (c === '+') {
      bytes.push(0x20);
    } else {
      for (const b of Buffer.from(c, 'utf8')) bytes.push(b);
    }
  }
  // Go keeps invalid UTF-8 as raw bytes; a JS string cannot, and gets U+FFFD instead.
  return Buffer.from(bytes).toString('utf8');
}

/**
 * Go's `url.ParseQuery` as `r.URL.Query()` uses it (errors ignored): pairs split on `&`, a
 * pair whose key contains `;` or whose key or value does not unescape is dropped, a pair
 * without `=` has an empty value. Values keep their order per key.
 */
export function goParseQuery(raw: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const pair of raw.split('&')) {
    if (pair === '' || pair.includes(';')) continue;
    const eq = pair.indexOf('=');
    const key = goQueryUnescape(eq < 0 ? pair : pair.slice(0, eq));
    const value = goQueryUnescape(eq < 0 ? '' : pair.slice(eq + 1));
    if (key === undefined || value === undefined) continue;
    const list = out.get(key);
    if (list) list.push(value);
    else out.set(key, [value]);
  }
  return out;
}

/** `url.Values.Get`: the first value of `key`, or `''`. */
export function goQueryGet(q: Map<string, string[]>, key: string): string {
  return q.get(key)?.[0] ?? '';
}

/**
 * Go's `%q` (strconv.Quote) of a string: `"…"` with `\"`, `\\`, the short escapes
 * `\a \b \f \n \r \t \v`, other ASCII control characters and DEL as `\xHH`, and characters Go
 * does not count as printable (controls, format characters, separators other than the
 * ASCII space) as `\uXXXX` / `\UXXXXXXXX`.
 */
export function goQuote(s: string): string {
  const short: Record<string, string> = {
    '\x07': '\\a',
    '\b': '\\b',
    '\f': '\\f',
    '\n': '\\n',
    '\r': '\\r',
    '\t': '\\t',
    '\v': '\\v',
    '"': '\\"',
    '\\': '\\\\',
  };
  let out = '"';
  for (const ch of s.toWellFormed()) {
    const cp = ch.codePointAt(0) as number;
    const esc = short[ch];
    if (esc !== undefined) out += esc;
    else if (cp < 0x20 || cp === 0x7f) out += `\\x${cp.toString(16).padStart(2, '0')}`;
    else if (ch !== ' ' && /^[\p{C}\p{Z}]$/u.test(ch)) {
      out +=
        cp > 0xffff ? `\\U${cp.toString(16).padStart(8, '0')}` : `\\u${cp.toString(16).padStart(4, '0')}`;
    } else out += ch;
  }
  return `${out}"`;
}

/** Go's `strconv.ParseInt(s, 10, 64)`: an optional sign, decimal digits (leading zeros allowed), in int64 range. */
export function goParseInt64(s: string): bigint | undefined {
  if (!/^[+-]?[0-9]+$/.test(s)) return undefined;
  const v = BigInt(s);
  if (v > 0x7fffffffffffffffn || v < -0x8000000000000000n) return undefined;
  return v;
}
