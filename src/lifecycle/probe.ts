/**
 * Probe cadence state machine (docs/contracts/pod-to-vm.md "Probes") and the PodReady rule (docs/contracts/lifecycle.md "PodReady").
 *
 * Before ready: 100 ms after the first failure, ×1.5 per further consecutive failure, capped
 * at 1 s (100, 150, 225, 337.5, 506.25, 759.375, 1000, 1000 … ms — Go `time.Duration`
 * arithmetic, so delays may carry fractions of a millisecond). One success flips to ready.
 * Once ready: every 5 s; 3 consecutive failures flip to not-ready and fall back to the fast
 * cadence. Transitions are reported only when readiness changes.
 */
import type { LifecycleState } from '../contract/annotations.ts';

export const PROBE_FAST_INTERVAL_MS = 100;
export const PROBE_BACKOFF_FACTOR = 1.5;
export const PROBE_MAX_FAST_INTERVAL_MS = 1000;
export const PROBE_READY_INTERVAL_MS = 5000;
export const PROBE_FAILURE_THRESHOLD = 3;
/** Timeout of one probe (docs/contracts/pod-to-vm.md "Probes"). */
export const PROBE_TIMEOUT_MS = 3000;

export interface ProbeState {
  readonly ready: boolean;
  /** Consecutive failures since the last success (or since the last transition). */
  readonly consecutiveFailures: number;
  /** Delay to use after the next failure while not ready. */
  readonly nextFastDelayMs: number;
}

export type ProbeResult = 'success' | 'failure';

export interface ProbeStep {
  readonly state: ProbeState;
  /** How long to wait before the next probe. */
  readonly delayMs: number;
  /** Set only when readiness changed. */
  readonly transition?: 'ready' | 'notReady';
}

/** A new probe agent: not ready, fast cadence. */
export function initialProbeState(): ProbeState {
  return { ready: false, consecutiveFailures: 0, nextFastDelayMs: PROBE_FAST_INTERVAL_MS };
}

/** Advances the cadence with one probe result. */
export function nextProbeStep(state: ProbeState, result: ProbeResult): ProbeStep {
  if (result === 'success') {
    const next: ProbeState = { ready: true, consecutiveFailures: 0, nextFastDelayMs: PROBE_FAST_INTERVAL_MS };
    return state.ready
      ? { state: next, delayMs: PROBE_READY_INTERVAL_MS }
      : { state: next, delayMs: PROBE_READY_INTERVAL_MS, transition: 'ready' };
  }
  const failures = state.consecutiveFailures + 1;
  if (state.ready) {
    if (failures < PROBE_FAILURE_THRESHOLD) {
      return { state: { ...state, consecutiveFailures: failures }, delayMs: PROBE_READY_INTERVAL_MS };
    }
    return {
      state: { ready: false, consecutiveFailures: 0, nextFastDelayMs: nextFastDelay(PROBE_FAST_INTERVAL_MS) },
      delayMs: PROBE_FAST_INTERVAL_MS,
      transition: 'notReady',
    };
  }
  return {
    state: {
      ready: false,
      consecutiveFailures: failures,
      nextFastDelayMs: nextFastDelay(state.nextFastDelayMs),
    },
    delayMs: state.nextFastDelayMs,
  };
}

function nextFastDelay(delayMs: number): number {
  return Math.min(delayMs * PROBE_BACKOFF_FACTOR, PROBE_MAX_FAST_INTERVAL_MS);
}

/** `Ready` = probe ready ∧ lifecycle `ready` (docs/contracts/lifecycle.md "PodReady"). */
export function podReady(probeReady: boolean, lifecycle: LifecycleState | ''): boolean {
  return probeReady && lifecycle === 'ready';
}
