// The bench figures (bench/lib/charts.ts): standalone SVG of fixed data, byte-identical from run
// to run, "no data" rather than an exception; and the `--figures DIR` argument.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  type BurstSample,
  burstSvg,
  escapeXml,
  figuresOption,
  readyLatencySvg,
  writeFigure,
} from '../../../bench/lib/charts.ts';

const XMLNS = 'xmlns="http://www.w3.org/2000/svg"';

/** 120 created → Ready latencies, 0.8 to 3.2 s, and a slow tail (fixed, no randomness). */
const latencies = Array.from({ length: 120 }, (_, i) => 800 + ((i * 37) % 2400) + (i % 40 === 0 ? 4000 : 0));

/** A 20 s burst every 500 ms: RSS climbing to a plateau, CPU busy then idle. */
const series: BurstSample[] = Array.from({ length: 40 }, (_, i) => ({
  tMs: (i + 1) * 500,
  rssKiB: 90_000 + Math.min(i, 20) * 3000,
  cpuPct: i < 25 ? 60 + ((i * 13) % 40) : 5,
}));
const readyAt = latencies.map((ms, i) => ms * 4 + i * 10);

function standalone(svg: string, title: string): void {
  assert.ok(svg.startsWith('<svg'), svg.slice(0, 40));
  assert.ok(svg.includes(XMLNS));
  assert.ok(svg.includes(`<title>${escapeXml(title)}</title>`));
  assert.match(svg, /^<svg[^>]* width="720"/);
  assert.ok(svg.includes('<rect width="100%" height="100%" fill="white"/>'), 'a white background');
  assert.ok(svg.trimEnd().endsWith('</svg>'));
}

test('readyLatencySvg: a histogram in seconds with p50 and p99 rules', () => {
  const title = '120 clone pods at once: created → Ready';
  const svg = readyLatencySvg(latencies, { title });
  standalone(svg, title);
  assert.ok(svg.includes('created → Ready (s)'));
  assert.ok(svg.includes('pods'));
  // Bars: Plot's rects, beyond the background's.
  assert.ok((svg.match(/<rect /g) ?? []).length > 3);
  assert.match(svg, /p50 \d+\.\d\d s/);
  assert.match(svg, /p99 \d+\.\d\d s/);
  assert.ok(!svg.includes('plot-d6a7b5'), "Plot's default class replaced by the figure's own");
});

test('burstSvg: RSS and CPU panels on one time axis, and the Ready count', () => {
  const title = '120 clone pods at once: the daemon';
  const svg = burstSvg(series, { title, readyAt });
  standalone(svg, title);
  for (const label of ['RSS (MiB)', 'CPU (% of one core)', 'pods Ready', 's since the first create'])
    assert.ok(svg.includes(label), label);
  assert.ok((svg.match(/<path /g) ?? []).length >= 3);
  assert.ok(svg.includes('120 pods Ready'));
  const without = burstSvg(series, { title });
  standalone(without, title);
  assert.ok(!without.includes('pods Ready'));
  assert.ok(without.includes('<path '));
});

test('the same input gives byte-identical figures', () => {
  assert.equal(readyLatencySvg(latencies, { title: 'a' }), readyLatencySvg([...latencies], { title: 'a' }));
  assert.equal(burstSvg(series, { title: 'b', readyAt }), burstSvg(series, { title: 'b', readyAt }));
  // No coordinate carries floating-point noise.
  assert.doesNotMatch(burstSvg(series, { title: 'b', readyAt }), /\d\.\d{3,}/);
});

test('no data: a figure that says so, not an exception', () => {
  for (const svg of [
    readyLatencySvg([], { title: 'empty & <odd>' }),
    readyLatencySvg([Number.NaN], { title: 'empty & <odd>' }),
    burstSvg([], { title: 'empty & <odd>', readyAt: [] }),
  ]) {
    standalone(svg, 'empty & <odd>');
    assert.ok(svg.includes('no data'));
  }
});

test('a single value or a single sample still draws', () => {
  const one = readyLatencySvg([1000, 1000], { title: 'alike' });
  standalone(one, 'alike');
  assert.ok((one.match(/<rect /g) ?? []).length >= 2);
  const lone = burstSvg(series.slice(0, 1), { title: 'lone' });
  standalone(lone, 'lone');
  assert.ok(lone.includes('<circle'));
});

test('writeFigure makes the directory and ends the file with a newline', () => {
  const dir = mkdtempSync(join(tmpdir(), 'charts-'));
  try {
    const path = join(dir, 'a', 'b', 'x.svg');
    const svg = readyLatencySvg(latencies, { title: 't' });
    writeFigure(path, svg);
    assert.equal(readFileSync(path, 'utf8'), `${svg}\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('figuresOption: --figures DIR, --figures=DIR, else VK_BENCH_FIGURES', () => {
  assert.deepEqual(figuresOption(['200', '--figures', 'docs/figures', '500']), {
    dir: 'docs/figures',
    rest: ['200', '500'],
  });
  assert.deepEqual(figuresOption(['--figures=out']), { dir: 'out', rest: [] });
  assert.deepEqual(figuresOption(['50'], { VK_BENCH_FIGURES: 'env' }), { dir: 'env', rest: ['50'] });
  assert.deepEqual(figuresOption(['--figures', 'arg'], { VK_BENCH_FIGURES: 'env' }).dir, 'arg');
  assert.deepEqual(figuresOption(['restart'], {}), { dir: undefined, rest: ['restart'] });
  assert.throws(() => figuresOption(['--figures']), /needs a directory/);
  assert.throws(() => figuresOption(['--figures', '--release']), /needs a directory/);
});
