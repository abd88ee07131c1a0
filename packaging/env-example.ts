// Generates packaging/vk-cocoon.env.example, the systemd EnvironmentFile of vk-cocoon.service,
// from the daemon's own settings table (src/config/settings.ts: the rows that also drive the
// parser, `--help` and the README table of scripts/config-table.ts), one section per group, so the example
// can never miss a variable or show a stale default. scripts/release.sh writes a fresh copy
// into every release; test/integration/release.test.ts fails when the committed file differs.
//   node packaging/env-example.ts           print it
//   node packaging/env-example.ts --write   rewrite packaging/vk-cocoon.env.example
import { readFileSync, writeFileSync } from 'node:fs';
import { docGroups, ENV_DOCS } from '../src/config/settings.ts';

/** `A, B and C`. */
const list = (names: readonly string[]) =>
  names.length < 2 ? names.join('') : `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;

const HEADER = `# /etc/vk-cocoon/vk-cocoon.env: the environment of vk-cocoon.service (EnvironmentFile=).
#
# Generated from the daemon's settings table (src/config/settings.ts) by
# packaging/env-example.ts: every variable vk-cocoon knows, by group, each commented out with
# its default. Uncomment a line to set it. A default in parentheses is computed at startup:
# leave the line commented (or empty) to get it. For every variable an empty value means the
# default, except ${list(ENV_DOCS.filter((d) => d.emptyIsValue).map((d) => d.name))}, where it disables.
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
  const sections = docGroups().map((g) => {
    const blocks = g.docs.map((d) => {
      const computed = d.default.startsWith('(');
      return [
        `# ${d.meaning}`,
        ...(computed ? [`# default: ${d.default.slice(1, -1)}`] : []),
        `#${d.name}=${computed ? '' : d.default}`,
      ].join('\n');
    });
    return [`# ==== ${g.title} ====`, ...blocks].join('\n\n');
  });
  return `${HEADER}\n${sections.join('\n\n')}\n`;
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
