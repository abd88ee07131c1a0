/**
 * Kubernetes resource quantities (`20Gi`, `500m`, `1.5G`, `4e3`) as exact rationals
 * (docs/contracts/pod-to-vm.md "Sizes").
 *
 * Hand-written on purpose: @kubernetes/client-node 2.x ships no quantity parser with exact
 * arithmetic (its helpers go through floating point), and sizes and millicores must be exact
 * integers. The grammar is apimachinery's `resource.ParseQuantity`:
 *
 * ```
 * quantity  ::= [+-] digits [ "." digits ] suffix      (at least one digit overall; "1." and ".5" ok)
 * suffix    ::= "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"     (decimal SI)
 *             | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"                      (binary SI)
 *             | ("e" | "E") [+-] digits                                      (decimal exponent)
 * ```
 *
 * No surrounding whitespace is accepted (Kubernetes rejects it too). `E` alone is exa; `E3` is
 * an exponent. Deliberately stricter than Kubernetes: texts longer than 128 characters and
 * decimal exponents beyond ±100 are rejected (bounded work on pod-author input). Rounding follows `Quantity.Value()` / `MilliValue()`: up, away from zero.
 */

/** An exact quantity `sign × numerator / denominator` (denominator > 0, numerator ≥ 0). */
export interface Quantity {
  readonly negative: boolean;
  readonly numerator: bigint;
  readonly denominator: bigint;
}

const DECIMAL_SUFFIX_EXPONENT: ReadonlyMap<string, number> = new Map([
  ['', 0],
  ['n', -9],
  ['u', -6],
  ['m', -3],
  ['k', 3],
  ['M', 6],
  ['G', 9],
  ['T', 12],
  ['P', 15],
  ['E', 18],
]);

const BINARY_SUFFIX_POWER: ReadonlyMap<string, number> = new Map([
  ['Ki', 10],
  ['Mi', 20],
  ['Gi', 30],
  ['Ti', 40],
  ['Pi', 50],
  ['Ei', 60],
]);

/**
 * Largest accepted |decimal exponent|. Values this far out are not sizes or CPU amounts, and an
 * unbounded exponent (`1e999999999`) would let a pod author make the provider build a huge
 * bigint. Kubernetes accepts them; we report them as unparsable.
 */
const MAX_DECIMAL_EXPONENT = 100;

/** Longest accepted quantity text, for the same reason (a 256 KiB digit string is not a size). */
const MAX_QUANTITY_LENGTH = 128;

const QUANTITY = /^([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)$/s;
const EXPONENT_SUFFIX = /^[eE]([+-]?[0-9]+)$/;

/** Parses a Kubernetes quantity; `undefined` when the text is not one. */
export function parseQuantity(text: string): Quantity | undefined {
  if (text.length > MAX_QUANTITY_LENGTH) return undefined;
  const match = QUANTITY.exec(text);
  if (match === null) return undefined;
  const [, sign = '', whole = '', fraction = '', suffix = ''] = match;
  if (whole.length + fraction.length === 0) return undefined;

  let decimalExponent: number;
  let binaryPower = 0;
  const decimal = DECIMAL_SUFFIX_EXPONENT.get(suffix);
  const binary = BINARY_SUFFIX_POWER.get(suffix);
  const exponent = EXPONENT_SUFFIX.exec(suffix);
  if (decimal !== undefined) {
    decimalExponent = decimal;
  } else if (binary !== undefined) {
    decimalExponent = 0;
    binaryPower = binary;
  } else if (exponent !== null) {
    const value = Number(exponent[1]);
    if (!Number.isSafeInteger(value) || Math.abs(value) > MAX_DECIMAL_EXPONENT) return undefined;
    decimalExponent = value;
  } else {
    return undefined;
  }

  // digits × 10^(exponent − fraction length) × 2^binaryPower
  let numerator = BigInt(whole + fraction || '0') * (1n << BigInt(binaryPower));
  let denominator = 1n;
  const scale = decimalExponent - fraction.length;
  if (scale >= 0) numerator *= 10n ** BigInt(scale);
  else denominator = 10n ** BigInt(-scale);
  const divisor = gcd(numerator, denominator);
  numerator /= divisor;
  denominator /= divisor;
  return { negative: sign === '-' && numerator !== 0n, numerator, denominator };
}

function gcd(a: bigint, b: bigint): bigint {
  let x = a;
  let y = b;
  while (y !== 0n) [x, y] = [y, x % y];
  return x === 0n ? 1n : x;
}

/** `q × multiplier` as an integer, rounded up away from zero (apimachinery `ScaledValue`). */
function roundedAwayFromZero(q: Quantity, multiplier: bigint): bigint {
  const scaled = q.numerator * multiplier;
  const quotient = scaled / q.denominator;
  const magnitude = scaled % q.denominator === 0n ? quotient : quotient + 1n;
  return q.negative ? -magnitude : magnitude;
}

/** `Quantity.Value()`: the integer value, rounded up away from zero (`0.1` ⇒ 1, `1500m` ⇒ 2). */
export function quantityValue(q: Quantity): bigint {
  return roundedAwayFromZero(q, 1n);
}

/** `Quantity.MilliValue()`: the value in thousandths, rounded up away from zero. */
export function quantityMilliValue(q: Quantity): bigint {
  return roundedAwayFromZero(q, 1000n);
}

/** A quantity as it appears in pod resources (`string`, or a number from an untyped source). */
export type QuantityInput = string | number;

function quantityText(input: QuantityInput): string {
  return typeof input === 'number' ? String(input) : input;
}

/**
 * A size for the CLI in plain bytes (docs/contracts/pod-to-vm.md "Sizes", `4Gi` ⇒ `4294967296n`). Zero,
 * negative and unparsable quantities yield `undefined` (the flag is omitted).
 */
export function parseByteSize(input: QuantityInput | undefined): bigint | undefined {
  if (input === undefined) return undefined;
  const q = parseQuantity(quantityText(input));
  if (q === undefined || q.negative) return undefined;
  const bytes = quantityValue(q);
  return bytes > 0n ? bytes : undefined;
}

/**
 * A CPU amount in millicores (`2` ⇒ `2000n`, `500m` ⇒ `500n`, `0.1m` ⇒ `1n`). Negative and
 * unparsable quantities yield `undefined`; zero stays `0n`.
 */
export function parseMillicores(input: QuantityInput | undefined): bigint | undefined {
  if (input === undefined) return undefined;
  const q = parseQuantity(quantityText(input));
  if (q === undefined || q.negative) return undefined;
  return quantityMilliValue(q);
}
