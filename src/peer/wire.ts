// The peer restore wire format of Go vk-cocoon (docs/peer-restore.md; the interop spec is
// shared/spec/peer-restore.md §3–§5): the plan document, how extents become slices, the
// slice checksum, the query strings, the client's plan checks and the staged envelope. Pure:
// the server (server.ts, slice.ts), the client (client.ts) and the tests share these, so each
// constant and each formatting rule lives here once.
import { ENVELOPE_FIELDS, type SnapshotConfig } from '../registry/artifact-config.ts';
import { crc32Package } from '../util/lazy-packages.ts';
import { goJson, goQueryEscape } from './gojson.ts';

export const MiB = 1 << 20;
/** Extents closer than this are merged; the hole between them travels as zeros (Go: 4 MiB). */
export const COALESCE_GAP = 4 * MiB;
/** Extents are cut into slices of at most this many bytes (Go: 256 MiB); also our server's bound on `length`. */
export const MAX_SLICE = 256 * MiB;
/** Most stream groups per file (Go `streamsPerFile`). */
export const STREAMS_PER_FILE = 8;
/** Most slice workers of one restore (Go `defaultPeerConcurrency`). */
export const RESTORE_CONCURRENCY = 32;
/** Bytes the client buffers before a positional write (Go `sectionWriter`). */
export const WRITE_BUFFER = 4 * MiB;
/** Zero-skipping granularity of the client's writes, counted from the buffer start. */
export const ZERO_CHUNK = MiB;
export const PLAN_PATH = '/v1/snapshot-plan';
export const SLICE_PATH = '/v1/snapshot-slice';
/** The chunked trailer carrying a slice's CRC-32C (canonical case, as Go writes it). */
export const CRC_TRAILER = 'X-Slice-Crc32c';
/** Largest plan body the client reads (ours; Go has no bound). */
export const MAX_PLAN_BYTES = 16 * MiB;
/** The envelope the client stages beside the files. */
export const ENVELOPE_NAME = 'snapshot.json';

export interface Extent {
  offset: number;
  length: number;
}

export interface PlanFile {
  name: string;
  /** Apparent size in bytes. */
  size: number;
  /** Byte ranges that carry data; `null` for an empty or all-hole file. */
  slices: Extent[] | null;
}

export interface PeerPlan {
  snapshotId: string;
  files: PlanFile[];
}

/** Go `coalesceExtents`: an extent whose gap to the previous one is ≤ `gap` joins it. Input sorted. */
export function coalesceExtents(extents: readonly Extent[], gap = COALESCE_GAP): Extent[] {
  const out: Extent[] = [];
  for (const e of extents) {
    const last = out[out.length - 1];
    if (last && e.offset - (last.offset + last.length) <= gap) {
      last.length = Math.max(last.offset + last.length, e.offset + e.length) - last.offset;
    } else out.push({ offset: e.offset, length: e.length });
  }
  return out;
}

/** Go `splitExtents`: each extent cut from its own start into pieces of at most `max` bytes. */
export function splitExtents(extents: readonly Extent[], max = MAX_SLICE): Extent[] {
  const out: Extent[] = [];
  for (const e of extents) {
    const end = e.offset + e.length;
    for (let off = e.offset; off < end; off += max)
      out.push({ offset: off, length: Math.min(max, end - off) });
  }
  return out;
}

/** Go `isPlainName`: not empty, not `.` or `..`, no `/` (a backslash is allowed). */
export function isPlainName(name: string): boolean {
  return name !== '' && name !== '.' && name !== '..' && !name.includes('/');
}

/** The plan body exactly as Go's json.Encoder writes it: compact, HTML-escaped, `\n` at the end. */
export function encodePlanJson(plan: PeerPlan): string {
  const doc = {
    snapshotId: plan.snapshotId,
    files: plan.files.map((f) => ({
      name: f.name,
      size: f.size,
      slices:
        f.slices && f.slices.length > 0
          ? f.slices.map((s) => ({ offset: s.offset, length: s.length }))
          : null,
    })),
  };
  return `${goJson(doc)}\n`;
}

const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v);

/**
 * Decodes a plan body the way Go's json.Decoder fills the struct (missing fields are zero
 * values, `null` lists are empty, unknown fields ignored) but refuses wrong types and
 * integers JavaScript cannot hold exactly. Returns an error text on failure.
 */
export function parsePlanJson(text: string): PeerPlan | string {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    return `plan is not JSON: ${(err as Error).message}`;
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return 'plan is not a JSON object';
  const r = raw as { snapshotId?: unknown; files?: unknown };
  if (r.snapshotId !== undefined && r.snapshotId !== null && typeof r.snapshotId !== 'string')
    return 'plan snapshotId is not a string';
  if (r.files !== undefined && r.files !== null && !Array.isArray(r.files)) return 'plan files is not a list';
  const files: PlanFile[] = [];
  for (const [i, f] of ((r.files as unknown[] | null | undefined) ?? []).entries()) {
    if (typeof f !== 'object' || f === null || Array.isArray(f)) return `plan file ${i} is not an object`;
    const { name = '', size = 0, slices = null } = f as { name?: unknown; size?: unknown; slices?: unknown };
    if (typeof name !== 'string') return `plan file ${i}: name is not a string`;
    if (!isInt(size)) return `plan file ${i}: size is not an integer`;
    if (slices !== null && !Array.isArray(slices)) return `plan file ${i}: slices is not a list`;
    const list: Extent[] = [];
    for (const [j, s] of ((slices as unknown[] | null) ?? []).entries()) {
      const { offset = 0, length = 0 } = (s ?? {}) as { offset?: unknown; length?: unknown };
      if (typeof s !== 'object' || s === null || !isInt(offset) || !isInt(length))
        return `plan file ${i}: slice ${j} is not {offset, length} integers`;
      list.push({ offset, length });
    }
    files.push({ name, size, slices: slices === null ? null : list });
  }
  return { snapshotId: (r.snapshotId as string | null | undefined) ?? '', files };
}

export interface PlanLimits {
  /** Most bytes all slices together may carry. */
  maxTotalBytes: number;
  /** Most files. */
  maxFiles: number;
}

/**
 * The client's checks of a plan. Go's (§5): plain names; per slice offset ≥ 0, length > 0,
 * offset + length ≤ size. Ours on top: no NUL in a name, no file named `snapshot.json` (the
 * envelope's), no duplicate names (Go fails later at O_EXCL), size ≥ 0, slices of at most
 * MAX_SLICE bytes, no two slices of a file overlapping, at most `maxFiles` files and
 * `maxTotalBytes` bytes in all. Returns the first problem, or undefined.
 */
export function validatePlan(plan: PeerPlan, limits: PlanLimits): string | undefined {
  if (plan.files.length > limits.maxFiles)
    return `plan has ${plan.files.length} files, more than the limit of ${limits.maxFiles}`;
  const names = new Set<string>();
  let total = 0;
  for (const f of plan.files) {
    const what = `plan file ${JSON.stringify(f.name)}`;
    if (!isPlainName(f.name) || f.name.includes('\0')) return `${what}: not a plain name`;
    if (f.name === ENVELOPE_NAME) return `${what}: collides with the envelope`;
    if (names.has(f.name)) return `${what}: listed twice`;
    names.add(f.name);
    if (f.size < 0) return `${what}: negative size`;
    const sorted = [...(f.slices ?? [])].sort((a, b) => a.offset - b.offset);
    let end = 0;
    for (const s of sorted) {
      const at = `${what}: slice at ${s.offset}+${s.length}`;
      if (s.offset < 0 || s.length <= 0 || s.offset + s.length > f.size) return `${at} is outside the file`;
      if (s.length > MAX_SLICE) return `${at} is longer than ${MAX_SLICE} bytes`;
      if (s.offset < end) return `${at} overlaps another slice`;
      end = s.offset + s.length;
      total += s.length;
      if (total > limits.maxTotalBytes)
        return `plan carries more than the limit of ${limits.maxTotalBytes} bytes`;
    }
  }
  return undefined;
}

/** CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 to start). */
export function crc32cUpdate(crc: number, data: Uint8Array): number {
  return crc32Package().crc32c(data, crc) >>> 0;
}

/** The trailer's text of a CRC value: lowercase hex, no `0x`, no zero padding (Go `FormatUint(v,16)`). */
export function crc32cHex(value: number): string {
  return (value >>> 0).toString(16);
}

/** Go's stream groups: at most `streams` contiguous runs of ⌈n/streams⌉ slices, in order. */
export function streamGroups<T>(slices: readonly T[], streams = STREAMS_PER_FILE): T[][] {
  if (slices.length === 0) return [];
  const per = Math.ceil(slices.length / streams);
  const out: T[][] = [];
  for (let i = 0; i < slices.length; i += per) out.push(slices.slice(i, i + per));
  return out;
}

/** Go's staging prefix: every character outside `[A-Za-z0-9.-]` becomes `_`. */
export function stagingPrefix(vmName: string): string {
  let out = '';
  for (const ch of vmName) out += /^[A-Za-z0-9.-]$/.test(ch) ? ch : '_';
  return out;
}

/** `{base}/v1/snapshot-plan?name=<QueryEscape>`. */
export function planUrl(base: string, name: string): string {
  return `${trimBase(base)}${PLAN_PATH}?name=${goQueryEscape(name)}`;
}

/** `{base}/v1/snapshot-slice?id=…&file=…&offset=N&length=N`, in Go's parameter order. */
export function sliceUrl(base: string, id: string, file: string, slice: Extent): string {
  return `${trimBase(base)}${SLICE_PATH}?id=${goQueryEscape(id)}&file=${goQueryEscape(file)}&offset=${slice.offset}&length=${slice.length}`;
}

function trimBase(base: string): string {
  return base.replace(/\/+$/, '');
}

/**
 * The staged `snapshot.json`, byte for byte Go's `MarshalEnvelope(config, vmName)`:
 * `json.MarshalIndent` with two spaces plus `\n`, `{"version":1,"config":{…}}`, the keys in
 * the order of Go's struct, every one but `name` omitted when it holds its zero value (empty
 * string, 0, false, an empty map). `image_blob_ids` is a Go map, so its keys are sorted.
 */
export function peerEnvelope(config: SnapshotConfig, vmName: string): string {
  const c: Record<string, unknown> = {};
  const put = (key: string, value: unknown) => {
    if (value === undefined || value === null || value === '' || value === 0 || value === false) return;
    c[key] = value;
  };
  put('id', config.snapshotId);
  c.name = vmName;
  for (const [key, value] of ENVELOPE_FIELDS) {
    if (key !== 'image_blob_ids') {
      put(key, value(config));
      continue;
    }
    const blobs = (value(config) ?? {}) as Readonly<Record<string, unknown>>;
    const keys = Object.keys(blobs).sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
    if (keys.length > 0) c.image_blob_ids = new Map(keys.map((k) => [k, blobs[k]]));
  }
  return `${goJson({ version: 1, config: c }, 2)}\n`;
}

/** Slack over the registry's file sizes for files a host keeps beside them (a few KiB of JSON). */
export const STAGING_SLACK = 64 * MiB;

/**
 * The most a peer restore may stage for `config` (pure): what the registry says the snapshot's
 * files hold (each file's apparent size: `sparseSize` for a sparse file, else `size`) plus
 * STAGING_SLACK, never more than `hostBound`. A peer that plans more is refused before anything
 * is written, so a peer cannot fill this host's disk with more than the snapshot it claims to
 * be. A config without file sizes (an older writer) gets `hostBound`.
 */
export function stagedBytesBound(config: SnapshotConfig, hostBound: number): number {
  let total = 0;
  for (const f of Object.values(config.files)) {
    const sparse = Number(f.sparseSize);
    total += Math.max(f.size ?? 0, Number.isFinite(sparse) ? sparse : 0);
  }
  return total === 0 ? hostBound : Math.min(hostBound, total + STAGING_SLACK);
}
