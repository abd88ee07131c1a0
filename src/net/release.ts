// DHCP lease release over the cocoon-net control socket (docs/contracts/cocoon-cli.md "Lease release",
// docs/contracts/cocoon-cli.md "Lease release"): `DELETE /v1/leases/<mac>` over HTTP/1.1 on a Unix socket. 204 means
// released or nothing to release. Best effort with a 5 s timeout that no caller can cancel;
// failures are logged and counted, lease expiry is the fallback.
// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const { request } = process.getBuiltinModule('node:http');

export type ReleaseResult = 'released' | 'disabled' | 'failed';

export function releaseLease(
  socketPath: string,
  mac: string,
  timeoutMs = 5000,
): Promise<{ result: ReleaseResult; detail?: string }> {
  if (socketPath === '') return Promise.resolve({ result: 'disabled' });
  return new Promise((resolve) => {
    const req = request(
      {
        socketPath,
        method: 'DELETE',
        path: `/v1/leases/${encodeURIComponent(mac.toLowerCase())}`,
        timeout: timeoutMs,
      },
      (res) => {
        res.resume();
        res.on('end', () =>
          resolve(
            res.statusCode === 204
              ? { result: 'released' }
              : { result: 'failed', detail: `HTTP ${res.statusCode}` },
          ),
        );
      },
    );
    req.on('timeout', () => req.destroy(new Error(`timeout after ${timeoutMs} ms`)));
    req.on('error', (err) => resolve({ result: 'failed', detail: err.message }));
    req.end();
  });
}
