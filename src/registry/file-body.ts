/**
 * A file range sent as a request body through a few reused 1 MiB buffers (docs/registry.md
 * "Push flow"): a buffer is read into again only once the request's write of it has completed
 * (its callback), so nothing is copied and no read lands in memory the process never touched.
 * `fs.createReadStream` reads every MiB into a new buffer, and new memory is what a transfer
 * costs here (slab-pool.ts, `npm run bench:blob-read`); the request is the only consumer, so
 * the ownership that a stream cannot express is plain here.
 */
import { close, open, read } from 'node:fs';
import type { Writable } from 'node:stream';

// The callback API, as fs.createReadStream uses it (not FileHandle), wrapped by hand: node:util's
// promisify would load worker_threads at the daemon's start (test/unit/shape/startup-modules).
const openFile = (path: string) =>
  new Promise<number>((resolve, reject) => open(path, 'r', (e, fd) => (e ? reject(e) : resolve(fd))));
const readFile = (fd: number, buf: Buffer, length: number, position: number) =>
  new Promise<number>((resolve, reject) =>
    read(fd, buf, 0, length, position, (e, n) => (e ? reject(e) : resolve(n))),
  );
const closeFile = (fd: number) =>
  new Promise<void>((resolve, reject) => close(fd, (e) => (e ? reject(e) : resolve())));

/** Buffers in flight: one being read while the others are written. */
const BUFFERS = 3;
const BUFFER_BYTES = 1024 * 1024;

/** Writes `length` bytes of `file` from `start` into `req`, then ends it. Rejects on a read error,
 * a file shorter than that, or a request that fails or closes first. */
export async function writeFileRange(
  req: Writable,
  file: string,
  start: number,
  length: number,
): Promise<void> {
  const fd = await openFile(file);
  try {
    const free: Buffer[] = Array.from({ length: Math.min(BUFFERS, Math.ceil(length / BUFFER_BYTES)) }, () =>
      Buffer.allocUnsafe(BUFFER_BYTES),
    );
    let failure: Error | undefined;
    let wake: (() => void) | undefined;
    const notify = () => {
      const w = wake;
      wake = undefined;
      w?.();
    };
    const onClose = () => {
      failure ??= new Error('the request closed before its body was sent');
      notify();
    };
    req.once('close', onClose);
    try {
      for (let pos = start, left = length; left > 0; ) {
        while (free.length === 0 && failure === undefined)
          await new Promise<void>((resolve) => (wake = resolve));
        if (failure !== undefined) throw failure;
        const buf = free.pop() as Buffer;
        const bytesRead = await readFile(fd, buf, Math.min(BUFFER_BYTES, left), pos);
        if (bytesRead === 0) throw new Error(`${file} ended at byte ${pos}, before ${start + length}`);
        if (req.destroyed) failure ??= new Error('the request closed before its body was sent');
        if (failure !== undefined) throw failure;
        pos += bytesRead;
        left -= bytesRead;
        req.write(buf.subarray(0, bytesRead), (error) => {
          if (error) failure ??= error;
          else free.push(buf);
          notify();
        });
      }
      req.end();
    } finally {
      req.off('close', onClose);
    }
  } finally {
    await closeFile(fd);
  }
}
