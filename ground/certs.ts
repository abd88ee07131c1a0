// Certificates and keys of the test ground, shaped like a kubeadm cluster's PKI: one
// cluster CA signs the apiserver serving certificate, the apiserver's kubelet-client
// certificate and every user client certificate (controller-manager, scheduler), so a
// kubeconfig's CA is also the CA of the kubelet client. A second, rogue CA signs one
// client certificate for negative tests. Node.js cannot mint X.509 certificates, so the
// harness drives Debian's `openssl` (test-ground.md §4.2).
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { run } from './proc.ts';

export interface GroundCerts {
  /** The cluster CA (kubeadm's `ca.crt`): every kubeconfig's certificate-authority. */
  caCert: string;
  caKey: string;
  /** The apiserver serving certificate (SANs 127.0.0.1, localhost, kubernetes.default...). */
  apiserverCert: string;
  apiserverKey: string;
  /** Client certificate the apiserver presents to kubelets (CN kube-apiserver-kubelet-client). */
  kubeletClientCert: string;
  kubeletClientKey: string;
  /** kube-controller-manager's identity (CN system:kube-controller-manager). */
  controllerManagerCert: string;
  controllerManagerKey: string;
  /** kube-scheduler's identity (CN system:kube-scheduler). */
  schedulerCert: string;
  schedulerKey: string;
  /** kubeadm's front-proxy CA and the apiserver's aggregation client (CN front-proxy-client):
   * the apiserver publishes the CA as requestheader-client-ca-file, which the delegated
   * authentication of kube-controller-manager and kube-scheduler expects to find. */
  frontProxyCaCert: string;
  frontProxyClientCert: string;
  frontProxyClientKey: string;
  /** The CA nobody trusts and a client certificate it signed (negative tests). */
  rogueCaCert: string;
  rogueClientCert: string;
  rogueClientKey: string;
  saPub: string;
  saKey: string;
}

/** The apiserver serving certificate's SANs: what kubeadm puts there for a loopback node
 * (the first address of --service-cluster-ip-range is the `kubernetes` Service). */
export const APISERVER_SANS = [
  'IP:127.0.0.1',
  'IP:10.0.0.1',
  'DNS:localhost',
  'DNS:kubernetes',
  'DNS:kubernetes.default',
  'DNS:kubernetes.default.svc',
  'DNS:kubernetes.default.svc.cluster.local',
];

export async function makeCa(dir: string, name: string, cn = name): Promise<{ cert: string; key: string }> {
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
    `/CN=${cn}`,
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
    // A random serial (as CAs make them), not `-CAcreateserial`: that reads and rewrites one
    // `<ca>.srl` per CA, and certificates issued at the same time (a fleet's hosts, the worlds of
    // concurrent test files) raced on it ("Unable to load number from ca.srl").
    '-set_serial',
    randomSerial(),
    '-out',
    cert,
    '-days',
    '3650',
    '-extfile',
    ext,
  ]);
  return { cert, key };
}

/** A positive, non-zero 127-bit serial in openssl's `0x` form. */
function randomSerial(): string {
  const b = randomBytes(16);
  b[0] = ((b[0] ?? 0) & 0x7f) | 0x40;
  return `0x${b.toString('hex')}`;
}

export async function makeGroundCerts(dir: string): Promise<GroundCerts> {
  const ca = await makeCa(dir, 'ca', 'kubernetes'); // kubeadm's CA subject
  const rogueCa = await makeCa(dir, 'rogue-ca');
  const apiserver = await issueCert(dir, 'apiserver', ca, '/CN=kube-apiserver', 'serverAuth', APISERVER_SANS);
  const kubeletClient = await issueCert(
    dir,
    'kubelet-client',
    ca,
    '/O=system:masters/CN=kube-apiserver-kubelet-client',
    'clientAuth',
  );
  const controllerManager = await issueCert(
    dir,
    'controller-manager',
    ca,
    '/CN=system:kube-controller-manager',
    'clientAuth',
  );
  const scheduler = await issueCert(dir, 'scheduler', ca, '/CN=system:kube-scheduler', 'clientAuth');
  const frontProxyCa = await makeCa(dir, 'front-proxy-ca');
  const frontProxyClient = await issueCert(
    dir,
    'front-proxy-client',
    frontProxyCa,
    '/CN=front-proxy-client',
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
    apiserverCert: apiserver.cert,
    apiserverKey: apiserver.key,
    kubeletClientCert: kubeletClient.cert,
    kubeletClientKey: kubeletClient.key,
    controllerManagerCert: controllerManager.cert,
    controllerManagerKey: controllerManager.key,
    schedulerCert: scheduler.cert,
    schedulerKey: scheduler.key,
    frontProxyCaCert: frontProxyCa.cert,
    frontProxyClientCert: frontProxyClient.cert,
    frontProxyClientKey: frontProxyClient.key,
    rogueCaCert: rogueCa.cert,
    rogueClientCert: rogue.cert,
    rogueClientKey: rogue.key,
    saPub,
    saKey,
  };
}
