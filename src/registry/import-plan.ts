/**
 * The plan of a `cocoon snapshot import` tar, pure (docs/registry.md "Pull flow" and "The v2 format"): which
 * blobs make each file, in what order, whether each is zstd-compressed, the entry's size and mode and its sparse
 * PAX records; and which blob the read-ahead downloads next. Every check fails closed before a byte is streamed.
 */
import type { Decoded } from '../cocoon/records.ts';
import { type SnapshotLayer, type SnapshotManifest, ZSTD_SUFFIX } from './artifact.ts';
import {
  DEFAULT_FILE_MODE,
  type SnapshotConfig,
  SPARSE_MAP_PAX,
  SPARSE_SIZE_PAX,
} from './artifact-config.ts';

/** Debug annotations of a v2 chunk layer (the config's `chunks` list is authoritative). */
export const CHUNK_INDEX_ANNOTATION = 'cocoonstack.chunk.index';
export const CHUNK_COUNT_ANNOTATION = 'cocoonstack.chunk.count';

/** One blob of a file: downloaded, verified against its digest, decompressed when `zstd`. */
export interface TarPart {
  readonly layer: SnapshotLayer;
  readonly zstd: boolean;
}

/** One file entry of the import tar. */
export interface TarLayerEntry {
  readonly name: string;
  /** The file's bytes in the tar (uncompressed, all chunks). */
  readonly size: number;
  readonly mode: number;
  /** PAX records, present only for files the config marks sparse. */
  readonly pax?: Readonly<Record<string, string>>;
  /** The blobs whose (decompressed) bytes, concatenated in this order, are the file. */
  readonly parts: readonly TarPart[];
}

/** Why a value cannot go into a PAX record (`key=value\n`): a newline would end the record early. */
function paxValue(what: string, value: string | number): string {
  const text = String(value);
  if (text.includes('\n')) throw new Error(`${what} contains a newline`);
  return text;
}

function sparsePax(title: string, config: SnapshotConfig): Decoded<Record<string, string> | undefined> {
  const info = Object.hasOwn(config.files, title) ? config.files[title] : undefined;
  if (info?.sparseMap === undefined && info?.sparseSize === undefined) return { ok: true, value: undefined };
  try {
    const pax: Record<string, string> = {};
    if (info.sparseMap !== undefined)
      pax[SPARSE_MAP_PAX] = paxValue(`files[${title}].sparseMap`, info.sparseMap);
    if (info.sparseSize !== undefined)
      pax[SPARSE_SIZE_PAX] = paxValue(`files[${title}].sparseSize`, info.sparseSize);
    return { ok: true, value: pax };
  } catch (error) {
    return { ok: false, error: `snapshot config: ${(error as Error).message}` };
  }
}

/**
 * The file entries of the import tar (docs/registry.md "Pull flow" step 3): name = title, mode =
 * `files[title].mode` or 0640, PAX records `COCOON.sparse.map` / `COCOON.sparse.size` when the config
 * marks the file sparse.
 *
 * v1: one entry per layer in manifest order, size = blob size; a `chunks` list is refused.
 * v2 (cocoon-common v0.3.0): one entry per title, in the order titles first appear among the layers. A
 * file with `files[title].chunks` is those blobs in that order (each digest must be a layer with that
 * title, every layer with that title must be listed, and where a layer carries the
 * `cocoonstack.chunk.index`/`.count` debug annotations they must agree with its place in the list);
 * otherwise exactly one layer has the title. `+zstd` layers are decompressed; the entry's size is
 * `files[title].size` (required once a file is compressed or chunked; for one raw blob it must equal
 * the blob's size when given).
 */
export function planTarEntries(manifest: SnapshotManifest, config: SnapshotConfig): Decoded<TarLayerEntry[]> {
  const entries: TarLayerEntry[] = [];
  const fileOf = (title: string) => (Object.hasOwn(config.files, title) ? config.files[title] : undefined);
  if (manifest.version === 1) {
    for (const layer of manifest.layers) {
      const info = fileOf(layer.title);
      if (info?.chunks !== undefined)
        return { ok: false, error: `files[${layer.title}]: chunked but manifest is not v2` };
      const pax = sparsePax(layer.title, config);
      if (!pax.ok) return pax;
      entries.push({
        name: layer.title,
        size: layer.size,
        mode: info?.mode ?? DEFAULT_FILE_MODE,
        ...(pax.value ? { pax: pax.value } : {}),
        parts: [{ layer, zstd: false }],
      });
    }
    return { ok: true, value: entries };
  }
  const byTitle = new Map<string, SnapshotLayer[]>();
  for (const layer of manifest.layers) {
    const same = byTitle.get(layer.title);
    if (same) same.push(layer);
    else byTitle.set(layer.title, [layer]);
  }
  for (const [title, layers] of byTitle) {
    const info = fileOf(title);
    const parts = info?.chunks ? chunkParts(title, info.chunks, layers) : singlePart(title, layers);
    if (!parts.ok) return parts;
    const compressed = parts.value.some((p) => p.zstd);
    let size: number;
    if (compressed || parts.value.length > 1) {
      if (info?.size === undefined)
        return {
          ok: false,
          error: `files[${title}]: no size (required for a ${compressed ? 'compressed' : 'chunked'} file)`,
        };
      size = info.size;
    } else {
      size = (parts.value[0] as TarPart).layer.size;
      if (info?.size !== undefined && info.size !== size)
        return { ok: false, error: `files[${title}]: size ${info.size} but its blob has ${size} bytes` };
    }
    const pax = sparsePax(title, config);
    if (!pax.ok) return pax;
    entries.push({
      name: title,
      size,
      mode: info?.mode ?? DEFAULT_FILE_MODE,
      ...(pax.value ? { pax: pax.value } : {}),
      parts: parts.value,
    });
  }
  return { ok: true, value: entries };
}

const part = (layer: SnapshotLayer): TarPart => ({ layer, zstd: layer.mediaType.endsWith(ZSTD_SUFFIX) });

function singlePart(title: string, layers: readonly SnapshotLayer[]): Decoded<TarPart[]> {
  if (layers.length !== 1)
    return {
      ok: false,
      error: `${layers.length} layers titled ${JSON.stringify(title)} but files[${title}] has no chunks list`,
    };
  return { ok: true, value: [part(layers[0] as SnapshotLayer)] };
}

/** A debug annotation as a number, or undefined when absent or not a decimal. */
function annotated(layer: SnapshotLayer, key: string): number | undefined {
  const text = layer.annotations[key];
  return text !== undefined && /^\d+$/.test(text) ? Number(text) : undefined;
}

function chunkParts(
  title: string,
  chunks: readonly string[],
  layers: readonly SnapshotLayer[],
): Decoded<TarPart[]> {
  if (chunks.length === 0) return { ok: false, error: `files[${title}].chunks is empty` };
  const listed = new Set(chunks);
  const unlisted = layers.find((l) => !listed.has(l.digest));
  if (unlisted)
    return {
      ok: false,
      error: `layer ${unlisted.digest} titled ${JSON.stringify(title)} is not in files[${title}].chunks`,
    };
  const parts: TarPart[] = [];
  for (const [i, digest] of chunks.entries()) {
    const candidates = layers.filter((l) => l.digest === digest);
    if (candidates.length === 0)
      return {
        ok: false,
        error: `files[${title}].chunks[${i}] ${digest} is not a layer titled ${JSON.stringify(title)}`,
      };
    // The same digest may be listed twice (two identical chunks): prefer the layer annotated with this index.
    const layer =
      candidates.find((l) => annotated(l, CHUNK_INDEX_ANNOTATION) === i) ?? (candidates[0] as SnapshotLayer);
    const index = annotated(layer, CHUNK_INDEX_ANNOTATION);
    if (index !== undefined && index !== i)
      return {
        ok: false,
        error: `files[${title}].chunks[${i}] is the layer annotated ${CHUNK_INDEX_ANNOTATION}=${index}: the chunk order disagrees`,
      };
    const count = annotated(layer, CHUNK_COUNT_ANNOTATION);
    if (count !== undefined && count !== chunks.length)
      return {
        ok: false,
        error: `files[${title}].chunks lists ${chunks.length} chunks but its layer ${i} is annotated ${CHUNK_COUNT_ANNOTATION}=${count}`,
      };
    parts.push(part(layer));
  }
  return { ok: true, value: parts };
}

// --- Read-ahead planning (docs/registry.md "Pull flow" step 5) ----------------------------------------------------

/** What the read-ahead scheduler knows about the blobs, in the order the tar takes them. */
export interface ReadAheadState {
  /** Index of the blob being written into the tar now. */
  readonly head: number;
  /** Blob sizes in tar order. */
  readonly sizes: readonly number[];
  /** Blobs whose download has started (the head included once it runs). */
  readonly started: ReadonlySet<number>;
  /** Downloads in flight now (all blobs). */
  readonly inFlight: number;
  /** Most parallel downloads (`SNAPSHOT_TRANSFER_CONCURRENCY`). */
  readonly concurrency: number;
  /** Bytes of the read-ahead budget not reserved by buffered blobs. */
  readonly freeBudget: number;
}

/**
 * The next blob to download ahead of the tar writer, or `undefined`. A blob is read ahead
 * only when its whole size fits in the free budget (so a buffered download never stalls on a
 * paused socket); blobs after the head are considered in order and one that does not
 * fit is skipped in favour of a later smaller one. The head itself is never planned here: it
 * streams straight into the tar.
 */
export function nextReadAhead(s: ReadAheadState): number | undefined {
  if (s.inFlight >= s.concurrency) return undefined;
  for (let i = s.head + 1; i < s.sizes.length; i++) {
    if (s.started.has(i)) continue;
    if (s.sizes[i]! <= s.freeBudget) return i;
  }
  return undefined;
}
