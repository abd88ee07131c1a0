// Docker credential helpers (docs/registry.md "Authentication"): which helper holds a host, and the
// docker-credential-helpers protocol run against real helper executables (shell scripts on PATH).
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { credentialHelperFor, parseHelperAnswer } from '../../../src/registry/auth.ts';
import {
  defaultCredentialSources,
  dockerConfigSource,
  isGoogleRegistryHost,
  runCredentialHelper,
  usesGoogleAdc,
} from '../../../src/registry/credentials.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('registry/credential-helpers', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vk-credhelper-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const env = { PATH: `${dir}:/usr/bin:/bin`, DOCKER_CONFIG: dir };

  /** Installs docker-credential-<name>: a script that keeps what it read and runs `body`. */
  function helper(name: string, body: string): void {
    const file = join(dir, `docker-credential-${name}`);
    writeFileSync(
      file,
      `#!/bin/sh\n[ "$1" = get ] || exit 3\nread -r host\nprintf %s "$host" > "${dir}/${name}.asked"\n${body}\n`,
    );
    chmodSync(file, 0o755);
  }

  describe('credentialHelperFor (the docker CLI order)', () => {
    const config = {
      credsStore: 'desktop',
      credHelpers: { 'gcr.test': 'gcloud', 'https://reg.test:5000/v2/': 'ecr-login' },
      auths: { 'gcr.test': {} },
    };

    it('credHelpers.<host> (exact, or once scheme and path are dropped), else credsStore, else none', () => {
      assert.equal(credentialHelperFor(config, 'gcr.test'), 'gcloud');
      assert.equal(credentialHelperFor(config, 'reg.test:5000'), 'ecr-login');
      assert.equal(credentialHelperFor(config, 'other.test'), 'desktop');
      assert.equal(credentialHelperFor({ auths: {} }, 'other.test'), undefined);
      assert.equal(credentialHelperFor({ credsStore: '' }, 'other.test'), undefined);
    });

    it('a helper name that is a path or an option is refused', () => {
      for (const bad of ['../../bin/sh', '/usr/bin/evil', '-x', 'a b', 7])
        assert.throws(() => credentialHelperFor({ credsStore: bad }, 'h'), /is not a plain program name/);
    });
  });

  describe('parseHelperAnswer', () => {
    it('Username and Secret; an identity token is refused by name', () => {
      assert.deepEqual(parseHelperAnswer('x', '{"ServerURL":"h","Username":"u","Secret":"s"}'), {
        username: 'u',
        password: 's',
      });
      assert.throws(() => parseHelperAnswer('x', 'nope'), /docker-credential-x get: the answer is not JSON/);
      assert.throws(() => parseHelperAnswer('x', '{"Username":"u"}'), /no Username and Secret/);
      assert.throws(() => parseHelperAnswer('x', '{"Username":"<token>","Secret":"r"}'), /identity token/);
    });
  });

  describe('runCredentialHelper (docker-credential-helpers protocol)', () => {
    it('`get` with the host on stdin; its JSON answer is the credential', async () => {
      helper('good', 'printf \'{"ServerURL":"%s","Username":"robot","Secret":"pw:1"}\' "$host"');
      assert.deepEqual(await runCredentialHelper('good', 'reg.test:5000', env), {
        username: 'robot',
        password: 'pw:1',
      });
      assert.equal(readFileSync(join(dir, 'good.asked'), 'utf8'), 'reg.test:5000');
    });

    it('"credentials not found" is no credential; any other failure throws with its words', async () => {
      helper('none', 'echo "credentials not found in native keychain"; exit 1');
      assert.equal(await runCredentialHelper('none', 'h', env), undefined);
      helper('broken', 'echo "keychain locked" >&2; exit 2');
      await assert.rejects(
        runCredentialHelper('broken', 'h', env),
        /docker-credential-broken get: exit status 2: keychain locked/,
      );
      await assert.rejects(
        runCredentialHelper('absent', 'h', env),
        /docker-credential-absent \(named by the docker config\) is not on PATH/,
      );
    });

    it('dockerConfigSource asks the helper the config names and lets its failure through', async () => {
      helper('store', 'printf \'{"Username":"from-store","Secret":"s"}\'');
      writeFileSync(
        join(dir, 'config.json'),
        JSON.stringify({ credsStore: 'store', credHelpers: { 'bad.test': 'broken' } }),
      );
      const source = dockerConfigSource(env);
      assert.deepEqual(await source('any.test'), { username: 'from-store', password: 's' });
      await assert.rejects(source('bad.test'), /keychain locked/);
    });
  });

  describe('which registries get Google application default credentials (VK_REGISTRY_GOOGLE_ADC)', () => {
    const key = { GOOGLE_APPLICATION_CREDENTIALS: '/etc/vk/key.json' };

    it('Google registry hosts: gcr.io, *.gcr.io, *.pkg.dev (any port); nothing that merely contains them', () => {
      for (const h of ['gcr.io', 'eu.gcr.io', 'europe-docker.pkg.dev', 'us-docker.pkg.dev:443'])
        assert.equal(isGoogleRegistryHost(h), true, h);
      for (const h of [
        'gcr.io.evil.test',
        'pkg.dev.evil.test',
        'notgcr.io',
        'registry.acme.test',
        '127.0.0.1:5000',
      ])
        assert.equal(isGoogleRegistryHost(h), false, h);
    });

    it('auto: Google hosts and only with a key file; true: any host; false: never', () => {
      assert.equal(usesGoogleAdc('auto', 'europe-docker.pkg.dev', key), true);
      assert.equal(
        usesGoogleAdc('auto', 'europe-docker.pkg.dev', {}),
        false,
        'no key: no metadata probe on a bare-metal host',
      );
      assert.equal(usesGoogleAdc('auto', 'registry.acme.test', key), false);
      assert.equal(usesGoogleAdc('true', 'registry.acme.test', {}), true);
      assert.equal(usesGoogleAdc('false', 'gcr.io', key), false);
      // The Google source goes first, before the docker config; without it only the docker config.
      assert.equal(defaultCredentialSources(key, undefined, { mode: 'auto', host: 'gcr.io' }).length, 2);
      assert.equal(
        defaultCredentialSources(key, undefined, { mode: 'auto', host: 'registry.acme.test' }).length,
        1,
      );
    });
  });
});
