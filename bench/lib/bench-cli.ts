// The `CocoonCli` of the registry-only rows of bench/transfer.ts (run in bench/transfer-child.ts):
// every call goes to the real runner except the cocoon work the row leaves out, so that
// pullSnapshot and pushSnapshot run exactly as the daemon runs them and the row measures what
// `crane pull` / `crane push` of the same blobs do.
//   - exportFrom: `snapshot export <name> -o -` is `cat <tar>`, a tar `cocoon snapshot export`
//     wrote to a file beforehand: the push reads it through a pipe as it reads the live export,
//     then hashes and uploads it;
//   - discardImportOf: `snapshot import --name <that name>` reads its stdin (the tar the pull
//     assembles) as fast as it comes and discards it, keeping only its first entry
//     (snapshot.json); `snapshot rm` of that name answers "removed" (nothing was imported) and
//     `snapshot inspect` the record the import would have made (from snapshot.json), so no
//     cocoon process runs in the row.
import { type ChildProcess, spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { Writable } from 'node:stream';
import { finished, pipeline } from 'node:stream/promises';
import {
  type CliCallOptions,
  type CliResult,
  CocoonCli,
  CocoonCommandError,
  killGroup,
} from '../../src/cocoon/runner.ts';
import type { Logger } from '../../src/log.ts';

export interface BenchCliOptions {
  /** A tar file `snapshot export` streams instead of running cocoon. */
  readonly exportFrom?: string;
  /** The local name whose import is discarded (and whose rm / inspect are answered here). */
  readonly discardImportOf?: string;
}

/** The tar header block: the name at 0 (100 bytes), the size in octal at 124 (12 bytes). */
const BLOCK = 512;

/** snapshot.json of a tar's first entry once `head` holds it; undefined while it does not. */
export function firstEntryJson(head: Buffer): Record<string, unknown> | undefined {
  if (head.length < BLOCK) return undefined;
  const field = (at: number, len: number) => head.toString('latin1', at, at + len).replace(/\0.*$/s, '');
  const name = field(0, 100);
  if (name !== 'snapshot.json' && name !== './snapshot.json')
    throw new Error(`the import tar starts with ${JSON.stringify(name)}, not snapshot.json`);
  const size = Number.parseInt(field(124, 12).trim(), 8);
  if (!Number.isFinite(size)) throw new Error('the import tar: snapshot.json has no size');
  if (head.length < BLOCK + size) return undefined;
  return JSON.parse(head.toString('utf8', BLOCK, BLOCK + size)) as Record<string, unknown>;
}

export class BenchCli extends CocoonCli {
  readonly #o: BenchCliOptions;
  readonly #lifetime: AbortSignal;
  /** The envelope's `config` of the last discarded import. */
  #imported: Record<string, unknown> | undefined;
  /** Bytes of the tar the last discarded import read. */
  discardedBytes = 0;

  constructor(bin: string, lifetime: AbortSignal, log: Logger, o: BenchCliOptions) {
    super(bin, lifetime, log);
    this.#o = o;
    this.#lifetime = lifetime;
  }

  override spawn(
    argv: readonly string[],
    opts: { signal?: AbortSignal; stdin?: boolean } = {},
  ): ChildProcess {
    if (this.#o.exportFrom === undefined || argv[0] !== 'snapshot' || argv[1] !== 'export')
      return super.spawn(argv, opts);
    // As CocoonCli.spawn: its own process group, killed on abort or at the end of the lifetime.
    const child = spawn('cat', [this.#o.exportFrom], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    const signals = [this.#lifetime, ...(opts.signal ? [opts.signal] : [])];
    const onAbort = () => killGroup(child);
    for (const s of signals) {
      if (s.aborted) onAbort();
      else s.addEventListener('abort', onAbort, { once: true });
    }
    child.once('close', () => {
      for (const s of signals) s.removeEventListener('abort', onAbort);
    });
    return child;
  }

  override async run(argv: readonly string[], opts: CliCallOptions): Promise<CliResult> {
    const target = this.#o.discardImportOf;
    if (target === undefined || argv[0] !== 'snapshot') return super.run(argv, opts);
    const verb = argv[1];
    if (verb === 'import' && argv[argv.indexOf('--name') + 1] === target) return this.#discard(argv, opts);
    if (verb === 'rm' && argv[2] === target) return { stdout: '', stderr: '' };
    if (verb === 'inspect' && argv[2] === target) {
      if (this.#imported === undefined)
        throw new CocoonCommandError(argv, `snapshot not found: ${target}`, 'snapshot not found', 1);
      return {
        stdout: JSON.stringify({ ...this.#imported, created_at: new Date().toISOString() }),
        stderr: '',
      };
    }
    return super.run(argv, opts);
  }

  /** The import's stdin read to the end and dropped; snapshot.json kept for `inspect`. */
  async #discard(argv: readonly string[], opts: CliCallOptions): Promise<CliResult> {
    const stdin = opts.stdin;
    if (stdin === undefined || Buffer.isBuffer(stdin)) throw new Error('snapshot import without a stream');
    const signal = AbortSignal.any([
      AbortSignal.timeout(Math.max(1, Math.ceil(opts.timeoutMs))),
      this.#lifetime,
      ...(opts.signal ? [opts.signal] : []),
    ]);
    let head: Buffer[] | undefined = [];
    let headBytes = 0;
    let envelope: Record<string, unknown> | undefined;
    let seen = 0;
    const sink = new Writable({
      write(chunk: Buffer, _encoding, callback) {
        seen += chunk.length;
        if (head !== undefined) {
          head.push(chunk);
          headBytes += chunk.length;
          try {
            envelope = firstEntryJson(head.length === 1 ? chunk : Buffer.concat(head, headBytes));
          } catch (error) {
            callback(error as Error);
            return;
          }
          if (envelope !== undefined) head = undefined;
          else if (headBytes > 1 << 20) {
            callback(new Error('the import tar: no snapshot.json in its first MiB'));
            return;
          }
        }
        callback();
      },
    });
    try {
      if (typeof stdin === 'function') {
        // As the runner: the writer writes and ends the sink; an abort destroys it.
        const onAbort = () => sink.destroy(signal.reason as Error);
        signal.addEventListener('abort', onAbort, { once: true });
        try {
          await Promise.all([stdin(sink), finished(sink)]);
        } finally {
          signal.removeEventListener('abort', onAbort);
        }
      } else await pipeline(stdin as Readable, sink, { signal });
    } catch (error) {
      const message = `cocoon snapshot import (discarded): ${(error as Error).message}`;
      throw new CocoonCommandError(argv, message, message, null);
    }
    const config = (envelope as { config?: Record<string, unknown> } | undefined)?.config;
    if (config === undefined)
      throw new CocoonCommandError(argv, 'the import tar had no snapshot.json', '', 1);
    this.#imported = config;
    this.discardedBytes = seen;
    return { stdout: '', stderr: '' };
  }
}
