import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  decodeVmRecord,
  parseEventLine,
  parseImageRecord,
  parseSnapshotList,
  parseSnapshotRecord,
  parseStaleCreateResult,
  parseVmList,
  parseVmRecord,
} from '../../../src/cocoon/records.ts';

/** The VM object example of cocoon-cli.md §3.1, verbatim. */
const VM_JSON = `{
  "id": "J7QX4MZK2N5VBR3TLWD6YHPC2E",
  "hypervisor": "cloud-hypervisor",
  "state": "running",
  "config": {
    "name": "vk-team-a-agent-0", "cpu": 2, "memory": 2147483648, "storage": 21474836480,
    "image": "ghcr.io/cocoonstack/cocoon/ubuntu:24.04",
    "image_digest": "sha256:5f1c0d9e7a6b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d",
    "image_type": "oci", "network": "cocoon-dhcp"
  },
  "pid": 48213,
  "socket_path": "/var/lib/cocoon/run/cloudhypervisor/J7QX4MZK2N5VBR3TLWD6YHPC2E/api.sock",
  "vsock_socket": "/var/lib/cocoon/run/cloudhypervisor/J7QX4MZK2N5VBR3TLWD6YHPC2E/vsock.uds",
  "network_configs": [
    {"tap": "tapJ7QX4MZK-0", "mac": "02:4e:9a:11:c3:7d", "num_queues": 4, "queue_size": 0,
     "backend": "cni", "netns_path": "/var/run/netns/cocoon-J7QX4MZK2N5VBR3TLWD6YHPC2E"}
  ],
  "storage_configs": [
    {"path": "/var/lib/cocoon/oci/blobs/9c1e0d.erofs", "ro": true, "serial": "layer0", "role": "layer"},
    {"path": "/var/lib/cocoon/run/cloudhypervisor/J7QX4MZK2N5VBR3TLWD6YHPC2E/cow.raw", "ro": false, "serial": "cocoon-cow", "role": "cow"}
  ],
  "first_booted": true,
  "created_at": "2026-05-02T09:14:03.118842113Z",
  "updated_at": "2026-05-02T09:14:03.118842113Z",
  "started_at": "2026-05-02T09:14:03.118842113Z"
}`;

describe('VM records (cocoon-cli.md §3.1)', () => {
  it('decodes the spec example and ignores unknown fields', () => {
    const result = parseVmRecord(VM_JSON);
    assert.ok(result.ok);
    assert.deepEqual(result.value, {
      id: 'J7QX4MZK2N5VBR3TLWD6YHPC2E',
      hypervisor: 'cloud-hypervisor',
      state: 'running',
      pid: 48213,
      name: 'vk-team-a-agent-0',
      image: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
      imageType: 'oci',
      nics: [
        {
          mac: '02:4e:9a:11:c3:7d',
          tap: 'tapJ7QX4MZK-0',
          netnsPath: '/var/run/netns/cocoon-J7QX4MZK2N5VBR3TLWD6YHPC2E',
          static: undefined,
        },
      ],
      storage: [
        { path: '/var/lib/cocoon/oci/blobs/9c1e0d.erofs', role: 'layer' },
        { path: '/var/lib/cocoon/run/cloudhypervisor/J7QX4MZK2N5VBR3TLWD6YHPC2E/cow.raw', role: 'cow' },
      ],
      vsockSocket: '/var/lib/cocoon/run/cloudhypervisor/J7QX4MZK2N5VBR3TLWD6YHPC2E/vsock.uds',
      // config.cpu and config.memory: the VM's size, counted by admission.
      cpus: 2,
      memoryBytes: 2147483648,
      createdAt: '2026-05-02T09:14:03.118842113Z',
    });
  });

  it('decodes the static NIC variant', () => {
    const nic = JSON.parse(
      '{"tap":"tapJ7QX4MZK-0","mac":"02:4e:9a:11:c3:7d","num_queues":4,"queue_size":0,"network":{"ip":"10.88.3.17","gateway":"10.88.0.1","prefix":16}}',
    );
    const result = decodeVmRecord({ id: 'X', network_configs: [nic] });
    assert.ok(result.ok);
    assert.deepEqual(result.value.nics[0]?.static, { ip: '10.88.3.17', gateway: '10.88.0.1', prefix: 16 });
  });

  it('a null network or an empty ip is a DHCP NIC', () => {
    const result = decodeVmRecord({
      id: 'X',
      network_configs: [
        { mac: 'a', network: null },
        { mac: 'b', network: { ip: '', gateway: '', prefix: 0 } },
      ],
    });
    assert.ok(result.ok);
    assert.deepEqual(
      result.value.nics.map((n) => n.static),
      [undefined, undefined],
    );
  });

  it('decodes a creating placeholder (only id, hypervisor, state, config, pid 0)', () => {
    const result = parseVmRecord(
      '{"id":"J7QX4MZK2N5VBR3TLWD6YHPC2E","hypervisor":"firecracker","state":"creating","config":{"name":"vm1"},"pid":0,"created_at":"x"}',
    );
    assert.ok(result.ok);
    assert.equal(result.value.state, 'creating');
    assert.equal(result.value.pid, 0);
    assert.deepEqual(result.value.nics, []);
    assert.deepEqual(result.value.storage, []);
    assert.equal(result.value.name, 'vm1');
  });

  it('null fields read as zero values (Go encoding/json)', () => {
    const result = decodeVmRecord({ id: 'X', config: null, network_configs: null, pid: null, state: null });
    assert.ok(result.ok);
    assert.equal(result.value.name, '');
    assert.equal(result.value.pid, 0);
    assert.equal(result.value.state, '');
  });

  it('returns decode errors as values', () => {
    for (const bad of [
      '',
      'not json',
      '[]',
      '{"id": 5}',
      '{"id":"X","pid":"12"}',
      '{"id":"X","network_configs":{}}',
    ]) {
      const result = parseVmRecord(bad);
      assert.equal(result.ok, false, bad);
      assert.match(result.ok ? '' : result.error, /^decode vm record: /);
    }
  });
});

describe('parseVmList', () => {
  it('the three empty forms mean empty', () => {
    for (const empty of ['', '\n', '[]', ' [ ] ', 'null', 'No VMs found.', 'No VMs found.\n']) {
      assert.deepEqual(parseVmList(empty), { ok: true, value: [] }, JSON.stringify(empty));
    }
  });

  it('decodes an array of VMs', () => {
    const result = parseVmList(`[${VM_JSON}, {"id":"D2M6QK7ZP4X3NWB5RT2YHCL7VA","state":"stopped"}]`);
    assert.ok(result.ok);
    assert.deepEqual(
      result.value.map((vm) => [vm.id, vm.state]),
      [
        ['J7QX4MZK2N5VBR3TLWD6YHPC2E', 'running'],
        ['D2M6QK7ZP4X3NWB5RT2YHCL7VA', 'stopped'],
      ],
    );
  });

  it('a non-array or a bad element is an error', () => {
    assert.equal(parseVmList('{"id":"x"}').ok, false);
    assert.equal(parseVmList('[{"state":"running"}]').ok, false);
    assert.equal(parseVmList('No VMs').ok, false);
  });
});

describe('snapshot records (cocoon-cli.md §3.2)', () => {
  const SNAPSHOT = `{
    "id": "D2M6QK7ZP4X3NWB5RT2YHCL7VA",
    "name": "acme/agent:v3",
    "cpu": 2, "memory": 2147483648, "storage": 21474836480,
    "image": "https://cloud-images.ubuntu.com/releases/jammy/release/ubuntu-22.04-server-cloudimg-amd64.img",
    "image_digest": "sha256:0b7c2f9d4e1a",
    "image_type": "cloudimg",
    "network": "cocoon-dhcp",
    "image_blob_ids": {"0b7c2f9d4e1a": {}},
    "hypervisor": "cloud-hypervisor",
    "nics": 1,
    "created_at": "2026-05-01T22:40:11.90412Z"
  }`;

  it('decodes the spec example', () => {
    const result = parseSnapshotRecord(SNAPSHOT);
    assert.ok(result.ok);
    assert.deepEqual(result.value, {
      id: 'D2M6QK7ZP4X3NWB5RT2YHCL7VA',
      name: 'acme/agent:v3',
      image: 'https://cloud-images.ubuntu.com/releases/jammy/release/ubuntu-22.04-server-cloudimg-amd64.img',
      imageDigest: 'sha256:0b7c2f9d4e1a',
      imageType: 'cloudimg',
      imageBlobIds: ['0b7c2f9d4e1a'],
      hypervisor: 'cloud-hypervisor',
      cpus: 2,
      memoryBytes: 2147483648,
      createdAt: '2026-05-01T22:40:11.90412Z',
    });
  });

  it('missing optional fields are empty', () => {
    const result = parseSnapshotRecord('{"id":"S","name":"n"}');
    assert.ok(result.ok);
    // An absent (or zero) size is unknown, never 0.
    assert.equal(result.value.cpus, undefined);
    assert.equal(result.value.memoryBytes, undefined);
    assert.equal(result.value.image, '');
    assert.equal(result.value.hypervisor, '');
    assert.deepEqual(result.value.imageBlobIds, []);
  });

  it('lists: empty output, [], null and cocoon\'s "No snapshots found." line are empty', () => {
    for (const empty of ['', '[]', 'null', 'No snapshots found.\n'])
      assert.deepEqual(parseSnapshotList(empty), { ok: true, value: [] }, JSON.stringify(empty));
    assert.equal(parseSnapshotList('No VMs found.').ok, false, 'the VM line is not a snapshot list');
    const list = parseSnapshotList(`[${SNAPSHOT}]`);
    assert.ok(list.ok);
    assert.equal(list.value[0]?.name, 'acme/agent:v3');
  });
});

describe('image inspect (cocoon-cli.md §3.4)', () => {
  it('decodes', () => {
    assert.deepEqual(
      parseImageRecord(
        '{"id":"sha256:abc","name":"ghcr.io/a/b:1","type":"oci","size":123,"created_at":"2026-05-01T00:00:00Z"}',
      ),
      {
        ok: true,
        value: {
          id: 'sha256:abc',
          name: 'ghcr.io/a/b:1',
          type: 'oci',
          size: 123,
          createdAt: '2026-05-01T00:00:00Z',
        },
      },
    );
    assert.equal(parseImageRecord('{}').ok, false);
  });
});

describe('event lines (cocoon-cli.md §3.3)', () => {
  it('decodes the spec examples', () => {
    const modified = parseEventLine(
      '{"event":"MODIFIED","vm":{"id":"J7QX4MZK2N5VBR3TLWD6YHPC2E","hypervisor":"cloud-hypervisor","state":"stopped (stale)","config":{"name":"vk-team-a-agent-0","cpu":2,"memory":2147483648},"pid":48213,"network_configs":[{"tap":"tapJ7QX4MZK-0","mac":"02:4e:9a:11:c3:7d","num_queues":4,"queue_size":0}],"first_booted":true,"created_at":"2026-05-02T09:14:03Z","updated_at":"2026-05-02T09:20:41Z"}}',
    );
    assert.ok(modified.ok);
    assert.equal(modified.value.event, 'MODIFIED');
    assert.equal(modified.value.vm.state, 'stopped (stale)');
    assert.equal(modified.value.vm.nics[0]?.mac, '02:4e:9a:11:c3:7d');
    const deleted = parseEventLine(
      '{"event":"DELETED","vm":{"id":"J7QX4MZK2N5VBR3TLWD6YHPC2E","hypervisor":"cloud-hypervisor","state":"running","config":{"name":"vk-team-a-agent-0"},"pid":48213}}\n',
    );
    assert.ok(deleted.ok);
    assert.equal(deleted.value.event, 'DELETED');
    assert.equal(deleted.value.vm.name, 'vk-team-a-agent-0');
  });

  it('rejects blank, undecodable, unknown-event and over-long lines', () => {
    assert.equal(parseEventLine('').ok, false);
    assert.equal(parseEventLine('{"event":"ADDED"').ok, false);
    assert.equal(parseEventLine('{"event":"RENAMED","vm":{"id":"X"}}').ok, false);
    assert.equal(parseEventLine(`{"event":"ADDED","vm":{"id":"${'x'.repeat(1024 * 1024)}"}}`).ok, false);
  });

  it('property: never throws on arbitrary input', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.json()), (line) => {
        const result = parseEventLine(line);
        assert.equal(typeof result.ok, 'boolean');
        assert.equal(typeof parseVmList(line).ok, 'boolean');
        assert.equal(typeof parseVmRecord(line).ok, 'boolean');
      }),
    );
  });
});

describe('stale create result (cocoon-cli.md §3.4)', () => {
  it('decodes outcomes; id omitted for not-found', () => {
    assert.deepEqual(parseStaleCreateResult('{"id":"X","outcome":"collected"}'), {
      ok: true,
      value: { id: 'X', outcome: 'collected' },
    });
    assert.deepEqual(parseStaleCreateResult('{"outcome":"not-found"}'), {
      ok: true,
      value: { id: '', outcome: 'not-found' },
    });
    assert.equal(parseStaleCreateResult('{"outcome":"weird"}').ok, false);
  });
});
