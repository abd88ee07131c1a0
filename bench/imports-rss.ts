// Benchmark (a script, not a test): the release daemon's memory after its imports alone, the
// figures of docs/decisions.md "Daemon memory" (fifth pass). Usage:
//   node bench/imports-rss.ts            # three runs of each case
// Builds the release artifact (scripts/release.sh: reused when its inputs are unchanged),
// unpacks it into a temporary directory (removed at the end) and starts its runtime with the
// daemon's V8 flags (DAEMON_V8_FLAGS) on: nothing (`-e 0`, bare node), the separate modules
// (`lib/src/main.js --version`), the bundle the launcher runs (`lib/bundle/vk-cocoon.js
// --version`) and the bundle with `--enable-source-maps`. A preload given as a data: URL (plain
// JavaScript, so that no TypeScript stripper is loaded into the measured process) prints, at
// exit, VmRSS, RssAnon and RssFile from /proc/self/status and V8's heap; the table shows each
// case's median in MiB. No compile cache (NODE_COMPILE_CACHE unset): what a first start costs.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { DAEMON_V8_FLAGS } from './lib/child.ts';

const RUNS = Number(process.env.VK_BENCH_RUNS ?? 3) || 3;
const repo = resolve(import.meta.dirname, '..');

const preload = `data:text/javascript,${encodeURIComponent(`
import { readFileSync } from 'node:fs';
process.on('exit', () => {
  const s = readFileSync('/proc/self/status', 'utf8');
  const kib = (k) => Number(new RegExp(k + ':\\\\s+(\\\\d+)').exec(s)[1]);
  const h = process.memoryUsage();
  process.stderr.write('EXIT-RSS ' + JSON.stringify({ rss: kib('VmRSS') * 1024, anon: kib('RssAnon') * 1024,
    file: kib('RssFile') * 1024, heapUsed: h.heapUsed, heapTotal: h.heapTotal }) + '\\n');
});`)}`;

type Sample = { rss: number; anon: number; file: number; heapUsed: number; heapTotal: number };

const artifact = execFileSync('bash', [join(repo, 'scripts', 'release.sh')], {
  encoding: 'utf8',
  stdio: ['ignore', 'pipe', 'inherit'],
}).trim();
const dir = mkdtempSync(join(tmpdir(), 'vk-imports-rss-'));
try {
  execFileSync('tar', ['-xzf', artifact, '-C', dir]);
  const top = join(dir, readdirSync(dir)[0]!);
  const node = join(top, 'runtime', 'node');
  const cases: [string, string[]][] = [
    ['bare node (-e 0)', ['-e', '0']],
    ['separate modules (lib/src/main.js --version)', [join(top, 'lib', 'src', 'main.js'), '--version']],
    ['bundle (lib/bundle/vk-cocoon.js --version)', [join(top, 'lib', 'bundle', 'vk-cocoon.js'), '--version']],
    [
      'bundle with --enable-source-maps',
      ['--enable-source-maps', join(top, 'lib', 'bundle', 'vk-cocoon.js'), '--version'],
    ],
  ];
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const mib = (n: number) => (n / 2 ** 20).toFixed(1);
  const rows: string[] = [];
  for (const [name, args] of cases) {
    const samples: Sample[] = [];
    for (let i = 0; i < RUNS; i++) {
      const r = spawnSync(node, [...DAEMON_V8_FLAGS, '--import', preload, ...args], {
        cwd: dir,
        encoding: 'utf8',
        env: { PATH: '/usr/bin:/bin', HOME: dir },
      });
      const line = /^EXIT-RSS (.*)$/m.exec(r.stderr)?.[1];
      if (r.status !== 0 || !line) throw new Error(`${name}: exit ${r.status}: ${r.stderr}`);
      samples.push(JSON.parse(line) as Sample);
    }
    const med = (k: keyof Sample) => mib(median(samples.map((s) => s[k])));
    rows.push(
      `| ${name} | ${med('rss')} | ${med('anon')} | ${med('file')} | ${med('heapUsed')} | ${med('heapTotal')} |`,
    );
    process.stderr.write(`imports-rss: ${name}: done\n`);
  }
  console.log(`\nrelease: ${artifact}; V8 flags ${DAEMON_V8_FLAGS.join(' ')}; median of ${RUNS} runs, MiB\n`);
  console.log('| process | RSS | anonymous | file-backed | V8 heap used | V8 heap total |');
  console.log('|---|---|---|---|---|---|');
  for (const r of rows) console.log(r);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
