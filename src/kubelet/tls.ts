// The kubelet API serving certificate (docs/contracts/virtual-node.md "Serving certificate"): VK_TLS_CERT/VK_TLS_KEY when
// readable and unexpired, else a self-signed ECDSA P-256 certificate (10 years) with SANs
// for the node name, localhost, the node IP and 127.0.0.1, kept in memory. Also names
// certificates for log lines (the client CA bundle, a rejected client certificate).
import 'reflect-metadata'; // @peculiar/x509 (through tsyringe) needs the Reflect polyfill first
import { webcrypto, X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as never);

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
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
  const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const names = [
    ...sans.dns.map((value) => ({ type: 'dns' as const, value })),
    ...sans.ips.map((value) => ({ type: 'ip' as const, value })),
  ];
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: Date.now().toString(16),
    name: `CN=${sans.dns[0] ?? 'vk-cocoon'}`,
    notBefore: new Date(now.getTime() - 60_000),
    notAfter: new Date(now.getTime() + 3650 * 86_400_000),
    keys,
    signingAlgorithm: alg,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(
        x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment,
        true,
      ),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(names),
    ],
  });
  const pkcs8 = await webcrypto.subtle.exportKey('pkcs8', keys.privateKey);
  const key = `-----BEGIN PRIVATE KEY-----\n${Buffer.from(pkcs8)
    .toString('base64')
    .replace(/(.{64})/g, '$1\n')
    .trimEnd()}\n-----END PRIVATE KEY-----\n`;
  return { cert: cert.toString('pem'), key, selfSigned: true, reason };
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
