// Generates packaging/vk-cocoon.env.example, the systemd EnvironmentFile of vk-cocoon.service,
// from the daemon's own configuration table (ENV_DOCS in src/config/env.ts: the rows that also
// drive the parser, `--help` and the README table of scripts/config-table.ts), so the example
// can never miss a variable or show a stale default. scripts/release.sh writes a fresh copy
// into every release; test/integration/release.test.ts fails when the committed file differs.
//   node packaging/env-example.ts           print it
//   node packaging/env-example.ts --write   rewrite packaging/vk-cocoon.env.example
import { readFileSync, writeFileSync } from 'node:fs';
import { ENV_DOCS } from '../src/config/env.ts';

const HEADER = `# /etc/vk-cocoon/vk-cocoon.env: the environment of vk-cocoon.service (EnvironmentFile=).
#
# Generated from the daemon's configuration table (src/config/env.ts) by
# packaging/env-example.ts: every variable vk-cocoon reads, each commented out with its
# default. Uncomment a line to set it. A default in parentheses is computed at startup:
# leave the line commented (or empty) to get it. For every variable an empty value means the
# default, except VK_METRICS_ADDR and VK_COCOON_NET_CONTROL_SOCKET, where it disables.
# A bad value stops the daemon at startup with a message naming the variable.
#
# Syntax (systemd.exec(5), EnvironmentFile=): NAME=value, one per line, no \`export\`; quote a
# value that has spaces.
#
# A host sets at least KUBECONFIG (the node identity system:node:<VK_NODE_NAME>, see
# deploy/rbac.yaml), VK_NODE_NAME and VK_NODE_IP; OCI_REGISTRY for clone sources and
# hibernation; VK_TLS_CERT/VK_TLS_KEY for a serving certificate the cluster trusts
# (docs/operations.md).
#
# Not daemon configuration: NODE_COMPILE_CACHE (the launcher's V8 code cache; by default the
# unit's CacheDirectory, /var/cache/vk-cocoon) and NODE_OPTIONS (extra Node.js flags).
`;

export function envExample(): string {
  const blocks = ENV_DOCS.map((d) => {
    const computed = d.default.startsWith('(');
    return [
      `# ${d.meaning}`,
      ...(computed ? [`# default: ${d.default.slice(1, -1)}`] : []),
      `#${d.name}=${computed ? '' : d.default}`,
    ].join('\n');
  });
  return `${HEADER}\n${blocks.join('\n\n')}\n`;
}

export const ENV_EXAMPLE_PATH = new URL('vk-cocoon.env.example', import.meta.url);

if (import.meta.main) {
  if (process.argv.includes('--write')) {
    const text = envExample();
    let old = '';
    try {
      old = readFileSync(ENV_EXAMPLE_PATH, 'utf8');
    } catch {
      // First write.
    }
    if (old !== text) writeFileSync(ENV_EXAMPLE_PATH, text);
  } else {
    process.stdout.write(envExample());
  }
}
