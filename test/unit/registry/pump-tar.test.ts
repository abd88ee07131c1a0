import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import tar from 'tar-stream';
import { pumpTar } from '../../../src/registry/pull.ts';

describe('pumpTar (the import tar into cocoon stdin)', () => {
  it('a body piece goes back to the read buffers only after stdin took it; a failed write keeps it', async () => {
    const pieces: Buffer[] = [Buffer.alloc(1000, 1), Buffer.alloc(1000, 2), Buffer.alloc(48, 3)];
    const events: string[] = [];
    const name = (b: Buffer) => `piece ${b[0]}`;
    const pending: (() => void)[] = [];
    const sink = new Writable({
      highWaterMark: 1,
      write(chunk: Buffer, _enc, callback) {
        // The pipe takes each chunk later, not at once; the third body piece fails. Body pieces
        // arrive as the very buffers written into the entry (tar-stream hands them on).
        const body = pieces.includes(chunk);
        if (body) events.push(`write ${name(chunk)}`);
        pending.push(() => {
          if (body) events.push(`taken ${name(chunk)}`);
          callback(body && chunk[0] === 3 ? new Error('EPIPE') : undefined);
        });
      },
    });
    sink.on('error', () => {});
    const flush = setInterval(() => pending.shift()?.(), 1);
    const pack = tar.pack();
    const recycle = (p: Buffer) => {
      if (pieces.includes(p)) events.push(`recycled ${name(p)}`);
    };
    const pumping = pumpTar(pack, sink, recycle, new AbortController().signal);
    const entry = pack.entry({ name: 'f', size: 2048 });
    for (const p of pieces) entry.write(p);
    entry.end(undefined);
    pack.finalize();
    await pumping.catch(() => {});
    clearInterval(flush);
    assert.equal(events.filter((e) => e.startsWith('write')).length, 3);
    assert.deepEqual(
      events.filter((e) => !e.startsWith('write')),
      ['taken piece 1', 'recycled piece 1', 'taken piece 2', 'recycled piece 2', 'taken piece 3'],
    );
  });

  it('stdin closing while the pump waits for it to drain fails the pump', async () => {
    const sink = new Writable({ highWaterMark: 1, write() {} });
    const pack = tar.pack();
    const pumping = pumpTar(pack, sink, () => {}, new AbortController().signal);
    pack.entry({ name: 'f', size: 10 }, () => {}).end(Buffer.alloc(10));
    setImmediate(() => sink.destroy());
    await assert.rejects(pumping, /the import closed its stdin/);
    pack.destroy();
  });
});
