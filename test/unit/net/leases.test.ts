import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import {
  findLease,
  type LeaseSnapshot,
  normalizeMac,
  parseLeaseFile,
  parseRfc3339,
  resolveIp,
} from '../../../src/net/lease-parse.ts';
import { LeaseFile } from '../../../src/net/leases.ts';

/** The lease file example of cocoon-cli.md §7.1, verbatim. */
const EXAMPLE = `[
  {"mac": "82:f7:df:93:90:f3", "ip": "172.20.100.37", "expiry": "2026-08-12T09:30:00Z"},
  {"mac": "1e:fb:e5:ab:5d:0a", "ip": "172.20.100.12", "expiry": "2026-08-12T08:02:11+08:00"}
]`;

const BEFORE = Date.parse('2026-08-12T00:00:00Z');

describe('parseRfc3339', () => {
  it('parses UTC and numeric offsets', () => {
    assert.equal(parseRfc3339('2026-08-12T09:30:00Z'), Date.parse('2026-08-12T09:30:00Z'));
    assert.equal(parseRfc3339('2026-08-12T08:02:11+08:00'), Date.parse('2026-08-12T00:02:11Z'));
    assert.equal(parseRfc3339('2026-08-12T08:02:11-02:30'), Date.parse('2026-08-12T10:32:11Z'));
    assert.equal(parseRfc3339('2026-08-12t09:30:00z'), Date.parse('2026-08-12T09:30:00Z'));
    assert.equal(parseRfc3339('2026-08-12T09:30:00.9876Z'), Date.parse('2026-08-12T09:30:00.987Z'));
    assert.equal(parseRfc3339('2024-02-29T00:00:00Z'), Date.parse('2024-02-29T00:00:00Z'));
    assert.equal(parseRfc3339('0001-01-01T00:00:00Z'), Date.parse('0001-01-01T00:00:00Z'));
  });

  it('rejects malformed and out-of-range timestamps', () => {
    for (const bad of [
      '',
      'tomorrow',
      '2026-08-12 09:30:00Z',
      '2026-08-12T09:30Z',
      '2026-08-12T09:30:00',
      '2026-08-12T09:30:00+0800',
      '2026-13-01T00:00:00Z',
      '2026-02-29T00:00:00Z',
      '2026-04-31T00:00:00Z',
      '2026-08-12T24:00:00Z',
      '2026-08-12T09:60:00Z',
      '2026-08-12T09:30:60Z',
      '2026-08-12T09:30:00+24:00',
      '2026-08-12T09:30:00.Z',
    ]) {
      assert.equal(parseRfc3339(bad), undefined, bad);
    }
  });

  it('property: agrees with Date for ISO strings', () => {
    fc.assert(
      fc.property(
        fc.date({
          min: new Date('1970-01-01T00:00:00Z'),
          max: new Date('2999-12-31T23:59:59Z'),
          noInvalidDate: true,
        }),
        (date) => {
          const iso = date.toISOString();
          assert.equal(parseRfc3339(iso), date.getTime());
        },
      ),
    );
  });
});

describe('normalizeMac', () => {
  it('normalises to lower-case colon form', () => {
    assert.equal(normalizeMac('AA:19:42:20:D4:BA'), 'aa:19:42:20:d4:ba');
    assert.equal(normalizeMac('aa-19-42-20-d4-ba'), 'aa:19:42:20:d4:ba');
    assert.equal(normalizeMac('aa19.4220.d4ba'), 'aa:19:42:20:d4:ba');
  });

  it('rejects other forms', () => {
    for (const bad of [
      '',
      'aa:19:42:20:d4',
      'aa:19:42:20:d4:ba:00',
      'aa:19-42:20:d4:ba',
      'aa1942 20d4ba',
      'gg:19:42:20:d4:ba',
    ]) {
      assert.equal(normalizeMac(bad), undefined, bad);
    }
  });
});

describe('parseLeaseFile (cocoon-cli.md §7)', () => {
  it('parses the spec example', () => {
    assert.deepEqual(parseLeaseFile(EXAMPLE), {
      ok: true,
      leases: [
        { mac: '82:f7:df:93:90:f3', ip: '172.20.100.37', expiresAtMs: Date.parse('2026-08-12T09:30:00Z') },
        { mac: '1e:fb:e5:ab:5d:0a', ip: '172.20.100.12', expiresAtMs: Date.parse('2026-08-12T00:02:11Z') },
      ],
    });
  });

  it('null, empty array and empty text mean no lease', () => {
    for (const empty of ['null', '[]', '', '  \n', 'null\n']) {
      assert.deepEqual(parseLeaseFile(empty), { ok: true, leases: [] }, JSON.stringify(empty));
    }
  });

  it('skips unparsable rows', () => {
    const text = JSON.stringify([
      { mac: '82:F7:DF:93:90:F3', ip: '172.20.100.37', expiry: '2026-08-12T09:30:00Z' },
      { mac: '82:f7:df:93:90:f4', ip: '172.20.100.38', expiry: 'never' },
      { mac: 'nope', ip: '172.20.100.39', expiry: '2026-08-12T09:30:00Z' },
      { mac: '82:f7:df:93:90:f5', ip: 'not-an-ip', expiry: '2026-08-12T09:30:00Z' },
      { mac: '82:f7:df:93:90:f6', ip: 5, expiry: '2026-08-12T09:30:00Z' },
      null,
      'row',
    ]);
    const result = parseLeaseFile(text);
    assert.ok(result.ok);
    assert.deepEqual(
      result.leases.map((l) => l.mac),
      ['82:f7:df:93:90:f3'],
    );
  });

  it('invalid JSON or a non-array is a read error', () => {
    assert.equal(parseLeaseFile('[{"mac":').ok, false);
    assert.equal(parseLeaseFile('{"mac":"x"}').ok, false);
    assert.equal(parseLeaseFile('42').ok, false);
  });
});

describe('findLease', () => {
  const parsed = parseLeaseFile(EXAMPLE);
  const leases = parsed.ok ? parsed.leases : [];

  it('matches MACs case-insensitively', () => {
    assert.equal(findLease(leases, '82:F7:DF:93:90:F3', BEFORE)?.ip, '172.20.100.37');
  });

  it('an expired lease is absent; the expiry instant itself is still live', () => {
    const expiry = Date.parse('2026-08-12T09:30:00Z');
    assert.equal(findLease(leases, '82:f7:df:93:90:f3', expiry)?.ip, '172.20.100.37');
    assert.equal(findLease(leases, '82:f7:df:93:90:f3', expiry + 1), undefined);
    // the +08:00 row expires at 00:02:11Z
    assert.equal(findLease(leases, '1e:fb:e5:ab:5d:0a', Date.parse('2026-08-12T00:03:00Z')), undefined);
  });

  it('prefers the live row that expires last', () => {
    const dup = [
      { mac: 'aa:aa:aa:aa:aa:aa', ip: '10.0.0.1', expiresAtMs: 100 },
      { mac: 'aa:aa:aa:aa:aa:aa', ip: '10.0.0.2', expiresAtMs: 300 },
      { mac: 'aa:aa:aa:aa:aa:aa', ip: '10.0.0.3', expiresAtMs: 200 },
    ];
    assert.equal(findLease(dup, 'aa:aa:aa:aa:aa:aa', 50)?.ip, '10.0.0.2');
    assert.equal(findLease(dup, 'not a mac', 50), undefined);
  });
});

describe('resolveIp (lifecycle.md §7.1)', () => {
  const leases: LeaseSnapshot = {
    ok: true,
    leases: [{ mac: 'aa:19:42:20:d4:ba', ip: '172.24.1.161', expiresAtMs: BEFORE + 1000 }],
  };
  const dhcpVm = { nics: [{ mac: 'AA:19:42:20:D4:BA' }] };

  it('NIC 0 static wins, even over a lease', () => {
    const vm = { nics: [{ mac: 'aa:19:42:20:d4:ba', static: { ip: '10.88.3.17' } }] };
    assert.deepEqual(resolveIp(vm, leases, BEFORE), { ip: '10.88.3.17', source: 'static' });
    assert.deepEqual(resolveIp(vm, { ok: false, error: 'x' }, BEFORE, 'cached'), {
      ip: '10.88.3.17',
      source: 'static',
    });
  });

  it('otherwise the lease of NIC 0 MAC, case-insensitively', () => {
    assert.deepEqual(resolveIp(dhcpVm, leases, BEFORE), { ip: '172.24.1.161', source: 'lease' });
  });

  it('only NIC 0 counts', () => {
    const vm = { nics: [{ mac: '02:00:00:00:00:01' }, { mac: 'aa:19:42:20:d4:ba' }] };
    assert.deepEqual(resolveIp(vm, leases, BEFORE, '1.2.3.4'), { ip: '', source: 'none' });
  });

  it('no lease clears a cached IP; a read error keeps it', () => {
    assert.deepEqual(resolveIp(dhcpVm, { ok: true, leases: [] }, BEFORE, '172.24.1.9'), {
      ip: '',
      source: 'none',
    });
    assert.deepEqual(resolveIp(dhcpVm, leases, BEFORE + 2000, '172.24.1.9'), { ip: '', source: 'none' });
    assert.deepEqual(resolveIp(dhcpVm, { ok: false, error: 'EACCES' }, BEFORE, '172.24.1.9'), {
      ip: '172.24.1.9',
      source: 'cached',
    });
  });

  it('a VM without NICs has no IP', () => {
    assert.deepEqual(resolveIp({ nics: [] }, leases, BEFORE), { ip: '', source: 'none' });
  });
});

describe('LeaseFile (cached reader)', () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'leases-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('a missing file is "no lease"', async () => {
    const file = new LeaseFile(join(dir, 'missing.json'));
    assert.deepEqual(await file.read(), { ok: true, leases: [] });
  });

  it('re-parses only when mtime or size change', async () => {
    const path = join(dir, 'leases.json');
    const row = (ip: string) =>
      JSON.stringify([{ mac: 'aa:19:42:20:d4:ba', ip, expiry: '2026-08-12T09:30:00Z' }]);
    const mtime = new Date('2026-08-01T00:00:00Z'); // whole seconds: utimes can restore it exactly
    await writeFile(path, row('172.24.1.161'));
    await utimes(path, mtime, mtime);
    const file = new LeaseFile(path);
    const first = await file.read();
    assert.ok(first.ok);
    assert.equal(first.leases[0]?.ip, '172.24.1.161');

    // same size, mtime restored ⇒ served from the cache
    await writeFile(path, row('172.24.1.162'));
    await utimes(path, mtime, mtime);
    const cached = await file.read();
    assert.equal(cached, first);

    // mtime changed ⇒ re-read
    await utimes(path, new Date(mtime.getTime() + 5000), new Date(mtime.getTime() + 5000));
    const fresh = await file.read();
    assert.ok(fresh.ok);
    assert.equal(fresh.leases[0]?.ip, '172.24.1.162');

    // size changed ⇒ re-read
    await writeFile(path, 'null');
    await utimes(path, new Date(mtime.getTime() + 5000), new Date(mtime.getTime() + 5000));
    assert.deepEqual(await file.read(), { ok: true, leases: [] });
  });

  it('a read error keeps the cached IP through resolve()', async () => {
    const path = join(dir, 'broken.json');
    await writeFile(path, '[{"mac":');
    const file = new LeaseFile(path);
    const result = await file.read();
    assert.equal(result.ok, false);
    const vm = { nics: [{ mac: 'aa:19:42:20:d4:ba' }] };
    assert.deepEqual(await file.resolve(vm, BEFORE, '172.24.1.9'), { ip: '172.24.1.9', source: 'cached' });
  });

  it('a directory in place of the file is a read error, not "no lease"', async () => {
    const path = join(dir, 'is-a-dir');
    await mkdir(path);
    const result = await new LeaseFile(path).read();
    assert.equal(result.ok, false);
  });

  it('resolve() serves a static IP without reading the file', async () => {
    const file = new LeaseFile(join(dir, 'is-a-dir'));
    assert.deepEqual(await file.resolve({ nics: [{ mac: 'x', static: { ip: '10.0.0.7' } }] }, BEFORE), {
      ip: '10.0.0.7',
      source: 'static',
    });
  });
});

describe('parseLeaseFile row cache', () => {
  it('a row re-read unchanged parses the same, and any changed field is parsed anew', () => {
    const row = (expiry: string, ip = '10.0.0.9', mac = 'AA-BB-CC-DD-EE-0F') => ({ mac, ip, expiry });
    const first = parseLeaseFile(JSON.stringify([row('2030-01-01T00:00:00Z')]));
    const again = parseLeaseFile(JSON.stringify([row('2030-01-01T00:00:00Z')]));
    assert.deepEqual(again, first);
    assert.deepEqual(first, {
      ok: true,
      leases: [{ mac: 'aa:bb:cc:dd:ee:0f', ip: '10.0.0.9', expiresAtMs: Date.UTC(2030, 0, 1) }],
    });
    const renewed = parseLeaseFile(JSON.stringify([row('2030-01-02T00:00:00Z')]));
    assert.ok(renewed.ok && renewed.leases[0]?.expiresAtMs === Date.UTC(2030, 0, 2));
    const moved = parseLeaseFile(JSON.stringify([row('2030-01-02T00:00:00Z', '10.0.0.10')]));
    assert.ok(moved.ok && moved.leases[0]?.ip === '10.0.0.10');
    // A malformed row stays skipped when it is read again.
    for (let i = 0; i < 2; i++) {
      const bad = parseLeaseFile(JSON.stringify([row('2030-02-30T00:00:00Z')]));
      assert.deepEqual(bad, { ok: true, leases: [] });
    }
  });
});
