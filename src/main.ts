// vk-cocoon entry point: `vk-cocoon [run]`, `explain <ns>/<pod>` (src/cli/explain), `--help`, `--version`.
// Start order (docs/contracts/virtual-node.md "Start order and shutdown"): configuration → client → serving certificate →
// provider (startup reconcile) → pod watch → node + Lease → kubelet API. SIGTERM/SIGINT stop
// taking work, close listeners, abort background jobs and exit 0; nothing is written to
// pods on shutdown (the next process re-derives everything).
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LEDGER_FILE, Ledger } from './authority/ledger.ts';
import { runExplain, withExplainUsage } from './cli/explain/command.ts';
import { CocoonCli } from './cocoon/runner.ts';
import { ConfigError, helpText, loadConfig } from './config/env.ts';
import { Kube, KubeConfigError, loadKubeConfig } from './kube/client.ts';
import { EventRecorder } from './kube/events.ts';
import { identityMismatch, nodeNameOf, whoAmI } from './kube/identity.ts';
import { KubeletAuthorizer } from './kubelet/auth.ts';
import { kubeletMetrics } from './kubelet/metrics.ts';
import { KubeletServer } from './kubelet/server.ts';
import { loadOrCreateServingCert } from './kubelet/tls.ts';
import { PROBE_TIMEOUT_MS } from './lifecycle/probe.ts';
import { createLogger } from './log.ts';
import { Counter, Gauge } from './metrics/prom.ts';
import { createMetrics } from './metrics/registry.ts';
import { startMetricsServer } from './metrics/server.ts';
import { IcmpProber, icmpUnavailable } from './net/icmp.ts';
import { LeaseFile } from './net/leases.ts';
import { NodeAgent } from './node/heartbeat.ts';
import { probeHost } from './node/host.ts';
import { allocatableForAdmission } from './node/node-object.ts';
import { PeerHost } from './node/peer-host.ts';
import { PodController } from './pods/controller.ts';
import { PodStatusWriter } from './pods/status-writer.ts';
import { lifecycleMetrics } from './provider/cocoon/metrics.ts';
import { CocoonProvider } from './provider/cocoon/provider.ts';
import { registryFromConfig } from './registry/client.ts';
import { RunImageImporter } from './registry/image-import.ts';
import { SnapshotPuller } from './registry/snapshot-puller.ts';
import { sweepStaleSpoolDirs } from './registry/spool-dirs.ts';
import { RegistrySnapshotStore } from './registry/store.ts';
import { attachSampler } from './stats/collect.ts';
import { statsRoutes } from './stats/routes.ts';
import { StatsSampler } from './stats/sampler.ts';
import { VERSION } from './version.ts';

async function main(argv: string[]): Promise<number> {
  const cmd = argv[0] ?? 'run';
  if (cmd === '--help' || cmd === '-h' || cmd === 'help') {
    process.stdout.write(withExplainUsage(helpText()));
    return 0;
  }
  if (cmd === '--version' || cmd === 'version') {
    process.stdout.write(`${VERSION}\n`);
    return 0;
  }
  if (cmd === 'explain') return await runExplain(argv.slice(1), process);
  if (cmd !== 'run') {
    process.stderr.write(
      `vk-cocoon: unknown command ${JSON.stringify(cmd)}\n\n${withExplainUsage(helpText())}`,
    );
    return 2;
  }

  let config: ReturnType<typeof loadConfig>;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`vk-cocoon: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  const log = createLogger(config.logLevel);
  log.info({ version: VERSION, node: config.nodeName }, 'starting vk-cocoon');
  for (const name of config.ignoredLaterTier)
    log.info({ variable: name }, 'setting belongs to a later tier; accepted and ignored');

  // A daemon must not die on a stray rejected promise: log it loudly and keep serving. Every
  // decision is re-derived by the reconcile, so nothing depends on the failed callback.
  process.on('unhandledRejection', (reason) => {
    log.error(
      { err: reason instanceof Error ? (reason.stack ?? reason.message) : String(reason) },
      'unhandled rejection',
    );
  });
  const lifetime = new AbortController();
  let access: ReturnType<typeof loadKubeConfig>;
  try {
    access = loadKubeConfig(config.kubeconfig);
  } catch (err) {
    if (!(err instanceof KubeConfigError)) throw err;
    log.fatal({ err: err.message }, 'cannot use the kubeconfig');
    return 2;
  }
  log.info({ server: access.server, from: access.source }, 'Kubernetes API');
  const kube = new Kube(access, config.kubeQps, config.kubeBurst, {
    eventQps: config.kubeEventQps,
    eventBurst: config.kubeEventBurst,
    heartbeatQps: config.kubeHeartbeatQps,
    heartbeatBurst: config.kubeHeartbeatBurst,
  });
  // Who we are decides what we may write (src/kube/identity.ts): a node identity leaves the
  // node-role labels and the taint to an administrator, and must be this node's.
  const identity = await whoAmI(kube, AbortSignal.timeout(10_000));
  if ('error' in identity)
    log.warn({ err: identity.error }, 'SelfSubjectReview failed; assuming an identity that is not a node');
  else {
    const mismatch = identityMismatch(identity, config.nodeName);
    if (mismatch) {
      log.fatal({ user: identity.username }, mismatch);
      return 1;
    }
    log.info(
      { user: identity.username, groups: identity.groups, nodeIdentity: nodeNameOf(identity) !== undefined },
      'API identity',
    );
  }
  const nodeIdentity = !('error' in identity) && nodeNameOf(identity) !== undefined;
  const host = probeHost(config.cocoonRootDir);
  const nodeIP = config.nodeIP ?? host.firstIPv4 ?? '127.0.0.1';

  const serving = await loadOrCreateServingCert(config.tlsCert, config.tlsKey, {
    dns: [config.nodeName, 'localhost'],
    ips: [...new Set([nodeIP, '127.0.0.1'])],
  });
  if (serving.selfSigned)
    log.warn({ reason: serving.reason }, 'serving the kubelet API with a self-signed certificate');
  const clientCa = config.tlsClientCA ? readFileSync(config.tlsClientCA, 'utf8') : kube.clusterCaPem();
  if (config.kubeletAuth === 'none')
    log.warn(
      { listen: config.nodeIP },
      'VK_KUBELET_AUTH=none: the kubelet API accepts any client on this loopback address (tests only)',
    );

  const cli = new CocoonCli(config.cocoonBin, lifetime.signal, log, { transferSlots: config.transferSlots });
  const metrics = createMetrics({ log, vmLabels: config.metricsVmLabels });
  const apiWrites = new Counter({
    name: 'cocoon_vk_api_writes_total',
    help: 'Kubernetes API writes made by the provider (TS addition).',
    registers: [metrics.registry],
  });
  kube.onWrite = () => apiWrites.inc();
  const events = new EventRecorder(kube, config.nodeName, log);
  const registry = registryFromConfig(config, log);
  // A push's spool or a pull's spill left by a daemon killed in the middle of one
  // (src/registry/spool-dirs.ts): removed before any transfer of this one starts.
  await sweepStaleSpoolDirs(tmpdir(), log);
  // Clone-source pulls and wake pulls count in the same pull metrics.
  const onPullDone = (result: 'ok' | 'failed', seconds: number) => {
    metrics.snapshotPull.inc({ result });
    metrics.snapshotPullDuration.observe(seconds);
  };
  const puller = registry
    ? new SnapshotPuller({
        registry,
        cli,
        log,
        budgetMiB: config.snapshotPullBudgetMiB,
        concurrency: config.snapshotTransferConcurrency,
        lifetime: lifetime.signal,
        onPullDone,
      })
    : undefined;
  const store = registry
    ? new RegistrySnapshotStore({
        registry,
        cli,
        lifetime: lifetime.signal,
        concurrency: config.snapshotTransferConcurrency,
        pullBudgetMiB: config.snapshotPullBudgetMiB,
        v2: { zstdLevel: config.snapshotZstdLevel, chunkBytes: config.snapshotChunkSizeMiB * 1024 * 1024 },
        spoolBudgetMiB: config.snapshotMemoryBudgetMiB,
        onPullDone,
      })
    : undefined;
  const imageImporter = registry
    ? new RunImageImporter({ registry, cli, log, lifetime: lifetime.signal })
    : undefined;
  if (!registry)
    log.info(
      'OCI_REGISTRY is not set: clone sources must already exist locally; hibernate saves locally only',
    );
  // The framework's status writer exists before the provider, which gets it at
  // construction: statuses published during startup are queued and written once the pod
  // controller has listed the pods.
  const status = new PodStatusWriter({ kube, log });
  // Watched while anything waits for a lease (src/net/leases.ts); closed at shutdown.
  const leases = new LeaseFile(config.leasesPath, { log });
  // The provenance ledger (docs/security.md): opened before anything is adopted; a file
  // that does not decode stops the startup.
  const ledger = await Ledger.open({
    path: join(config.stateDir, LEDGER_FILE),
    node: config.nodeName,
    log,
  });
  // Peer restore (docs/peer-restore.md): this host's snapshot server and the wakes' client;
  // the staging directory is emptied before anything could stage into it.
  const peer = new PeerHost({
    config: config.peer,
    nodeName: config.nodeName,
    kube,
    cli,
    ledger,
    stateDir: config.stateDir,
    nodeIP,
    clientCa,
    clientCert: access.cert && access.key ? { cert: access.cert, key: access.key } : undefined,
    // The host's bound; each restore is held to its registry config's file sizes below it
    // (stagedBytesBound): the largest disk a pod may have, plus 1 TiB of guest memory.
    maxStagedBytes: Number(config.maxVmStorageBytes ?? 2n ** 50n) + 2 ** 40,
    metrics: metrics.peer,
    lifetime: lifetime.signal,
    log,
  });
  try {
    await peer.start();
  } catch (err) {
    log.fatal(
      { err: err instanceof Error ? err.message : String(err) },
      'cannot start the peer server (VK_PEER_ADDR)',
    );
    return 1;
  }
  const nodeFacts = {
    config,
    host,
    nodeIP,
    version: VERSION,
    declareWebSockets: config.execWebSocket,
    nodeIdentity,
  };
  // Readiness without a probe port sends one ICMP echo (docs/decisions.md, "ICMP probes").
  const icmpGap = await icmpUnavailable({ log });
  if (icmpGap)
    log.warn(
      { reason: icmpGap },
      'no ICMP echo on this host (install fping; the unit keeps CAP_NET_RAW): pods without vm.cocoonstack.io/probe-port are ready once their IP resolves',
    );
  const icmp = icmpGap ? undefined : new IcmpProber({ timeoutMs: PROBE_TIMEOUT_MS, log });
  new Gauge({
    name: 'cocoon_vk_probe_icmp_available',
    help: '1 when probes without a probe port send ICMP echo, 0 when a resolved IP counts as reachable.',
    registers: [metrics.registry],
    collect() {
      this.set(icmp ? 1 : 0);
    },
  });
  const provider = new CocoonProvider({
    icmp: icmp ? (ip, withinMs) => icmp.probe(ip, withinMs) : undefined,
    ledger,
    status,
    // CreatePod admission counts against the figures the node object advertises.
    allocatable: allocatableForAdmission(nodeFacts),
    puller,
    store,
    imageImporter,
    // A wake asks the pushing host only when there is a registry to check its copy against.
    peer: config.peer.listen && store ? peer : undefined,
    config,
    kube,
    cli,
    events,
    metrics: lifecycleMetrics(metrics),
    leases,
    log,
    nodeIP,
    lifetime: lifetime.signal,
  });
  // Startup reconcile runs to completion before the pod controller and the node start
  // (docs/contracts/pod-to-vm.md "Startup reconcile"): adoption by VM ID and name, orphan policy, owed work.
  try {
    const pods = await kube.core.listPodForAllNamespaces({
      fieldSelector: `spec.nodeName=${config.nodeName}`,
    });
    await provider.startupReconcile(pods.items);
  } catch (err) {
    log.fatal(
      { err: err instanceof Error ? err.message : String(err) },
      'startup reconcile failed; refusing to register node',
    );
    return 1;
  }
  const controller = new PodController({ kube, nodeName: config.nodeName, provider, status, events, log });
  await controller.start();
  provider.startLoops();
  // VM deaths: the event stream, its re-check after a restart, the pid check.
  provider.startVmWatch();
  new Gauge({
    name: 'cocoon_vk_vm_table_size',
    help: 'VMs the provider tracks (bound to a pod).',
    registers: [metrics.registry],
    collect() {
      this.set(provider.trackedVms().length);
    },
  });
  const agent = new NodeAgent({
    kube,
    health: provider,
    log,
    facts: nodeFacts,
  });
  await agent.register();
  agent.start();

  const startedAt = new Date();
  const sampler = new StatsSampler(
    () =>
      provider.trackedVms().map(({ rec, vm }) => ({
        namespace: rec.pod.metadata?.namespace ?? '',
        pod: rec.pod.metadata?.name ?? '',
        uid: rec.uid,
        vmId: vm.id,
        vmName: vm.name,
        backend: vm.hypervisor,
        pid: vm.pid,
        startTime: rec.startTime ?? startedAt,
        tap: vm.nics.map((n) => n.tap).filter(Boolean),
        container: rec.pod.spec?.containers?.[0]?.name,
      })),
    { rootDir: config.cocoonRootDir, cgroupParent: config.cgroupParent, cgroupRoot: config.cgroupRoot, log },
  );
  attachSampler(metrics, sampler);
  const metricsServer = await startMetricsServer({
    addr: config.metricsAddr,
    metrics,
    log,
    debugEndpoints: config.debugEndpoints,
  });

  const kubeletCounters = kubeletMetrics(metrics.registry);
  const authorizer = new KubeletAuthorizer(kube, config.nodeName, {
    clientCa,
    log,
    onTokenReview: (result) => kubeletCounters.tokenReviews.inc({ result }),
    onThrottled: () => kubeletCounters.authThrottled.inc(),
  });
  const server = new KubeletServer({
    port: config.kubeletPort,
    // Every interface, except without authentication: then only the loopback node IP the
    // configuration insists on (src/config/env.ts), so nothing off the host reaches it.
    ...(config.kubeletAuth === 'none' ? { host: config.nodeIP } : {}),
    maxConnections: config.kubeletMaxConnections,
    onConnectionDropped: () => kubeletCounters.connectionsDropped.inc(),
    cert: serving.cert,
    key: serving.key,
    clientCa,
    authorize: config.kubeletAuth === 'none' ? undefined : (req) => authorizer.decide(req),
    provider,
    nodePods: () => controller.list(),
    runningPods: () => provider.getPods(),
    extraRoutes: statsRoutes(sampler, config.nodeName, startedAt),
    streamIdleTimeoutMs: config.streamIdleTimeoutSeconds * 1000,
    log,
  });
  await server.listen();
  log.info({ port: server.port, nodeIP }, 'kubelet API listening; node ready');

  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      log.info({ signal }, 'shutting down');
      resolve();
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
  agent.stop();
  provider.stopLoops();
  leases.close();
  events.stop();
  const closing = Promise.allSettled([
    controller.stop(),
    server.close(),
    metricsServer?.close(),
    peer.close(),
  ]);
  lifetime.abort();
  await Promise.race([closing, new Promise((r) => setTimeout(r, 10_000).unref())]);
  log.info('stopped');
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`vk-cocoon: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
