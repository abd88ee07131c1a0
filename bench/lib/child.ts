// A transfer measured in a Node.js process of its own (bench/transfer.ts, bench/peer-wake.ts), so
// its peak RSS is the transfer's and not the bench's: started with the daemon's V8 flags
// (bin/vk-cocoon), so memory, GC and JIT are the daemon's, plus VK_BENCH_CHILD_FLAGS (e.g.
// `--cpu-prof --cpu-prof-dir=/tmp/prof`, or `--opt --maglev` to measure with the JIT on). The
// child prints its result as the last line of its stdout.
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';

/** The daemon's own V8 flags (bin/vk-cocoon, packaging/launcher.sh). */
export const DAEMON_V8_FLAGS = [
  '--max-semi-space-size=2',
  '--no-opt',
  '--no-maglev',
  '--no-sparkplug',
  '--optimize-for-size',
];

const benchDir = path.resolve(import.meta.dirname, '..');

/** Node flags from a space-separated environment variable. */
export function flagsOf(name: string): string[] {
  return (process.env[name] ?? '').split(' ').filter((f) => f !== '');
}

/** Starts `bench/<script>` with the daemon's flags, the flags of `flagsVar` and the job as JSON. */
export function spawnBenchChild(
  script: string,
  job: Record<string, unknown>,
  env: Record<string, string>,
  opts: { flagsVar?: string; stdin?: 'ignore' | 'pipe' } = {},
): ChildProcess {
  return spawn(
    process.execPath,
    [
      ...DAEMON_V8_FLAGS,
      ...flagsOf(opts.flagsVar ?? 'VK_BENCH_CHILD_FLAGS'),
      path.join(benchDir, script),
      JSON.stringify(job),
    ],
    {
      stdio: [opts.stdin ?? 'ignore', 'pipe', process.env.VK_BENCH_CHILD_LOG ? 'inherit' : 'pipe'],
      env: { ...process.env, ...env },
    },
  );
}

/** Runs `bench/<script>` to completion; resolves with its last stdout line, parsed. `onStart`
 * sees the process (its pid, e.g. to sample it). */
export function runBenchChild<T>(
  script: string,
  job: Record<string, unknown>,
  env: Record<string, string>,
  onStart?: (child: ChildProcess) => void,
): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = spawnBenchChild(script, job, env);
    onStart?.(child);
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code !== 0) {
        reject(new Error(`${script} ${String(job.op)} exited ${code}: ${stderr.trim()}`));
        return;
      }
      resolve(JSON.parse(stdout.trim().split('\n').pop() ?? '') as T);
    });
  });
}
