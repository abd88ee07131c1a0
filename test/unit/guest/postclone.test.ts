import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  type FixupFacts,
  fixupKind,
  hintBase64,
  linuxGuestFlavour,
  planFixup,
  prefixToMask,
  WINDOWS_FIXUP_ARGV,
  WINDOWS_FIXUP_HINT,
} from '../../../src/guest/postclone.ts';

const STATIC_NIC = {
  mac: '02:4e:9a:11:c3:7d',
  static: { ip: '10.88.3.17', gateway: '10.88.0.1', prefix: 16 },
};
const DHCP_NIC = { mac: '02:4e:9a:11:c3:7e' };

function facts(overrides: Partial<FixupFacts> = {}): FixupFacts {
  return {
    clonedBoot: true,
    os: 'linux',
    backend: 'cloud-hypervisor',
    nics: [STATIC_NIC],
    vmName: 'vk-prod-demo-1',
    sourceImage: 'ghcr.io/cocoonstack/cocoon/ubuntu:24.04',
    ...overrides,
  };
}

function plan(overrides: Partial<FixupFacts> = {}) {
  const result = planFixup(facts(overrides));
  assert.ok(result.needed && result.ok, JSON.stringify(result));
  return result;
}

/** lifecycle.md §6.4 example, byte for byte. */
const SPEC_EXAMPLE_HINT = String.raw`echo 3 > /proc/sys/vm/drop_caches
echo vk-prod-demo-1 > /etc/hostname
rm -f /etc/systemd/network/10-*.network
printf '[Match]\nMACAddress=02:4e:9a:11:c3:7d\n\n[Network]\nAddress=10.88.3.17/16\nGateway=10.88.0.1\n' > /etc/systemd/network/10-024e9a11c37d.network
systemctl restart systemd-networkd`;

describe('fixupKind: the §6.1 matrix', () => {
  const base = { clonedBoot: true, nics: [DHCP_NIC] };
  it('windows on any backend', () => {
    assert.equal(fixupKind({ ...base, os: 'windows', backend: 'cloud-hypervisor' }), 'windows');
    assert.equal(fixupKind({ ...base, os: 'windows', backend: 'firecracker' }), 'windows');
  });

  it('firecracker always', () => {
    assert.equal(fixupKind({ ...base, os: 'linux', backend: 'firecracker' }), 'linux_fc');
    assert.equal(fixupKind({ ...base, os: 'android', backend: 'firecracker' }), 'linux_fc');
    assert.equal(fixupKind({ ...base, os: 'linux', backend: 'firecracker', nics: [STATIC_NIC] }), 'linux_fc');
  });

  it('CH with at least one static NIC', () => {
    assert.equal(
      fixupKind({ ...base, os: 'linux', backend: 'cloud-hypervisor', nics: [DHCP_NIC, STATIC_NIC] }),
      'linux_static',
    );
  });

  it('CH all-DHCP (Linux or android) needs nothing', () => {
    assert.equal(fixupKind({ ...base, os: 'linux', backend: 'cloud-hypervisor' }), undefined);
    assert.equal(fixupKind({ ...base, os: 'android', backend: 'cloud-hypervisor' }), undefined);
    const emptyIp = { mac: DHCP_NIC.mac, static: { ip: '', gateway: '', prefix: 0 } };
    assert.equal(
      fixupKind({ ...base, os: 'linux', backend: 'cloud-hypervisor', nics: [emptyIp] }),
      undefined,
    );
  });

  it('no fixup for a boot that is not cloned', () => {
    assert.equal(
      fixupKind({ clonedBoot: false, os: 'windows', backend: 'cloud-hypervisor', nics: [] }),
      undefined,
    );
    assert.deepEqual(planFixup(facts({ clonedBoot: false })), { needed: false });
  });
});

describe('planFixup: Windows (§6.3)', () => {
  it('is the 4-element PowerShell argv and the shell-quoted hint', () => {
    const result = plan({ os: 'windows', nics: [DHCP_NIC] });
    assert.equal(result.kind, 'windows');
    assert.deepEqual(result.argv, [
      'powershell',
      '-nop',
      '-c',
      '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false',
    ]);
    assert.equal(
      result.hint,
      "powershell -nop -c '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false'",
    );
    assert.deepEqual(WINDOWS_FIXUP_ARGV, result.argv);
    assert.equal(WINDOWS_FIXUP_HINT, result.hint);
  });
});

describe('planFixup: Linux script (§6.4)', () => {
  it('reproduces the spec example byte for byte (CH, OCI, one static NIC)', () => {
    const result = plan();
    assert.equal(result.kind, 'linux_static');
    assert.equal(result.hint, SPEC_EXAMPLE_HINT);
    assert.deepEqual(result.argv, ['sh', '-c', SPEC_EXAMPLE_HINT]);
    assert.equal(hintBase64(result.hint), Buffer.from(SPEC_EXAMPLE_HINT).toString('base64'));
    assert.equal(Buffer.from(hintBase64(result.hint), 'base64').toString('utf8'), SPEC_EXAMPLE_HINT);
  });

  it('CH cloudimg with a static NIC: cloud-init lines, no networkd files', () => {
    const result = plan({ sourceImage: 'https://cloud-images.ubuntu.com/jammy.img' });
    assert.equal(
      result.hint,
      [
        'echo 3 > /proc/sys/vm/drop_caches',
        'echo vk-prod-demo-1 > /etc/hostname',
        'rm -f /etc/systemd/network/10-*.network',
        'cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init',
        'cloud-init modules --mode=config && systemctl restart systemd-networkd',
      ].join('\n'),
    );
  });

  it('Firecracker OCI with a DHCP and a static NIC: MAC rewrite per NIC, then per-NIC files', () => {
    const result = plan({ backend: 'firecracker', nics: [DHCP_NIC, STATIC_NIC] });
    assert.equal(result.kind, 'linux_fc');
    assert.equal(
      result.hint,
      [
        'echo 3 > /proc/sys/vm/drop_caches',
        'echo vk-prod-demo-1 > /etc/hostname',
        'ip link set dev eth0 down && ip link set dev eth0 address 02:4e:9a:11:c3:7e && ip link set dev eth0 up',
        'ip link set dev eth1 down && ip link set dev eth1 address 02:4e:9a:11:c3:7d && ip link set dev eth1 up',
        'rm -f /etc/systemd/network/10-*.network',
        String.raw`printf '[Match]\nMACAddress=02:4e:9a:11:c3:7e\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n' > /etc/systemd/network/10-024e9a11c37e.network`,
        String.raw`printf '[Match]\nMACAddress=02:4e:9a:11:c3:7d\n\n[Network]\nAddress=10.88.3.17/16\nGateway=10.88.0.1\n' > /etc/systemd/network/10-024e9a11c37d.network`,
        'systemctl restart systemd-networkd',
      ].join('\n'),
    );
  });

  it('cloudimg vs OCI: source image URL, else the overlay.qcow2 probe', () => {
    assert.equal(linuxGuestFlavour({ sourceImage: 'http://x/img' }), 'cloudimg');
    assert.equal(linuxGuestFlavour({ sourceImage: 'https://x/img' }), 'cloudimg');
    assert.equal(linuxGuestFlavour({ sourceImage: 'ghcr.io/a/b', overlayQcow2Exists: true }), 'oci');
    assert.equal(linuxGuestFlavour({ overlayQcow2Exists: true }), 'cloudimg');
    assert.equal(linuxGuestFlavour({ sourceImage: '', overlayQcow2Exists: true }), 'cloudimg');
    assert.equal(linuxGuestFlavour({ overlayQcow2Exists: false }), 'oci');
    assert.equal(linuxGuestFlavour({}), 'oci');
    assert.match(plan({ sourceImage: undefined, overlayQcow2Exists: true }).hint, /cloud-init clean/);
  });

  it('lower-cases a MAC reported in upper case', () => {
    const result = plan({ nics: [{ ...STATIC_NIC, mac: '02:4E:9A:11:C3:7D' }] });
    assert.equal(result.hint, SPEC_EXAMPLE_HINT);
  });

  it('writes an empty gateway as Gateway=', () => {
    const result = plan({
      nics: [{ mac: STATIC_NIC.mac, static: { ip: '10.88.3.17', gateway: '', prefix: 16 } }],
    });
    assert.match(result.hint, /Address=10\.88\.3\.17\/16\\nGateway=\\n' >/);
  });
});

describe('planFixup refuses invalid input (no shell injection)', () => {
  const cases: [string, Partial<FixupFacts>, RegExp][] = [
    ['VM name with a shell metacharacter', { vmName: 'x;reboot' }, /invalid VM name "x;reboot"/],
    ['VM name with a space', { vmName: 'a b' }, /invalid VM name/],
    ['VM name with a leading dash', { vmName: '-n' }, /invalid VM name/],
    [
      'MAC with a quote',
      { nics: [{ ...STATIC_NIC, mac: "02:4e:9a:11:c3:7d' ; reboot ; '" }] },
      /NIC 0: invalid MAC/,
    ],
    ['MAC in dash form', { nics: [{ ...STATIC_NIC, mac: '02-4e-9a-11-c3-7d' }] }, /NIC 0: invalid MAC/],
    [
      'IP with a CIDR',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, ip: '10.0.0.1/8' } }] },
      /invalid IPv4 address/,
    ],
    [
      'IP with leading zeros',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, ip: '10.0.0.01' } }] },
      /invalid IPv4/,
    ],
    [
      'IPv6 address',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, ip: 'fd00::1' } }] },
      /invalid IPv4/,
    ],
    [
      'prefix 33',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, prefix: 33 } }] },
      /invalid prefix 33/,
    ],
    [
      'prefix -1',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, prefix: -1 } }] },
      /invalid prefix/,
    ],
    [
      'prefix 1.5',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, prefix: 1.5 } }] },
      /invalid prefix/,
    ],
    [
      'gateway with a command',
      { nics: [{ mac: STATIC_NIC.mac, static: { ...STATIC_NIC.static, gateway: '10.0.0.1 && reboot' } }] },
      /invalid gateway/,
    ],
    ['FC MAC', { backend: 'firecracker', nics: [{ mac: '$(reboot)' }] }, /NIC 0: invalid MAC/],
  ];
  for (const [name, override, message] of cases) {
    it(name, () => {
      const result = planFixup(facts(override));
      assert.equal(result.needed, true);
      assert.ok(result.needed && !result.ok, 'expected a refusal');
      assert.match(result.needed && !result.ok ? result.error : '', message);
      assert.match(result.needed && !result.ok ? result.error : '', /^post-clone plan: /);
    });
  }

  it('values that do not enter the script are not validated (cloudimg CH: MACs and IPs unused)', () => {
    const result = planFixup(
      facts({
        sourceImage: 'https://x/img',
        nics: [{ mac: 'weird', static: { ip: 'x', gateway: 'y', prefix: 99 } }],
      }),
    );
    assert.ok(result.needed && result.ok);
  });

  it('reports every invalid value', () => {
    const result = planFixup(
      facts({ vmName: 'a b', nics: [{ mac: 'm', static: { ip: 'i', gateway: 'g', prefix: 40 } }] }),
    );
    assert.ok(result.needed && !result.ok);
    assert.equal(result.needed && !result.ok ? result.error.split('; ').length : 0, 5);
  });

  it('property: any plan built from arbitrary strings has only whitelisted lines', () => {
    const mac = '[0-9a-f]{2}(?::[0-9a-f]{2}){5}';
    const ip = '(?:[0-9]{1,3}\\.){3}[0-9]{1,3}';
    const allowed = [
      /^echo 3 > \/proc\/sys\/vm\/drop_caches$/,
      /^echo [a-zA-Z0-9][a-zA-Z0-9._-]{0,62} > \/etc\/hostname$/,
      new RegExp(
        `^ip link set dev eth(\\d+) down && ip link set dev eth\\1 address ${mac} && ip link set dev eth\\1 up$`,
      ),
      /^rm -f \/etc\/systemd\/network\/10-\*\.network$/,
      /^cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init$/,
      /^cloud-init modules --mode=config && systemctl restart systemd-networkd$/,
      new RegExp(
        `^printf '\\[Match\\]\\\\nMACAddress=${mac}\\\\n\\\\n\\[Network\\]\\\\n(?:Address=${ip}/[0-9]{1,2}\\\\nGateway=(?:${ip})?\\\\n|DHCP=ipv4\\\\n\\\\n\\[DHCPv4\\]\\\\nClientIdentifier=mac\\\\n)' > /etc/systemd/network/10-[0-9a-f]{12}\\.network$`,
      ),
      /^systemctl restart systemd-networkd$/,
    ];
    const text = fc.oneof(
      fc.string(),
      fc.constantFrom('02:4e:9a:11:c3:7d', '10.0.0.1', 'vm-1', "'", '$(x)', ''),
    );
    const nic = fc.record({
      mac: text,
      static: fc.option(fc.record({ ip: text, gateway: text, prefix: fc.integer({ min: -2, max: 40 }) }), {
        nil: undefined,
      }),
    });
    fc.assert(
      fc.property(
        text,
        fc.array(nic, { maxLength: 3 }),
        fc.constantFrom('cloud-hypervisor', 'firecracker'),
        fc.option(fc.constantFrom('https://x/img', 'ghcr.io/a/b'), { nil: undefined }),
        (vmName, nics, backend, sourceImage) => {
          const result = planFixup({ clonedBoot: true, os: 'linux', backend, nics, vmName, sourceImage });
          if (!result.needed || !result.ok) return;
          for (const line of result.hint.split('\n')) {
            assert.ok(
              allowed.some((re) => re.test(line)),
              `unexpected script line: ${line}`,
            );
          }
        },
      ),
      { numRuns: 500 },
    );
  });
});

describe('prefixToMask (§6.6)', () => {
  it('maps prefixes to dotted masks; invalid gives /24', () => {
    assert.equal(prefixToMask(24), '255.255.255.0');
    assert.equal(prefixToMask(16), '255.255.0.0');
    assert.equal(prefixToMask(0), '0.0.0.0');
    assert.equal(prefixToMask(32), '255.255.255.255');
    assert.equal(prefixToMask(20), '255.255.240.0');
    assert.equal(prefixToMask(33), '255.255.255.0');
    assert.equal(prefixToMask(-1), '255.255.255.0');
  });
});
