/**
 * The fields of a `/proc/<pid>/stat` text from field 3 (state) on: the command (field 2) is
 * parenthesised and may hold spaces and parentheses, so fields are counted after the last `)`.
 * Field n is at index n - 3; empty when the text has no `)`.
 */
export function pidStatFields(text: string): string[] {
  const close = text.lastIndexOf(')');
  if (close < 0) return [];
  return text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
}
