/**
 * The `Authorization` header of every request (docs/registry.md "Authentication"): anonymous
 * first; the registry's 401 challenge ({@link RegistryAuthorization.challenged}) selects Bearer
 * (a token per repository and action set, cached until shortly before expiry, fetched with Basic
 * credentials when a source has them; concurrent fetches for one key shared) or Basic. No
 * credential goes over plain HTTP to a non-loopback host. The pure parts (challenge parsing,
 * token URL and answer, the plain-HTTP rule) are auth.ts.
 */
import type { Logger } from '../log.ts';
import { VERSION } from '../version.ts';
import {
  basicAuthorization,
  type Challenge,
  type Credential,
  parseTokenResponse,
  plainHttpCredentialRefusal,
  repositoryScope,
  tokenExpiresAt,
  tokenUrl,
} from './auth.ts';
import { type CredentialSource, lookupCredential } from './credentials.ts';
import { RegistryError, type RegistryResponse, readBody, statusError } from './errors.ts';
import type { RegistryBase } from './reference.ts';

const MAX_TOKEN_BODY = 1024 * 1024;

interface CachedToken {
  readonly token: string;
  readonly expiresAt: number;
}

/** One body-less HTTP exchange on the registry's agents (the token request). */
export type SendRequest = (
  url: URL,
  method: string,
  headers: Readonly<Record<string, string>>,
  signal: AbortSignal | undefined,
  body: undefined,
) => Promise<RegistryResponse>;

function tokenKey(repository: string, actions: readonly string[]): string {
  return `${repository}|${[...actions].sort().join(',')}`;
}

export class RegistryAuthorization {
  readonly #base: RegistryBase;
  readonly #credentials: readonly CredentialSource[];
  readonly #log: Logger;
  readonly #send: SendRequest;
  /** The registry's last challenge; drives pre-emptive auth on later requests. */
  #challenge: Challenge | undefined;
  readonly #tokens = new Map<string, CachedToken>();
  readonly #tokenFetches = new Map<string, Promise<string>>();

  constructor(opts: {
    readonly base: RegistryBase;
    readonly credentials: readonly CredentialSource[];
    readonly log: Logger;
    readonly send: SendRequest;
  }) {
    this.#base = opts.base;
    this.#credentials = opts.credentials;
    this.#log = opts.log;
    this.#send = opts.send;
  }

  /** The registry answered a request for `repository` and `actions` with `challenge` (a 401):
   * later requests follow it, and the token sent with that request (if any) is dropped. */
  challenged(challenge: Challenge, repository: string, actions: readonly string[]): void {
    this.#challenge = challenge;
    this.#tokens.delete(tokenKey(repository, actions)); // the one we sent (if any) was refused
  }

  /** Throws when a credential would go over plain HTTP to a non-loopback host (auth.ts). */
  #refusePlainHttp(scheme: string, host: string, what: string): void {
    const refusal = plainHttpCredentialRefusal(scheme, host, what);
    if (refusal === undefined) return;
    this.#log.error({ host, rule: 'no credentials over plain HTTP to a non-loopback host' }, refusal);
    throw new RegistryError('auth', refusal);
  }

  /** The Authorization header for a request, per the last challenge (none before any 401). */
  async authorization(
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string | undefined> {
    const challenge = this.#challenge;
    if (!challenge) return undefined;
    if (challenge.scheme === 'basic') {
      const cred = await this.#credential();
      if (!cred) return undefined;
      this.#refusePlainHttp(this.#base.scheme, this.#base.host, 'Basic credentials');
      return basicAuthorization(cred);
    }
    return `Bearer ${await this.#token(challenge, repository, actions, signal)}`;
  }

  /** The registry's credential from the sources; a source that fails (a credential helper) is an auth error naming it. */
  async #credential(): Promise<Credential | undefined> {
    try {
      return await lookupCredential(this.#credentials, this.#base.host);
    } catch (error) {
      throw new RegistryError('auth', `credentials for ${this.#base.host}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  /** A cached or freshly fetched bearer token; concurrent fetches for one key are shared. */
  async #token(
    challenge: Challenge,
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string> {
    const key = tokenKey(repository, actions);
    const cached = this.#tokens.get(key);
    if (cached && cached.expiresAt > Date.now()) return cached.token;
    const running = this.#tokenFetches.get(key);
    if (running) return await running;
    const fetching = this.#fetchToken(challenge, repository, actions, signal).finally(() => {
      this.#tokenFetches.delete(key);
    });
    this.#tokenFetches.set(key, fetching);
    return await fetching;
  }

  async #fetchToken(
    challenge: Challenge,
    repository: string,
    actions: readonly string[],
    signal?: AbortSignal,
  ): Promise<string> {
    let url: URL;
    try {
      url = tokenUrl(challenge, repositoryScope(repository, actions));
    } catch (error) {
      throw new RegistryError('auth', `registry ${this.#base.host}: ${(error as Error).message}`);
    }
    if (repository === '') url.searchParams.delete('scope');
    if (url.protocol === 'http:' && this.#base.scheme === 'https') {
      throw new RegistryError('auth', `token realm ${url.host} is plain HTTP for an HTTPS registry; refused`);
    }
    const cred = await this.#credential();
    if (cred) {
      // Neither the credential to the realm nor the token it buys to the registry over plain
      // HTTP to a non-loopback host. An anonymous token (no credential) carries no secret of
      // ours and is not refused.
      this.#refusePlainHttp(url.protocol, url.host, `token realm ${url.host}`);
      this.#refusePlainHttp(this.#base.scheme, this.#base.host, 'a bearer token obtained with credentials');
    }
    const headers: Record<string, string> = {
      'user-agent': `vk-cocoon/${VERSION}`,
      accept: 'application/json',
    };
    if (cred) headers.authorization = basicAuthorization(cred);
    const res = await this.#send(url, 'GET', headers, signal, undefined);
    if (res.statusCode !== 200) throw await statusError(res, `token from ${url.host}${url.pathname}`, 'auth');
    let token: string;
    let expiresInSeconds: number;
    try {
      ({ token, expiresInSeconds } = parseTokenResponse(
        (await readBody(res, MAX_TOKEN_BODY, 'token')).toString('utf8'),
      ));
    } catch (error) {
      if (error instanceof RegistryError) throw error;
      throw new RegistryError('auth', `token from ${url.host}${url.pathname}: ${(error as Error).message}`);
    }
    this.#tokens.set(tokenKey(repository, actions), {
      token,
      expiresAt: tokenExpiresAt(Date.now(), expiresInSeconds),
    });
    this.#log.debug(
      { repository, actions, expiresInSeconds, authenticated: cred !== undefined },
      'registry token',
    );
    return token;
  }
}
