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
