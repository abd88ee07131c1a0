// The peer-restore settings (docs/peer-restore.md): where this host serves its snapshots to the
// other vk-cocoon hosts of the cluster, where a wake stages what it fetches from one, and the
// bounds of both. Their rows are the `peer` group of the settings table (src/config/settings.ts);
// parsePeerConfig reads them alone (tests build a peer host from it).
import { absolutePath, bytesPerSecond, cidrList, int, listenAddress } from './parsers.ts';
import { type Getter, readSettings } from './read.ts';
import { type Setting, setting } from './setting.ts';

export interface PeerConfig {
  /** VK_PEER_ADDR; `undefined` when set empty: no peer server, and wakes never ask a peer. */
  listen: { host: string; port: number } | undefined;
  /** VK_STAGING_DIR: where a peer restore writes the files it fetches (same filesystem as cocoon's). */
  stagingDir: string;
  /** VK_COCOON_SNAPSHOT_DIR: `<dir>/<snapshot id>/<file>`, what the peer server reads. */
  snapshotDir: string;
  /** VK_PEER_PLAIN_HTTP: the networks (CIDRs) whose plain-HTTP clients (Go daemons) are also
   * answered; empty: TLS node identities only. */
  plainHttp: readonly string[];
  /** VK_PEER_MAX_STREAMS: slices served at once, all callers together (Go: 128). */
  maxStreams: number;
  /** VK_PEER_BANDWIDTH in bytes per second, served and fetched each; 0 = unbounded. */
  bandwidth: number;
}

export const PEER_SETTINGS = [
  setting({
    name: 'VK_PEER_ADDR',
    group: 'peer',
    field: 'peer.listen',
    default: { host: '', port: 12_501 },
    shown: ':12501',
    emptyIsValue: true,
    parse: listenAddress('disables peer restore'),
    doc: 'peer snapshot server (host:port or :port; TLS, cluster nodes only); its port is also where wakes ask other hosts; empty disables peer restore',
  }),
  setting({
    name: 'VK_PEER_PLAIN_HTTP',
    group: 'peer',
    field: 'peer.plainHttp',
    default: [],
    shown: '(unset)',
    parse: cidrList,
    doc: 'comma-separated CIDRs of the node network whose plain-HTTP peer clients (Go vk-cocoon hosts) are also served: anyone on those addresses can read the hibernated state this host keeps (docs/peer-restore.md); unset: node client certificates only',
  }),
  setting({
    name: 'VK_PEER_MAX_STREAMS',
    group: 'peer',
    field: 'peer.maxStreams',
    default: 128,
    parse: int(1, 4096),
    doc: 'peer slices served at once (all callers; 16 per caller at most)',
  }),
  setting({
    name: 'VK_PEER_BANDWIDTH',
    group: 'peer',
    field: 'peer.bandwidth',
    default: 0,
    parse: bytesPerSecond,
    doc: 'bytes per second the peer server sends and a peer restore fetches (quantity, e.g. 500Mi; 0 = unbounded)',
  }),
  setting({
    name: 'VK_STAGING_DIR',
    group: 'peer',
    field: 'peer.stagingDir',
    default: '/var/lib/cocoon/vk-staging',
    parse: absolutePath,
    doc: 'where peer restores stage the files they fetch (same filesystem as COCOON_ROOT_DIR; emptied at start)',
  }),
  setting({
    name: 'VK_COCOON_SNAPSHOT_DIR',
    group: 'peer',
    field: 'peer.snapshotDir',
    default: '/var/lib/cocoon/snapshot/localfile',
    parse: absolutePath,
    doc: "cocoon's snapshot data (<dir>/<snapshot id>/<file>), what the peer server serves",
  }),
];

/** Reads the peer settings alone; every problem is pushed to `problems`. */
export function parsePeerConfig(get: Getter, problems: string[]): PeerConfig {
  const { values } = readSettings(PEER_SETTINGS as readonly Setting[], get, problems);
  const peer: Record<string, unknown> = {};
  for (const [path, value] of Object.entries(values)) peer[path.slice('peer.'.length)] = value;
  return peer as unknown as PeerConfig;
}
