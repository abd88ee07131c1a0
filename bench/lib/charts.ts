// The figures of `npm run bench -- --figures DIR` (docs/benchmarks.md), as standalone SVG files
// to commit beside the tables: the created → Ready latency distribution of a burst of clone pods
// (a histogram with its p50 and p99), and the daemon's RSS and CPU over the burst (stacked
// panels on one time axis, with the count of Ready pods when it is known).
// Drawn with Observable Plot, rendered through linkedom: Plot builds its SVG with DOM calls and
// Node has no DOM. Plot's output is a fragment for a web page (no xmlns, colors from
// currentColor, no background); each figure here wraps it in a standalone <svg> with the
// namespace, a <title>, black text and a white background (legible in dark-mode viewers), and is
// a pure function of its input: the same data gives a byte-identical file, so a re-run that
// measured the same thing leaves no diff.
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import * as Plot from '@observablehq/plot';
import { parseHTML } from 'linkedom';
import { max, pct } from './stats.ts';

/** One sample of the daemon during a burst (BringUpResult.series). */
export interface BurstSample {
  /** Since the first create, ms. */
  tMs: number;
  /** VmRSS, KiB. */
  rssKiB: number;
  /** CPU over the interval before the sample, % of one core. */
  cpuPct: number;
}

/** Every figure's width, px (the panels inside share it). */
export const FIGURE_WIDTH = 720;

const SVG_NS = 'http://www.w3.org/2000/svg';
/** The band above the panels: the title and a line of figures. */
const HEADER = 46;
/** The same left and right margins in every panel, so stacked panels share the time axis. */
const MARGIN = { marginLeft: 56, marginRight: 24 } as const;
const COLOR = {
  bars: '#4e79a7',
  p50: '#f28e2b',
  p99: '#e15759',
  rss: '#4e79a7',
  cpu: '#f28e2b',
  ready: '#59a14f',
} as const;

export function escapeXml(s: string): string {
  return s.replace(
    /[<>&"']/g,
    (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;', "'": '&apos;' })[c] ?? c,
  );
}

/** Seconds of a millisecond figure: two decimals under 10 s, one above. */
function secs(ms: number): string {
  return `${(ms / 1000).toFixed(Math.abs(ms) < 10_000 ? 2 : 1)} s`;
}

/**
 * A class name of the figure's own, from its title. Plot styles its output through a class
 * (`plot-d6a7b5` by default); one derived from the title keeps two figures inlined in one page
 * apart and stays the same from run to run.
 */
function classOf(title: string): string {
  return `plot-${createHash('sha256').update(title).digest('hex').slice(0, 6)}`;
}

/**
 * One Plot panel as SVG text, placed at `y` in the figure. Coordinates are rounded to 0.01 px
 * (Plot's floating point, e.g. 479.99999999999994, is noise in a diff); clip-path ids, which
 * Plot numbers from a process-wide counter, are renumbered within the panel.
 */
function panel(options: Plot.PlotOptions, y: number, className: string): string {
  const { document } = parseHTML('<!doctype html><html><body></body></html>');
  const svg = Plot.plot({ ...options, document, className, width: FIGURE_WIDTH }) as unknown as {
    setAttribute(name: string, value: string): void;
    outerHTML: string;
  };
  svg.setAttribute('x', '0');
  svg.setAttribute('y', String(y));
  const clips = new Map<string, string>();
  return svg.outerHTML
    .replace(/plot-clip-\d+/g, (id) => {
      if (!clips.has(id)) clips.set(id, `${className}-clip-${clips.size + 1}`);
      return clips.get(id) as string;
    })
    .replace(/="([^"]*)"/g, (_, v: string) => `="${v.replace(/-?\d+\.\d{3,}/g, round)}"`);
}

function round(n: string): string {
  return String(Math.round(Number(n) * 100) / 100);
}

/** The standalone figure: namespace, title, white background, header, then the panels. */
function figure(title: string, subtitle: string, height: number, body: string): string {
  const t = escapeXml(title);
  return (
    `<svg xmlns="${SVG_NS}" width="${FIGURE_WIDTH}" height="${height}" viewBox="0 0 ${FIGURE_WIDTH} ${height}" ` +
    `font-family="system-ui, sans-serif" style="background:white;color:black">` +
    `<title>${t}</title>` +
    `<rect width="100%" height="100%" fill="white"/>` +
    `<text x="12" y="20" font-size="14" font-weight="bold" fill="black">${t}</text>` +
    `<text x="12" y="38" font-size="11" fill="#555">${escapeXml(subtitle)}</text>` +
    body +
    `</svg>`
  );
}

/** The figure of no data: its title and "no data", rather than an exception mid-bench. */
function noData(title: string): string {
  const h = HEADER + 80;
  return figure(
    title,
    '',
    h,
    `<text x="${FIGURE_WIDTH / 2}" y="${HEADER + 40}" text-anchor="middle" font-size="14" fill="#555">no data</text>`,
  );
}

/**
 * The histogram of created → Ready of a burst's pods (`valuesMs`, ms), in seconds, with its p50
 * and p99 (nearest rank, as the tables) as labelled vertical rules.
 */
export function readyLatencySvg(valuesMs: readonly number[], opts: { title: string }): string {
  const ms = valuesMs.filter(Number.isFinite);
  if (ms.length === 0) return noData(opts.title);
  const p50 = pct(ms, 50);
  const p99 = pct(ms, 99);
  const className = classOf(opts.title);
  // All alike (a handful of pods, or a coarse clock): one 100 ms bin in a 1 s wide axis, since
  // Plot's automatic bins of a single value span the whole frame.
  const lo = ms.reduce((a, b) => Math.min(a, b)) / 1000;
  const hi = max(ms) / 1000;
  const alike = hi - lo < 0.01;
  // A rule's label on the side with room (p99 is often the largest value, at the right edge);
  // p99's a line below p50's, so the two never overlap.
  const label = (text: string, at: number, color: string, prefer: 'start' | 'end', line: number) => {
    const f = alike ? 0.5 : (at / 1000 - lo) / (hi - lo);
    const anchor = f < 0.15 ? 'start' : f > 0.85 ? 'end' : prefer;
    return Plot.text([at / 1000], {
      x: (d: number) => d,
      frameAnchor: 'top',
      text: () => text,
      textAnchor: anchor,
      dx: anchor === 'end' ? -4 : 4,
      dy: line * 13,
      fill: color,
      fontWeight: 'bold',
    });
  };
  const body = panel(
    {
      height: 280,
      ...MARGIN,
      marginBottom: 40,
      x: {
        label: 'created → Ready (s)',
        labelAnchor: 'center',
        labelArrow: 'none',
        ...(alike ? { domain: [Math.max(0, lo - 0.5), hi + 0.5] } : {}),
      },
      // Room above the tallest bar for the rules' labels.
      y: { label: 'pods', grid: true, insetTop: 30 },
      marks: [
        Plot.rectY(
          ms.map((v) => v / 1000),
          Plot.binX<Plot.RectYOptions>(
            { y: 'count' },
            {
              x: (d: number) => d,
              fill: COLOR.bars,
              inset: 0.5,
              ...(alike ? { interval: 0.1 } : {}),
            },
          ),
        ),
        Plot.ruleY([0]),
        Plot.ruleX([p50 / 1000], { stroke: COLOR.p50, strokeWidth: 2 }),
        Plot.ruleX([p99 / 1000], { stroke: COLOR.p99, strokeWidth: 2, strokeDasharray: '4,3' }),
        label(`p50 ${secs(p50)}`, p50, COLOR.p50, 'end', 0),
        label(`p99 ${secs(p99)}`, p99, COLOR.p99, 'start', 1),
      ],
    },
    HEADER,
    className,
  );
  const subtitle = `${ms.length} pods; p50 ${secs(p50)}, p99 ${secs(p99)}, max ${secs(max(ms))}`;
  return figure(opts.title, subtitle, HEADER + 280, body);
}

/**
 * The daemon over a burst, in panels on one time axis (seconds since the first create): its
 * VmRSS (MiB), its CPU (% of one core, over each sample's interval) and, when `readyAt` (ms
 * since the first create, one per pod) is given, the count of Ready pods.
 */
export function burstSvg(
  series: readonly BurstSample[],
  opts: { title: string; readyAt?: readonly number[] },
): string {
  const samples = series.filter((s) => Number.isFinite(s.tMs));
  if (samples.length === 0) return noData(opts.title);
  const ready = [...(opts.readyAt ?? [])].filter(Number.isFinite).sort((a, b) => a - b);
  const endS = Math.max(max(samples.map((s) => s.tMs)), max(ready.length ? ready : [0])) / 1000;
  const className = classOf(opts.title);
  const rss = samples
    .filter((s) => Number.isFinite(s.rssKiB))
    .map((s) => ({ t: s.tMs / 1000, v: s.rssKiB / 1024 }));
  const cpu = samples.filter((s) => Number.isFinite(s.cpuPct)).map((s) => ({ t: s.tMs / 1000, v: s.cpuPct }));
  const time = 's since the first create';
  const panels: { height: number; options: (last: boolean) => Plot.PlotOptions }[] = [
    {
      height: 170,
      options: (last) => ({
        x: { domain: [0, endS], label: last ? time : null, labelAnchor: 'center', labelArrow: 'none' },
        y: { label: 'RSS (MiB)', grid: true, zero: true },
        marks: [
          Plot.lineY(rss, { x: 't', y: 'v', stroke: COLOR.rss, strokeWidth: 1.5 }),
          // A line of one point draws nothing.
          ...(rss.length === 1 ? [Plot.dot(rss, { x: 't', y: 'v', fill: COLOR.rss })] : []),
        ],
      }),
    },
    {
      height: 170,
      options: (last) => ({
        x: { domain: [0, endS], label: last ? time : null, labelAnchor: 'center', labelArrow: 'none' },
        y: { label: 'CPU (% of one core)', grid: true, zero: true },
        marks: [
          Plot.areaY(cpu, { x: 't', y: 'v', fill: COLOR.cpu, fillOpacity: 0.25 }),
          Plot.lineY(cpu, { x: 't', y: 'v', stroke: COLOR.cpu, strokeWidth: 1.5 }),
          ...(cpu.length === 1 ? [Plot.dot(cpu, { x: 't', y: 'v', fill: COLOR.cpu })] : []),
          Plot.ruleY([0]),
        ],
      }),
    },
  ];
  if (ready.length > 0) {
    // A step up at each pod's Ready, held to the end of the window.
    const steps = [
      { t: 0, n: 0 },
      ...ready.map((ms, i) => ({ t: ms / 1000, n: i + 1 })),
      { t: endS, n: ready.length },
    ];
    panels.push({
      height: 130,
      options: (last) => ({
        x: { domain: [0, endS], label: last ? time : null, labelAnchor: 'center', labelArrow: 'none' },
        y: { label: 'pods Ready', grid: true, zero: true },
        marks: [
          Plot.lineY(steps, { x: 't', y: 'n', curve: 'step-after', stroke: COLOR.ready, strokeWidth: 1.5 }),
        ],
      }),
    });
  }
  let y = HEADER;
  let body = '';
  panels.forEach((p, i) => {
    const last = i === panels.length - 1;
    // Only the bottom panel carries the axis label, and the room for it.
    const height = p.height + (last ? 14 : 0);
    body += panel({ height, ...MARGIN, marginBottom: last ? 40 : 26, ...p.options(last) }, y, className);
    y += height;
  });
  const peakRss = max(rss.map((r) => r.v));
  const peakCpu = max(cpu.map((c) => c.v));
  const subtitle =
    `daemon VmRSS peak ${Number.isFinite(peakRss) ? `${Math.round(peakRss)} MiB` : '–'}, ` +
    `CPU peak ${Number.isFinite(peakCpu) ? `${Math.round(peakCpu)} %` : '–'} of one core; ` +
    `${samples.length} sample${samples.length === 1 ? '' : 's'} over ${endS.toFixed(1)} s` +
    (ready.length > 0 ? `; ${ready.length} pods Ready` : '');
  return figure(opts.title, subtitle, y + 8, body);
}

/** Writes a figure to `path` (its directory made as needed), ending in a newline. */
export function writeFigure(path: string, svg: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, svg.endsWith('\n') ? svg : `${svg}\n`);
}

/**
 * The figures directory of a bench's arguments, `--figures DIR` or `--figures=DIR`, else
 * VK_BENCH_FIGURES of `env`; `rest` is the arguments without it.
 */
export function figuresOption(
  args: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): { dir: string | undefined; rest: string[] } {
  const rest: string[] = [];
  let dir: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '--figures') {
      const next = args[i + 1];
      if (next === undefined || next === '' || next.startsWith('--'))
        throw new Error('--figures needs a directory (e.g. --figures docs/figures)');
      dir = next;
      i++;
    } else if (a.startsWith('--figures=')) {
      dir = a.slice('--figures='.length);
      if (dir === '') throw new Error('--figures needs a directory (e.g. --figures=docs/figures)');
    } else rest.push(a);
  }
  return { dir: dir ?? (env.VK_BENCH_FIGURES || undefined), rest };
}
