// Helper verbs offered only under the name `cocoon-sim`: `knobs get|set|merge` and
// `fixture snapshot|image`. Not logged in calls.jsonl.
import fs from 'node:fs';
import path from 'node:path';
import { type CommandSpec, int, parseArgs, str, strs } from '../cli.ts';
import {
  imageDigestFor,
  isCloudImage,
  newId,
  newMac,
  nowIso,
  SNAPSHOT_NAME_RE,
  type SnapshotRecord,
  type StaticNetwork,
  updateSnapDb,
} from '../db.ts';
import { CliError } from '../errors.ts';
import { checkStaticAddress } from '../guestnet.ts';
import { registerImage } from '../images.ts';
import { io } from '../io.ts';
import type { Knobs } from '../knob-schema.ts';
import { readJson, withLock, writeAtomic } from '../lock.ts';
import { knobsFile, simDir, snapDataDir } from '../paths.ts';

const USAGE = `Usage: cocoon-sim <knobs|fixture> ...
  knobs get                          print the knob file
  knobs set <json|->                 replace the knob file (validated)
  knobs merge <json|->               deep-merge into the knob file (objects merge, arrays replace)
  fixture snapshot <name> --backend cloud-hypervisor|firecracker --os linux|windows --image <ref|url>
          [--nics N] [--static-ip ip/prefix,gw]... [--cpu N] [--memory BYTES] [--storage BYTES]
          [--network NET] [--pulled]
  fixture image <ref> [--digest sha256:<hex>]
`;

function spec(p: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number): CommandSpec {
  return { path: p, usage: p, flags, minArgs, maxArgs };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Objects merge recursively; arrays and scalars replace; `null` deletes a key. */
export function deepMerge(base: unknown, patch: unknown): unknown {
  if (!isObject(base) || !isObject(patch)) return patch;
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = deepMerge(out[k], v);
  }
  return out;
}

async function readDoc(arg: string): Promise<unknown> {
  let text = arg;
  if (arg === '-') {
    const chunks: Buffer[] = [];
    for await (const c of io().stdin) chunks.push(c as Buffer);
    text = Buffer.concat(chunks).toString('utf8');
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new CliError(`knobs: invalid JSON: ${(e as Error).message}`);
  }
}

async function knobs(root: string, argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  const file = knobsFile(root);
  fs.mkdirSync(simDir(root), { recursive: true });
  if (sub === 'get') {
    parseArgs(spec('knobs get', [], 0, 0), rest);
    io().stdout.write(`${JSON.stringify(readJson<Knobs>(file, {}), null, 2)}\n`);
    return 0;
  }
  if (sub === 'set' || sub === 'merge') {
    const p = parseArgs(spec(`knobs ${sub}`, [], 1, 1), rest);
    const doc = await readDoc(p.args[0] as string);
    const { validateKnobs } = await import('../knob-schema.ts');
    const next = withLock(path.join(simDir(root), 'config.lock'), () => {
      const merged = sub === 'set' ? doc : deepMerge(readJson<Knobs>(file, {}), doc);
      try {
        validateKnobs(merged);
      } catch (e) {
        throw new CliError(`knobs: ${(e as Error).message}`);
      }
      writeAtomic(file, JSON.stringify(merged, null, 2));
      return merged;
    });
    io().stdout.write(`${JSON.stringify(next, null, 2)}\n`);
    return 0;
  }
  throw new CliError(`unknown knobs command "${sub ?? ''}"\n${USAGE}`);
}

function parseStaticIp(text: string): StaticNetwork {
  const m = /^(\d+\.\d+\.\d+\.\d+)\/(\d+),(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (!m) throw new CliError(`invalid --static-ip "${text}": want ip/prefix,gateway`);
  return { ip: m[1] as string, prefix: Number(m[2]), gateway: m[3] as string };
}

async function fixture(root: string, argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === 'image') {
    const p = parseArgs(spec('fixture image', [{ name: 'digest', type: 'string' }], 1, 1), rest);
    const ref = p.args[0] as string;
    const rec = registerImage(root, ref, str(p, 'digest') ?? imageDigestFor(ref));
    io().stdout.write(`${JSON.stringify(rec)}\n`);
    return 0;
  }
  if (sub !== 'snapshot') throw new CliError(`unknown fixture command "${sub ?? ''}"\n${USAGE}`);
  const p = parseArgs(
    spec(
      'fixture snapshot',
      [
        { name: 'backend', type: 'string' },
        { name: 'os', type: 'string' },
        { name: 'image', type: 'string' },
        { name: 'nics', type: 'int' },
        { name: 'static-ip', type: 'strings' },
        { name: 'cpu', type: 'int' },
        { name: 'memory', type: 'int' },
        { name: 'storage', type: 'int' },
        { name: 'network', type: 'string' },
        { name: 'digest', type: 'string' },
        { name: 'pulled', type: 'bool' },
      ],
      1,
      1,
    ),
    rest,
  );
  const name = p.args[0] as string;
  if (!SNAPSHOT_NAME_RE.test(name)) throw new CliError(`invalid snapshot name "${name}"`);
  const backend = str(p, 'backend') ?? 'cloud-hypervisor';
  if (backend !== 'cloud-hypervisor' && backend !== 'firecracker') {
    throw new CliError(`--backend must be cloud-hypervisor or firecracker, not "${backend}"`);
  }
  const os = str(p, 'os') ?? 'linux';
  if (os !== 'linux' && os !== 'windows') throw new CliError(`--os must be linux or windows, not "${os}"`);
  const image = str(p, 'image');
  if (!image) throw new CliError('required flag(s) "image" not set');
  const cloud = isCloudImage(image);
  if (os === 'windows' && !cloud)
    throw new CliError('a windows snapshot needs a cloud image URL (--image https://...)');
  if (backend === 'firecracker' && (cloud || os === 'windows')) {
    throw new CliError('firecracker snapshots need a Linux OCI image');
  }
  const nics = int(p, 'nics') ?? 1;
  const statics = strs(p, 'static-ip').map(parseStaticIp);
  if (statics.length > nics) throw new CliError('more --static-ip than --nics');
  for (const s of statics) checkStaticAddress(root, s.ip);
  const digest = str(p, 'digest') ?? imageDigestFor(image);
  const id = newId();
  const cpu = int(p, 'cpu') ?? 2;
  const rec: SnapshotRecord = {
    id,
    name,
    cpu,
    memory: int(p, 'memory') ?? 2 * 1024 ** 3,
    storage: int(p, 'storage') ?? (os === 'windows' ? 40 : 20) * 1024 ** 3,
    image,
    image_digest: digest,
    image_type: cloud ? 'cloudimg' : 'oci',
    ...(str(p, 'network') ? { network: str(p, 'network') as string } : {}),
    image_blob_ids: { [digest.replace(/^sha256:/, '')]: {} },
    hypervisor: backend,
    nics,
    ...(os === 'windows' ? { windows: true } : {}),
    created_at: nowIso(),
  };
  const data = snapDataDir(root, id);
  fs.mkdirSync(data, { recursive: true });
  const networkConfigs = Array.from({ length: nics }, (_, i) => ({
    tap: `tapFIXTURE-${i}`,
    mac: newMac(),
    num_queues: backend === 'firecracker' ? 1 : cpu * 2,
    queue_size: 0,
    ...(statics[i] ? { network: statics[i] } : {}),
  }));
  fs.writeFileSync(
    path.join(data, 'config.json'),
    JSON.stringify(
      {
        id: newId(),
        hypervisor: backend,
        config: { name: `${name}-source` },
        network_configs: networkConfigs,
      },
      null,
      2,
    ),
  );
  fs.writeFileSync(path.join(data, 'state.json'), JSON.stringify({ fixture: true }));
  fs.writeFileSync(path.join(data, 'memory-range-0'), '');
  const disk = (f: string, size: number) => {
    const fd = fs.openSync(path.join(data, f), 'w');
    fs.ftruncateSync(fd, size);
    fs.closeSync(fd);
  };
  if (cloud) {
    disk('overlay.qcow2', 196_608);
    if (os !== 'windows') disk('cidata.img', 372_736);
  } else {
    disk('cow.raw', 0);
  }
  updateSnapDb(root, (db) => {
    const holder = db.names[name];
    if (holder && db.snapshots[holder]) throw new CliError(`snapshot name "${name}" already exists`);
    db.snapshots[id] = rec;
    db.names[name] = id;
  });
  if (p.flags.get('pulled') === true) registerImage(root, image, digest);
  io().stdout.write(`${JSON.stringify(rec)}\n`);
  return 0;
}

export async function runHelper(root: string, argv: string[], _env: NodeJS.ProcessEnv): Promise<number> {
  const [group, ...rest] = argv;
  if (group === 'knobs') return knobs(root, rest);
  if (group === 'fixture') return fixture(root, rest);
  io().stdout.write(USAGE);
  return 0;
}
