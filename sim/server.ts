// The simulator server of one root (docs/simulator.md, "Server mode"): a long-lived Node
// process that runs `cocoon` invocations in-process for the thin client (sim/client-go), so a
// call costs a few milliseconds of CPU instead of a Node start.
//
// Usage: node sim/server.ts <root>. Listens on the root's abstract unix socket
// (protocol.ts), prints `ready` on stdout once it serves, logs to stderr. Exits on
// SIGTERM/SIGINT, when its parent (the owner that created the root, sim/client.ts) dies or
// when the root directory disappears.
//
// Each connection is one invocation with its own Io (sim/io.ts): stdout/stderr chunks are
// framed back as they are written, stdin is requested from the client when the verb first
// reads it, SIGTERM/SIGINT from the client run the verb's handler or abort the request, and a
// client that goes away (killed) aborts it. An aborted request runs no further code past its
// next await point, which leaves the same on-disk state a killed process leaves.
import fs from 'node:fs';
import module from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { finished, Readable, Writable } from 'node:stream';
import { guestNetSync, SYNC_INTERVAL_MS } from './guestnet.ts';
import { gateOn, type Io, markServerProcess, runWithIo, type SimSignal, serverInfo, sleepOn } from './io.ts';
import { loadKnobs } from './knobs.ts';
import { startNetControl } from './netctl.ts';
import { leasesFile, resolveRoot } from './paths.ts';
import { procStat } from './proc.ts';
import { FrameReader, frame, type Hello, PROTOCOL_VERSION, socketName, T } from './protocol.ts';
import { invoke, preloadVerbs } from './run.ts';

const rootArg = process.argv[2];
if (!rootArg) {
  process.stderr.write('usage: server.ts <root>\n');
  process.exit(2);
}
const root = path.resolve(rootArg);
markServerProcess();
process.title = 'cocoon-sim-server';
const log = (msg: string) => process.stderr.write(`${new Date().toISOString()} server: ${msg}\n`);

const active = new Set<Request>();
let served = 0;
const startedAt = Date.now();
serverInfo.stats = () => ({ pid: process.pid, root, active: active.size, served, startedAt });

const EPIPE = () => Object.assign(new Error('write EPIPE'), { code: 'EPIPE', errno: -32, syscall: 'write' });

function endStream(w: Writable): Promise<void> {
  if (w.destroyed || w.writableFinished) return Promise.resolve();
  return new Promise<void>((resolve) => {
    finished(w, () => resolve());
    w.end();
  });
}

class Request implements Io {
  readonly server = true;
  readonly stdout: Writable;
  readonly stderr: Writable;
  readonly env: NodeJS.ProcessEnv;
  readonly cwd: string;
  readonly owner: { pid: number; start: number };
  readonly signal: AbortSignal;
  readonly gate: <T>(p: Promise<T>) => Promise<T>;
  readonly sleep: (ms: number) => Promise<void>;
  private readonly ac = new AbortController();
  private readonly sock: net.Socket;
  private stdinStream: Readable | undefined;
  private stdinWanted = false;
  private readonly handlers = new Map<SimSignal, (() => void)[]>();
  private defers: (() => void)[] = [];
  private ended = false;

  constructor(sock: net.Socket, hello: Hello, env: NodeJS.ProcessEnv, ownerStart: number) {
    this.sock = sock;
    this.env = env;
    this.cwd = hello.cwd;
    this.owner = { pid: hello.pid, start: ownerStart };
    this.signal = this.ac.signal;
    this.gate = gateOn(this.signal);
    this.sleep = sleepOn(this.signal);
    this.stdout = this.output(T.stdout);
    this.stderr = this.output(T.stderr);
  }

  /** A Writable whose chunks become frames; after an abort, writes stall forever. */
  private output(type: number): Writable {
    const w = new Writable({
      write: (chunk: Buffer, _enc, cb) => {
        if (this.signal.aborted) return;
        if (this.sock.write(frame(type, chunk))) cb();
        else this.sock.once('drain', () => cb());
      },
    });
    w.on('error', () => {}); // a broken client stdout is reported to listeners, not fatal
    return w;
  }

  get stdin(): Readable {
    this.stdinStream ??= new Readable({
      read: () => {
        if (this.stdinWanted || this.signal.aborted) return;
        this.stdinWanted = true;
        this.sock.write(frame(T.wantStdin));
      },
    });
    return this.stdinStream;
  }

  onSignal(sig: SimSignal, fn: () => void): void {
    const list = this.handlers.get(sig) ?? [];
    list.push(fn);
    this.handlers.set(sig, list);
  }

  defer(fn: () => void): void {
    this.defers.push(fn);
  }

  private runDefers(): void {
    const list = this.defers;
    this.defers = [];
    for (const fn of list) {
      try {
        fn();
      } catch (e) {
        log(`defer failed: ${(e as Error).stack ?? e}`);
      }
    }
  }

  exit(code: number): void {
    if (this.ended || this.signal.aborted) return;
    this.ended = true;
    this.runDefers();
    void Promise.all([endStream(this.stdout), endStream(this.stderr)]).then(() => {
      if (this.signal.aborted) return;
      const status = Buffer.alloc(4);
      status.writeInt32BE(code);
      this.sock.end(frame(T.exit, status));
    });
  }

  /** The caller is gone (or died by a signal): nothing of this request runs any more. */
  abort(): void {
    if (this.signal.aborted) return;
    this.ac.abort();
    this.handlers.clear();
    if (!this.ended) this.runDefers();
  }

  onFrame(type: number, payload: Buffer): void {
    switch (type) {
      case T.stdin:
        this.stdinStream?.push(Buffer.from(payload));
        return;
      case T.stdinEof:
        this.stdinStream?.push(null);
        return;
      case T.stdoutBroken:
        if (!this.stdout.destroyed) this.stdout.destroy(EPIPE());
        return;
      case T.signal: {
        if (this.ended || this.signal.aborted) return;
        const sig: SimSignal = payload.toString() === 'SIGINT' ? 'SIGINT' : 'SIGTERM';
        const hs = this.handlers.get(sig);
        if (hs && hs.length > 0) {
          runWithIo(this, () => {
            for (const h of hs) h();
          });
          return;
        }
        // No handler: die like a process would, without logging the call.
        this.abort();
        this.sock.end(frame(T.kill, sig));
        return;
      }
      default:
        this.sock.destroy();
    }
  }
}

function parseEnv(words: string[]): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const w of words) {
    const eq = w.indexOf('=');
    if (eq > 0) env[w.slice(0, eq)] = w.slice(eq + 1);
  }
  return env;
}

/** Starts the invocation of a hello, or declines it (fallback) when it is not for this server. */
function begin(sock: net.Socket, hello: Hello): Request | undefined {
  const env = parseEnv(hello.env ?? []);
  const relative = ['COCOON_SIM_ROOT', 'COCOON_ROOT_DIR', 'COCOON_SIM_LEASES'].some(
    (k) => env[k] && !path.isAbsolute(env[k] as string),
  );
  if (
    hello.v !== PROTOCOL_VERSION ||
    !Array.isArray(hello.argv) ||
    relative ||
    resolveRoot(env) !== root ||
    !path.isAbsolute(hello.cwd ?? '')
  ) {
    sock.end(frame(T.fallback));
    return undefined;
  }
  const owner = procStat(hello.pid);
  if (!owner || owner.state === 'Z') {
    sock.destroy(); // the caller is already gone
    return undefined;
  }
  const req = new Request(sock, hello, env, owner.start);
  active.add(req);
  served += 1;
  runWithIo(req, () => invoke(req, hello.argv)).then(
    (code) => req.exit(code),
    (e: unknown) => {
      req.stderr.write(`Error: internal simulator error: ${(e as Error)?.stack ?? String(e)}\n`);
      req.exit(1);
    },
  );
  return req;
}

function onConnection(sock: net.Socket): void {
  const reader = new FrameReader();
  let req: Request | undefined;
  let declined = false;
  sock.on('data', (chunk: Buffer) => {
    reader.push(chunk, (type, payload) => {
      if (declined) return;
      if (req) return req.onFrame(type, payload);
      if (type !== T.hello) {
        declined = true;
        sock.destroy();
        return;
      }
      let hello: Hello;
      try {
        hello = JSON.parse(payload.toString('utf8')) as Hello;
      } catch {
        declined = true;
        sock.destroy();
        return;
      }
      req = begin(sock, hello);
      if (!req) declined = true;
    });
  });
  sock.on('error', () => {}); // 'close' follows
  sock.on('close', () => {
    if (!req) return;
    req.abort();
    active.delete(req);
  });
}

process.on('uncaughtException', (e) => log(`uncaught exception: ${e.stack ?? e}`));
process.on('unhandledRejection', (e) => log(`unhandled rejection: ${(e as Error)?.stack ?? e}`));
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(sig, () => process.exit(0));

const server = net.createServer(onConnection);
server.on('error', (e: NodeJS.ErrnoException) => {
  log(`listen: ${e.code === 'EADDRINUSE' ? `another server serves ${root}` : e.message}`);
  process.exit(3);
});
server.listen(socketName(root), () => {
  void (async () => {
    // Warm every verb module and persist the compile cache, so that no request pays for it.
    await preloadVerbs().catch((e: unknown) => log(`preload: ${(e as Error).message}`));
    // cocoon-net's control socket (sim/netctl.ts): the daemon releases leases through it.
    await startNetControl(root, leasesFile(root, process.env), log);
    module.flushCompileCache?.();
    process.stdout.write('ready\n');
    log(`serving ${root} (pid ${process.pid})`);
  })();
});

// Never outlive the owner (the parent that created the root) or the root itself.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) {
    log('parent gone: exiting');
    process.exit(0);
  }
}, 250);
// The guests' ICMP answers (guestnet.ts): stand-ins killed from outside, VMs stopped and
// leases expired stop answering within one interval.
setInterval(() => {
  loadKnobs(root)
    .then((knobs) => guestNetSync(root, leasesFile(root, process.env), knobs))
    .catch((e: unknown) => log(`guest network sync: ${(e as Error).message}`));
}, SYNC_INTERVAL_MS).unref();
setInterval(() => {
  if (!fs.existsSync(root)) {
    log('root gone: exiting');
    process.exit(0);
  }
}, 1000);
