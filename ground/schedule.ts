// Which test job starts next (ground/run-tests.ts; docs/test-ground.md "Suite scheduling").
// Pure: the queue (longest first) and the running jobs in, an index out.
//
// Jobs differ in how much of a core they keep busy: the SAC file waits two minutes on the
// console's enumeration budget at a fifth of a core, the teardown file starts grounds at nearly
// a whole one. Counting jobs alone either leaves the cores idle while three waiting files run
// or saturates them with three busy ones, so up to `base` jobs always run (longest first), and
// more, up to `max`, while the CPU the running jobs are expected to use leaves room for the
// next one: the longest waiting job whose share fits in `cpuBudget`.

export interface Schedulable {
  /** Wall time in seconds, measured (the order: longest first). */
  readonly estimate: number;
  /** Cores the job keeps busy on average (its CPU time over its wall time), measured. */
  readonly cpu: number;
}

export interface ScheduleLimits {
  /** Jobs that always run while any wait, whatever their CPU. */
  readonly base: number;
  /** Jobs at most. */
  readonly max: number;
  /** Cores the running jobs may be expected to use for one more to start beyond `base`. */
  readonly cpuBudget: number;
}

/** Index in `queue` of the job to start now, or `undefined` to wait for one to end. */
export function pickNext(
  queue: readonly Schedulable[],
  running: readonly Schedulable[],
  limits: ScheduleLimits,
): number | undefined {
  if (queue.length === 0 || running.length >= limits.max) return undefined;
  if (running.length < limits.base) return 0;
  const load = running.reduce((sum, j) => sum + j.cpu, 0);
  const i = queue.findIndex((j) => load + j.cpu <= limits.cpuBudget);
  return i < 0 ? undefined : i;
}

/** The limits on `cores` with `base` jobs always running: two more at most (none when `base`
 * is 1: a serial run stays serial), and the jobs' expected CPU within the cores less half a
 * core (the shared ground's apiserver, etcd, controllers and registry, and some headroom for
 * timing tests). */
export function scheduleLimits(base: number, cores: number): ScheduleLimits {
  return { base, max: base === 1 ? 1 : base + 2, cpuBudget: Math.max(1, cores - 0.5) };
}
