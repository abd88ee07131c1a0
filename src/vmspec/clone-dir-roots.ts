// The clone-from-dir root rule (docs/contracts/annotations.md, "clone-from-dir roots"). A pod's
// `vm.cocoonstack.io/clone-from-dir` is a tenant's claim on a host path: without a rule, a
// tenant clones another tenant's snapshot export, and cocoon's error text ("no such
// directory", "snapshot.json not found") tells it which host paths exist. The rule: the path,
// with every symlink followed, lies strictly under `<root>/<pod namespace>/` for one root of
// VK_CLONE_FROM_DIR_ROOTS (each root resolved too, the namespace component not: a
// `<root>/<ns>` that is itself a symlink leads elsewhere and is refused). Unset or empty
// roots refuse every clone-from-dir, unlike the Go daemon, which accepts any path.
//
// Pure: realpath is injected (the provider passes fs.promises.realpath), so the decision is
// unit-tested with fakes as well as with real symlinks. Only the pod-facing bring-up calls
// this; clones from directories the daemon stages itself do not (ops/sources.ts).
import { posix } from 'node:path';

export const CLONE_FROM_DIR_ROOTS_ENV = 'VK_CLONE_FROM_DIR_ROOTS';

/** `realpath(3)`: the path with every symlink followed; rejects when it does not exist. */
export type Realpath = (path: string) => Promise<string>;

export type CloneDirVerdict =
  /** `dir` is the resolved path: the one cocoon is given, so a symlink swapped after the
   * check cannot redirect the clone through the path the pod wrote. */
  { readonly ok: true; readonly dir: string } | { readonly ok: false; readonly message: string };

/** A clean absolute path (what `path.posix.normalize` leaves alone, no trailing slash). */
export function isCleanAbsolute(p: string): boolean {
  if (!p.startsWith('/')) return false;
  let clean = posix.normalize(p);
  if (clean.length > 1 && clean.endsWith('/')) clean = clean.slice(0, -1);
  return clean === p;
}

/** Parses VK_CLONE_FROM_DIR_ROOTS: comma-separated clean absolute directories other than `/`
 * (a root of `/` would make `/<namespace>/` the rule, which no operator means). Empty entries
 * are ignored; duplicates are harmless. Returns the roots and one problem per bad entry. */
export function parseCloneDirRoots(value: string | undefined): {
  roots: readonly string[];
  problems: readonly string[];
} {
  const roots: string[] = [];
  const problems: string[] = [];
  for (const raw of (value ?? '').split(',')) {
    const entry = raw.trim();
    if (entry === '') continue;
    if (!isCleanAbsolute(entry) || entry === '/') {
      problems.push(
        `${CLONE_FROM_DIR_ROOTS_ENV}: ${JSON.stringify(entry)} is not a clean absolute directory other than /`,
      );
      continue;
    }
    if (!roots.includes(entry)) roots.push(entry);
  }
  return { roots, problems };
}

/** The message of every refusal. It names the rule and the places a pod of `namespace` may
 * clone from, never the outcome of the lookup: a missing path and one that resolves outside
 * the roots read the same, so the refusal reveals nothing about the host's file tree. */
export function cloneDirRefusal(roots: readonly string[], namespace: string, requested: string): string {
  const head = `clone-from-dir ${JSON.stringify(requested)} refused`;
  if (roots.length === 0) {
    return `${head}: clone-from-dir is disabled on this node (${CLONE_FROM_DIR_ROOTS_ENV} is unset); the node's operator allows it by setting ${CLONE_FROM_DIR_ROOTS_ENV}`;
  }
  const places = roots.map((r) => `${posix.join(r, namespace)}/`).join(', ');
  return `${head}: a pod clones only from an existing directory whose resolved path (symlinks followed) lies under <root>/<its namespace>/ for a root of ${CLONE_FROM_DIR_ROOTS_ENV}, here ${places}`;
}

/** True when `resolved` lies strictly below `dir` (both clean absolute paths). */
function strictlyBelow(resolved: string, dir: string): boolean {
  return resolved.startsWith(dir.endsWith('/') ? dir : `${dir}/`) && resolved.length > dir.length + 1;
}

/** A namespace usable as one path component (a Kubernetes namespace always is; anything else,
 * such as an empty string, never matches a root). */
const NAMESPACE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/**
 * The root rule for one pod: `requested` (the annotation, already an absolute clean path)
 * resolved with `realpath`, against `<realpath(root)>/<namespace>/` for each root. Every
 * failure (a missing path, a root that does not exist, an unreadable component, a resolved
 * path outside) is the same {@link cloneDirRefusal}.
 */
export async function checkCloneDir(
  roots: readonly string[],
  namespace: string,
  requested: string,
  realpath: Realpath,
): Promise<CloneDirVerdict> {
  const refused = { ok: false as const, message: cloneDirRefusal(roots, namespace, requested) };
  if (roots.length === 0 || !NAMESPACE.test(namespace) || !isCleanAbsolute(requested)) return refused;
  // Cheap lexical pre-check: a path under no root's namespace directory is refused without
  // touching the file system, so a tenant cannot even make the daemon stat foreign paths.
  if (!roots.some((r) => strictlyBelow(requested, posix.join(r, namespace)))) {
    // A root given through a symlink (`/srv` -> `/data/srv`) may still contain it once
    // resolved; only then is the file system consulted.
    const resolvedRoots = await Promise.all(roots.map((r) => realpath(r).catch(() => undefined)));
    if (!resolvedRoots.some((r) => r !== undefined && strictlyBelow(requested, posix.join(r, namespace)))) {
      return refused;
    }
  }
  let resolved: string;
  try {
    resolved = await realpath(requested);
  } catch {
    return refused;
  }
  for (const root of roots) {
    const realRoot = await realpath(root).catch(() => undefined);
    if (realRoot !== undefined && strictlyBelow(resolved, posix.join(realRoot, namespace))) {
      return { ok: true, dir: resolved };
    }
  }
  return refused;
}
