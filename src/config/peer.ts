// The peer-restore settings (docs/peer-restore.md): where this host serves its snapshots to the
// other vk-cocoon hosts of the cluster, where a wake stages what it fetches from one, and the
// bounds of both. A file of its own beside env.ts: loadConfig calls parsePeerConfig with its
// own value readers, and ENV_DOCS lists PEER_ENV_DOCS, so `--help`, the README table and the
// parser keep one source.
import { isIP } from 'node:net';
import { parseQuantity, quantityValue } from '../vmspec/quantity.ts';

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

export const PEER_ENV_DOCS = [
  {
    name: 'VK_PEER_ADDR',
    default: ':12501',
    meaning:
      'peer snapshot server (host:port or :port; TLS, cluster nodes only); its port is also where wakes ask other hosts; empty disables peer restore',
  },
  {
    name: 'VK_PEER_PLAIN_HTTP',
    default: '(unset)',
    meaning:
      'comma-separated CIDRs of the node network whose plain-HTTP peer clients (Go vk-cocoon hosts) are also served: anyone on those addresses can read the hibernated state this host keeps (docs/peer-restore.md); unset: node client certificates only',
  },
  {
    name: 'VK_PEER_MAX_STREAMS',
    default: '128',
    meaning: 'peer slices served at once (all callers; 16 per caller at most)',
  },
  {
    name: 'VK_PEER_BANDWIDTH',
    default: '0',
    meaning:
      'bytes per second the peer server sends and a peer restore fetches (quantity, e.g. 500Mi; 0 = unbounded)',
  },
  {
    name: 'VK_STAGING_DIR',
    default: '/var/lib/cocoon/vk-staging',
    meaning:
      'where peer restores stage the files they fetch (same filesystem as COCOON_ROOT_DIR; emptied at start)',
  },
  {
    name: 'VK_COCOON_SNAPSHOT_DIR',
    default: '/var/lib/cocoon/snapshot/localfile',
    meaning: "cocoon's snapshot data (<dir>/<snapshot id>/<file>), what the peer server serves",
  },
] as const;

const ADDR = /^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):([0-9]{1,5})$/;

/** Parses the peer settings; every problem is pushed to `problems` (loadConfig reports them all). */
export function parsePeerConfig(get: (name: string) => string | undefined, problems: string[]): PeerConfig {
  const str = (name: string, def: string) => {
    const v = get(name);
    return v === undefined || v === '' ? def : v;
  };
  const raw = get('VK_PEER_ADDR') ?? ':12501';
  let listen: PeerConfig['listen'];
  if (raw !== '') {
    const m = ADDR.exec(raw);
    const port = Number(m?.[2]);
    const host = (m?.[1] ?? '').replace(/^\[(.*)\]$/, '$1');
    if (!m || port < 1 || port > 65_535 || (host !== '' && host.includes(':') && isIP(host) !== 6)) {
      problems.push(
        `VK_PEER_ADDR=${JSON.stringify(raw)}: expected host:port or :port (empty disables peer restore)`,
      );
    } else {
      listen = { host, port };
    }
  }
  const plainHttp: string[] = [];
  for (const cidr of (get('VK_PEER_PLAIN_HTTP') ?? '')
    .split(',')
    .map((c) => c.trim())
    .filter(Boolean)) {
    const [ip = '', bits = ''] = cidr.split('/');
    const family = isIP(ip);
    const max = family === 6 ? 128 : 32;
    if (family === 0 || (bits !== '' && (!/^[0-9]+$/.test(bits) || Number(bits) > max)))
      problems.push(
        `VK_PEER_PLAIN_HTTP: ${JSON.stringify(cidr)} is not a CIDR (e.g. 10.0.0.0/16) or an IP address`,
      );
    else plainHttp.push(bits === '' ? `${ip}/${max}` : cidr);
  }
  const streamsRaw = get('VK_PEER_MAX_STREAMS') ?? '';
  let maxStreams = 128;
  if (streamsRaw !== '') {
    if (!/^[0-9]+$/.test(streamsRaw) || Number(streamsRaw) < 1 || Number(streamsRaw) > 4096)
      problems.push(`VK_PEER_MAX_STREAMS=${JSON.stringify(streamsRaw)}: expected an integer from 1 to 4096`);
    else maxStreams = Number(streamsRaw);
  }
  const bwRaw = get('VK_PEER_BANDWIDTH') ?? '';
  let bandwidth = 0;
  if (bwRaw !== '') {
    const q = parseQuantity(bwRaw);
    if (!q || q.negative)
      problems.push(
        `VK_PEER_BANDWIDTH=${JSON.stringify(bwRaw)}: expected a quantity of bytes per second such as 500Mi (0 = unbounded)`,
      );
    else bandwidth = Number(quantityValue(q));
  }
  const stagingDir = str('VK_STAGING_DIR', '/var/lib/cocoon/vk-staging');
  const snapshotDir = str('VK_COCOON_SNAPSHOT_DIR', '/var/lib/cocoon/snapshot/localfile');
  for (const [name, dir] of [
    ['VK_STAGING_DIR', stagingDir],
    ['VK_COCOON_SNAPSHOT_DIR', snapshotDir],
  ] as const) {
    if (!dir.startsWith('/')) problems.push(`${name}=${JSON.stringify(dir)}: expected an absolute path`);
  }
  return { listen, stagingDir, snapshotDir, plainHttp, maxStreams, bandwidth };
}
