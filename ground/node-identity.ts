// The daemon's node identity on the test ground, made the way kubeadm makes a kubelet's: a
// client certificate of the cluster CA with CN `system:node:<node>` and O `system:nodes`, in a
// kubeconfig of its own. Every daemon runs on a node name of its own, so the certificate is
// issued per node name (once per directory; a restart reuses it). Under the ground's
// `--authorization-mode=Node,RBAC` and NodeRestriction this identity may touch only its own
// node, Lease and pods, and read only the Secrets/ConfigMaps its pods reference.
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { issueCert } from './certs.ts';
import { type ClusterState, kubeconfigYaml } from './cluster.ts';

/** The username a node identity authenticates as. */
export function nodeUser(nodeName: string): string {
  return `system:node:${nodeName}`;
}

export interface NodeCredentials {
  kubeconfig: string;
  cert: string;
  key: string;
}

/** Issues (or finds, in `dir`) the node's client certificate and writes its kubeconfig,
 * `<dir>/node-<name>.kubeconfig`. */
export async function nodeCredentials(
  cluster: ClusterState,
  nodeName: string,
  dir: string,
): Promise<NodeCredentials> {
  const pki = join(dir, 'node-pki');
  const kubeconfig = join(dir, `node-${nodeName}.kubeconfig`);
  const cert = join(pki, `node-${nodeName}.crt`);
  const key = join(pki, `node-${nodeName}.key`);
  if (existsSync(kubeconfig)) return { kubeconfig, cert, key };
  mkdirSync(pki, { recursive: true });
  await issueCert(
    pki,
    `node-${nodeName}`,
    { cert: cluster.certs.caCert, key: cluster.certs.caKey },
    `/O=system:nodes/CN=${nodeUser(nodeName)}`,
    'clientAuth',
  );
  writeFileSync(
    kubeconfig,
    kubeconfigYaml(cluster.url, cluster.certs.caCert, nodeUser(nodeName), { cert, key }),
  );
  return { kubeconfig, cert, key };
}

/** The kubeconfig path of nodeCredentials (what the daemon's KUBECONFIG is). */
export async function nodeKubeconfig(cluster: ClusterState, nodeName: string, dir: string): Promise<string> {
  return (await nodeCredentials(cluster, nodeName, dir)).kubeconfig;
}
