import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { after, describe, it } from 'node:test';
import { writeFileRange } from '../../../src/registry/file-body.ts';

describe('writeFileRange (a file range as a request body, file-body.ts)', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-file-body-'));
  after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const data = randomBytes(5 * 1024 * 1024 + 333);
  const file = path.join(dir, 'blob');
  fs.writeFileSync(file, data);

  /** A request stand-in: copies what it is given only when it "sends" it, later, as a socket does. */
  function slowSink(opts: { failAt?: number } = {}) {
    const got: Buffer[] = [];
    let writes = 0;
    const sink = new Writable({
      highWaterMark: 1,
      write(chunk: Buffer, _enc, callback) {
        const n = writes++;
        setImmediate(() => {
          if (n === opts.failAt) {
            callback(new Error('EPIPE'));
            return;
          }
          got.push(Buffer.from(chunk));
          callback();
        });
      },
    });
    sink.on('error', () => {});
    return { sink, got };
  }

  it('sends exactly the range, in order, each buffer reused only after its write completed', async () => {
    const { sink, got } = slowSink();
    const start = 1_000_001;
    const length = 3 * 1024 * 1024 + 17;
    const finished = new Promise((resolve) => sink.on('finish', resolve));
    await writeFileRange(sink, file, start, length);
    await finished;
    assert.ok(Buffer.concat(got).equals(data.subarray(start, start + length)));
  });

  it('an empty range ends the request with no body', async () => {
    const { sink, got } = slowSink();
    await writeFileRange(sink, file, 0, 0);
    assert.equal(sink.writableEnded, true);
    assert.equal(got.length, 0);
  });

  it('a file shorter than the range, a failed write and a closed request fail it', async () => {
    await assert.rejects(
      writeFileRange(slowSink().sink, file, data.length - 10, 20),
      new RegExp(`ended at byte ${data.length}, before ${data.length + 10}`),
    );
    await assert.rejects(writeFileRange(slowSink({ failAt: 1 }).sink, file, 0, data.length), /EPIPE/);
    const { sink } = slowSink();
    setImmediate(() => sink.destroy());
    await assert.rejects(writeFileRange(sink, file, 0, data.length), /closed before its body was sent/);
    await assert.rejects(writeFileRange(slowSink().sink, path.join(dir, 'missing'), 0, 1), /ENOENT/);
  });
});
