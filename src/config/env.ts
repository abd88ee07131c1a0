// Configuration from environment variables (README.md "Configuration"), compatible with the Go
// implementation's variable names and defaults. Unlike the Go implementation, every value
// is validated at startup and a bad one stops startup with an error naming the variable
// and what it accepts (the issue overrides the spec's "lenient" wording: a typo in a
// deployment unit should fail loudly, not silently fall back to a default).
//
// Each variable is one row of the settings table (src/config/settings.ts): its parser, default
// and documentation. What this file adds are the rules across settings (CROSS_CHECKS).
import { isGoogleRegistryHost } from '../registry/credentials.ts';
import { isLoopbackHost } from '../util/loopback.ts';
import { assemble, type Getter, readSettings } from './read.ts';
import { SETTINGS } from './settings.ts';
import type { Config } from './types.ts';

export { ENV_DOCS, type EnvVarDoc, helpText, SETTINGS } from './settings.ts';
export {
  type Config,
  DEFAULT_STATE_DIR,
  type KubeletAuthMode,
  type LogLevel,
  type OrphanPolicy,
  type RestoreMode,
} from './types.ts';

export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** A rule across settings. */
export interface CrossCheck {
  /** The settings involved: the message names every one of them. The rule is skipped when one
   * of them has a bad value (reported already, and its default stands in). */
  readonly settings: readonly string[];
  /** The problem, or `undefined` when the settings agree. */
  readonly check: (config: Config, get: Getter) => string | undefined;
}

/** Client-side write budgets (docs/decisions.md "Client rate limits"): a burst below its rate is
 * refused (an unset burst is twice the rate: the table's derived default). */
function budget(prefix: string, rate: (c: Config) => number, burst: (c: Config) => number): CrossCheck {
  return {
    settings: [`${prefix}_QPS`, `${prefix}_BURST`],
    check: (c) =>
      burst(c) < rate(c)
        ? `${prefix}_BURST=${burst(c)}: expected at least ${prefix}_QPS (${rate(c)})`
        : undefined,
  };
}

/** A pod's clone-from-dir reads under its roots; the daemon's own staged peer restores and
 * cocoon's snapshot data must never be among them (another tenant's state). */
function cloneRootsApart(name: string, dir: (c: Config) => string): CrossCheck {
  const within = (a: string, b: string) => a === b || a.startsWith(`${b.replace(/\/+$/, '')}/`);
  return {
    settings: ['VK_CLONE_FROM_DIR_ROOTS', name],
    check: (c) => {
      const d = dir(c);
      const roots = c.cloneFromDirRoots.filter((root) => within(root, d) || within(d, root));
      return roots.length === 0
        ? undefined
        : `VK_CLONE_FROM_DIR_ROOTS: root ${roots.join(', ')} overlaps ${name}=${d}: a pod's clone-from-dir would reach the daemon's own snapshot state`;
    },
  };
}

export const CROSS_CHECKS: readonly CrossCheck[] = [
  budget(
    'VK_KUBE',
    (c) => c.kubeQps,
    (c) => c.kubeBurst,
  ),
  budget(
    'VK_KUBE_EVENT',
    (c) => c.kubeEventQps,
    (c) => c.kubeEventBurst,
  ),
  budget(
    'VK_KUBE_HEARTBEAT',
    (c) => c.kubeHeartbeatQps,
    (c) => c.kubeHeartbeatBurst,
  ),
  // A Google credential never goes to another registry by accident.
  {
    settings: ['GOOGLE_APPLICATION_CREDENTIALS', 'OCI_REGISTRY', 'VK_REGISTRY_GOOGLE_ADC'],
    check: (c, get) => {
      if (!get('GOOGLE_APPLICATION_CREDENTIALS') || c.registryGoogleAdc !== 'auto') return undefined;
      const host = c.ociRegistry?.replace(/^https?:\/\//, '').split('/')[0];
      return host === undefined || isGoogleRegistryHost(host)
        ? undefined
        : `GOOGLE_APPLICATION_CREDENTIALS is set but OCI_REGISTRY ${host} is not a Google registry (gcr.io, *.pkg.dev): set VK_REGISTRY_GOOGLE_ADC=true to use it there, or unset it`;
    },
  },
  // The profile and heap endpoints hand out the daemon's memory (tokens, pod specs) to
  // whoever can reach them, and the metrics listener has no authentication: they are served
  // on a loopback listener only. An empty host (`:9091`) is every interface.
  {
    settings: ['VK_DEBUG_ENDPOINTS', 'VK_METRICS_ADDR'],
    check: (c) =>
      c.debugEndpoints && c.metricsAddr !== '' && !isLoopbackHost(c.metricsAddr)
        ? `VK_DEBUG_ENDPOINTS=true needs VK_METRICS_ADDR on a loopback host (127.0.0.1:port, [::1]:port or localhost:port), not ${JSON.stringify(c.metricsAddr)}: the debug endpoints hand out the daemon's memory without authentication`
        : undefined,
  },
  // Without authentication the kubelet API runs anything in any VM for anyone who reaches
  // it. Its listen address is VK_NODE_IP (with webhook authentication: every interface; with
  // none: VK_NODE_IP alone, src/main.ts), so `none` needs a loopback VK_NODE_IP: 127.0.0.0/8
  // (VK_NODE_IP is IPv4; ::1 and localhost are loopback too wherever a host is allowed).
  {
    settings: ['VK_KUBELET_AUTH', 'VK_NODE_IP'],
    check: (c) =>
      c.kubeletAuth === 'none' && (c.nodeIP === undefined || !isLoopbackHost(c.nodeIP))
        ? `VK_KUBELET_AUTH=none needs VK_NODE_IP to be a loopback address (e.g. 127.0.0.1), not ${c.nodeIP === undefined ? '(unset: the first non-loopback IPv4)' : JSON.stringify(c.nodeIP)}: the kubelet API then listens on VK_NODE_IP alone, and unauthenticated it lets anyone who reaches it exec into every VM`
        : undefined,
  },
  cloneRootsApart('VK_STAGING_DIR', (c) => c.peer.stagingDir),
  cloneRootsApart('VK_COCOON_SNAPSHOT_DIR', (c) => c.peer.snapshotDir),
];

/** Parses and validates the environment; throws ConfigError listing every bad variable. */
export function loadConfig(env: NodeJS.ProcessEnv): Config {
  const problems: string[] = [];
  const get: Getter = (name) => env[name]?.trim();
  const { values, bad, ignored } = readSettings(SETTINGS, get, problems);
  const config = { ...assemble(values), ignoredLaterTier: [...ignored] } as unknown as Config;
  for (const rule of CROSS_CHECKS) {
    if (rule.settings.some((name) => bad.has(name))) continue;
    const problem = rule.check(config, get);
    if (problem !== undefined) problems.push(problem);
  }
  if (problems.length > 0) {
    throw new ConfigError(`invalid configuration:\n  ${problems.join('\n  ')}`);
  }
  return config;
}
