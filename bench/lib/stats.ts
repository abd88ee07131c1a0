// Pure statistics and formatting helpers of the benchmarks (unit-tested in test/unit/bench).

/** Nearest-rank percentile (p in 0..100) of `values`; NaN for none. */
export function pct(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const s = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))] ?? Number.NaN;
}

export function max(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => Math.max(a, b));
}

export function mean(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

/** Milliseconds as seconds with one decimal ("12.3 s"); "–" for NaN. */
export function fmtS(ms: number): string {
  return Number.isFinite(ms) ? `${(ms / 1000).toFixed(1)} s` : '–';
}

/** A number with `digits` decimals; "–" for NaN. */
export function fmtN(n: number, digits = 1): string {
  return Number.isFinite(n) ? n.toFixed(digits) : '–';
}

/** KiB as MiB ("123 MiB"); "–" for NaN/0. */
export function fmtMiB(kib: number): string {
  return Number.isFinite(kib) && kib > 0 ? `${Math.round(kib / 1024)} MiB` : '–';
}

/** A markdown table: a header row and rows of cells (a missing cell prints empty). */
export function markdownTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]) =>
    `| ${header.map((_, i) => (cells[i] ?? '').replaceAll('|', '\\|')).join(' | ')} |`;
  return [line(header), `|${header.map(() => '---').join('|')}|`, ...rows.map(line)].join('\n');
}

/** "a 1, b 2" of a count map (keys sorted by count, then name); `scale` divides the counts. */
export function fmtCounts(counts: Readonly<Record<string, number>>, scale = 1, digits = 0): string {
  const entries = Object.entries(counts).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  if (entries.length === 0) return '0';
  return entries.map(([k, v]) => `${k} ${(v / scale).toFixed(digits)}`).join(', ');
}
