// Loading the knob file (re-read on every invocation) and the persistent `times` counters.
// Validation (valibot, ~20 ms to import) runs only when the file's identity changes; the
// result is remembered in config.json.validated so the hot path stays a single readFile.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { CliError } from './errors.ts';
import { checkNetworks, readGuestNet } from './guestnet.ts';
import type { Knobs, WorldKnob } from './knob-schema.ts';
import { readJson, updateJson, writeAtomic } from './lock.ts';
import { countersFile, countersLock, knobsFile } from './paths.ts';

export type { Effect, ExecRuleKnob, FaultKnob, Knobs, WorldKnob } from './knob-schema.ts';

/** The realistic timing world (docs/simulator.md "Timing worlds"): what a cocoon host shows
 * under load, a lease 1–8 s after boot, the guest agent 2–20 s, a clone 0.3–3 s. */
export const REALISTIC_WORLD = {
  leaseMs: [1000, 8000],
  agentMs: [2000, 20_000],
  cloneMs: [300, 3000],
} as const satisfies Omit<WorldKnob, 'seed'>;

/** The timing world's delay of `kind` for a VM: uniform in the range, from a hash of
 * (seed, kind, VM name), so a run is reproducible from its seed; undefined without a world
 * or a range for `kind`. */
export function worldDelayMs(
  knobs: Knobs,
  kind: 'leaseMs' | 'agentMs' | 'cloneMs',
  vmName: string,
): number | undefined {
  const range = knobs.world?.[kind];
  if (!range) return undefined;
  const h = createHash('sha256')
    .update(`${knobs.world?.seed ?? 0}\0${kind}\0${vmName}`)
    .digest();
  const u = h.readUInt32BE(0) / 2 ** 32;
  return Math.round(range[0] + u * (range[1] - range[0]));
}

/** The knob file, with the guest network's pool (guestnet.ts) as `dhcp.pool` unless it names
 * its own; a pool or static network outside the guest network is refused. */
export async function loadKnobs(root: string): Promise<Knobs> {
  const knobs = await loadKnobFile(root);
  const net = readGuestNet(root);
  if (!net) return knobs;
  checkNetworks(net, knobs);
  if (knobs.dhcp?.pool) return knobs;
  return { ...knobs, dhcp: { ...knobs.dhcp, pool: { start: net.poolStart, end: net.poolEnd } } };
}

async function loadKnobFile(root: string): Promise<Knobs> {
  const file = knobsFile(root);
  let text: string;
  let st: fs.Stats;
  try {
    text = fs.readFileSync(file, 'utf8');
    st = fs.statSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw e;
  }
  if (text.trim() === '') return {};
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new CliError(`sim config ${file}: ${(e as Error).message}`);
  }
  const stamp = `${st.ino}:${st.size}:${st.mtimeMs}`;
  const stampFile = `${file}.validated`;
  let known = '';
  try {
    known = fs.readFileSync(stampFile, 'utf8');
  } catch {
    // not validated yet
  }
  if (known !== stamp) {
    const { validateKnobs } = await import('./knob-schema.ts');
    try {
      validateKnobs(doc);
    } catch (e) {
      throw new CliError(`sim config ${file}: ${(e as Error).message}`);
    }
    writeAtomic(stampFile, stamp);
  }
  return doc as Knobs;
}

const regexCache = new Map<string, RegExp>();
/** Compiles (and caches) a knob regex. */
export function re(source: string): RegExp {
  let r = regexCache.get(source);
  if (!r) {
    r = new RegExp(source);
    regexCache.set(source, r);
  }
  return r;
}

/** True when `pattern` is absent or matches any of `names`. */
export function matchesAny(pattern: string | undefined, names: readonly string[]): boolean {
  if (pattern === undefined) return true;
  const r = re(pattern);
  return names.some((n) => r.test(n));
}

/** A stable key for a knob entry, so counters reset when the entry's content changes. */
export function ruleKey(kind: string, index: number, rule: unknown): string {
  const text = JSON.stringify(rule);
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (Math.imul(h, 31) + text.charCodeAt(i)) | 0;
  return `${kind}:${index}:${(h >>> 0).toString(16)}`;
}

/**
 * Atomically consumes one use of a `times`-limited entry. Returns true when the entry still
 * had uses left (and records the use), false when it is exhausted. Counted across invocations.
 */
export function consumeTimes(root: string, key: string, times: number): boolean {
  return updateJson<Record<string, number>, boolean>(
    countersFile(root),
    countersLock(root),
    () => ({}),
    (doc) => {
      const used = doc[key] ?? 0;
      if (used >= times) return false;
      doc[key] = used + 1;
      return true;
    },
  );
}

/** Reads the counter of `key` without changing it. */
export function counterValue(root: string, key: string): number {
  return readJson<Record<string, number>>(countersFile(root), {})[key] ?? 0;
}

/** Latency for a verb path (`vm clone`), with optional uniform jitter; without a `latency`
 * knob for it, a clone of `vmName` takes the timing world's clone delay. */
export function latencyMs(knobs: Knobs, verb: string, vmName?: string): number {
  const l = knobs.latency?.[verb];
  if (l === undefined) return (verb === 'vm clone' && vmName && worldDelayMs(knobs, 'cloneMs', vmName)) || 0;
  if (typeof l === 'number') return l;
  return l.ms + (l.jitterMs ? Math.random() * l.jitterMs : 0);
}

export interface DhcpPolicy {
  leaseDelayMs: number;
  never: boolean;
  keyByGuestMac: boolean;
  windowsApipaWedge: boolean;
  windowsNeedsPnp: boolean;
}

/** The DHCP behaviour for a VM name: the first `dhcp.vms` entry that matches and sets a field wins. */
export function dhcpPolicy(knobs: Knobs, vmName: string): DhcpPolicy {
  const d = knobs.dhcp ?? {};
  const out: DhcpPolicy = {
    leaseDelayMs: d.leaseDelayMs ?? worldDelayMs(knobs, 'leaseMs', vmName) ?? 0,
    never: d.never ?? false,
    keyByGuestMac: d.keyByGuestMac ?? false,
    windowsApipaWedge: d.windowsApipaWedge ?? false,
    windowsNeedsPnp: d.windowsNeedsPnp ?? false,
  };
  const seen = new Set<string>();
  for (const rule of d.vms ?? []) {
    if (!re(rule.match).test(vmName)) continue;
    for (const k of Object.keys(out) as (keyof DhcpPolicy)[]) {
      const val = rule[k];
      if (val !== undefined && !seen.has(k)) {
        seen.add(k);
        (out as unknown as Record<string, unknown>)[k] = val;
      }
    }
  }
  return out;
}

export function agentReadyAfterMs(knobs: Knobs, vmName: string): number {
  for (const rule of knobs.guest?.vms ?? []) {
    if (rule.agentReadyAfterMs !== undefined && re(rule.match).test(vmName)) return rule.agentReadyAfterMs;
  }
  return knobs.guest?.agentReadyAfterMs ?? worldDelayMs(knobs, 'agentMs', vmName) ?? 0;
}
