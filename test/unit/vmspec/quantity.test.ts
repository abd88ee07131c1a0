import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  parseByteSize,
  parseMillicores,
  parseQuantity,
  quantityMilliValue,
  quantityValue,
} from '../../../src/vmspec/quantity.ts';

function value(text: string): bigint | undefined {
  const q = parseQuantity(text);
  return q === undefined ? undefined : quantityValue(q);
}

function milli(text: string): bigint | undefined {
  const q = parseQuantity(text);
  return q === undefined ? undefined : quantityMilliValue(q);
}

describe('parseQuantity', () => {
  it('binary SI suffixes', () => {
    assert.equal(value('20Gi'), 20n * 2n ** 30n);
    assert.equal(value('4Gi'), 4294967296n);
    assert.equal(value('1Ki'), 1024n);
    assert.equal(value('512Mi'), 536870912n);
    assert.equal(value('1Ti'), 2n ** 40n);
    assert.equal(value('2Pi'), 2n ** 51n);
    assert.equal(value('1Ei'), 2n ** 60n);
    assert.equal(value('1.5Gi'), 1610612736n);
  });

  it('decimal SI suffixes', () => {
    assert.equal(value('1.5G'), 1500000000n);
    assert.equal(value('1k'), 1000n);
    assert.equal(value('3M'), 3000000n);
    assert.equal(value('1T'), 10n ** 12n);
    assert.equal(value('1P'), 10n ** 15n);
    assert.equal(value('1E'), 10n ** 18n);
    assert.equal(milli('500m'), 500n);
    assert.equal(milli('1u'), 1n); // 0.001 milli rounds up
    assert.equal(milli('5n'), 1n);
    assert.equal(value('123'), 123n);
  });

  it('decimal exponents', () => {
    assert.equal(value('4e3'), 4000n);
    assert.equal(value('4E3'), 4000n);
    assert.equal(value('1e+3'), 1000n);
    assert.equal(milli('1e-3'), 1n);
    assert.equal(value('2.5e2'), 250n);
    assert.equal(value('1e03'), 1000n);
  });

  it('numeric forms: signs, leading zeros, "1." and ".5"', () => {
    assert.equal(value('+5'), 5n);
    assert.equal(value('007'), 7n);
    assert.equal(milli('.5'), 500n);
    assert.equal(value('1.'), 1n);
    assert.equal(value('1.G'), 1000000000n);
    assert.equal(value('-5'), -5n);
    assert.equal(parseQuantity('-0')?.negative, false);
    assert.equal(value('0'), 0n);
  });

  it('Value() and MilliValue() round up away from zero', () => {
    assert.equal(value('0.1'), 1n);
    assert.equal(value('1500m'), 2n);
    assert.equal(value('1001m'), 2n);
    assert.equal(value('1000m'), 1n);
    assert.equal(value('-1500m'), -2n);
    assert.equal(milli('0.0001'), 1n);
  });

  it('rejects malformed quantities', () => {
    for (const bad of [
      '',
      ' 1',
      '1 ',
      '1Gb',
      '1gi',
      '1ki',
      '1K',
      '1e',
      '1E+',
      'Gi',
      '.',
      '+',
      '-',
      '1..5',
      '1.5.5',
      '0x10',
      '1Mi3',
      'abc',
      '1,5',
      '١',
      '1e1000',
      '1\n',
      '1constructor',
      '1__proto__',
      '1toString',
      '1hasOwnProperty',
      '1'.repeat(129),
    ]) {
      assert.equal(parseQuantity(bad), undefined, JSON.stringify(bad));
    }
  });

  it('accepts up to 128 characters', () => {
    assert.equal(value('1'.repeat(128)), BigInt('1'.repeat(128)));
  });

  it('is exact beyond 2^53', () => {
    assert.equal(value('9007199254740993'), 9007199254740993n);
    assert.equal(value('8Ei'), 8n * 2n ** 60n);
  });

  it('property: integer byte strings round-trip', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 70n }), (n) => {
        assert.equal(value(n.toString()), n);
        assert.equal(value(`${n}Ki`), n * 1024n);
        assert.equal(milli(`${n}m`), n);
      }),
    );
  });

  it('property: decimal fractions match exact arithmetic', () => {
    fc.assert(
      fc.property(fc.nat({ max: 1_000_000 }), fc.nat({ max: 999 }), (whole, frac) => {
        const text = `${whole}.${String(frac).padStart(3, '0')}`;
        assert.equal(milli(text), BigInt(whole) * 1000n + BigInt(frac));
      }),
    );
  });
});

describe('parseByteSize (pod-to-vm.md §3.3)', () => {
  it('converts to plain bytes', () => {
    assert.equal(parseByteSize('4Gi'), 4294967296n);
    assert.equal(parseByteSize('20Gi'), 21474836480n);
    assert.equal(parseByteSize(1024), 1024n);
  });

  it('omits zero, negative and unparsable quantities', () => {
    for (const bad of ['0', '0Gi', '-1Gi', 'lots', '', undefined])
      assert.equal(parseByteSize(bad), undefined);
  });
});

describe('parseMillicores', () => {
  it('converts CPU amounts', () => {
    assert.equal(parseMillicores('2'), 2000n);
    assert.equal(parseMillicores('500m'), 500n);
    assert.equal(parseMillicores('0.5'), 500n);
    assert.equal(parseMillicores(1.5), 1500n);
    assert.equal(parseMillicores('0'), 0n);
  });

  it('rejects negative and unparsable amounts', () => {
    assert.equal(parseMillicores('-1'), undefined);
    assert.equal(parseMillicores('two'), undefined);
    assert.equal(parseMillicores(undefined), undefined);
  });
});
