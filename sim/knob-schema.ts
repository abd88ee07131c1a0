// The knob file schema (<root>/sim/config.json). Every knob is documented in docs/simulator.md.
// Validated with valibot when the file changes (see knobs.ts); unknown keys are rejected so a
// typo in a test's knobs fails loudly instead of silently doing nothing.
import * as v from 'valibot';

const regex = v.pipe(
  v.string(),
  v.check((s) => {
    try {
      new RegExp(s);
      return true;
    } catch {
      return false;
    }
  }, 'invalid regular expression'),
);
const ms = v.pipe(v.number(), v.minValue(0));
const count = v.pipe(v.number(), v.integer(), v.minValue(1));
const ipv4 = v.pipe(v.string(), v.ipv4());

const Latency = v.union([ms, v.strictObject({ ms, jitterMs: v.optional(ms) })]);

/** [min, max] in ms, both inclusive. */
const Range = v.pipe(
  v.tuple([ms, ms]),
  v.check(([lo, hi]) => lo <= hi, "the range's min is above its max"),
);

/** A timing world (docs/simulator.md "Timing worlds"): per VM, a delay drawn in each range from
 * a hash of (seed, VM name), used where no explicit knob sets that delay. */
const World = v.strictObject({
  seed: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0))),
  leaseMs: v.optional(Range),
  agentMs: v.optional(Range),
  cloneMs: v.optional(Range),
});

const Fault = v.strictObject({
  match: v.optional(regex),
  argvRegex: v.optional(regex),
  phase: v.optional(v.picklist(['pre', 'start'])),
  times: v.optional(count),
  probability: v.optional(v.pipe(v.number(), v.minValue(0), v.maxValue(1))),
  exit: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(255))),
  error: v.optional(v.string()),
  stderr: v.optional(v.string()),
  stdout: v.optional(v.string()),
  hang: v.optional(v.boolean()),
  delayMs: v.optional(ms),
});

export const EFFECTS = ['fixMac', 'renewLease', 'releaseLease', 'pnpRebind', 'linuxFixup', 'none'] as const;

const ExecRule = v.strictObject({
  match: v.optional(regex),
  argvRegex: v.optional(regex),
  argv: v.optional(v.array(v.string())),
  stdout: v.optional(v.string()),
  stderr: v.optional(v.string()),
  exit: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(255))),
  error: v.optional(v.string()),
  delayMs: v.optional(ms),
  effect: v.optional(v.picklist(EFFECTS)),
  times: v.optional(count),
  echoStdin: v.optional(v.boolean()),
  hang: v.optional(v.boolean()),
});

const DhcpVm = v.strictObject({
  match: regex,
  leaseDelayMs: v.optional(ms),
  never: v.optional(v.boolean()),
  keyByGuestMac: v.optional(v.boolean()),
  windowsApipaWedge: v.optional(v.boolean()),
  windowsNeedsPnp: v.optional(v.boolean()),
});

const Dhcp = v.strictObject({
  pool: v.optional(v.strictObject({ start: ipv4, end: ipv4 })),
  leaseTTLSeconds: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1))),
  leaseDelayMs: v.optional(ms),
  never: v.optional(v.boolean()),
  keyByGuestMac: v.optional(v.boolean()),
  windowsApipaWedge: v.optional(v.boolean()),
  windowsNeedsPnp: v.optional(v.boolean()),
  expiryOffset: v.optional(v.pipe(v.string(), v.regex(/^(Z|[+-]\d\d:\d\d)$/))),
  shuffle: v.optional(v.boolean()),
  vms: v.optional(v.array(DhcpVm)),
});

/** SAC console behaviour (docs/simulator.md, "Stand-ins"); per VM name in `vms`. */
const SacBehaviour = {
  readyAfterMs: v.optional(ms),
  nicsVisibleAfterMs: v.optional(ms),
  noPrompt: v.optional(v.boolean()),
  setFails: v.optional(v.boolean()),
  setIgnored: v.optional(v.boolean()),
};
const Sac = v.strictObject({
  ...SacBehaviour,
  vms: v.optional(v.array(v.strictObject({ match: regex, ...SacBehaviour }))),
});

const Guest = v.strictObject({
  agentReadyAfterMs: v.optional(ms),
  vms: v.optional(v.array(v.strictObject({ match: regex, agentReadyAfterMs: v.optional(ms) }))),
  execFailures: v.optional(
    v.array(v.strictObject({ match: v.optional(regex), attempts: count, error: v.optional(v.string()) })),
  ),
  sac: v.optional(Sac),
  serveVsock: v.optional(v.boolean()),
});

/** Load a node stand-in puts on the host (docs/simulator.md "Stand-ins"); per VM name in `vms`. */
const StandinLoad = {
  cpuMillicores: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(1000))),
  rssMiB: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(65_536))),
};
const Standin = v.strictObject({
  ...StandinLoad,
  vms: v.optional(v.array(v.strictObject({ match: regex, ...StandinLoad }))),
});

const StaticNet = v.strictObject({
  subnet: v.pipe(v.string(), v.regex(/^\d+\.\d+\.\d+\.\d+\/\d+$/)),
  gateway: ipv4,
  rangeStart: v.optional(ipv4),
});

export const KnobsSchema = v.strictObject({
  latency: v.optional(v.record(v.string(), Latency)),
  faults: v.optional(v.array(Fault)),
  exec: v.optional(v.array(ExecRule)),
  dhcp: v.optional(Dhcp),
  guest: v.optional(Guest),
  standin: v.optional(Standin),
  list: v.optional(v.strictObject({ empty: v.optional(v.picklist(['message', '[]', 'nothing'])) })),
  images: v.optional(v.strictObject({ digests: v.optional(v.record(v.string(), v.string())) })),
  networks: v.optional(v.record(v.string(), StaticNet)),
  quirks: v.optional(v.strictObject({ clonePidZero: v.optional(v.boolean()) })),
  /** Guests (by VM name) that stop answering ICMP echo: a hung guest (sim/guestnet.ts). */
  icmp: v.optional(v.strictObject({ silent: v.optional(regex) })),
  world: v.optional(World),
});

export type Knobs = v.InferOutput<typeof KnobsSchema>;
export type FaultKnob = v.InferOutput<typeof Fault>;
export type WorldKnob = v.InferOutput<typeof World>;
export type ExecRuleKnob = v.InferOutput<typeof ExecRule>;
export type Effect = (typeof EFFECTS)[number];

/** Validates a knob document; throws an Error listing every issue. */
export function validateKnobs(doc: unknown): Knobs {
  const result = v.safeParse(KnobsSchema, doc);
  if (result.success) return result.output;
  const issues = result.issues.map((i) => {
    const where = (i.path ?? []).map((p) => String(p.key)).join('.');
    return `${where || '(root)'}: ${i.message}`;
  });
  throw new Error(issues.join('; '));
}
