// The pure SAC dialogue (docs/contracts/post-clone.md, "Windows static IP"; lifecycle.md §6.6):
// one block per rule.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  hasPrompt,
  listedNets,
  outputBeforePrompt,
  parseNetList,
  planSacSets,
  SAC_COMMAND_TIMEOUT_MS,
  SAC_DIAL_BUDGET_MS,
  SAC_DIAL_RETRY_MS,
  SAC_ENUM_INTERVAL_MS,
  SAC_ENUM_TRIES,
  SAC_EOL,
  SAC_PHASE_REASONS,
  SAC_VERIFY_INTERVAL_MS,
  SAC_VERIFY_TRIES,
  sacBudgetMs,
  sacErrorMessage,
  sacMask,
  setReplyError,
  shownFor,
  showsIp,
  WINDOWS_STATIC_IP_FAILED,
} from '../../../src/guest/sac.ts';

/** What the simulator's emulator (and SAC) print for `i` on a two-NIC guest. */
const LISTING = [
  'i',
  'Net: 10, Ip=169.254.12.7  Subnet=255.255.0.0  Gateway=0.0.0.0',
  'Net: 11, Ip=172.20.100.10  Subnet=255.255.0.0  Gateway=172.20.0.1',
  '',
].join('\r\n');

const STATIC_A = { mac: '02:00:00:00:00:01', static: { ip: '10.88.3.17', gateway: '10.88.0.1', prefix: 16 } };
const STATIC_B = { mac: '02:00:00:00:00:02', static: { ip: '10.89.0.5', gateway: '10.89.0.1', prefix: 24 } };
const DHCP = { mac: '02:00:00:00:00:03' };

describe('SAC budgets (§6.6)', () => {
  it('dial 60 s retried every 2 s, 5 s per command, enumeration 60 × 2 s, verification 10 × 2 s', () => {
    assert.equal(SAC_DIAL_BUDGET_MS, 60_000);
    assert.equal(SAC_DIAL_RETRY_MS, 2_000);
    assert.equal(SAC_COMMAND_TIMEOUT_MS, 5_000);
    assert.equal(SAC_ENUM_TRIES, 60);
    assert.equal(SAC_ENUM_INTERVAL_MS, 2_000);
    assert.equal(SAC_VERIFY_TRIES, 10);
    assert.equal(SAC_VERIFY_INTERVAL_MS, 2_000);
    assert.equal(SAC_EOL, '\r\n');
  });

  it('the job budget is dial + enumeration + a set/verify bound per static NIC', () => {
    assert.equal(sacBudgetMs(0), 60_000 + 125_000);
    assert.equal(sacBudgetMs(1), 60_000 + 125_000 + 30_000);
    assert.equal(sacBudgetMs(2) - sacBudgetMs(1), 30_000);
    // Fits the ready deadline's lower bound (480 s) after a 180 s fixup with two static NICs.
    assert.ok(180_000 + sacBudgetMs(2) + 45_000 < 480_000);
  });
});

describe('prompt detection', () => {
  it('finds `SAC>` anywhere and returns the output before the first one', () => {
    assert.equal(hasPrompt('\r\nComputer is booting\r\nSAC>'), true);
    assert.equal(hasPrompt('login: '), false);
    assert.equal(outputBeforePrompt(`${LISTING}\r\nSAC>`), `${LISTING}\r\n`);
    assert.equal(outputBeforePrompt('i\r\nNet: 10, Ip=1.2.3.4'), undefined);
    assert.equal(outputBeforePrompt('SAC>SAC>'), '');
  });
});

describe('parsing the `i` listing', () => {
  it('reads every `Net: <n>, Ip=<ip>` line in order and ignores the rest', () => {
    assert.deepEqual(parseNetList(LISTING), [
      { net: 10, ip: '169.254.12.7' },
      { net: 11, ip: '172.20.100.10' },
    ]);
    assert.deepEqual(parseNetList(''), []);
    assert.deepEqual(parseNetList("Unrecognized command.  Try 'help' or '?'."), []);
  });

  it('accepts loose spacing, a lone CR or LF, and no trailing fields', () => {
    assert.deepEqual(parseNetList('Net:12 ,Ip=10.0.0.1\nnet: 13, ip=10.0.0.2\rNet: 14, Ip=10.0.0.3'), [
      { net: 12, ip: '10.0.0.1' },
      { net: 13, ip: '10.0.0.2' },
      { net: 14, ip: '10.0.0.3' },
    ]);
  });

  it('counts each net number once, in order of first appearance (the i-th belongs to NIC i)', () => {
    const entries = parseNetList('Net: 11, Ip=10.0.0.1\r\nNet: 11, Ip=fe80::1\r\nNet: 10, Ip=10.0.0.2');
    assert.deepEqual(listedNets(entries), [11, 10]);
  });
});

describe('the mask from a prefix', () => {
  it('is dotted; an invalid prefix gives 255.255.255.0', () => {
    assert.equal(sacMask(24), '255.255.255.0');
    assert.equal(sacMask(16), '255.255.0.0');
    assert.equal(sacMask(20), '255.255.240.0');
    assert.equal(sacMask(32), '255.255.255.255');
    for (const bad of [33, -1, 1.5, Number.NaN]) assert.equal(sacMask(bad), '255.255.255.0');
  });
});

describe('the set command', () => {
  it('is `i <netnum> <ip> <mask> <gateway>` for each static NIC, NIC i on the i-th listed net', () => {
    const plan = planSacSets([STATIC_A, DHCP, STATIC_B], [10, 11, 12]);
    assert.deepEqual(plan, {
      ok: true,
      sets: [
        { nic: 0, net: 10, ip: '10.88.3.17', command: 'i 10 10.88.3.17 255.255.0.0 10.88.0.1' },
        { nic: 2, net: 12, ip: '10.89.0.5', command: 'i 12 10.89.0.5 255.255.255.0 10.89.0.1' },
      ],
    });
  });

  it('sends an empty gateway as 0.0.0.0', () => {
    const nic = { mac: 'x', static: { ip: '10.0.0.5', gateway: '', prefix: 8 } };
    assert.deepEqual(planSacSets([nic], [10]), {
      ok: true,
      sets: [{ nic: 0, net: 10, ip: '10.0.0.5', command: 'i 10 10.0.0.5 255.0.0.0 0.0.0.0' }],
    });
  });

  it('refuses anything that is not a plain dotted quad, and a NIC without a listed net', () => {
    const evil = { mac: 'x', static: { ip: '10.0.0.5\r\ncmd', gateway: '10.0.0.1', prefix: 24 } };
    const plan = planSacSets([evil, STATIC_B], [10]);
    assert.equal(plan.ok, false);
    assert.match(plan.ok ? '' : plan.error, /NIC 0: invalid IPv4 address/);
    assert.match(plan.ok ? '' : plan.error, /NIC 1: no net number listed/);
    const badGw = { mac: 'x', static: { ip: '10.0.0.5', gateway: '010.0.0.1', prefix: 24 } };
    assert.match(JSON.stringify(planSacSets([badGw], [10])), /invalid gateway/);
  });

  it('no command ever holds a line break (property)', () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), fc.integer({ min: -5, max: 40 }), (ip, gateway, prefix) => {
        const plan = planSacSets([{ mac: 'x', static: { ip, gateway, prefix } }], [10]);
        if (plan.ok) for (const s of plan.sets) assert.doesNotMatch(s.command, /[\r\n]/);
      }),
    );
  });
});

describe('the set reply', () => {
  it("SAC's refusals are errors; success or silence is left to verification", () => {
    assert.equal(
      setReplyError('i 10 1.2.3.4 255.0.0.0 1.2.3.1\r\nSAC could not set the IP Address.\r\n'),
      'SAC could not set the IP Address.',
    );
    assert.equal(
      setReplyError('The specified network interface number is invalid.'),
      'The specified network interface number is invalid.',
    );
    assert.equal(
      setReplyError(
        'i 10 1.2.3.4 255.0.0.0 1.2.3.1\r\nSAC successfully set the IP address, subnet mask, and gateway.\r\n',
      ),
      undefined,
    );
    assert.equal(setReplyError(''), undefined);
  });
});

describe('verification', () => {
  it('passes when the entry of the net shows the IP', () => {
    const entries = parseNetList(LISTING);
    assert.equal(showsIp(entries, 11, '172.20.100.10'), true);
    assert.equal(showsIp(entries, 10, '172.20.100.10'), false);
    assert.equal(showsIp(entries, 12, '172.20.100.10'), false);
    assert.equal(shownFor(entries, 10), '169.254.12.7');
    assert.equal(shownFor(entries, 12), 'nothing');
  });
});

describe('reasons and messages (§9)', () => {
  it('one Warning reason per phase, then WindowsStaticIPFailed', () => {
    assert.deepEqual(SAC_PHASE_REASONS, {
      dial: 'PostCloneSACDialFailed',
      enum: 'PostCloneSACEnumFailed',
      set: 'PostCloneSACSetFailed',
      verify: 'PostCloneSACVerifyFailed',
    });
    assert.equal(WINDOWS_STATIC_IP_FAILED, 'WindowsStaticIPFailed');
    assert.equal(
      sacErrorMessage('enum', 'listed 1 of 2 NICs after 60 tries'),
      'sac enum: listed 1 of 2 NICs after 60 tries',
    );
  });
});
