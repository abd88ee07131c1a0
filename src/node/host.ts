// Host facts for the node object (docs/contracts/virtual-node.md "Node object"), read once at start.
import { readFileSync, statfsSync } from 'node:fs';
import { availableParallelism, networkInterfaces } from 'node:os';

export interface HostFacts {
  cpus: number;
  memoryBytes: bigint;
  storageTotalBytes: bigint;
  storageAvailableBytes: bigint;
  /** e.g. `hugepages-2Mi` and its total bytes, when the host has huge pages. */
  hugepages: { resource: string; bytes: bigint } | undefined;
  firstIPv4: string | undefined;
}

function meminfo(): Map<string, bigint> {
  const out = new Map<string, bigint>();
  try {
    for (const line of readFileSync('/proc/meminfo', 'utf8').split('\n')) {
      const m = /^(\S+):\s+(\d+)(\s+kB)?/.exec(line);
      if (m) out.set(m[1] as string, BigInt(m[2] as string) * (m[3] ? 1024n : 1n));
    }
  } catch {
    // Not Linux: leave empty; capacity overrides still apply.
  }
  return out;
}

export function firstNonLoopbackIPv4(): string | undefined {
  for (const addrs of Object.values(networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return undefined;
}

export function probeHost(rootDir: string): HostFacts {
  const mi = meminfo();
  let storageTotalBytes = 0n;
  let storageAvailableBytes = 0n;
  try {
    const st = statfsSync(rootDir, { bigint: true });
    storageTotalBytes = st.blocks * st.bsize;
    storageAvailableBytes = st.bavail * st.bsize;
  } catch {
    try {
      const st = statfsSync('/', { bigint: true });
      storageTotalBytes = st.blocks * st.bsize;
      storageAvailableBytes = st.bavail * st.bsize;
    } catch {
      // leave zero
    }
  }
  const hpSize = mi.get('Hugepagesize');
  const hpTotal = mi.get('HugePages_Total');
  const hugepages =
    hpSize && hpSize > 0n
      ? { resource: `hugepages-${hugepageSuffix(hpSize)}`, bytes: (hpTotal ?? 0n) * hpSize }
      : undefined;
  return {
    cpus: availableParallelism(),
    memoryBytes: mi.get('MemTotal') ?? 0n,
    storageTotalBytes,
    storageAvailableBytes,
    hugepages,
    firstIPv4: firstNonLoopbackIPv4(),
  };
}

function hugepageSuffix(bytes: bigint): string {
  if (bytes % 1024n ** 3n === 0n) return `${bytes / 1024n ** 3n}Gi`;
  if (bytes % 1024n ** 2n === 0n) return `${bytes / 1024n ** 2n}Mi`;
  return `${bytes / 1024n}Ki`;
}
