/**
 * Registry credential sources (docs/registry.md "Authentication" item 2), tried in order for a host: the docker
 * config, with its credential helpers (`credHelpers`, `credsStore`) run through the docker-credential-helpers
 * protocol; Google application default credentials first where they serve the host (see
 * {@link defaultCredentialSources}).
 */
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { Logger } from '../log.ts';
import { googleAuthPackage } from '../util/lazy-packages.ts';
import { type Credential, credentialHelperFor, dockerConfigCredential, parseHelperAnswer } from './auth.ts';

/** How long a credential helper may take to answer. */
const HELPER_TIMEOUT_MS = 15_000;
/** What a helper prints (docker-credential-helpers' `credentials.NewErrCredentialsNotFound`) when it has none. */
const NOT_FOUND = /credentials not found/i;

/**
 * `docker-credential-<helper> get` with the host on stdin (the docker-credential-helpers
 * protocol, as the docker CLI and go-containerregistry run it): its credential, `undefined` when
 * it has none for the host; any other failure (not installed, a non-zero exit, a bad answer, no
 * answer in 15 s) throws with the helper's own words. Run from PATH without a shell; the host is
 * the registry's from OCI_REGISTRY, never pod input.
 */
export function runCredentialHelper(
  helper: string,
  host: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Credential | undefined> {
  const program = `docker-credential-${helper}`;
  return new Promise((resolve, reject) => {
    const child = spawn(program, ['get'], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    // Our own deadline rather than spawn's `timeout` option: that one's timer outlives a helper
    // that never started (ENOENT), holding the process for 15 s.
    const deadline = setTimeout(() => child.kill('SIGTERM'), HELPER_TIMEOUT_MS);
    child.on('close', () => clearTimeout(deadline));
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => {
      out = (out + t).slice(0, 64 * 1024);
    });
    child.stderr.setEncoding('utf8').on('data', (t: string) => {
      err = (err + t).slice(-4096);
    });
    child.stdin.on('error', () => {}); // a helper that exits without reading
    child.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(deadline);
      reject(
        new Error(
          e.code === 'ENOENT'
            ? `${program} (named by the docker config) is not on PATH`
            : `${program}: ${e.message}`,
        ),
      );
    });
    child.on('close', (code, signal) => {
      if (code === 0) {
        try {
          resolve(parseHelperAnswer(helper, out));
        } catch (e) {
          reject(e);
        }
        return;
      }
      const said = (out.trim() || err.trim()).split('\n')[0] ?? '';
      if (code !== null && NOT_FOUND.test(said)) return resolve(undefined);
      reject(
        new Error(
          `${program} get: ${signal ? `killed (${signal}, no answer in ${HELPER_TIMEOUT_MS / 1000} s)` : `exit status ${code}`}${said ? `: ${said}` : ''}`,
        ),
      );
    });
    child.stdin.end(host);
  });
}

/** Returns the credential for a registry host (`host[:port]`), or `undefined`. */
export type CredentialSource = (host: string) => Promise<Credential | undefined>;

/** `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. */
export function dockerConfigPath(env: NodeJS.ProcessEnv = process.env): string {
  const dir = env.DOCKER_CONFIG;
  return dir !== undefined && dir !== ''
    ? join(dir, 'config.json')
    : join(homedir(), '.docker', 'config.json');
}

/**
 * Credentials from the docker config file, read at each lookup (lookups happen only when a
 * registry challenges, so a rotated file is picked up without a restart). A missing file
 * means no credential; an unreadable or malformed one is logged and means no credential. A host
 * the config gives to a credential helper is asked of that helper ({@link runCredentialHelper});
 * a failing helper fails the lookup with its reason (the registry error names it).
 */
export function dockerConfigSource(env: NodeJS.ProcessEnv = process.env, log?: Logger): CredentialSource {
  const path = dockerConfigPath(env);
  return async (host) => {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') {
        log?.warn({ path, err: (error as Error).message }, 'cannot read docker config');
      }
      return undefined;
    }
    let config: unknown;
    try {
      config = JSON.parse(text);
    } catch (error) {
      log?.warn({ path, err: (error as Error).message }, 'malformed docker config');
      return undefined;
    }
    const helper = credentialHelperFor(config, host);
    if (helper === undefined) return dockerConfigCredential(config, host);
    try {
      return await runCredentialHelper(helper, host, env);
    } catch (error) {
      log?.warn({ path, helper, host, err: (error as Error).message }, 'credential helper failed');
      throw error;
    }
  };
}

/** The first credential any source has for `host`. */
export async function lookupCredential(
  sources: readonly CredentialSource[],
  host: string,
): Promise<Credential | undefined> {
  for (const source of sources) {
    const cred = await source(host);
    if (cred) return cred;
  }
  return undefined;
}

/** `VK_REGISTRY_GOOGLE_ADC`: `auto` (Google registry hosts, when GOOGLE_APPLICATION_CREDENTIALS is set), `true`
 * (the configured registry whatever its host; any ADC source, the metadata server included), `false`. */
export type GoogleAdcMode = 'auto' | 'true' | 'false';

/** gcr.io, *.gcr.io and *.pkg.dev (Artifact Registry): the hosts go-containerregistry's Google keychain serves. */
export function isGoogleRegistryHost(host: string): boolean {
  const name = host.toLowerCase().replace(/:\d+$/, '');
  return name === 'gcr.io' || name.endsWith('.gcr.io') || name.endsWith('.pkg.dev');
}

/** Whether Google application default credentials serve `host` (pure; docs/registry.md "Authentication"). */
export function usesGoogleAdc(
  mode: GoogleAdcMode,
  host: string,
  env: NodeJS.ProcessEnv = process.env,
): boolean {
  if (mode === 'false') return false;
  if (mode === 'true') return true;
  return (env.GOOGLE_APPLICATION_CREDENTIALS ?? '') !== '' && isGoogleRegistryHost(host);
}

/** The OAuth2 scope of a registry access token (docs/registry.md "Authentication"). */
const CLOUD_PLATFORM = 'https://www.googleapis.com/auth/cloud-platform';
/** Given to google-auth-library so it never looks a project up (googleAdcSource says why). */
const UNUSED_PROJECT = 'vk-cocoon-registry-token-only';

/**
 * Google application default credentials as a registry credential: `oauth2accesstoken` and an
 * access token, which google-auth-library caches and refreshes before it expires (a service
 * account key named by GOOGLE_APPLICATION_CREDENTIALS, else gcloud's, else the metadata server).
 * The library is loaded on the first lookup. A failure fails the lookup with its reason.
 */
export function googleAdcSource(log?: Logger): CredentialSource {
  let auth: InstanceType<ReturnType<typeof googleAuthPackage>['GoogleAuth']> | undefined;
  return async (host) => {
    // A project id of our own, never used: without one the library looks the project up on
    // every new client (a shell running `gcloud config config-helper`, a Python process, where
    // gcloud is installed; then the metadata server), and a registry token needs none.
    auth ??= new (googleAuthPackage().GoogleAuth)({ scopes: [CLOUD_PLATFORM], projectId: UNUSED_PROJECT });
    try {
      const token = await auth.getAccessToken();
      if (!token) throw new Error('no access token');
      return { username: 'oauth2accesstoken', password: token };
    } catch (error) {
      log?.warn({ host, err: (error as Error).message }, 'Google application default credentials failed');
      throw new Error(`Google application default credentials: ${(error as Error).message}`, {
        cause: error,
      });
    }
  };
}

/**
 * The credential sources of the provider for a registry, in the order of docs/registry.md "Authentication":
 *
 * 1. Google application default credentials, when {@link usesGoogleAdc} says they serve its host.
 * 2. The docker config file: `credHelpers.<host>`, else `credsStore`, run as
 *    `docker-credential-<name> get`; else `auths`.
 */
export function defaultCredentialSources(
  env: NodeJS.ProcessEnv = process.env,
  log?: Logger,
  google?: { mode: GoogleAdcMode; host: string },
): CredentialSource[] {
  const docker = dockerConfigSource(env, log);
  return google && usesGoogleAdc(google.mode, google.host, env) ? [googleAdcSource(log), docker] : [docker];
}
