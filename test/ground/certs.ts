// Certificates and keys of the test ground. Node.js cannot mint X.509 certificates, so
// the harness drives Debian's `openssl` (test-ground.md §4.2).
import { generateKeyPairSync } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { run } from './proc.ts';

export interface GroundCerts {
  caCert: string;
  caKey: string;
  /** Client certificate the apiserver presents to kubelets (CN kube-apiserver-kubelet-client). */
  kubeletClientCert: string;
  kubeletClientKey: string;
  /** A client certificate signed by a CA nobody trusts (negative tests). */
  rogueClientCert: string;
  rogueClientKey: string;
  saPub: string;
  saKey: string;
}

async function makeCa(dir: string, name: string): Promise<{ cert: string; key: string }> {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  await run('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    key,
    '-out',
    cert,
    '-days',
    '3650',
    '-subj',
    `/CN=${name}`,
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  ]);
  return { cert, key };
}

/** Issues a leaf certificate signed by `ca` with the given subject and extended key usage. */
export async function issueCert(
  dir: string,
  name: string,
  ca: { cert: string; key: string },
  subject: string,
  usage: 'clientAuth' | 'serverAuth',
  sans: string[] = [],
): Promise<{ cert: string; key: string }> {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const ext = join(dir, `${name}.ext`);
  const lines = [`extendedKeyUsage=${usage}`, 'keyUsage=critical,digitalSignature,keyEncipherment'];
  if (sans.length > 0) lines.push(`subjectAltName=${sans.join(',')}`);
  writeFileSync(ext, `${lines.join('\n')}\n`);
  await run('openssl', [
    'req',
    '-new',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    key,
    '-out',
    csr,
    '-subj',
    subject,
  ]);
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    ca.cert,
    '-CAkey',
    ca.key,
    '-CAcreateserial',
    '-out',
    cert,
    '-days',
    '3650',
    '-extfile',
    ext,
  ]);
  return { cert, key };
}

export async function makeGroundCerts(dir: string): Promise<GroundCerts> {
  const ca = await makeCa(dir, 'harness-ca');
  const rogueCa = await makeCa(dir, 'rogue-ca');
  const kubeletClient = await issueCert(
    dir,
    'kubelet-client',
    ca,
    '/O=system:masters/CN=kube-apiserver-kubelet-client',
    'clientAuth',
  );
  const rogue = await issueCert(dir, 'rogue-client', rogueCa, '/O=system:masters/CN=rogue', 'clientAuth');
  const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const saPub = join(dir, 'sa.pub');
  const saKey = join(dir, 'sa.key');
  writeFileSync(saPub, publicKey.export({ type: 'spki', format: 'pem' }));
  writeFileSync(saKey, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
  return {
    caCert: ca.cert,
    caKey: ca.key,
    kubeletClientCert: kubeletClient.cert,
    kubeletClientKey: kubeletClient.key,
    rogueClientCert: rogue.cert,
    rogueClientKey: rogue.key,
    saPub,
    saKey,
  };
}
