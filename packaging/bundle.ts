// The release runs one bundled module instead of ~200 (docs/decisions.md "Daemon memory",
// fifth pass): every ES module Node loads costs a module record, a namespace, a wrapper and
// its own compile-cache entry, and the bundle takes 1–2 MiB off the daemon's RSS at start and
// at the peak of a burst. esbuild (a devDependency: it runs at build time only) bundles the
// stripped sources of lib/src with the packages they import statically (valibot, js-yaml);
// what the daemon requires on first use through `createRequire` (ws, tar-stream, the CRC-32C
// addon, google-auth-library, prom-client's four files: src/util/lazy-packages.ts,
// src/metrics/prom.ts) stays out of the bundle and still loads from lib/node_modules, since a
// bound `require` is not followed. Not minified: names and text stay readable in a stack
// trace, and the source map beside it (`--enable-source-maps`) turns the bundle's positions
// into those of lib/src, whose every token sits at its line and column in src/*.ts.
import { createRequire } from 'node:module';
import { join } from 'node:path';

/** Where the bundle lives, relative to lib/: one directory down, as lib/src/main.js is, so
 * that src/version.ts's `new URL('../', import.meta.url)` still finds lib/release.json. */
export const BUNDLE_PATH = 'bundle/vk-cocoon.js';

interface Esbuild {
  /** Throws on an error; returns the warnings. */
  buildSync(o: Record<string, unknown>): {
    warnings: { text: string; location?: { file: string; line: number } | null }[];
    metafile?: { inputs: Record<string, unknown> };
  };
}

/** Bundles lib/src/main.js into lib/BUNDLE_PATH (with a `.map` beside it); returns the number
 * of modules it holds. Any esbuild warning fails the build: the bundle must mean what the
 * sources mean. */
export function bundleDaemon(lib: string): number {
  const esbuild = createRequire(import.meta.url)('esbuild') as Esbuild;
  const out = esbuild.buildSync({
    entryPoints: [join(lib, 'src', 'main.js')],
    outfile: join(lib, BUNDLE_PATH),
    absWorkingDir: lib,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node24',
    sourcemap: 'linked',
    sourcesContent: false,
    metafile: true,
    logLevel: 'silent',
  });
  if (out.warnings.length > 0)
    throw new Error(
      `esbuild warned: ${out.warnings.map((w) => `${w.location ? `${w.location.file}:${w.location.line}: ` : ''}${w.text}`).join('; ')}`,
    );
  return Object.keys(out.metafile?.inputs ?? {}).length;
}
