// The provider version string (nodeInfo.kubeletVersion, `vk-cocoon --version`).
import { readFileSync } from 'node:fs';

export const VERSION: string = (() => {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
      version?: string;
    };
    return `v${pkg.version ?? '0.0.0'}-vk-cocoon`;
  } catch {
    return 'v0.0.0-vk-cocoon';
  }
})();
