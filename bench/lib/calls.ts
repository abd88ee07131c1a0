// Counting `cocoon` invocations by verb from the simulator's record (<root>/sim/calls.jsonl,
// one line per invocation, written by the simulator itself: sim/client.ts CallRecord).
import type { CallRecord } from '../../sim/client.ts';

/** "vm clone", "snapshot inspect", ...: the group and the verb, flags excluded. */
export function verbOf(argv: readonly string[]): string {
  const words: string[] = [];
  for (const a of argv) {
    if (a.startsWith('-') || words.length === 2) break;
    words.push(a);
  }
  return words.join(' ') || '(none)';
}

/** Calls by verb whose start lies in the inclusive epoch-ms window. */
export function countCalls(
  calls: readonly Pick<CallRecord, 'argv' | 'startedAt'>[],
  from: number,
  to: number,
): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of calls) {
    const at = Date.parse(c.startedAt);
    if (!(at >= from && at <= to)) continue;
    const v = verbOf(c.argv);
    out[v] = (out[v] ?? 0) + 1;
  }
  return out;
}

export function sumCounts(counts: Readonly<Record<string, number>>): number {
  return Object.values(counts).reduce((a, b) => a + b, 0);
}
