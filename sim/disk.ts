// Guest disk content (docs/simulator.md, "Disk content"): sparse-aware copies of the COW disk
// and cidata between a VM's run dir and a snapshot's data dir, and the data segments of a
// sparse file for `snapshot export` / `snapshot import` (PAX `COCOON.sparse.map` / `.size`).
//
// Data is found by reading: 1 MiB blocks, all-zero blocks skipped, and inside a block with
// data only the runs of non-zero 4 KiB pages count as data (so a copy allocates no zero
// pages). Reading a hole still costs (about 3 s per GiB on the 2-core test machine) and Node
// has no SEEK_DATA/SEEK_HOLE, hence three shortcuts:
//  - an all-hole file (st.blocks === 0, larger than SMALL) is known without any read: a stat
//    and a truncate, exactly what a placeholder cost before disks had content;
//  - the scan stops once the non-zero pages found account for every allocated block
//    (st.blocks × 512): the rest of the file is holes. Each non-zero page proves at least
//    min(4096, st.blksize) allocated bytes, so the count is a lower bound and the stop is
//    exact, on filesystems whose st_blocks counts data blocks (ext2/3/4, xfs, tmpfs, overlayfs
//    over those). Elsewhere (transparent compression: zfs, btrfs) it is not used. A marker at
//    the start of a 20 GiB cow.raw is found after one block;
//  - past the first LINEAR bytes the scan asks the filesystem for the data extents
//    (SEEK_DATA/SEEK_HOLE through a perl one-liner, one spawn) and reads only those: when
//    st_blocks also counts metadata (ext4 with more than 4 extents allocates an extent block)
//    the early stop never fires, and reading 20 GiB of holes would take a minute. Without perl
//    the scan reads on.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';

const BLOCK = 1 << 20;
const PAGE = 4096;
/** Files up to this size are always copied and exported as plain bytes (no scan). */
const SMALL = 64 * 1024;
/** Bytes the scan reads in order before it asks the filesystem where the data is. */
const LINEAR = 8 * BLOCK;
/** The scan yields an await point for async consumers every this many bytes read. */
const YIELD_EVERY = 64 * BLOCK;

/** A data segment of a sparse file: `[offset, length]` in bytes. */
export type Segment = [offset: number, length: number];

/** A run of non-zero pages read by the scan; `data` is only valid until the next step. */
export interface DataRun {
  offset: number;
  data: Buffer;
}

let zeros: Buffer | undefined;
function zeroBlock(): Buffer {
  zeros ??= Buffer.alloc(BLOCK);
  return zeros;
}

/** Filesystems whose st_blocks counts the data blocks (the early stop of the scan is exact). */
const EXACT_BLOCKS_FS = new Set([
  0xef53, // ext2/3/4
  0x01021994, // tmpfs
  0x58465342, // xfs
  0x794c7630, // overlayfs (Docker's overlay2 runs on ext4 or xfs)
]);

function blocksAreExact(file: string): boolean {
  try {
    return EXACT_BLOCKS_FS.has(Number(fs.statfsSync(file).type));
  } catch {
    return false;
  }
}

/** A file with no allocated block at all: content is holes only, known from a stat. */
export function allHole(st: fs.Stats): boolean {
  return st.size > SMALL && st.blocks === 0;
}

/** Whether the file may have holes worth a scan (else it is exported plainly). */
function mayHaveHoles(st: fs.Stats): boolean {
  return st.size > SMALL && st.blocks * 512 < st.size;
}

/** State of one scan: the read buffer and the early-stop accounting. */
interface Scan {
  readonly fd: number;
  readonly buf: Buffer;
  readonly zero: Buffer;
  /** st.blocks × 512; the scan stops once `proven` reaches it (when `earlyStop`). */
  readonly allocated: number;
  /** Allocated bytes each non-zero page proves: min(4096, st.blksize). */
  readonly perPage: number;
  readonly earlyStop: boolean;
  proven: number;
  sinceYield: number;
}

/**
 * Reads the block `[pos, pos + want)` and yields its runs of non-zero pages (and `null` at the
 * await points). Returns true when the allocated blocks are all accounted for.
 */
function* scanBlock(s: Scan, pos: number, want: number): Generator<DataRun | null, boolean> {
  let n = 0;
  while (n < want) {
    const got = fs.readSync(s.fd, s.buf, n, want - n, pos + n);
    if (got === 0) break;
    n += got;
  }
  if (n < want) s.buf.fill(0, n, want); // the file shrank meanwhile: the rest reads as zeros
  if (!s.buf.subarray(0, want).equals(s.zero.subarray(0, want))) {
    let runStart = -1;
    for (let p = 0; p < want; p += PAGE) {
      const end = Math.min(p + PAGE, want);
      if (!s.buf.subarray(p, end).equals(s.zero.subarray(0, end - p))) {
        s.proven += s.perPage;
        if (runStart < 0) runStart = p;
      } else if (runStart >= 0) {
        yield { offset: pos + runStart, data: s.buf.subarray(runStart, p) };
        runStart = -1;
      }
    }
    if (runStart >= 0) yield { offset: pos + runStart, data: s.buf.subarray(runStart, want) };
    if (s.earlyStop && s.proven >= s.allocated) return true;
  }
  s.sinceYield += want;
  if (s.sinceYield >= YIELD_EVERY) {
    s.sinceYield = 0;
    yield null;
  }
  return false;
}

/**
 * Data extents of `file` in `[from, size)` from the filesystem (lseek SEEK_DATA/SEEK_HOLE),
 * pages aligned outwards and merged; undefined when they cannot be had (Node has no lseek:
 * this asks perl, which Debian and Ubuntu always have; without it the caller reads on).
 */
function dataExtents(file: string, from: number, size: number): Segment[] | undefined {
  const r = spawnSync('perl', ['-e', SEEK_DATA_PERL, file, String(from), String(size)], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
    timeout: 30_000,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' },
  });
  if (r.error || r.status !== 0 || !r.stdout.endsWith('done\n')) return undefined;
  const out: Segment[] = [];
  for (const line of r.stdout.split('\n')) {
    const m = /^(\d+) (\d+)$/.exec(line);
    if (!m) continue;
    const start = Math.max(from, Math.floor(Number(m[1]) / PAGE) * PAGE);
    const end = Math.min(size, Math.ceil(Number(m[2]) / PAGE) * PAGE);
    if (end <= start) continue;
    const last = out[out.length - 1];
    if (last && last[0] + last[1] >= start) last[1] = Math.max(last[1], end - last[0]);
    else out.push([start, end - start]);
  }
  return out;
}

/** Prints "<data start> <hole start>" per data extent from ARGV[1] to ARGV[2], then "done". */
const SEEK_DATA_PERL = [
  'open(my $f, "<", $ARGV[0]) or exit 2;',
  'my ($pos, $end) = ($ARGV[1] + 0, $ARGV[2] + 0);',
  'while ($pos < $end) {',
  '  my $d = sysseek($f, $pos, 3);', // SEEK_DATA; undef (ENXIO) when no data follows
  '  last unless defined $d;',
  '  $d += 0;',
  '  last if $d >= $end;',
  '  my $h = sysseek($f, $d, 4);', // SEEK_HOLE
  '  $h = defined $h ? $h + 0 : $end;',
  '  $h = $end if $h > $end;',
  '  print "$d $h\n";',
  '  last if $h <= $d;',
  '  $pos = $h;',
  '}',
  'print "done\n";',
].join('\n');

/**
 * Reads `fd` (the file `file`, stat `st`) and yields its runs of non-zero 4 KiB pages in
 * offset order, and `null` every YIELD_EVERY bytes read (an await point: async consumers pause
 * there, sync consumers skip it). Stops early once the allocated blocks are accounted for.
 * The first LINEAR bytes are read in order (a marker at the start ends the scan there); past
 * them, only the data extents the filesystem reports are read, when it can tell.
 */
export function* scanData(fd: number, file: string, st: fs.Stats): Generator<DataRun | null> {
  if (st.size === 0 || allHole(st)) return;
  const s: Scan = {
    fd,
    buf: Buffer.allocUnsafe(BLOCK),
    zero: zeroBlock(),
    allocated: st.blocks * 512,
    perPage: Math.min(PAGE, st.blksize > 0 ? st.blksize : 512),
    earlyStop: blocksAreExact(file),
    proven: 0,
    sinceYield: 0,
  };
  let pos = 0;
  for (; pos < st.size && pos < LINEAR; pos += BLOCK) {
    if (yield* scanBlock(s, pos, Math.min(BLOCK, st.size - pos))) return;
  }
  if (pos >= st.size) return;
  const ranges = dataExtents(file, pos, st.size) ?? [[pos, st.size - pos]];
  for (const [start, length] of ranges) {
    for (let p = start; p < start + length; p += BLOCK) {
      if (yield* scanBlock(s, p, Math.min(BLOCK, start + length - p))) return;
    }
  }
}

/** Appends a run to a segment list, merging it with the previous segment when adjacent. */
export function addSegment(segments: Segment[], offset: number, length: number): void {
  const last = segments[segments.length - 1];
  if (last && last[0] + last[1] === offset) last[1] += length;
  else segments.push([offset, length]);
}

function writeAll(fd: number, data: Buffer, position: number): void {
  let done = 0;
  while (done < data.length) done += fs.writeSync(fd, data, done, data.length - done, position + done);
}

/**
 * Copies `src` to `dst` (created or truncated, with the source's mode) keeping holes: only the non-zero
 * pages are written, then the copy is truncated to the apparent size. An all-hole source costs
 * a stat and a truncate; a small file is copied as is. `st`: the source's stat, when known.
 */
export function copySparse(src: string, dst: string, st: fs.Stats = fs.statSync(src)): void {
  if (st.size <= SMALL) {
    fs.copyFileSync(src, dst);
    return;
  }
  const out = fs.openSync(dst, 'w', st.mode & 0o777);
  try {
    if (!allHole(st)) {
      const fd = fs.openSync(src, 'r');
      try {
        for (const run of scanData(fd, src, st)) if (run) writeAll(out, run.data, run.offset);
      } finally {
        fs.closeSync(fd);
      }
    }
    fs.ftruncateSync(out, st.size);
  } finally {
    fs.closeSync(out);
  }
}

/**
 * A disk of a new VM: a sparse copy of `src` when the snapshot has that disk with a non-zero
 * size, else an empty placeholder of `fallbackSize` (what every disk was before content).
 */
export function restoreDisk(src: string | undefined, dst: string, fallbackSize: number): void {
  const st = src === undefined ? undefined : fs.statSync(src, { throwIfNoEntry: false });
  if (src !== undefined && st?.isFile() && st.size > 0) {
    copySparse(src, dst, st);
    return;
  }
  const fd = fs.openSync(dst, 'w');
  try {
    if (fallbackSize > 0) fs.ftruncateSync(fd, fallbackSize);
  } finally {
    fs.closeSync(fd);
  }
}

/** How `snapshot export` sends a file: plain bytes, or the data segments of a sparse file. */
export type ExportPlan =
  | { sparse: false; size: number }
  | { sparse: true; size: number; segments: Segment[] };

/**
 * Plans the export of `file`: a file without holes is plain; otherwise its data segments
 * (`await pause()` is called at the scan's await points). A file whose only segment is the
 * whole file is plain as well.
 */
export async function planExport(file: string, pause: () => Promise<void>): Promise<ExportPlan> {
  const st = fs.statSync(file);
  if (!mayHaveHoles(st)) return { sparse: false, size: st.size };
  const segments: Segment[] = [];
  if (!allHole(st)) {
    const fd = fs.openSync(file, 'r');
    try {
      for (const run of scanData(fd, file, st)) {
        if (run) addSegment(segments, run.offset, run.data.length);
        else await pause();
      }
    } finally {
      fs.closeSync(fd);
    }
  }
  const only = segments[0];
  if (segments.length === 1 && only && only[0] === 0 && only[1] === st.size) {
    return { sparse: false, size: st.size };
  }
  return { sparse: true, size: st.size, segments };
}

/** The PAX value of `COCOON.sparse.map`: compact JSON `[[offset,length],...]`. */
export function encodeSparseMap(segments: readonly Segment[]): string {
  return JSON.stringify(segments);
}

/**
 * Parses `COCOON.sparse.map` and checks it against the entry: segments sorted, not
 * overlapping, inside `size`, their lengths summing to `dataSize`. Also accepts
 * `{"offset","length"}` objects. Returns undefined when the value is not JSON at all (an
 * opaque map of another encoding: the caller writes the data plainly); throws a message
 * (without prefix) when it is JSON but not a valid map for this entry.
 */
export function decodeSparseMap(text: string, size: number, dataSize: number): Segment[] | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!Array.isArray(raw)) throw new Error('not an array');
  const out: Segment[] = [];
  let end = 0;
  let total = 0;
  for (const item of raw) {
    const pair: unknown[] = Array.isArray(item)
      ? item
      : typeof item === 'object' && item !== null
        ? [(item as { offset?: unknown }).offset, (item as { length?: unknown }).length]
        : [];
    const [offset, length] = pair;
    if (
      pair.length !== 2 ||
      typeof offset !== 'number' ||
      typeof length !== 'number' ||
      !Number.isSafeInteger(offset) ||
      !Number.isSafeInteger(length) ||
      offset < end ||
      length < 0 ||
      offset + length > size
    ) {
      throw new Error(`bad segment ${JSON.stringify(item)}`);
    }
    out.push([offset, length]);
    end = offset + length;
    total += length;
  }
  if (total !== dataSize) throw new Error(`segments hold ${total} bytes, the entry ${dataSize}`);
  return out;
}

/**
 * Reads the data segments of `fd` in order, in chunks of at most 1 MiB (fresh buffers: the
 * consumer may keep them). A segment past the end of the file reads as zeros.
 */
export function* readSegments(fd: number, segments: readonly Segment[]): Generator<Buffer> {
  for (const [offset, length] of segments) {
    for (let done = 0; done < length; ) {
      const want = Math.min(BLOCK, length - done);
      const chunk = Buffer.allocUnsafe(want);
      let n = 0;
      while (n < want) {
        const got = fs.readSync(fd, chunk, n, want - n, offset + done + n);
        if (got === 0) break;
        n += got;
      }
      if (n < want) chunk.fill(0, n);
      yield chunk;
      done += want;
    }
  }
}

/**
 * Writes a sparse entry's data (the concatenated segments, in chunks of any size) back at the
 * segments' offsets of `fd`.
 */
export class SegmentWriter {
  private index = 0;
  private done = 0;
  private readonly fd: number;
  private readonly segments: readonly Segment[];

  constructor(fd: number, segments: readonly Segment[]) {
    this.fd = fd;
    this.segments = segments;
  }

  write(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      const seg = this.segments[this.index];
      if (!seg) throw new Error('entry data longer than its sparse map');
      const n = Math.min(seg[1] - this.done, chunk.length - at);
      writeAll(this.fd, chunk.subarray(at, at + n), seg[0] + this.done);
      at += n;
      this.done += n;
      if (this.done === seg[1]) {
        this.index += 1;
        this.done = 0;
      }
    }
  }
}
