// The clone-from-dir root rule (vmspec/clone-dir-roots.ts): parsing of VK_CLONE_FROM_DIR_ROOTS,
// the decision against fake resolutions, and the resolve part against a temp dir with real
// symlinks (a link inside the root pointing out of it, a root reached through a link).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import { realpath } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadConfig } from '../../../src/config/env.ts';
import {
  checkCloneDir,
  cloneDirRefusal,
  parseCloneDirRoots,
  type Realpath,
} from '../../../src/vmspec/clone-dir-roots.ts';

describe('VK_CLONE_FROM_DIR_ROOTS parsing', () => {
  it('takes comma-separated clean absolute directories, ignoring blanks and repeats', () => {
    assert.deepEqual(parseCloneDirRoots(' /srv/exports , ,/data/x,/srv/exports'), {
      roots: ['/srv/exports', '/data/x'],
      problems: [],
    });
    assert.deepEqual(parseCloneDirRoots(undefined).roots, []);
    assert.deepEqual(parseCloneDirRoots('').roots, []);
  });

  it('names every bad entry: relative, unclean, trailing slash, /', () => {
    const { roots, problems } = parseCloneDirRoots('rel/dir,/a/../b,/a/,/,/ok');
    assert.deepEqual(roots, ['/ok']);
    assert.equal(problems.length, 4);
    for (const p of problems)
      assert.match(p, /^VK_CLONE_FROM_DIR_ROOTS: ".*" is not a clean absolute directory/);
  });

  it('a bad root stops startup; unset leaves the list empty', () => {
    assert.throws(
      () => loadConfig({ VK_CLONE_FROM_DIR_ROOTS: 'exports' }),
      /VK_CLONE_FROM_DIR_ROOTS: "exports"/,
    );
    assert.deepEqual(loadConfig({}).cloneFromDirRoots, []);
    assert.deepEqual(loadConfig({ VK_CLONE_FROM_DIR_ROOTS: '/a,/b' }).cloneFromDirRoots, ['/a', '/b']);
  });
});

/** A fake file tree: path → its resolution; anything else does not exist. */
function fakeRealpath(tree: Record<string, string>): Realpath & { asked: string[] } {
  const asked: string[] = [];
  const fn = async (p: string) => {
    asked.push(p);
    const r = tree[p];
    if (r === undefined) throw Object.assign(new Error(`ENOENT: ${p}`), { code: 'ENOENT' });
    return r;
  };
  return Object.assign(fn, { asked });
}

describe('checkCloneDir (fake resolutions)', () => {
  const tree = {
    '/roots': '/roots',
    '/roots/ns-a/snap': '/roots/ns-a/snap',
    '/roots/ns-a/escape': '/etc',
    '/roots/ns-a/to-b': '/roots/ns-b/snap',
    '/roots/ns-b/snap': '/roots/ns-b/snap',
  };

  it('unset roots refuse every path and name the setting', async () => {
    const v = await checkCloneDir([], 'ns-a', '/roots/ns-a/snap', fakeRealpath(tree));
    assert.equal(v.ok, false);
    assert.match(v.ok ? '' : v.message, /disabled on this node \(VK_CLONE_FROM_DIR_ROOTS is unset\)/);
  });

  it('a path under <root>/<namespace>/ is allowed, resolved', async () => {
    assert.deepEqual(await checkCloneDir(['/roots'], 'ns-a', '/roots/ns-a/snap', fakeRealpath(tree)), {
      ok: true,
      dir: '/roots/ns-a/snap',
    });
  });

  it('another namespace, the namespace directory itself and a path outside are refused', async () => {
    for (const p of ['/roots/ns-b/snap', '/roots/ns-a', '/roots', '/etc', '/roots/ns-ab/snap']) {
      const v = await checkCloneDir(['/roots'], 'ns-a', p, fakeRealpath(tree));
      assert.equal(v.ok, false, p);
    }
  });

  it('a path outside every root is refused without touching the file system', async () => {
    const rp = fakeRealpath(tree);
    await checkCloneDir(['/nope'], 'ns-a', '/etc/shadow-exports', rp);
    assert.deepEqual(rp.asked, ['/nope'], 'only the root is resolved, never the foreign path');
  });

  it('symlinks inside the root that lead out of it, or to another namespace, are refused', async () => {
    for (const p of ['/roots/ns-a/escape', '/roots/ns-a/to-b']) {
      const v = await checkCloneDir(['/roots'], 'ns-a', p, fakeRealpath(tree));
      assert.equal(v.ok, false, p);
    }
  });

  it('a missing path and a path outside read exactly the same', async () => {
    const rp = fakeRealpath(tree);
    const missing = await checkCloneDir(['/roots'], 'ns-a', '/roots/ns-a/missing', rp);
    const outside = await checkCloneDir(['/roots'], 'ns-a', '/roots/ns-a/escape', rp);
    assert.equal(missing.ok, false);
    assert.equal(outside.ok, false);
    const text = (v: typeof missing, p: string) => (v.ok ? '' : v.message.replace(JSON.stringify(p), 'P'));
    assert.equal(text(missing, '/roots/ns-a/missing'), text(outside, '/roots/ns-a/escape'));
    assert.doesNotMatch(outside.ok ? '' : outside.message, /\/etc|exist(s|ed) |not found|no such/i);
  });

  it('the refusal names the rule and where the namespace may clone from', () => {
    const m = cloneDirRefusal(['/r1', '/r2'], 'ns-a', '/x');
    assert.match(
      m,
      /^clone-from-dir "\/x" refused: .*VK_CLONE_FROM_DIR_ROOTS, here \/r1\/ns-a\/, \/r2\/ns-a\/$/,
    );
  });

  it('a namespace that is not one path component never matches', async () => {
    for (const ns of ['', '..', 'a/b']) {
      const v = await checkCloneDir(['/roots'], ns, '/roots/ns-a/snap', fakeRealpath(tree));
      assert.equal(v.ok, false, JSON.stringify(ns));
    }
  });
});

describe('checkCloneDir (real symlinks)', () => {
  let dir: string;
  let root: string;
  before(() => {
    dir = realpathSync(mkdtempSync(join(tmpdir(), 'clone-dir-roots-')));
    root = join(dir, 'roots');
    mkdirSync(join(root, 'ns-a', 'snap'), { recursive: true });
    mkdirSync(join(root, 'ns-b', 'snap'), { recursive: true });
    mkdirSync(join(dir, 'outside', 'snap'), { recursive: true });
    symlinkSync(join(dir, 'outside', 'snap'), join(root, 'ns-a', 'escape'));
    symlinkSync(join(root, 'ns-b', 'snap'), join(root, 'ns-a', 'to-b'));
    symlinkSync(join(root, 'ns-a', 'snap'), join(root, 'ns-a', 'alias'));
    symlinkSync(root, join(dir, 'via-link'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('a real directory under the namespace is allowed', async () => {
    assert.deepEqual(await checkCloneDir([root], 'ns-a', join(root, 'ns-a', 'snap'), realpath), {
      ok: true,
      dir: join(root, 'ns-a', 'snap'),
    });
  });

  it('a link inside the namespace to inside it is allowed, and the resolved path is returned', async () => {
    assert.deepEqual(await checkCloneDir([root], 'ns-a', join(root, 'ns-a', 'alias'), realpath), {
      ok: true,
      dir: join(root, 'ns-a', 'snap'),
    });
  });

  it('links out of the root or into another namespace are refused', async () => {
    for (const p of [join(root, 'ns-a', 'escape'), join(root, 'ns-a', 'to-b')]) {
      assert.equal((await checkCloneDir([root], 'ns-a', p, realpath)).ok, false, p);
    }
  });

  it('a root configured through a symlink still works, for both spellings of the path', async () => {
    const linked = join(dir, 'via-link');
    for (const p of [join(linked, 'ns-a', 'snap'), join(root, 'ns-a', 'snap')]) {
      assert.deepEqual(await checkCloneDir([linked], 'ns-a', p, realpath), {
        ok: true,
        dir: join(root, 'ns-a', 'snap'),
      });
    }
  });
});
