// Data extents of the files of a stored snapshot and the plan built from them
// (shared/spec/peer-restore.md §3 "buildPlan", §4 "Extents"; docs/peer-restore.md).
//
// Go's scanExtents walks the file with lseek(SEEK_DATA) / lseek(SEEK_HOLE). Node has no
// lseek at all, and no npm package offers SEEK_DATA without a native build of our own, so
// this is hand-written in two ways:
//  - when perl exists (Debian and Ubuntu always ship it), one perl spawn per file walks the
//    extents with sysseek(…, 3|4) and prints them: the same answer as Go, ENXIO ending the
//    walk, EINVAL/ENOTSUP (no hole support) meaning one dense extent [0, size);
//  - without perl, a read scan: 1 MiB blocks, an all-zero block is a hole. Two shortcuts
//    keep it cheap: a small file (≤ 64 KiB) or one whose allocated bytes cover its size is
//    one extent, unread; and on filesystems whose st_blocks counts data blocks only, the scan
//    stops once the non-zero 4 KiB pages it found account for every allocated block (the
//    rest is holes: the st_blocks early stop of sim/disk.ts). The result
//    differs from Go's only in granularity (1 MiB), and a data block of zeros counts as a
//    hole: the bytes a client reassembles are the same.
// Either way a file with no allocated block at all (st.blocks 0, larger than 64 KiB: smaller
// ones may keep their data inline in the inode) has no data and is not read.
// The scan is asynchronous (a spawned process, FileHandle reads): a 20 GiB disk never blocks
// the daemon's event loop. Plans of unchanged files come from a small LRU cache.
import { execFile } from 'node:child_process';
import type { Dirent } from 'node:fs';
import { constants, promises as fsp, statfsSync } from 'node:fs';
import { join } from 'node:path';
import { coalesceExtents, type Extent, isPlainName, MiB, type PlanFile, splitExtents } from './wire.ts';

const BLOCK = MiB;
const PAGE = 4096;
/** Up to this size a file with no allocated block may still hold data (ext4 inline data): it is scanned. */
const SMALL = 64 * 1024;
/** Files whose plan the cache keeps (path, size, mtime, inode). */
const CACHE_ENTRIES = 256;

/** Filesystems whose st_blocks counts data blocks (the read scan's early stop is exact). */
const EXACT_BLOCKS_FS = new Set([0xef53, 0x01021994, 0x58465342, 0x794c7630]); // ext2/3/4, tmpfs, xfs, overlayfs

/** Prints "<data> <hole>" per extent of ARGV[0] below ARGV[1], then "done"; "dense" without hole support. */
const SEEK_PERL = `
open(my $f, "<", $ARGV[0]) or exit 2;
my ($pos, $end) = (0, $ARGV[1] + 0);
while ($pos < $end) {
  my $d = sysseek($f, $pos, 3);
  if (!defined $d) {
    last if $!{ENXIO};
    if ($!{EINVAL} || $!{ENOTSUP} || $!{EOPNOTSUPP}) { print "dense\\n"; exit 0 }
    exit 3;
  }
  $d += 0;
  last if $d >= $end;
  my $h = sysseek($f, $d, 4);
  exit 3 unless defined $h;
  $h += 0;
  $h = $end if $h > $end;
  print "$d $h\\n";
  last if $h <= $d;
  $pos = $h;
}
print "done\\n";
`;

export type ScanMethod = 'seek' | 'read';

/** Extents from SEEK_DATA/SEEK_HOLE through perl; undefined when perl is missing or fails. */
async function seekExtents(path: string, size: number): Promise<Extent[] | undefined> {
  const out = await new Promise<string | undefined>((resolve) => {
    execFile(
      'perl',
      ['-e', SEEK_PERL, path, String(size)],
      {
        timeout: 60_000,
        maxBuffer: 64 * MiB,
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' },
      },
      (err, stdout) => resolve(err ? undefined : stdout),
    );
  });
  if (out === undefined) return undefined;
  if (out === 'dense\n') return [{ offset: 0, length: size }];
  if (!out.endsWith('done\n')) return undefined;
  const extents: Extent[] = [];
  for (const line of out.split('\n')) {
    const m = /^(\d+) (\d+)$/.exec(line);
    if (m && Number(m[2]) > Number(m[1]))
      extents.push({ offset: Number(m[1]), length: Number(m[2]) - Number(m[1]) });
  }
  return extents;
}

function blocksAreExact(path: string): boolean {
  try {
    return EXACT_BLOCKS_FS.has(Number(statfsSync(path).type));
  } catch {
    return false;
  }
}

/** Extents found by reading: non-zero 1 MiB blocks, merged when adjacent (see the header). */
async function readExtents(path: string, fh: fsp.FileHandle, st: StatLike): Promise<Extent[]> {
  const allocated = st.blocks * 512;
  if (st.size <= SMALL || allocated >= st.size) return [{ offset: 0, length: st.size }];
  const earlyStop = blocksAreExact(path);
  const perPage = Math.min(PAGE, st.blksize > 0 ? st.blksize : 512);
  const buf = Buffer.allocUnsafe(BLOCK);
  const zero = Buffer.alloc(BLOCK);
  const out: Extent[] = [];
  let proven = 0;
  for (let pos = 0; pos < st.size; pos += BLOCK) {
    const want = Math.min(BLOCK, st.size - pos);
    let n = 0;
    while (n < want) {
      const { bytesRead } = await fh.read(buf, n, want - n, pos + n);
      if (bytesRead === 0) break;
      n += bytesRead;
    }
    if (n === 0) break; // the file shrank: nothing more to send
    if (buf.subarray(0, n).equals(zero.subarray(0, n))) continue;
    const last = out[out.length - 1];
    if (last && last.offset + last.length === pos) last.length += n;
    else out.push({ offset: pos, length: n });
    for (let p = 0; p < n; p += PAGE) {
      const end = Math.min(p + PAGE, n);
      if (!buf.subarray(p, end).equals(zero.subarray(0, end - p))) proven += perPage;
    }
    if (earlyStop && proven >= allocated) break;
  }
  return out;
}

interface StatLike {
  size: number;
  blocks: number;
  blksize: number;
}

/**
 * The data extents of an open file (`path` names it for perl and statfs), sorted, not
 * overlapping. Size 0 and an all-hole file (no allocated block, > 64 KiB) have none and are not read.
 * `method` forces one way (tests); by default SEEK_DATA through perl, the read scan without it.
 */
export async function scanExtents(
  path: string,
  fh: fsp.FileHandle,
  st: StatLike,
  method?: ScanMethod,
): Promise<Extent[]> {
  if (st.size === 0 || (st.blocks === 0 && st.size > SMALL)) return [];
  if (method !== 'read') {
    const found = await seekExtents(path, st.size);
    if (found || method === 'seek') {
      if (!found) throw new Error('SEEK_DATA scan failed');
      return found;
    }
  }
  return await readExtents(path, fh, st);
}

/** A tiny LRU of file plans keyed by (path, size, mtime, inode). */
class PlanCache {
  readonly #map = new Map<string, Extent[] | null>();

  get(key: string): Extent[] | null | undefined {
    const v = this.#map.get(key);
    if (v !== undefined) {
      this.#map.delete(key);
      this.#map.set(key, v);
    }
    return v;
  }

  set(key: string, value: Extent[] | null): void {
    this.#map.delete(key);
    this.#map.set(key, value);
    while (this.#map.size > CACHE_ENTRIES) this.#map.delete(this.#map.keys().next().value as string);
  }
}

const cache = new PlanCache();

/** The plan entry of one regular file: its extents coalesced (4 MiB) and split (256 MiB). */
export async function planFile(dir: string, name: string, method?: ScanMethod): Promise<PlanFile> {
  const path = join(dir, name);
  const fh = await fsp.open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new Error(`${name} is not a regular file`);
    const key = `${method ?? ''}\0${path}\0${st.size}\0${st.mtimeMs}\0${st.ino}`;
    let slices = cache.get(key);
    if (slices === undefined) {
      const extents = await scanExtents(path, fh, st, method);
      const split = splitExtents(coalesceExtents(extents));
      slices = split.length > 0 ? split : null;
      cache.set(key, slices);
    }
    return { name, size: st.size, slices: slices?.map((s) => ({ ...s })) ?? null };
  } finally {
    await fh.close();
  }
}

/**
 * Go `buildPlan` after the ID is known: the regular files of `<storeDir>/<id>` (no
 * directories, symlinks or recursion), sorted by name (bytewise, as Go sorts), each planned.
 * Throws a short message (no absolute path) when the ID is not plain, the directory cannot be
 * read, a scan fails or there is no regular file.
 */
export async function planSnapshotFiles(
  storeDir: string,
  id: string,
  method?: ScanMethod,
): Promise<PlanFile[]> {
  if (!isPlainName(id) || id.includes('\0')) throw new Error('snapshot id is not a plain name');
  const dir = join(storeDir, id);
  let entries: Dirent[];
  try {
    entries = await fsp.readdir(dir, { withFileTypes: true });
  } catch {
    throw new Error('snapshot directory cannot be read');
  }
  const names = entries
    .filter((e) => e.isFile())
    .map((e) => e.name)
    .sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  if (names.length === 0) throw new Error('snapshot has no files');
  const files: PlanFile[] = [];
  for (const name of names) {
    try {
      files.push(await planFile(dir, name, method));
    } catch {
      throw new Error(`scan of ${name} failed`);
    }
  }
  return files;
}
