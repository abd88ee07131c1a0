// The wire protocol between the thin `cocoon` client (sim/client-go/main.go) and the simulator
// server (sim/server.ts), over an abstract unix socket named after the root. Every message is
// a frame: 1 byte type, 4 bytes big-endian payload length, payload. Keep in sync with main.go.
//
// client → server                       server → client
//   H hello: JSON {v, argv, env, cwd, pid}  O stdout bytes
//   I stdin bytes                          E stderr bytes
//   Z stdin EOF                            W send stdin (the verb reads it)
//   S signal name (SIGTERM, SIGINT)        X exit status (4 bytes, big-endian)
//   P the client's stdout is broken (EPIPE) K die by this signal (name)
//                                          F not mine: run the Node fallback instead
import crypto from 'node:crypto';

export const PROTOCOL_VERSION = 1;

export const T = {
  hello: 0x48, // H
  stdin: 0x49, // I
  stdinEof: 0x5a, // Z
  signal: 0x53, // S
  stdoutBroken: 0x50, // P
  stdout: 0x4f, // O
  stderr: 0x45, // E
  wantStdin: 0x57, // W
  exit: 0x58, // X
  kill: 0x4b, // K
  fallback: 0x46, // F
} as const;

export interface Hello {
  v: number;
  argv: string[];
  /** KEY=VALUE words (the client's environ). */
  env: string[];
  cwd: string;
  pid: number;
}

/** The abstract socket of a root's server ('\0' prefix; `@` in Go's notation). */
export function socketName(root: string): string {
  return `\0cocoon-sim-${crypto.createHash('sha256').update(root).digest('hex').slice(0, 32)}`;
}

export function frame(type: number, payload: Uint8Array | string = ''): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const out = Buffer.allocUnsafe(5 + body.length);
  out[0] = type;
  out.writeUInt32BE(body.length, 1);
  out.set(body, 5);
  return out;
}

/** Splits a byte stream into frames. */
export class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  push(chunk: Buffer, onFrame: (type: number, payload: Buffer) => void): void {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (this.buf.length >= 5) {
      const len = this.buf.readUInt32BE(1);
      if (this.buf.length < 5 + len) break;
      const type = this.buf[0] as number;
      const payload = this.buf.subarray(5, 5 + len);
      this.buf = this.buf.subarray(5 + len);
      onFrame(type, payload);
    }
  }
}
