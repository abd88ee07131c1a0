// Per-pod readiness probe (docs/contracts/pod-to-vm.md "Probes"). The cadence is the pure state machine of
// src/lifecycle/probe.ts; this module only performs probes and fires the transition
// callback. Probe kinds:
// - `vm.cocoonstack.io/probe-port` set: TCP connect to ip:port (3 s timeout);
// - otherwise one ICMP echo (src/net/icmp.ts, through fping). A host that cannot send ICMP
//   (no fping, no CAP_NET_RAW: found at startup) degrades to "IP resolved means reachable",
//   as the Go daemon does without the capability (logged once per process).
import { Socket } from 'node:net';
import {
  initialProbeState,
  nextProbeStep,
  PROBE_READY_INTERVAL_MS,
  PROBE_TIMEOUT_MS,
  type ProbeState,
} from '../../lifecycle/probe.ts';
import type { Logger } from '../../log.ts';
import { READY_WINDOW_MS } from '../../net/icmp.ts';

export interface ProbeTarget {
  ip: string;
  port: number | undefined;
}

export interface ProbeAgentOptions {
  /** The current target, or `undefined` when the VM is gone (probe fails with `vm gone`). */
  target: () => ProbeTarget | undefined;
  refreshIp: () => Promise<void>;
  onTransition: (ready: boolean) => void;
  onDuration: (seconds: number) => void;
  /** One ICMP echo to `ip`, sent within `withinMs` (batched with others meanwhile);
   * `undefined` when the host cannot send ICMP (the IP counts). */
  icmp: ((ip: string, withinMs?: number) => Promise<boolean>) | undefined;
  log: Logger;
  /** Start from a ready probe (a restart keeps the published result until the probe says
   * otherwise: 3 failures, as for any ready probe). */
  ready?: boolean;
}

let icmpNoticeLogged = false;

export function tcpProbe(ip: string, port: number, timeoutMs = PROBE_TIMEOUT_MS): Promise<boolean> {
  return new Promise((resolve) => {
    const s = new Socket();
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(timeoutMs, () => done(false));
    s.once('error', () => done(false));
    s.connect(port, ip, () => done(true));
  });
}

export class ProbeAgent {
  readonly #o: ProbeAgentOptions;
  #state: ProbeState = initialProbeState();
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  #probing = false;

  constructor(opts: ProbeAgentOptions) {
    this.#o = opts;
    if (opts.ready) this.#state = nextProbeStep(this.#state, 'success').state;
  }

  start(): void {
    void this.#probeOnce();
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
  }

  /** The provider saw the probe succeed itself (its synchronous first probe at the ready
   * publication) and published Ready with it: the cadence continues as after a success,
   * without a transition of its own. */
  assumeReady(): void {
    if (this.#stopped || this.#state.ready) return;
    this.#state = nextProbeStep(this.#state, 'success').state;
    if (this.#probing) return; // the probe in flight schedules the next one
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.#probeOnce(), PROBE_READY_INTERVAL_MS);
    this.#timer.unref();
  }

  async #probe(): Promise<boolean> {
    await this.#o.refreshIp();
    const target = this.#o.target();
    if (!target) return false; // vm gone
    if (target.ip === '') return false; // waiting for dhcp lease
    if (target.port !== undefined) return await tcpProbe(target.ip, target.port);
    // A ready pod's echo may wait up to a second to share a run with others: its 5 s cadence
    // does not need the precision, and the host's CPU does (src/net/icmp.ts).
    if (this.#o.icmp) return await this.#o.icmp(target.ip, this.#state.ready ? READY_WINDOW_MS : undefined);
    if (!icmpNoticeLogged) {
      icmpNoticeLogged = true;
      this.#o.log.info('no ICMP on this host: probes without a probe-port treat a resolved IP as reachable');
    }
    return true;
  }

  async #probeOnce(): Promise<void> {
    if (this.#stopped) return;
    const started = performance.now();
    let ok = false;
    this.#probing = true;
    try {
      ok = await this.#probe();
    } catch {
      ok = false;
    } finally {
      this.#probing = false;
    }
    this.#o.onDuration((performance.now() - started) / 1000);
    if (this.#stopped) return;
    const step = nextProbeStep(this.#state, ok ? 'success' : 'failure');
    this.#state = step.state;
    if (step.transition) this.#o.onTransition(step.transition === 'ready');
    this.#timer = setTimeout(() => void this.#probeOnce(), step.delayMs);
    this.#timer.unref();
  }
}
