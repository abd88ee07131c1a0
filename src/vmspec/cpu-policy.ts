/**
 * CPU policy mapping (docs/contracts/pod-to-vm.md "CPU policy"): cgroup weight, quota and period for every run and
 * clone path (wake included: cocoon never inherits cgroup knobs from a snapshot), and the run
 * mode `--cpu` count.
 */

/** Minimum and maximum cgroup v1 shares (Kubernetes `MinShares` / `MaxShares`). */
export const MIN_CPU_SHARES = 2n;
export const MAX_CPU_SHARES = 262144n;
/** The only CFS period the provider sends (`--cpu-period-us 100000`). */
export const CPU_PERIOD_US = 100000;
/** Lower bound of `--cpu-quota-us` (Kubernetes `MinQuotaPeriod`, 1 ms). */
export const MIN_CPU_QUOTA_US = 1000n;

/** The CPU flags of one VM. */
export interface CpuPolicy {
  /** `--cpu-weight`, 1..10000. */
  readonly weight: number;
  /** `--cpu-quota-us`; only with a CPU limit. */
  readonly quotaUs?: bigint;
  /** `--cpu-period-us`; set exactly when `quotaUs` is. */
  readonly periodUs?: number;
  /** Run mode `--cpu`: ceil(limit), else ceil(request), in whole cores; absent for BestEffort. */
  readonly cpus?: bigint;
}

function ceilDiv(value: bigint, divisor: bigint): bigint {
  return (value + divisor - 1n) / divisor;
}

/** A present, positive millicore amount; `0n` and `undefined` both mean "not set". */
function positive(milli: bigint | undefined): bigint | undefined {
  return milli !== undefined && milli > 0n ? milli : undefined;
}

/**
 * Maps CPU request and limit (millicores) to the cocoon CPU flags (docs/contracts/pod-to-vm.md "CPU policy"):
 *
 * - `m` = request, else limit, else 0 (BestEffort). A zero request counts as no request.
 * - `shares = clamp(m × 1024 / 1000, 2, 262144)` (integer division).
 * - `weight = 1 + (shares − 2) × 9999 / 262142` (integer division): request 2 ⇒ 79,
 *   500m ⇒ 20, none ⇒ 1.
 * - Only with a limit `L`: `quotaUs = max(L × 100000 / 1000, 1000)`, `periodUs = 100000`.
 * - `cpus = ceil(L / 1000)`, else `ceil(request / 1000)` (run mode only; clones keep the
 *   snapshot topology and ignore it).
 */
export function cpuPolicy(requestMilli: bigint | undefined, limitMilli: bigint | undefined): CpuPolicy {
  const request = positive(requestMilli);
  const limit = positive(limitMilli);
  const m = request ?? limit ?? 0n;
  let shares = (m * 1024n) / 1000n;
  if (shares < MIN_CPU_SHARES) shares = MIN_CPU_SHARES;
  if (shares > MAX_CPU_SHARES) shares = MAX_CPU_SHARES;
  const weight = Number(1n + ((shares - MIN_CPU_SHARES) * 9999n) / (MAX_CPU_SHARES - MIN_CPU_SHARES));
  const policy: { weight: number; quotaUs?: bigint; periodUs?: number; cpus?: bigint } = { weight };
  if (limit !== undefined) {
    const quota = (limit * BigInt(CPU_PERIOD_US)) / 1000n;
    policy.quotaUs = quota > MIN_CPU_QUOTA_US ? quota : MIN_CPU_QUOTA_US;
    policy.periodUs = CPU_PERIOD_US;
  }
  const cores = limit ?? request;
  if (cores !== undefined) policy.cpus = ceilDiv(cores, 1000n);
  return policy;
}
