// Sparse snapshot files of the transfer benches (bench/transfer.ts, bench/peer-wake.ts): a disk
// with random data in 16 MiB extents spread evenly, its apparent and allocated sizes, and a
// byte-for-byte comparison of a staged copy with its source.
import { spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

/** The data extent of a bench disk. */
export const EXTENT = 16 * 2 ** 20;

/** Bytes of a compressible page: random in its first half, zeros in its second. */
const PAGE = 4096;

/**
 * A `size`-byte sparse file with `data` bytes of random data in EXTENT pieces spread evenly.
 * With `compressible` (0–1, default 0) that fraction of the extents, spread evenly too, holds
 * pages that are half random and half zeros instead (zstd stores them at about half their size).
 */
export function writeSparseDisk(file: string, size: number, data: number, compressible = 0): void {
  const extents = Math.max(1, Math.round(data / EXTENT));
  const stride = Math.floor(size / extents / EXTENT) * EXTENT;
  if (stride < EXTENT) throw new Error(`cannot spread ${data} bytes of data in ${size} bytes`);
  const fd = fs.openSync(file, 'w');
  try {
    fs.ftruncateSync(fd, size);
    const buf = Buffer.allocUnsafe(EXTENT);
    for (let i = 0; i < extents; i++) {
      randomFillSync(buf);
      if (Math.floor((i + 1) * compressible) > Math.floor(i * compressible)) {
        for (let at = PAGE / 2; at < EXTENT; at += PAGE) buf.fill(0, at, at + PAGE / 2);
      }
      fs.writeSync(fd, buf, 0, EXTENT, i * stride);
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** Apparent and allocated bytes of a directory's regular files. */
export function usage(dir: string): { apparent: number; allocated: number } {
  let apparent = 0;
  let allocated = 0;
  for (const name of fs.readdirSync(dir)) {
    const st = fs.statSync(path.join(dir, name));
    if (!st.isFile()) continue;
    apparent += st.size;
    allocated += st.blocks * 512;
  }
  return { apparent, allocated };
}

/** Compares the staged files with the source's (every staged file but snapshot.json): a problem, or undefined. */
export async function compareStaged(staged: string, source: string): Promise<string | undefined> {
  for (const name of fs.readdirSync(staged)) {
    if (name === 'snapshot.json') continue;
    const same = await new Promise<boolean>((resolve) => {
      const c = spawn('cmp', ['-s', path.join(staged, name), path.join(source, name)], { stdio: 'ignore' });
      c.on('error', () => resolve(false));
      c.on('close', (code) => resolve(code === 0));
    });
    if (!same) return `${name} differs from host A's`;
  }
  const missing = fs.readdirSync(source).filter((n) => !fs.existsSync(path.join(staged, n)));
  return missing.length > 0 ? `not staged: ${missing.join(', ')}` : undefined;
}
