// The provider version string (nodeInfo.kubeletVersion, the registry user agent, `vk-cocoon
// --version`): `v<package version>-vk-cocoon+<commit>`, the commit as semver build metadata
// (12 hex digits; `.dirty` when a release was built from a tree with uncommitted changes).
//
// Where the commit comes from: a release (scripts/release.sh) bakes it in at build time as
// `release.json` next to the release's package.json, since a host has no `.git`; a checkout
// reads it from `.git` (HEAD, its ref or packed-refs: file reads only, no `git` process). With
// neither the version has no build metadata.
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** What scripts/release.sh writes into the release (lib/release.json). */
export interface ReleaseInfo {
  commit: string;
  /** The tree the release was built from had uncommitted changes to its inputs. */
  dirty: boolean;
  builtAt?: string;
  node?: string;
}

const read = (path: string): string | undefined => {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
};

/** The commit HEAD names in a git directory (a worktree's `.git` file is followed). */
export function gitHead(repo: string): string | undefined {
  let gitDir = join(repo, '.git');
  try {
    if (statSync(gitDir).isFile()) {
      const m = /^gitdir: (.+)$/m.exec(read(gitDir) ?? '');
      if (!m?.[1]) return undefined;
      gitDir = m[1].startsWith('/') ? m[1] : join(repo, m[1]);
    }
  } catch {
    return undefined;
  }
  const head = read(join(gitDir, 'HEAD'))?.trim();
  if (!head) return undefined;
  if (/^[0-9a-f]{40,64}$/.test(head)) return head;
  const ref = /^ref: (refs\/\S+)$/.exec(head)?.[1];
  if (!ref) return undefined;
  // A linked worktree keeps its HEAD but shares the refs of the main repository.
  const common = read(join(gitDir, 'commondir'))?.trim();
  const dirs = [gitDir, ...(common ? [common.startsWith('/') ? common : join(gitDir, common)] : [])];
  for (const dir of dirs) {
    const loose = read(join(dir, ref))?.trim();
    if (loose && /^[0-9a-f]{40,64}$/.test(loose)) return loose;
    for (const line of (read(join(dir, 'packed-refs')) ?? '').split('\n')) {
      const [sha, name] = line.split(' ');
      if (name === ref && sha && /^[0-9a-f]{40,64}$/.test(sha)) return sha;
    }
  }
  return undefined;
}

/** The build metadata of the version: the baked-in release commit, else the checkout's HEAD. */
export function buildCommit(root: URL): { commit: string; dirty: boolean } | undefined {
  const baked = read(fileURLToPath(new URL('release.json', root)));
  if (baked !== undefined) {
    try {
      const info = JSON.parse(baked) as Partial<ReleaseInfo>;
      if (typeof info.commit === 'string' && /^[0-9a-f]{7,64}$/.test(info.commit))
        return { commit: info.commit, dirty: info.dirty === true };
    } catch {
      // An unreadable release.json names no commit.
    }
    return undefined;
  }
  const head = gitHead(fileURLToPath(root));
  return head ? { commit: head, dirty: false } : undefined;
}

export function versionString(pkgVersion: string, build: { commit: string; dirty: boolean } | undefined) {
  const meta = build ? `+${build.commit.slice(0, 12)}${build.dirty ? '.dirty' : ''}` : '';
  return `v${pkgVersion}-vk-cocoon${meta}`;
}

export const VERSION: string = (() => {
  // The package root: the checkout, or the release's lib/ directory.
  const root = new URL('../', import.meta.url);
  let pkgVersion = '0.0.0';
  try {
    const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { version?: string };
    pkgVersion = pkg.version ?? pkgVersion;
  } catch {
    // No package.json: 0.0.0.
  }
  return versionString(pkgVersion, buildCommit(root));
})();
