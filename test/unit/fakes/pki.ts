// A throwaway PKI for unit tests (ECDSA P-256, valid for a day): a CA and certificates it
// issues, as PEM and as @peculiar/x509 objects. Shared by the kubelet-auth and REST client tests.
import 'reflect-metadata'; // @peculiar/x509 (through tsyringe) needs the Reflect polyfill first
import { webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as never);
const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
const validity = { notBefore: new Date(Date.now() - 60_000), notAfter: new Date(Date.now() + 86_400_000) };

export interface Pair {
  cert: string;
  key: string;
  keys: webcrypto.CryptoKeyPair;
  x: x509.X509Certificate;
}

export type San = { type: 'dns' | 'ip'; value: string };

async function pair(keys: webcrypto.CryptoKeyPair, x: x509.X509Certificate): Promise<Pair> {
  const pkcs8 = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey)).toString('base64');
  const key = `-----BEGIN PRIVATE KEY-----\n${pkcs8.replace(/(.{64})/g, '$1\n').trimEnd()}\n-----END PRIVATE KEY-----\n`;
  return { cert: x.toString('pem'), key, keys, x };
}

const newKeys = async () =>
  (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;

export async function makeCa(name: string): Promise<Pair> {
  const keys = await newKeys();
  const x = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: '01',
    name,
    ...validity,
    keys,
    signingAlgorithm: alg,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
    ],
  });
  return await pair(keys, x);
}

export async function issue(
  ca: Pair,
  subject: string,
  usage: 'client' | 'server',
  sans: San[] = [],
): Promise<Pair> {
  const keys = await newKeys();
  const x = await x509.X509CertificateGenerator.create({
    serialNumber: String(Math.floor(Math.random() * 1e9)),
    subject,
    issuer: ca.x.subject,
    ...validity,
    publicKey: keys.publicKey,
    signingKey: ca.keys.privateKey,
    signingAlgorithm: alg,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([
        usage === 'client' ? x509.ExtendedKeyUsage.clientAuth : x509.ExtendedKeyUsage.serverAuth,
      ]),
      ...(sans.length > 0 ? [new x509.SubjectAlternativeNameExtension(sans)] : []),
    ],
  });
  return await pair(keys, x);
}
