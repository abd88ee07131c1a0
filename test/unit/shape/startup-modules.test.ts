// What the daemon's module graph loads at startup (docs/decisions.md "Daemon memory"): every
// module loaded stays in the daemon's memory for its whole life, so the ones it never uses
// are kept out, and this test keeps them out.
// - Node's bundled undici and http2: an ES import of `node:http` builds the module's namespace
//   from every export, and its lazy WebSocket/CloseEvent/MessageEvent getters load them; the
//   daemon takes node:http through process.getBuiltinModule instead.
// - node:inspector: the debug endpoints import it on their first CPU profile.
// - prom-client's index (its default metrics require @opentelemetry/api, the Pushgateway
//   node:http/https, the cluster aggregator node:cluster): src/metrics/prom.ts requires the
//   four classes from their own files.
// - ws and tar-stream: required on the first WebSocket exec and the first registry transfer.
// - @node-rs/crc32 (a native addon, ~3.4 MB resident): required on the first peer checksum.
// - google-auth-library (and gaxios & co.): required on the first lookup with Google ADC configured.
// - pino (and thread-stream, sonic-boom, worker_threads): src/log.ts writes pino's lines itself.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** Node's internal modules and the package files `src/main.ts --version` loads (it imports
 * the daemon's whole static module graph, then exits). */
function startupModules(): { internal: string[]; files: string[] } {
  const hook = `
    import { registerHooks } from 'node:module';
    const files = [];
    registerHooks({
      resolve(specifier, context, next) {
        const r = next(specifier, context);
        files.push(r.url);
        return r;
      },
    });
    process.on('exit', () => {
      process.stderr.write(JSON.stringify({ internal: process.moduleLoadList, files }) + '\\n');
    });`;
  const res = spawnSync(
    process.execPath,
    [
      '--import',
      `data:text/javascript,${encodeURIComponent(hook)}`,
      join(root, 'src', 'main.ts'),
      '--version',
    ],
    { encoding: 'utf8', timeout: 60_000 },
  );
  assert.equal(res.status, 0, res.stderr);
  const line = res.stderr.trim().split('\n').at(-1) ?? '{}';
  return JSON.parse(line) as { internal: string[]; files: string[] };
}

test('the daemon loads neither undici, http2, the inspector, worker_threads, prom-client index, ws, tar-stream, the CRC addon, google-auth-library nor pino at startup', () => {
  const { internal, files } = startupModules();
  assert.ok(internal.length > 50 && files.length > 50, 'the hook saw the module graph');
  const unwanted = internal.filter((m) =>
    /^NativeModule (internal\/deps\/undici\/undici|http2|internal\/http2\/|inspector|worker_threads)/.test(m),
  );
  assert.deepEqual(unwanted, []);
  const packages = files.filter((f) =>
    /\/node_modules\/(@opentelemetry\/|prom-client\/index\.js|prom-client\/lib\/(pushgateway|cluster|defaultMetrics)\.js|ws\/|tar-stream\/|streamx\/|@node-rs\/|google-auth-library\/|gaxios\/|gcp-metadata\/|pino\/|thread-stream\/|sonic-boom\/)/.test(
      f,
    ),
  );
  assert.deepEqual(packages, []);
});
