/**
 * Decoders for cocoon's JSON output (docs/contracts/cocoon-cli.md "JSON shapes"). Only the fields the provider reads are
 * kept; unknown fields are ignored. Like Go's `encoding/json`, a missing or `null` field reads
 * as its zero value; a field of the wrong type is a decode error. Decode errors are returned
 * as values, never thrown.
 */
import * as v from 'valibot';

/** A decode outcome. */
export type Decoded<T> =
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly error: string };

const str = v.nullish(v.string(), '');
const num = v.nullish(v.number(), 0);
/** A size cocoon may or may not print (older builds do not): absent stays `undefined`. */
const size = v.nullish(v.number());

// --- VM object (docs/contracts/cocoon-cli.md "VM list") --------------------------------------------------------

const StaticNetworkSchema = v.object({
  ip: str,
  gateway: str,
  prefix: num,
});

const NicSchema = v.object({
  mac: str,
  tap: str,
  netns_path: str,
  network: v.nullish(StaticNetworkSchema),
});

const VmSchema = v.object({
  id: v.string(),
  hypervisor: str,
  state: str,
  pid: num,
  config: v.nullish(v.object({ name: str, image: str, image_type: str, cpu: size, memory: size }), {
    name: '',
    image: '',
    image_type: '',
  }),
  network_configs: v.nullish(v.array(NicSchema), []),
  storage_configs: v.nullish(v.array(v.object({ path: str, role: str })), []),
  vsock_socket: str,
  created_at: str,
});

/** Static addressing of a NIC (present only when `network.ip` is non-empty). */
export interface StaticNetwork {
  readonly ip: string;
  readonly gateway: string;
  readonly prefix: number;
}

export interface VmNic {
  /** As reported by cocoon (lower-case colon form in practice). */
  readonly mac: string;
  readonly tap: string;
  readonly netnsPath: string;
  /** Set for a static NIC (`network.ip` non-empty), `undefined` for DHCP (docs/contracts/post-clone.md "When a fixup is owed"). */
  readonly static: StaticNetwork | undefined;
}

export interface VmStorage {
  readonly path: string;
  readonly role: string;
}

/** A VM record (`vm inspect`, `vm list` element, clone/run output, event `vm`). */
export interface VmRecord {
  readonly id: string;
  /** `cloud-hypervisor` | `firecracker` (kept as text; unknown values are the caller's call). */
  readonly hypervisor: string;
  /** `creating` | `created` | `running` | `stopped` | `error` | `stopped (stale)` (docs/contracts/cocoon-cli.md "VM states"). */
  readonly state: string;
  readonly pid: number;
  readonly name: string;
  readonly image: string;
  readonly imageType: string;
  /** NIC 0 carries the VM's MAC and IP. */
  readonly nics: readonly VmNic[];
  readonly storage: readonly VmStorage[];
  readonly vsockSocket: string;
  /** `config.cpu` (vCPUs) and `config.memory` (bytes) when cocoon prints them: the VM's
   * real size, counted by admission (src/lifecycle/admission.ts). */
  readonly cpus?: number;
  readonly memoryBytes?: number;
  /** RFC 3339 creation time (`''` when cocoon did not print one): the provenance ledger
   * attributes a VM to a create intent only when it was made after the intent. */
  readonly createdAt: string;
}

/** Only a positive finite size is a size. */
const sized = (n: number | null | undefined) =>
  n !== null && n !== undefined && n > 0 && Number.isFinite(n) ? n : undefined;

function toVmRecord(raw: v.InferOutput<typeof VmSchema>): VmRecord {
  return {
    id: raw.id,
    hypervisor: raw.hypervisor,
    state: raw.state,
    pid: raw.pid,
    name: raw.config.name,
    image: raw.config.image,
    imageType: raw.config.image_type,
    nics: raw.network_configs.map((nic) => ({
      mac: nic.mac,
      tap: nic.tap,
      netnsPath: nic.netns_path,
      static:
        nic.network != null && nic.network.ip !== ''
          ? { ip: nic.network.ip, gateway: nic.network.gateway, prefix: nic.network.prefix }
          : undefined,
    })),
    storage: raw.storage_configs.map((s) => ({ path: s.path, role: s.role })),
    vsockSocket: raw.vsock_socket,
    ...sizeFields(raw.config.cpu, raw.config.memory),
    createdAt: raw.created_at,
  };
}

function sizeFields(cpu: number | null | undefined, memory: number | null | undefined) {
  const c = sized(cpu);
  const mem = sized(memory);
  return { ...(c !== undefined ? { cpus: c } : {}), ...(mem !== undefined ? { memoryBytes: mem } : {}) };
}

function describeIssues(issues: readonly v.BaseIssue<unknown>[]): string {
  return issues
    .slice(0, 5)
    .map((issue) => {
      const path = v.getDotPath(issue);
      return path === null ? issue.message : `${path}: ${issue.message}`;
    })
    .join('; ');
}

function decodeWith<S extends v.GenericSchema, T>(
  what: string,
  schema: S,
  input: unknown,
  convert: (raw: v.InferOutput<S>) => T,
): Decoded<T> {
  const result = v.safeParse(schema, input);
  if (!result.success) return { ok: false, error: `decode ${what}: ${describeIssues(result.issues)}` };
  return { ok: true, value: convert(result.output) };
}

function parseJson(what: string, text: string): Decoded<unknown> {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (error) {
    return { ok: false, error: `decode ${what}: invalid JSON: ${(error as Error).message}` };
  }
}

/** Decodes an already-parsed VM object. */
export function decodeVmRecord(input: unknown): Decoded<VmRecord> {
  return decodeWith('vm record', VmSchema, input, toVmRecord);
}

/** Parses the stdout of `vm inspect`, `vm clone --output json`, `vm run --output json`. */
export function parseVmRecord(stdout: string): Decoded<VmRecord> {
  const json = parseJson('vm record', stdout);
  return json.ok ? decodeVmRecord(json.value) : json;
}

/** The plain line cocoon prints for an empty `vm list`. */
export const NO_VMS_FOUND = 'No VMs found.';

/**
 * Parses the stdout of `vm list -o json`: a JSON array of VM objects. Empty output, `[]`,
 * `null` and the plain line `No VMs found.` all mean an empty list (docs/contracts/cocoon-cli.md "VM list").
 */
export function parseVmList(stdout: string): Decoded<readonly VmRecord[]> {
  const trimmed = stdout.trim();
  if (trimmed === '' || trimmed === NO_VMS_FOUND) return { ok: true, value: [] };
  const json = parseJson('vm list', trimmed);
  if (!json.ok) return json;
  return decodeWith('vm list', v.nullish(v.array(VmSchema), []), json.value, (list) => list.map(toVmRecord));
}

// --- Snapshot object (docs/contracts/cocoon-cli.md "Snapshot record") ---------------------------------------------------

const SnapshotSchema = v.object({
  id: v.string(),
  name: str,
  image: str,
  image_digest: str,
  image_type: str,
  image_blob_ids: v.nullish(v.record(v.string(), v.unknown()), {}),
  hypervisor: str,
  cpu: size,
  memory: size,
  created_at: str,
});

export interface SnapshotRecord {
  readonly id: string;
  readonly name: string;
  /** OCI ref, cloud-image URL, or `''`. */
  readonly image: string;
  readonly imageDigest: string;
  readonly imageType: string;
  /** Keys of `image_blob_ids`, sorted. */
  readonly imageBlobIds: readonly string[];
  /** `''` when unknown. */
  readonly hypervisor: string;
  /** vCPUs and memory bytes of the saved VM, when cocoon prints them (its clones' size). */
  readonly cpus?: number;
  readonly memoryBytes?: number;
  /** RFC 3339 creation time, `''` when not printed. */
  readonly createdAt: string;
}

function toSnapshotRecord(raw: v.InferOutput<typeof SnapshotSchema>): SnapshotRecord {
  return {
    id: raw.id,
    name: raw.name,
    image: raw.image,
    imageDigest: raw.image_digest,
    imageType: raw.image_type,
    imageBlobIds: Object.keys(raw.image_blob_ids).sort(),
    hypervisor: raw.hypervisor,
    ...sizeFields(raw.cpu, raw.memory),
    createdAt: raw.created_at,
  };
}

/** Decodes an already-parsed snapshot object. */
export function decodeSnapshotRecord(input: unknown): Decoded<SnapshotRecord> {
  return decodeWith('snapshot record', SnapshotSchema, input, toSnapshotRecord);
}

/** Parses the stdout of `snapshot inspect`. */
export function parseSnapshotRecord(stdout: string): Decoded<SnapshotRecord> {
  const json = parseJson('snapshot record', stdout);
  return json.ok ? decodeSnapshotRecord(json.value) : json;
}

/** The plain line cocoon prints for an empty `snapshot list`. */
export const NO_SNAPSHOTS_FOUND = 'No snapshots found.';

/**
 * Parses the stdout of `snapshot list -o json`: empty output, `[]`, `null` and the plain line
 * `No snapshots found.` all mean an empty list (docs/contracts/cocoon-cli.md "Snapshot list").
 */
export function parseSnapshotList(stdout: string): Decoded<readonly SnapshotRecord[]> {
  const trimmed = stdout.trim();
  if (trimmed === '' || trimmed === NO_SNAPSHOTS_FOUND) return { ok: true, value: [] };
  const json = parseJson('snapshot list', trimmed);
  if (!json.ok) return json;
  return decodeWith('snapshot list', v.nullish(v.array(SnapshotSchema), []), json.value, (list) =>
    list.map(toSnapshotRecord),
  );
}

// --- Image inspect (docs/contracts/cocoon-cli.md "Image record") -----------------------------------------------------

const ImageSchema = v.object({
  id: v.string(),
  name: str,
  type: str,
  size: num,
  created_at: str,
});

export interface ImageRecord {
  readonly id: string;
  readonly name: string;
  readonly type: string;
  readonly size: number;
  readonly createdAt: string;
}

/** Parses the stdout of `image inspect`. */
export function parseImageRecord(stdout: string): Decoded<ImageRecord> {
  const json = parseJson('image record', stdout);
  if (!json.ok) return json;
  return decodeWith('image record', ImageSchema, json.value, (raw) => ({
    id: raw.id,
    name: raw.name,
    type: raw.type,
    size: raw.size,
    createdAt: raw.created_at,
  }));
}

// --- Event line (docs/contracts/cocoon-cli.md "Event line") --------------------------------------------------------

/** Longest event line the watcher accepts (docs/contracts/cocoon-cli.md "Event line"). */
export const MAX_EVENT_LINE_BYTES = 1024 * 1024;

export type VmEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface VmEvent {
  readonly event: VmEventType;
  readonly vm: VmRecord;
}

const EventSchema = v.object({
  event: v.picklist(['ADDED', 'MODIFIED', 'DELETED']),
  vm: VmSchema,
});

/**
 * Parses one line of `vm status --event --format json`. Blank lines, over-long lines,
 * undecodable lines and unknown event types are errors (the watcher skips them).
 */
export function parseEventLine(line: string): Decoded<VmEvent> {
  if (Buffer.byteLength(line, 'utf8') > MAX_EVENT_LINE_BYTES) {
    return { ok: false, error: `decode vm event: line longer than ${MAX_EVENT_LINE_BYTES} bytes` };
  }
  const trimmed = line.trim();
  if (trimmed === '') return { ok: false, error: 'decode vm event: empty line' };
  const json = parseJson('vm event', trimmed);
  if (!json.ok) return json;
  return decodeWith('vm event', EventSchema, json.value, (raw) => ({
    event: raw.event,
    vm: toVmRecord(raw.vm),
  }));
}

// --- Stale create (docs/contracts/cocoon-cli.md "Image record", later tier) ------------------------------------------

export type StaleCreateOutcome = 'collected' | 'busy' | 'not-creating' | 'not-found';

/** Parses the stdout of `vm reconcile-stale-create <id> -o json`. */
export function parseStaleCreateResult(
  stdout: string,
): Decoded<{ readonly id: string; readonly outcome: StaleCreateOutcome }> {
  const json = parseJson('stale create result', stdout);
  if (!json.ok) return json;
  return decodeWith(
    'stale create result',
    v.object({ id: str, outcome: v.picklist(['collected', 'busy', 'not-creating', 'not-found']) }),
    json.value,
    (raw) => ({ id: raw.id, outcome: raw.outcome }),
  );
}
