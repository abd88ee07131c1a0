// The kubelet API serving certificate (docs/contracts/virtual-node.md "Serving certificate"): VK_TLS_CERT/VK_TLS_KEY when
// readable and unexpired, else a self-signed ECDSA P-256 certificate (10 years) with SANs
// for the node name, localhost, the node IP and 127.0.0.1, kept in memory. Also names
// certificates for log lines (the client CA bundle, a rejected client certificate).
// The self-signed certificate is DER-encoded here (one fixed shape, ~60 lines) and signed with
// node:crypto: a general X.509 library (@peculiar/x509 + reflect-metadata + tsyringe) cost
// ~10 MB of resident memory for this one certificate (docs/decisions.md "Daemon memory").
import { generateKeyPairSync, sign, X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { isIPv4, isIPv6 } from 'node:net';

export interface ServingCert {
  cert: string;
  key: string;
  selfSigned: boolean;
  /** Why the configured pair was not used (for the startup log). */
  reason?: string;
}

export async function loadOrCreateServingCert(
  certPath: string,
  keyPath: string,
  sans: { dns: string[]; ips: string[] },
  now = new Date(),
): Promise<ServingCert> {
  let reason: string;
  try {
    const cert = readFileSync(certPath, 'utf8');
    const key = readFileSync(keyPath, 'utf8');
    const parsed = new X509Certificate(cert);
    if (new Date(parsed.validTo) <= now) reason = `certificate ${certPath} expired on ${parsed.validTo}`;
    else return { cert, key, selfSigned: false };
  } catch (err) {
    reason = `cannot use ${certPath}/${keyPath}: ${(err as Error).message}`;
  }
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const cert = selfSignedDer({
    serial: Date.now().toString(16),
    commonName: sans.dns[0] ?? 'vk-cocoon',
    notBefore: new Date(now.getTime() - 60_000),
    notAfter: new Date(now.getTime() + 3650 * 86_400_000),
    spki: publicKey.export({ type: 'spki', format: 'der' }),
    sans,
    signTbs: (tbs) => sign('sha256', tbs, privateKey),
  });
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  return { cert: pem('CERTIFICATE', cert), key, selfSigned: true, reason };
}

// --- DER encoding of the self-signed serving certificate (RFC 5280) ---

function der(tag: number, ...content: Buffer[]): Buffer {
  const body = Buffer.concat(content);
  const n = body.length;
  const len =
    n < 0x80
      ? [n]
      : n < 0x100
        ? [0x81, n]
        : n < 0x10000
          ? [0x82, n >> 8, n & 0xff]
          : [0x83, n >> 16, (n >> 8) & 0xff, n & 0xff];
  return Buffer.concat([Buffer.from([tag, ...len]), body]);
}
const seq = (...c: Buffer[]) => der(0x30, ...c);
function oid(dotted: string): Buffer {
  const [a, b, ...rest] = dotted.split('.').map(Number) as [number, number, ...number[]];
  const bytes = [40 * a + b];
  for (const n of rest) {
    const chunk = [n & 0x7f];
    for (let v = n >>> 7; v > 0; v >>>= 7) chunk.unshift((v & 0x7f) | 0x80);
    bytes.push(...chunk);
  }
  return der(0x06, Buffer.from(bytes));
}
/** A positive INTEGER from hex digits. */
function integerHex(hex: string): Buffer {
  let b = Buffer.from(hex.length % 2 ? `0${hex}` : hex, 'hex');
  if ((b[0] as number) & 0x80) b = Buffer.concat([Buffer.from([0]), b]);
  return der(0x02, b);
}
/** UTCTime through 2049, GeneralizedTime after (RFC 5280 4.1.2.5). */
function time(d: Date): Buffer {
  const iso = d.toISOString(); // YYYY-MM-DDTHH:MM:SS.sssZ
  const digits = `${iso.slice(0, 4)}${iso.slice(5, 7)}${iso.slice(8, 10)}${iso.slice(11, 13)}${iso.slice(14, 16)}${iso.slice(17, 19)}Z`;
  return d.getUTCFullYear() < 2050 ? der(0x17, Buffer.from(digits.slice(2))) : der(0x18, Buffer.from(digits));
}
function ipBytes(ip: string): Buffer {
  if (isIPv4(ip)) return Buffer.from(ip.split('.').map(Number));
  if (!isIPv6(ip)) throw new Error(`not an IP address: ${ip}`);
  let text = ip.replace(/%.*$/, '');
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4?.[1]) {
    const [a, b, c, d] = v4[1].split('.').map(Number) as [number, number, number, number];
    text = `${text.slice(0, -v4[1].length)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const left = head ? head.split(':') : [];
  const right = tail ? tail.split(':') : [];
  const groups = [...left, ...Array(8 - left.length - right.length).fill('0'), ...right];
  const out = Buffer.alloc(16);
  for (const [i, g] of groups.entries()) out.writeUInt16BE(Number.parseInt(g, 16), i * 2);
  return out;
}
function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return seq(oid(id), ...(critical ? [der(0x01, Buffer.from([0xff]))] : []), der(0x04, value));
}
function pem(label: string, body: Buffer): string {
  const lines = body.toString('base64').match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join('\n')}\n-----END ${label}-----\n`;
}

/** A self-signed ECDSA-with-SHA256 serving certificate: CN, basicConstraints (critical, not a
 * CA), keyUsage (critical: digitalSignature, keyEncipherment), extKeyUsage serverAuth and the
 * DNS/IP subject alternative names. */
export function selfSignedDer(o: {
  serial: string;
  commonName: string;
  notBefore: Date;
  notAfter: Date;
  spki: Buffer;
  sans: { dns: string[]; ips: string[] };
  signTbs: (tbs: Buffer) => Buffer;
}): Buffer {
  const ecdsaWithSha256 = seq(oid('1.2.840.10045.4.3.2'));
  const name = seq(der(0x31, seq(oid('2.5.4.3'), der(0x0c, Buffer.from(o.commonName, 'utf8')))));
  const altNames = seq(
    ...o.sans.dns.map((d) => der(0x82, Buffer.from(d, 'ascii'))),
    ...o.sans.ips.map((ip) => der(0x87, ipBytes(ip))),
  );
  const tbs = seq(
    der(0xa0, der(0x02, Buffer.from([2]))), // v3
    integerHex(o.serial),
    ecdsaWithSha256,
    name,
    seq(time(o.notBefore), time(o.notAfter)),
    name,
    o.spki,
    der(
      0xa3,
      seq(
        extension('2.5.29.19', true, seq()),
        extension('2.5.29.15', true, der(0x03, Buffer.from([0x05, 0xa0]))),
        extension('2.5.29.37', false, seq(oid('1.3.6.1.5.5.7.3.1'))),
        extension('2.5.29.17', false, altNames),
      ),
    ),
  );
  return seq(tbs, ecdsaWithSha256, der(0x03, Buffer.concat([Buffer.from([0]), o.signTbs(tbs)])));
}

/** One-line form of a distinguished name as node:crypto prints it ("O=a\nCN=b" → "O=a, CN=b"). */
export function oneLineName(name: string): string {
  return name
    .split('\n')
    .map((part) => part.trim())
    .filter(Boolean)
    .join(', ');
}

/** Subject and issuer of a DER certificate, one line each; undefined when it does not parse. */
export function certificateNames(der: Buffer): { subject: string; issuer: string } | undefined {
  try {
    const c = new X509Certificate(der);
    return { subject: oneLineName(c.subject), issuer: oneLineName(c.issuer) };
  } catch {
    return undefined;
  }
}

/** Subjects of the certificates of a PEM bundle, in order (blocks that do not parse are skipped). */
export function bundleSubjects(pem: string): string[] {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  const out: string[] = [];
  for (const block of blocks) {
    try {
      out.push(oneLineName(new X509Certificate(block).subject));
    } catch {
      // not a certificate node:crypto can read: nothing to name
    }
  }
  return out;
}
