// bench:transfer's summary (bench/lib/transfer-report.ts): ours against crane per run, and over
// several runs the sum of each side's walls (ours and crane take turns at going first).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Row, type RowKind, summaryTable } from '../../../bench/lib/transfer-report.ts';

const MiB = 2 ** 20;
const row = (kind: RowKind, run: number, ms: number): Row => ({
  size: '1 GiB disk',
  format: 'v1',
  kind,
  run,
  what: kind,
  bytes: 576 * MiB,
  ms,
  peakKiB: 65 * 1024,
  startKiB: 58 * 1024,
  cpuMs: 0,
  registryMs: 0,
  simMs: 0,
  note: '',
});

/** The table's lines whose cells start with `first` cells. */
const linesOf = (table: string, ...first: string[]) =>
  table
    .split('\n')
    .map((l) => l.split('|').map((c) => c.trim()))
    .filter((cells) => first.every((f, i) => cells[i + 1] === f));

describe('summaryTable', () => {
  it('one run: upload against crane push, fetch against crane pull; no sum line', () => {
    const table = summaryTable(
      [row('upload', 1, 2000), row('crane-push', 1, 2500), row('fetch', 1, 600), row('crane-pull', 1, 1200)],
      1,
    );
    const upload = linesOf(table, '1 GiB disk', 'v1', '576 MiB', 'push: upload');
    assert.equal(upload.length, 1);
    assert.equal(upload[0]?.[6], '**0.80**');
    assert.equal(linesOf(table, '1 GiB disk', 'v1', '576 MiB', 'pull: fetch + verify')[0]?.[6], '**0.50**');
    assert.doesNotMatch(table, /runs/);
  });

  it('two runs: each run, then the ratio of the sums (not the mean of the ratios)', () => {
    const rows = [
      row('upload', 1, 17_500),
      row('crane-push', 1, 15_200),
      row('crane-push', 2, 14_500),
      row('upload', 2, 13_200),
    ];
    const table = summaryTable(rows, 2);
    assert.equal(linesOf(table, '1 GiB disk', 'v1 #1', '576 MiB', 'push: upload')[0]?.[6], '**1.15**');
    assert.equal(linesOf(table, '1 GiB disk', 'v1 #2', '576 MiB', 'push: upload')[0]?.[6], '**0.91**');
    const sum = linesOf(table, '1 GiB disk', 'v1, 2 runs', '576 MiB', 'push: upload');
    assert.equal(sum.length, 1);
    assert.equal(sum[0]?.[5], '30.7 s / 29.7 s (sum)');
    assert.equal(sum[0]?.[6], '**1.03**');
  });
});
