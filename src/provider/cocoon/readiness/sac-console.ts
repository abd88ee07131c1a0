// The serial console transport of the `sac` job (sac.ts): a unix-socket connection to the VM's
// console.sock with buffered output and bounded waits for the next `SAC>` prompt.
import net from 'node:net';
import { outputBeforePrompt, SAC_DIAL_RETRY_MS, SAC_EOL, SAC_PROMPT } from '../../../guest/sac.ts';
import { monoNow } from '../../../util/mono-clock.ts';

/** Console output kept while waiting for a prompt (a chatty console cannot grow it further). */
const MAX_BUFFER = 64 * 1024;
/** After the first prompt, output must stop for this long before the first command. */
const SETTLE_MS = 200;

/** A connected serial console: buffered output and bounded waits for the next `SAC>`. */
export class SacConsole {
  private buf = '';
  private wake: (() => void) | undefined;
  private lastData = monoNow();
  closed: string | undefined;
  private readonly sock: net.Socket;

  constructor(sock: net.Socket) {
    this.sock = sock;
    sock.setEncoding('latin1');
    sock.on('data', (d: string) => {
      this.buf = (this.buf + d).slice(-MAX_BUFFER);
      this.lastData = monoNow();
      this.wake?.();
    });
    sock.on('error', (e) => {
      this.closed ??= `console: ${e.message}`;
      this.wake?.();
    });
    sock.on('close', () => {
      this.closed ??= 'console closed';
      this.wake?.();
    });
  }

  /** Resolves at the next data, close, abort or after `ms`. */
  private next(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        signal.removeEventListener('abort', done);
        this.wake = undefined;
        resolve();
      };
      const t = setTimeout(done, Math.max(0, ms));
      signal.addEventListener('abort', done, { once: true });
      this.wake = done;
    });
  }

  /** The output before the next prompt (consumed with it), or `undefined` at the timeout. */
  async untilPrompt(timeoutMs: number, signal: AbortSignal): Promise<string | undefined> {
    const end = monoNow() + timeoutMs;
    for (;;) {
      const out = outputBeforePrompt(this.buf);
      if (out !== undefined) {
        this.buf = this.buf.slice(out.length + SAC_PROMPT.length);
        return out;
      }
      if (this.closed !== undefined) throw new Error(this.closed);
      if (signal.aborted) throw new Error('aborted');
      if (monoNow() >= end) return undefined;
      await this.next(end - monoNow(), signal);
    }
  }

  /** Sends CR LF until a prompt shows (each wait ≤ 2 s), then lets the output settle. */
  async hunt(deadline: number, signal: AbortSignal): Promise<boolean> {
    while (monoNow() < deadline && this.closed === undefined && !signal.aborted) {
      this.sock.write(SAC_EOL);
      const out = await this.untilPrompt(Math.min(SAC_DIAL_RETRY_MS, deadline - monoNow()), signal).catch(
        () => undefined,
      );
      if (out === undefined) continue;
      // Earlier CR LFs may still be answered: wait for quiet, then start from a clean buffer.
      while (monoNow() - this.lastData < SETTLE_MS && !signal.aborted && this.closed === undefined) {
        await this.next(SETTLE_MS - (monoNow() - this.lastData), signal);
      }
      this.buf = '';
      return this.closed === undefined;
    }
    return false;
  }

  /** Sends one command; its output runs until the next prompt (≤ `timeoutMs`). */
  async command(line: string, timeoutMs: number, signal: AbortSignal): Promise<string> {
    if (this.closed !== undefined) throw new Error(this.closed);
    this.buf = '';
    this.sock.write(`${line}${SAC_EOL}`);
    const out = await this.untilPrompt(timeoutMs, signal);
    if (out === undefined) throw new Error(`no ${SAC_PROMPT} within ${timeoutMs} ms after "${line}"`);
    return out;
  }

  close(): void {
    this.sock.destroy();
  }
}

export function connectConsole(path: string, timeoutMs: number, signal: AbortSignal): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(path);
    const fail = (err: Error) => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      sock.destroy();
      reject(err);
    };
    const onAbort = () => fail(new Error('aborted'));
    const timer = setTimeout(() => fail(new Error(`connect timed out after ${timeoutMs} ms`)), timeoutMs);
    signal.addEventListener('abort', onAbort, { once: true });
    sock.once('error', fail);
    sock.once('connect', () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      sock.off('error', fail);
      resolve(sock);
    });
  });
}
