// Owns the checks of deploy/kubernetes/: every manifest parses, and what the service relies on holds
// (host PID namespace, probe paths that are real routes on the right port, setting names from the
// settings table, the state mount, the token Secret, the image's UID, metrics discovery). The
// example shard's hook scripts are run with bash against a live nodecompute, as kubelet would run
// them in the pod: registration, the readiness probe in each state, and removal.
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import { chmodSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { basename, join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import t, { type Test } from 'tap';
import { parseAllDocuments } from 'yaml';
import { TOKEN_FILE_CHECK_MS } from '../../src/auth.js';
import { readStartTokens, resolveConfig, SETTINGS, tokenProblem, type Config } from '../../src/config.js';
import { RegisterShardSchema } from '../../src/schemas/shards.js';
import { ENGINES } from '../../src/shards/shard.js';
import { createProcReader, type ProcReader } from '../../src/system/procfs.js';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { createFakeNvidiaSmi, eightGpuNode, waitUntil, type FakeGpu } from '../helpers/fake-nvidia-smi.js';
import { readSample } from '../helpers/samples.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const DIR = join(ROOT, 'deploy/kubernetes');
const SCRAPE_CONFIG = 'prometheus-scrape-config.yaml';

// Parsed YAML is untyped by nature; each check says what it expects to find.
type Doc = any;

const files = readdirSync(DIR).filter((name) => name.endsWith('.yaml')).sort();
/** Every document of a file; an empty stream is no documents. Manifests are read as YAML 1.1, as
 *  kubectl reads them (0440 is octal, `yes` is a boolean); the scrape config as Prometheus does. */
function documents(name: string) {
  const docs = parseAllDocuments(readFileSync(join(DIR, name), 'utf8'), { version: name === SCRAPE_CONFIG ? '1.2' : '1.1' });
  return Array.isArray(docs) ? docs : [];
}
const parsed = new Map(files.map((name) => [name, documents(name)] as const));
const objects: Array<Doc & { file: string }> = files
  .filter((name) => name !== SCRAPE_CONFIG)
  .flatMap((name) => (parsed.get(name) ?? []).map((doc) => ({ ...(doc.toJS() as Doc), file: name })));

function find(kind: string, name?: string, file?: string): Doc {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata?.name === name) && (file === undefined || o.file === file));
  if (found.length !== 1) throw new Error(`expected one ${kind}${name ? ` ${name}` : ''}${file ? ` in ${file}` : ''}, found ${found.length}`);
  return found[0];
}

const daemonSet = find('DaemonSet', 'nodecompute');
const pod = daemonSet.spec.template.spec;
const container = pod.containers.find((c: Doc) => c.name === 'nodecompute');
const envOf = (c: Doc): Map<string, Doc> => new Map((c.env ?? []).map((e: Doc) => [e.name, e]));
const dsEnv = envOf(container);
const httpPort = container.ports.find((p: Doc) => p.name === 'http');
const stateFile: string = dsEnv.get('NODECOMPUTE_STATE_FILE')?.value;
const tokenFile: string = dsEnv.get('NODECOMPUTE_TOKEN_FILE')?.value;
const imageUid = Number(/^USER\s+(\d+)/m.exec(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))?.[1]);

const shardObjects = 'example-shard-deployment.yaml';
const shardDeployment = find('Deployment', undefined, shardObjects);
const shardPod = shardDeployment.spec.template.spec;
const llama = shardPod.containers[0];
const llamaEnv = envOf(llama);
const hooks = find('ConfigMap', undefined, shardObjects);

async function appWithRoutes(t: Test) {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  return app;
}

/** The DaemonSet's literal env values, with the token file pointed at `tokenPath`. */
function daemonSetEnv(tokenPath: string): Record<string, string> {
  return Object.fromEntries(
    [...dsEnv].filter(([, e]) => e.value !== undefined).map(([name, e]) => [name, name === 'NODECOMPUTE_TOKEN_FILE' ? tokenPath : String(e.value)]),
  );
}

/** A loopback port that was just listened on and closed: nothing answers there. */
async function closedPort(): Promise<number> {
  const closed = createServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const { port } = closed.address() as { port: number };
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  return port;
}

t.test('every manifest parses: all documents, no errors or warnings', async (t) => {
  t.ok(files.length >= 6, files.join(', '));
  for (const [name, docs] of parsed) {
    t.ok(docs.length > 0, `${name} has documents`);
    for (const doc of docs) {
      t.same(doc.errors.map(String), [], `${name}: no errors`);
      t.same(doc.warnings.map(String), [], `${name}: no warnings`);
      t.ok(doc.toJS(), `${name}: no empty document`);
    }
  }
  for (const o of objects) {
    t.ok(o.apiVersion && o.kind && o.metadata?.name, `${o.file}: ${o.kind}/${o.metadata?.name} has apiVersion, kind, name`);
    if (o.kind !== 'Namespace') t.ok(o.metadata.namespace, `${o.file}: ${o.kind}/${o.metadata.name} names its namespace`);
  }
});

t.test('the DaemonSet runs in the host PID namespace on GPU nodes, with the NVIDIA runtime', async (t) => {
  t.equal(daemonSet.metadata.namespace, 'nodecompute');
  t.equal(pod.hostPID, true, 'hostPID: nvidia-smi reports host PIDs');
  t.equal(pod.enableServiceLinks, false, "no Service sets NODECOMPUTE_PORT to a service link's tcp:// address");
  t.equal(pod.runtimeClassName, 'nvidia');
  t.equal(dsEnv.get('NVIDIA_VISIBLE_DEVICES')?.value, 'all');
  t.match(dsEnv.get('NVIDIA_DRIVER_CAPABILITIES')?.value, /(^|,)(utility|all)(,|$)/);
  t.equal(pod.nodeSelector?.['nvidia.com/gpu.present'], 'true');
  t.ok(pod.tolerations.some((tol: Doc) => tol.key === 'nvidia.com/gpu' && tol.effect === 'NoSchedule'), 'tolerates the GPU taint');
  t.equal(pod.priorityClassName, 'system-node-critical');
  const quota = find('ResourceQuota');
  t.equal(quota.metadata.namespace, daemonSet.metadata.namespace);
  t.ok(
    quota.spec.scopeSelector.matchExpressions.some(
      (e: Doc) => e.scopeName === 'PriorityClass' && e.operator === 'In' && e.values.includes(pod.priorityClassName),
    ),
    'a quota scoped to the priority class admits it outside kube-system',
  );
  const resources = [...(pod.initContainers ?? []), ...pod.containers].map((c: Doc) => c.resources ?? {});
  t.notOk(resources.some((r: Doc) => r.requests?.['nvidia.com/gpu'] ?? r.limits?.['nvidia.com/gpu']), 'takes no GPU away from the shards');
  t.same(container.args, ['serve']);
});

t.test('port and probes: real routes on the container port, which is the default port and the hostPort', async (t) => {
  // The app as the DaemonSet configures it, so its probe budget is the deployed one.
  const dir = t.testdir({ token: 'x'.repeat(40) });
  const settings: Partial<Config> = resolveConfig(daemonSetEnv(join(dir, 'token')), ['serve']).config;
  for (const key of ['nvidiaSmi', 'stateFile', 'token', 'tokenFile', 'logLevel'] as const) delete settings[key];
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: settings });
  const port = Number(dsEnv.get('NODECOMPUTE_PORT')?.value ?? SETTINGS.port.default);
  t.equal(httpPort.containerPort, port, 'containerPort is the port the service listens on');
  t.equal(httpPort.containerPort, SETTINGS.port.default);
  t.ok(pod.hostNetwork === true || httpPort.hostPort === httpPort.containerPort, 'reachable at status.hostIP:9470 (hostPort)');
  for (const [probe, path] of [
    ['livenessProbe', '/livez'],
    ['readinessProbe', '/readyz'],
  ] as const) {
    const get = container[probe]?.httpGet;
    t.equal(get?.path, path, `${probe} asks ${path}`);
    t.ok(get.port === 'http' || get.port === port, `${probe} uses the http port`);
    t.ok(app.hasRoute({ method: 'GET', url: path }), `${path} is a route`);
  }
  const timeoutMs = (container.readinessProbe.timeoutSeconds ?? 1) * 1000;
  t.ok(app.services.probeBudgetMs < timeoutMs, `/readyz answers within ${app.services.probeBudgetMs} ms, under the probe's ${timeoutMs} ms`);
});

t.test('every NODECOMPUTE_* name in the manifests is a setting', async (t) => {
  const known = new Set<string>(Object.values(SETTINGS).map((setting) => setting.env));
  const used = objects.flatMap((o) => {
    const spec = o.spec?.template?.spec;
    return spec ? [...(spec.initContainers ?? []), ...spec.containers].flatMap((c: Doc) => (c.env ?? []).map((e: Doc) => e.name as string)) : [];
  });
  const ours = used.filter((name) => name.startsWith('NODECOMPUTE_'));
  t.ok(ours.length >= 3, ours.join(', '));
  for (const name of ours) t.ok(known.has(name), `${name} is in SETTINGS`);
});

t.test("the DaemonSet's settings are accepted by the service", async (t) => {
  const dir = t.testdir({ token: 'x'.repeat(40) });
  const { config: settings, positionals } = resolveConfig(daemonSetEnv(join(dir, 'token')), container.args);
  const config = await readStartTokens(settings);
  t.equal(config.stateFile, stateFile);
  t.equal(config.token, 'x'.repeat(40), 'the token is read from the file');
  t.same(positionals, ['serve']);
});

t.test('the state directory: a hostPath mounted at the state file directory, owned by the image user', async (t) => {
  const dir = posix.dirname(stateFile);
  const mount = container.volumeMounts.find((m: Doc) => m.mountPath === dir);
  t.ok(mount, `a volume is mounted at ${dir}`);
  t.notOk(mount.readOnly, 'writable');
  const volume = pod.volumes.find((v: Doc) => v.name === mount.name);
  t.equal(volume.hostPath?.path, '/var/lib/nodecompute', 'registrations survive the pod');
  t.equal(volume.hostPath?.type, 'DirectoryOrCreate');
  const owner = (pod.initContainers ?? []).find((c: Doc) => (c.volumeMounts ?? []).some((m: Doc) => m.name === mount.name));
  t.ok(owner, 'an initContainer prepares it');
  t.same(owner.command, ['chown', `${imageUid}:${imageUid}`, dir], 'chowned to the UID the service runs as');
  t.equal(owner.securityContext.runAsUser, 0);
  t.same(owner.securityContext.capabilities, { drop: ['ALL'], add: ['CHOWN'] }, 'with CAP_CHOWN only');
  t.equal(owner.image, container.image, 'the same image: no extra pull');
});

t.test('the token: a Secret file read through NODECOMPUTE_TOKEN_FILE', async (t) => {
  t.notOk(dsEnv.has('NODECOMPUTE_TOKEN'), 'not also as a plain variable (the service refuses both)');
  const mount = container.volumeMounts.find((m: Doc) => m.mountPath === posix.dirname(tokenFile));
  t.ok(mount?.readOnly, 'mounted read-only');
  const volume = pod.volumes.find((v: Doc) => v.name === mount.name);
  const secret = find('Secret', volume.secret.secretName, 'secret.example.yaml');
  t.equal(secret.metadata.namespace, daemonSet.metadata.namespace);
  const item = volume.secret.items.find((i: Doc) => i.path === basename(tokenFile));
  t.ok(item, `the file ${basename(tokenFile)} is projected`);
  // A placeholder anyone can read must never become a cluster's write token.
  t.match(tokenProblem(secret.stringData[item.key]), /placeholder of deploy\/kubernetes\/secret\.example\.yaml/, 'the example token is refused, if applied by mistake');
  const shardSecret = find('Secret', volume.secret.secretName, shardObjects);
  t.match(tokenProblem(shardSecret.stringData.token), /placeholder of deploy\/kubernetes\/secret\.example\.yaml/, "so is the shard namespace's copy");
  t.equal(pod.securityContext.fsGroup, imageUid, 'fsGroup makes the secret file readable with defaultMode 0440');
  t.equal(volume.secret.defaultMode, 0o440, 'read by the owner and group only');
});

t.test('securityContext: non-root with the image UID, read-only root, no capabilities', async (t) => {
  const sc = container.securityContext;
  t.equal(sc.runAsNonRoot, true);
  t.equal(sc.runAsUser, imageUid, `the Dockerfile's USER ${imageUid}`);
  t.equal(pod.securityContext.runAsUser, imageUid);
  t.equal(sc.readOnlyRootFilesystem, true);
  t.equal(sc.allowPrivilegeEscalation, false);
  t.same(sc.capabilities, { drop: ['ALL'] }, 'reading /proc of other users needs no capability');
  t.notOk(sc.privileged);
  t.equal(pod.automountServiceAccountToken, false, 'no Kubernetes API token');
});

function cpu(value: string | number): number {
  return typeof value === 'number' ? value * 1000 : value.endsWith('m') ? Number(value.slice(0, -1)) : Number(value) * 1000;
}

function mebibytes(value: string): number {
  const units: Record<string, number> = { Ki: 1 / 1024, Mi: 1, Gi: 1024 };
  const match = /^(\d+)(Ki|Mi|Gi)$/.exec(value);
  if (!match) throw new Error(`unexpected memory quantity ${value}`);
  return Number(match[1]) * (units[match[2] as string] as number);
}

t.test('resources: small requests and limits', async (t) => {
  const { requests, limits } = container.resources;
  t.ok(cpu(requests.cpu) <= cpu(limits.cpu) && cpu(limits.cpu) <= 1000, `cpu ${requests.cpu}..${limits.cpu}`);
  t.ok(mebibytes(requests.memory) <= mebibytes(limits.memory) && mebibytes(limits.memory) <= 512, `memory ${requests.memory}..${limits.memory}`);
});

t.test('the headless Service and the ServiceMonitor find every pod on /metrics', async (t) => {
  const app = await appWithRoutes(t);
  const service = find('Service', 'nodecompute');
  const podLabels = daemonSet.spec.template.metadata.labels;
  t.equal(service.spec.clusterIP, 'None', 'headless: one endpoint per node, scraped on its own');
  for (const [key, value] of Object.entries(service.spec.selector)) t.equal(podLabels[key], value, `selector ${key}`);
  const servicePort = service.spec.ports[0];
  t.equal(servicePort.targetPort, httpPort.name);
  t.equal(servicePort.port, httpPort.containerPort);

  const monitor = find('ServiceMonitor');
  t.equal(monitor.apiVersion, 'monitoring.coreos.com/v1');
  for (const [key, value] of Object.entries(monitor.spec.selector.matchLabels)) t.equal(service.metadata.labels[key], value, `selects the Service by ${key}`);
  t.ok(monitor.spec.namespaceSelector.matchNames.includes(service.metadata.namespace));
  const endpoint = monitor.spec.endpoints[0];
  t.equal(endpoint.port, servicePort.name);
  t.equal(endpoint.path, '/metrics');
  t.ok(app.hasRoute({ method: 'GET', url: endpoint.path }), '/metrics is a route');
});

/** Prometheus relabeling, as far as the scrape config uses it (keep, drop, replace). */
function relabel(labels: Record<string, string>, rules: Doc[]): Record<string, string> | null {
  const out = { ...labels };
  for (const rule of rules) {
    const value = (rule.source_labels ?? []).map((name: string) => out[name] ?? '').join(rule.separator ?? ';');
    const regex = new RegExp(`^(?:${rule.regex ?? '(.*)'})$`);
    const action = rule.action ?? 'replace';
    if (action === 'keep' && !regex.test(value)) return null;
    if (action === 'drop' && regex.test(value)) return null;
    if (action === 'replace') {
      const match = regex.exec(value);
      if (match) out[rule.target_label] = String(rule.replacement ?? '$1').replace(/\$(\d+)/g, (_, i: string) => match[Number(i)] ?? '');
    }
  }
  return out;
}

t.test('the plain scrape config keeps the nodecompute pods and labels them by node', async (t) => {
  const app = await appWithRoutes(t);
  const config = parsed.get(SCRAPE_CONFIG)?.[0]?.toJS() as Doc;
  const job = config.scrape_configs.find((j: Doc) => j.job_name === 'nodecompute');
  t.equal(job.kubernetes_sd_configs[0].role, 'pod');
  t.ok(job.kubernetes_sd_configs[0].namespaces.names.includes(daemonSet.metadata.namespace));
  t.ok(app.hasRoute({ method: 'GET', url: job.metrics_path }), `${job.metrics_path} is a route`);
  const target = (labels: Record<string, string>, portName: string) => ({
    ...Object.fromEntries(Object.entries(labels).map(([k, v]) => [`__meta_kubernetes_pod_label_${k.replace(/[^A-Za-z0-9_]/g, '_')}`, v])),
    __meta_kubernetes_pod_container_port_name: portName,
    __meta_kubernetes_pod_node_name: 'gpu-node-7',
    __meta_kubernetes_pod_name: 'nodecompute-x1',
    __meta_kubernetes_namespace: 'nodecompute',
  });
  const kept = relabel(target(daemonSet.spec.template.metadata.labels, httpPort.name), job.relabel_configs);
  t.equal(kept?.node, 'gpu-node-7', 'the nodecompute pod is scraped, labelled with its node');
  t.equal(relabel(target({ 'app.kubernetes.io/name': 'llama-server' }, 'http'), job.relabel_configs), null, 'other pods are dropped');
  t.equal(relabel(target(daemonSet.spec.template.metadata.labels, 'other'), job.relabel_configs), null, 'other ports are dropped');
});

t.test('the example shard: one GPU, downward API, and hooks that use the real API', async (t) => {
  const app = await appWithRoutes(t);
  t.equal(Number(llama.resources.limits['nvidia.com/gpu']), 1);
  t.equal(llamaEnv.get('NODE_IP')?.valueFrom?.fieldRef?.fieldPath, 'status.hostIP');
  t.equal(llamaEnv.get('POD_NAME')?.valueFrom?.fieldRef?.fieldPath, 'metadata.name');
  t.equal(llamaEnv.get('POD_UID')?.valueFrom?.fieldRef?.fieldPath, 'metadata.uid');
  t.equal(Number(llamaEnv.get('NODECOMPUTE_PORT')?.value), httpPort.hostPort, "nodecompute's hostPort");
  t.equal(Number(llamaEnv.get('LLAMA_ARG_PORT')?.value), llama.ports.find((p: Doc) => p.name === 'http').containerPort);
  // The token is a file the hooks read at each call: an env var would keep the old token after a rotation.
  t.notOk(llamaEnv.has('NODECOMPUTE_TOKEN'), 'the token is not an env var (never updated in a running pod)');
  const shardTokenFile: string = llamaEnv.get('NODECOMPUTE_TOKEN_FILE')?.value;
  const tokenMount = llama.volumeMounts.find((m: Doc) => m.mountPath === posix.dirname(shardTokenFile));
  t.ok(tokenMount?.readOnly, `the Secret is mounted read-only at ${posix.dirname(shardTokenFile)}`);
  t.notOk(tokenMount.subPath, 'the whole volume, not a subPath (which the kubelet never updates)');
  const tokenVolume = shardPod.volumes.find((v: Doc) => v.name === tokenMount.name).secret;
  t.ok(tokenVolume.items.some((i: Doc) => i.key === 'token' && i.path === posix.basename(shardTokenFile)), 'the key token is the file the hooks read');
  const secret = find('Secret', tokenVolume.secretName, shardObjects);
  t.equal(secret.metadata.namespace, shardDeployment.metadata.namespace, 'the token Secret is in the shard namespace');
  t.ok(secret.stringData.token);

  const mount = llama.volumeMounts.find((m: Doc) => shardPod.volumes.some((v: Doc) => v.name === m.name && v.configMap?.name === hooks.metadata.name));
  const script = (name: string) => [`bash`, posix.join(mount.mountPath, name)];
  t.same(llama.readinessProbe.exec.command, script('ready.sh'), 'the readiness probe is an exec of ready.sh');
  t.same(llama.lifecycle.postStart.exec.command, script('register.sh'));
  t.same(llama.lifecycle.preStop.exec.command, script('deregister.sh'));
  t.same(llama.command, script('run-engine.sh'), "llama-server runs under run-engine.sh, which sends its log (the image's entrypoint is replaced, its args kept)");
  for (const name of ['http.sh', 'ready.sh', 'register.sh', 'deregister.sh', 'run-engine.sh', 'engine-log.sh']) t.ok(hooks.data[name], `the ConfigMap holds ${name}`);
  t.match(hooks.data['run-engine.sh'], /exec "\$\{ENGINE_BINARY:-\/app\/llama-server\}" "\$@" /, "the engine is the image's entrypoint, with the container's args");
  t.match(hooks.data['engine-log.sh'], /POST "\/shards\/\$POD_NAME\/engine-output"/);
  t.ok(app.hasRoute({ method: 'POST', url: '/shards/:id/engine-output' }));

  t.match(hooks.data['ready.sh'], /GET "\/shards\/\$POD_NAME\/ready"/, 'the probe asks /shards/<its own id>/ready');
  t.ok(app.hasRoute({ method: 'GET', url: '/shards/:id/ready' }));
  t.match(hooks.data['register.sh'], /PUT "\/shards\/\$POD_NAME"/);
  t.ok(app.hasRoute({ method: 'PUT', url: '/shards/:id' }));
  t.match(hooks.data['deregister.sh'], /DELETE "\/shards\/\$POD_NAME"/);
  const body = /body="(\{.*\})"/.exec(hooks.data['register.sh'])?.[1] ?? '';
  const keys = [...body.matchAll(/\\"(\w+)\\":/g)].map((m) => m[1] as string);
  t.same(keys.slice(0, 3), ['cgroup', 'gpus', 'engine'], `the registration body ${body}`);
  for (const key of keys) t.ok(key in RegisterShardSchema.properties, `"${key}" is a property of RegisterShardSchema`);
  t.ok((ENGINES as readonly string[]).includes(/\\"engine\\":\\"([^\\]+)\\"/.exec(body)?.[1] ?? ''), 'engine llama.cpp is known');
});

interface HookResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `script` with bash to its end, as kubelet runs a hook (30 s at most). */
function runBash(script: string, env: Record<string, string | undefined>): Promise<HookResult> {
  return new Promise((resolve) => {
    execFile('bash', [script], { env, timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? Number((err as { code?: number }).code ?? -1) : 0, stdout, stderr });
    });
  });
}

t.test('the hook scripts, run by bash against a live nodecompute', async (t) => {
  const TOKEN = 'k8s-example-token-0123456789abcdef';
  // Characters a shell would expand or glob if the hooks let it: they must reach the header as they are.
  const NEW_TOKEN = 'k8s-rotated!$HOME*?\'"\\-fedcba9876543210';
  const POD_NAME = 'llama-server-5d8c7b9f4-x2k8q';
  const POD_UID = randomUUID();
  const dir = t.testdir({ hooks: hooks.data, 'container-smi': {}, 'stranger-smi': {}, node: { token: `${TOKEN}\n` }, pod: { token: `${TOKEN}\n` } });
  /** Replaces a token file with a rename, as the kubelet updates a mounted Secret. */
  const publish = (which: 'node' | 'pod', content: string) => {
    writeFileSync(join(dir, which, 'token.new'), content);
    renameSync(join(dir, which, 'token.new'), join(dir, which, 'token'));
  };
  const shard = await spawnShardProcess(t, 1);
  const engine = shard.members[0] as number;

  // The pod's processes are found by its UID in /proc/PID/cgroup; here they are the test's shard group.
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const podPids = (needle: string) => (needle === POD_UID ? [shard.pid, engine] : []);
  const proc: ProcReader = {
    ...real,
    findPidsInCgroup: async (needle) => podPids(needle),
    findPidsInCgroups: async (needles) => new Map(needles.map((needle) => [needle, podPids(needle)])),
  };
  const gpu = (index: number, uuid: string): FakeGpu => ({ index, uuid, name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 0, freeMiB: 143157 });
  const hostGpus = [gpu(0, 'GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb'), gpu(1, 'GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90')];
  const { app, fake } = await buildTestApp(t, {
    scenario: { gpus: hostGpus, processes: [] },
    config: { token: TOKEN, tokenFile: join(dir, 'node', 'token'), fileTokens: [TOKEN] },
    deps: { proc },
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const port = (app.server.address() as { port: number }).port;

  // Inside the container nvidia-smi sees only the pod's GPU, as GPU 0.
  const inContainer = createFakeNvidiaSmi(join(dir, 'container-smi'), { gpus: [gpu(0, hostGpus[1]!.uuid)], processes: [] });
  const stranger = createFakeNvidiaSmi(join(dir, 'stranger-smi'), { gpus: [gpu(0, 'GPU-00000000-0000-0000-0000-000000000000')], processes: [] });

  let llamaStatus = 200;
  const llamaServer: Server = createServer((request, response) => {
    response.statusCode = request.url === '/health' ? llamaStatus : 404;
    response.end(JSON.stringify({ status: llamaStatus === 200 ? 'ok' : 'loading model' }));
  });
  await new Promise<void>((resolve) => llamaServer.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => llamaServer.close(() => resolve())));
  const llamaPort = (llamaServer.address() as { port: number }).port;

  const hook = (name: string, env: Record<string, string> = {}, smi = inContainer.dir) =>
    runBash(join(dir, 'hooks', name), {
      PATH: `${smi}:${process.env.PATH}`,
      NODE_IP: '127.0.0.1',
      NODECOMPUTE_PORT: String(port),
      NODECOMPUTE_TOKEN_FILE: join(dir, 'pod', 'token'),
      POD_NAME,
      POD_UID,
      LLAMA_ARG_PORT: String(llamaPort),
      SHARD_GRACE_MS: '60000',
      REGISTER_ATTEMPTS: '2',
      ...env,
    });

  /** Runs a hook as kubelet runs a probe, every 200 ms, until `done` says so or 20 s pass. */
  async function probeUntil(name: string, done: (result: HookResult) => boolean): Promise<HookResult> {
    const giveUpAt = Date.now() + 20_000;
    for (;;) {
      const result = await hook(name);
      if (done(result) || Date.now() > giveUpAt) return result;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  await t.test('before registration the probe fails and says why', async (t) => {
    const result = await hook('ready.sh');
    t.equal(result.code, 1);
    t.match(result.stdout, new RegExp(`shard ${POD_NAME} is not registered with nodecompute on 127\\.0\\.0\\.1`));
  });

  await t.test('registration with a wrong token is refused, with the reason', async (t) => {
    const wrong = join(dir, 'wrong-token');
    writeFileSync(wrong, 'not-the-token-of-this-node\n');
    const result = await hook('register.sh', { NODECOMPUTE_TOKEN_FILE: wrong });
    t.equal(result.code, 1);
    t.match(result.stdout, /refused the registration .* \(HTTP 401\): .*bearer token does not match/);
  });

  await t.test('a token file the pod cannot read fails the registration at once, saying so', async (t) => {
    const result = await hook('register.sh', { NODECOMPUTE_TOKEN_FILE: join(dir, 'no-such-secret', 'token') });
    t.equal(result.code, 1);
    t.match(result.stdout, /^cannot read the token file .*no-such-secret\/token, so the registration cannot carry a token: is the nodecompute-token Secret mounted there/);
    t.equal(result.stderr, '', 'no bash noise');
  });

  await t.test('a GPU nodecompute does not see is not registered', async (t) => {
    const result = await hook('register.sh', {}, stranger.dir);
    t.equal(result.code, 1);
    t.match(result.stdout, /GPU GPU-00000000-0000-0000-0000-000000000000 of this container is not among the GPUs nodecompute sees/);
  });

  await t.test('postStart registers the pod by UID on the host index of its GPU', async (t) => {
    // A rotation under way: the pod's Secret already has "old + new" (with a comment), its node only
    // the old. The newest is sent first, refused, then the older one is.
    publish('pod', `# rotated by ops\n ${TOKEN} \r\n\n${NEW_TOKEN}\n`);
    const result = await hook('register.sh');
    t.equal(result.code, 0, result.stdout + result.stderr);
    t.match(result.stdout, `registered shard ${POD_NAME} on GPU 1`);
    const record = (await app.inject({ method: 'GET', url: `/shards/${POD_NAME}` })).json();
    t.match(record, { id: POD_NAME, pid: null, cgroup: POD_UID, gpus: [1], engine: 'llama.cpp', graceMs: 60_000 });
    t.equal(record.identity.pgid, shard.pid);
  });

  await t.test('the probe fails while the shard holds no memory on its GPU, with nodecompute\'s reason', async (t) => {
    const result = await hook('ready.sh');
    t.equal(result.code, 1);
    t.match(result.stdout, new RegExp(`nodecompute says shard ${POD_NAME} is not ready \\(HTTP 503\\): .*"state":"starting"`));
  });

  await t.test('the probe passes once its process holds memory on the GPU', async (t) => {
    fake.update((s) => {
      s.processes.push({ gpuUuid: hostGpus[1]!.uuid, pid: engine, name: '/app/llama-server', usedMiB: 20_480 });
    });
    const result = await probeUntil('ready.sh', (r) => r.code === 0);
    t.equal(result.code, 0, result.stdout + result.stderr);
    t.equal(result.stdout, '');
  });

  await t.test('the probe fails while llama-server itself is not healthy', async (t) => {
    llamaStatus = 503;
    const result = await hook('ready.sh');
    llamaStatus = 200;
    t.equal(result.code, 1);
    t.match(result.stdout, /llama-server is not healthy yet \(HTTP 503\): .*loading model/);
  });

  await t.test('after a rotation the pod has not received yet, preStop says NOT deregistered (HTTP 401) and fails; once the file is updated, it removes the shard', async (t) => {
    // The node's Secret ends the rotation ("new") while the pod's file still holds the old token.
    publish('node', `${NEW_TOKEN}\n`);
    publish('pod', `${TOKEN}\n`);
    // The node looks at its token file at most once a second, at a write.
    await new Promise((resolve) => setTimeout(resolve, TOKEN_FILE_CHECK_MS + 100));
    const stale = await hook('deregister.sh');
    t.equal(stale.code, 1, 'the hook fails, so the FailedPreStopHook event carries why');
    t.match(stale.stdout, new RegExp(`^NOT deregistered: shard ${POD_NAME} \\(HTTP 401: token rotated\\? no token in .*pod/token is accepted by nodecompute on this node\\): .*does not match`));
    t.match(stale.stdout, `It stays registered, and reads exited once the pod is gone, until DELETE /shards/${POD_NAME} is sent`);
    t.notMatch(stale.stdout, /^deregistered/m);
    t.equal((await app.inject({ method: 'GET', url: `/shards/${POD_NAME}` })).statusCode, 200, 'still registered');

    // The kubelet updates the pod's file: the hook reads it at its next call, no restart needed.
    publish('pod', `${NEW_TOKEN}\n`);
    const first = await hook('deregister.sh');
    t.equal(first.code, 0, first.stdout);
    t.equal(first.stdout, `deregistered shard ${POD_NAME} (HTTP 204)\n`);
    t.equal((await app.inject({ method: 'GET', url: `/shards/${POD_NAME}` })).statusCode, 404);
    const again = await hook('deregister.sh');
    t.equal(again.code, 0);
    t.equal(again.stdout, `deregistered shard ${POD_NAME} (HTTP 404: it was not registered)\n`);
  });

  await t.test('preStop when nodecompute does not answer: NOT deregistered, saying so', async (t) => {
    const deadPort = await closedPort();
    const result = await hook('deregister.sh', { NODECOMPUTE_PORT: String(deadPort) });
    t.equal(result.code, 1);
    t.match(result.stdout, new RegExp(`^NOT deregistered: shard ${POD_NAME} \\(cannot connect to 127\\.0\\.0\\.1:${deadPort}\\)\n`));
    t.equal(result.stderr, '');
  });

  await t.test('when nodecompute does not answer, the probe passes on llama-server\'s health and says it is unverified', async (t) => {
    const deadPort = await closedPort();
    const result = await hook('ready.sh', { NODECOMPUTE_PORT: String(deadPort) });
    t.equal(result.code, 0, 'a node agent that is down is no evidence against the shard');
    t.match(result.stdout, new RegExp(`^unverified: nodecompute on this node \\(127\\.0\\.0\\.1:${deadPort}\\) does not answer .*so ready on llama-server's own health`));
    t.equal(result.stderr, '', 'no bash noise in the probe output');
  });

});

/**
 * Runs bash with `args` as a container runtime would start its command, in a process group of its
 * own, which the test's teardown kills whole: an engine left behind by a failed assertion (a child of
 * run-engine.sh) must not outlive the test. Its output is read and dropped unless `keep` says which
 * stream the test reads itself: an unread pipe would fill and hold the engine up.
 */
function startContainer(t: Test, args: string[], env: Record<string, string | undefined>, keep: Array<'stdout' | 'stderr'> = []) {
  const container = spawn('bash', args, { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  for (const stream of ['stdout', 'stderr'] as const) if (!keep.includes(stream)) container[stream].resume();
  t.teardown(() => {
    try {
      process.kill(-(container.pid as number), 'SIGKILL');
    } catch {
      // The group is gone already.
    }
  });
  return container;
}

/** A test directory with the example's hooks, `files`, and engine.sh: bash running `engine`, the stand-in for llama-server. */
function engineDir(t: Test, engine: string[], files: Record<string, string | Record<string, never>> = {}): string {
  const dir = t.testdir({ hooks: hooks.data, ...files, 'engine.sh': ['#!/bin/bash', ...engine].join('\n') });
  chmodSync(join(dir, 'engine.sh'), 0o755);
  return dir;
}

/** What the example's container gives run-engine.sh, with nodecompute on loopback `port` and the spool in `dir`. */
function engineEnv(dir: string, port: number, podName: string, more: Record<string, string> = {}): Record<string, string | undefined> {
  return { PATH: process.env.PATH, NODE_IP: '127.0.0.1', NODECOMPUTE_PORT: String(port), POD_NAME: podName, ENGINE_BINARY: join(dir, 'engine.sh'), TMPDIR: dir, ...more };
}

/** The spool directories run-engine.sh made in `dir` that are still there. */
const spools = (dir: string) => readdirSync(dir).filter((name) => name.startsWith('engine-log.'));

/** A listening nodecompute where `podName` is registered already (a process of the test's, on GPU 0): engine-log.sh's posts are taken at once. */
async function nodecomputeWithShard(t: Test, podName: string) {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const shard = await spawnShardProcess(t, 0);
  t.equal((await app.inject({ method: 'PUT', url: `/shards/${podName}`, payload: { pid: shard.pid, gpus: [0], engine: 'llama.cpp' } })).statusCode, 201);
  return { app, port: (app.server.address() as { port: number }).port };
}

t.test("run-engine.sh: llama-server gets the container's signals and gives it its exit status and whole stderr, and nodecompute gets its start-up log, so the probe says why it is on the CPU", async (t) => {
  const POD_NAME = 'llama-cpu-7c9d5';
  const POD_UID = randomUUID();
  const TOKEN = 'k8s-engine-log-token-0123456789';
  // A llama-server whose CUDA backend did not load (a real b9692 log), then its "model loaded" line,
  // then a request log line, which is not sent. It prints its PID on stdout; on SIGTERM it says so,
  // and its last words, and exits 7.
  const startup = `${readSample('llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt')}0.06.041.657 I srv  llama_server: model loaded\n`;
  const request = '0.09.000.001 I srv  log_server_r: request: GET /health 127.0.0.1 200\n';
  const dir = engineDir(
    t,
    [
      'trap \'echo "engine: SIGTERM" >&2; sleep 0.2; echo "engine: last words" >&2; exit 7\' TERM',
      'echo "engine pid $$"',
      'cat "$(dirname "$0")/startup.log" >&2',
      'cat "$(dirname "$0")/request.log" >&2',
      'while :; do sleep 0.1; done',
    ],
    { 'container-smi': {}, 'startup.log': startup, 'request.log': request, token: `${TOKEN}\n` },
  );
  let enginePid = 0;
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  // The pod's processes: run-engine.sh (the container's first process) and llama-server.
  const podPids = (needle: string) => (needle === POD_UID && enginePid > 0 ? [container.pid as number, enginePid] : []);
  const proc: ProcReader = {
    ...real,
    findPidsInCgroup: async (needle) => podPids(needle),
    findPidsInCgroups: async (needles) => new Map(needles.map((needle) => [needle, podPids(needle)])),
  };
  const gpu: FakeGpu = { index: 0, uuid: 'GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90', name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 0, freeMiB: 143157 };
  const { app } = await buildTestApp(t, { scenario: { gpus: [gpu], processes: [] }, config: { token: TOKEN }, deps: { proc } });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const inContainer = createFakeNvidiaSmi(join(dir, 'container-smi'), { gpus: [gpu], processes: [] });
  const env = engineEnv(dir, (app.server.address() as { port: number }).port, POD_NAME, {
    PATH: `${inContainer.dir}:${process.env.PATH}`,
    NODECOMPUTE_TOKEN_FILE: join(dir, 'token'),
    POD_UID,
    ENGINE_LOG_PAUSE_S: '0.2',
  });

  // The container starts: run-engine.sh starts the engine. postStart runs beside it, so the first
  // posts find no shard (404) and are sent again once it is registered.
  const container = startContainer(t, [join(dir, 'hooks', 'run-engine.sh'), '--model', '/models/model.gguf'], env, ['stdout', 'stderr']);
  let stdout = '';
  let stderr = '';
  container.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  container.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => container.on('exit', (code) => resolve(code)));
  await waitUntil(() => stdout.includes('\n'), { what: 'the engine to start', timeoutMs: 20_000 });
  enginePid = Number(/^engine pid (\d+)\n$/.exec(stdout)?.[1]);
  t.equal((await real.readStat(enginePid))?.ppid, container.pid, "llama-server is a child of run-engine.sh, which stays the container's first process");

  const register = await runBash(join(dir, 'hooks', 'register.sh'), { ...env, REGISTER_ATTEMPTS: '2' });
  t.equal(register.code, 0, register.stdout + register.stderr);
  const ready = async () => (await app.inject({ method: 'GET', url: `/shards/${POD_NAME}/ready` })).json();
  // The sender posts every 0.2 s; a loaded machine may take seconds.
  const giveUpAt = Date.now() + 20_000;
  while ((await ready()).cause !== 'engine-gpu-backend-failed' && Date.now() < giveUpAt) await new Promise((resolve) => setTimeout(resolve, 100));
  t.match(await ready(), { state: 'on-cpu', reason: /^placed on GPU 0 but computing on the CPU: .*device_info: - CPU : 13th Gen Intel/ });
  // Only the start-up log was sent: one more byte posted makes the tail the start-up's bytes and one.
  const more = await app.inject({ method: 'POST', url: `/shards/${POD_NAME}/engine-output`, payload: '\n', headers: { 'content-type': 'text/plain', authorization: `Bearer ${TOKEN}` } });
  t.equal(more.json().tailBytes, Buffer.byteLength(startup) + 1, 'up to "model loaded" and no further: request logs are not sent');

  container.kill('SIGTERM');
  t.equal(await exited, 7, "the engine got the signal and its exit status is the container's");
  t.equal(stderr, `${startup}${request}engine: SIGTERM\nengine: last words\n`, "the container log has the engine's whole stderr, its last words too, and nothing else");
});

t.test('engine-log.sh never holds up the engine: once it gives up on nodecompute, the engine still writes its stderr through it; SIGINT reaches the engine', async (t) => {
  const dir = engineDir(
    t,
    [
      'trap \'echo "engine: SIGINT" >&2; exit 3\' INT',
      'cat "$(dirname "$0")/startup.log" >&2',
      'until [ -e "$(dirname "$0")/go" ]; do sleep 0.05; done',
      // 2 MiB more: past the pipe's buffer many times over, and past what is ever sent.
      'head -c 2097152 /dev/zero | tr "\\0" x >&2',
      ': >"$(dirname "$0")/written"',
      'while :; do sleep 0.05; done',
    ],
    { 'startup.log': 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n' },
  );
  const env = engineEnv(dir, await closedPort(), 'llama-lonely', { ENGINE_LOG_PAUSE_S: '0.1', ENGINE_LOG_ATTEMPTS: '2' });
  const container = startContainer(t, [join(dir, 'hooks', 'run-engine.sh')], env, ['stderr']);
  let stderr = '';
  container.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => container.on('exit', (code) => resolve(code)));
  await waitUntil(() => stderr.includes('gave up'), { what: 'engine-log.sh to give up', timeoutMs: 20_000 });
  t.match(stderr, /nodecompute engine-log: gave up sending llama-server's log to nodecompute at 127\.0\.0\.1:\d+ after 2 tries \(last: HTTP 000 cannot connect to 127\.0\.0\.1:\d+\): shard llama-lonely is judged by its GPU memory alone\./);
  writeFileSync(join(dir, 'go'), '');
  await waitUntil(() => readdirSync(dir).includes('written'), { what: 'the engine to write 2 MiB', timeoutMs: 20_000 });
  // bash starts a background command with SIGINT ignored unless it traps it: run-engine.sh passes it on.
  container.kill('SIGINT');
  t.equal(await exited, 3, 'the engine got SIGINT, and its exit status is the container\'s');
  t.equal(
    stderr.replace(/nodecompute engine-log: .*\n/, ''),
    `ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n${'x'.repeat(2_097_152)}engine: SIGINT\n`,
    'every byte of its stderr reached the container log',
  );
  t.same(spools(dir), [], 'no spool is left behind');
});

t.test('engine-log.sh sends 256 KiB at most, the tail nodecompute keeps: lines past it are not sent', async (t) => {
  const POD_NAME = 'llama-chatty-9e1d0';
  // 2,700 lines of 100 bytes (past 256 KiB at line 2,622), then a CUDA failure, which is not sent.
  const filler = Array.from({ length: 2700 }, (_, i) => `srv  filler: ${String(i).padStart(4, '0')} ${'x'.repeat(81)}`).join('\n');
  const dir = engineDir(t, ['cat "$(dirname "$0")/filler.log" >&2', 'while :; do sleep 0.05; done'], {
    'filler.log': `${filler}\nggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n`,
  });
  const { app, port } = await nodecomputeWithShard(t, POD_NAME);
  const container = startContainer(t, [join(dir, 'hooks', 'run-engine.sh')], engineEnv(dir, port, POD_NAME, { ENGINE_LOG_PAUSE_S: '0.1' }));
  const exited = new Promise<number | null>((resolve) => container.on('exit', (code) => resolve(code)));
  // The sender removes its spool once it has sent all the reader kept.
  await waitUntil(() => spools(dir).length > 0, { what: 'the spool', timeoutMs: 20_000 });
  await waitUntil(() => spools(dir).length === 0, { what: 'the sender to finish', timeoutMs: 30_000 });
  const more = await app.inject({ method: 'POST', url: `/shards/${POD_NAME}/engine-output`, payload: '\n', headers: { 'content-type': 'text/plain' } });
  t.match(more.json(), { account: null, note: /^Nothing in the output kept so far says where llama\.cpp computes/ }, 'the CUDA failure past 256 KiB was not sent');
  t.ok(more.json().tailBytes > 250_000, `the filler was (${more.json().tailBytes} bytes kept)`);
  container.kill('SIGTERM');
  t.equal(await exited, 143, 'the engine ended by the SIGTERM passed on');
});

t.test('an engine that ends before its model loads: the lines that say why reach nodecompute before the container ends', async (t) => {
  const POD_NAME = 'llama-crash-4f2b1';
  const failed = 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected';
  const dir = engineDir(t, [`echo '${failed}' >&2`, "echo 'error: failed to load model' >&2", 'exit 1']);
  const { app, port } = await nodecomputeWithShard(t, POD_NAME);
  // The sender looks every second: the engine has ended long before its second look.
  const run = await runBash(join(dir, 'hooks', 'run-engine.sh'), engineEnv(dir, port, POD_NAME, { ENGINE_LOG_PAUSE_S: '1' }));
  t.same([run.code, run.stderr], [1, `${failed}\nerror: failed to load model\n`], "the engine's status and its whole stderr");
  const compute = (await app.inject({ method: 'GET', url: `/shards/${POD_NAME}/compute` })).json();
  t.match(compute.engine, { backend: 'CPU', evidence: failed }, 'posted before the container ended, where its other processes would have been killed');
  t.same(spools(dir), [], 'no spool is left behind');
});

t.test('the hook scripts over IPv6: NODE_IP fd00::1 is written [fd00::1]:9470 in the Host header (RFC 9110) and in what they print', async (t) => {
  const dir = t.testdir({ hooks: hooks.data });
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const hosts: string[] = [];
  app.addHook('onRequest', async (request) => {
    hosts.push(String(request.headers.host));
  });
  // :: takes IPv6 and IPv4 alike (listen.ts), as the DaemonSet's default does.
  await app.listen({ host: '::', port: 0 });
  const port = (app.server.address() as { port: number }).port;
  const llamaServer: Server = createServer((_request, response) => response.end('{"status":"ok"}'));
  await new Promise<void>((resolve) => llamaServer.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => llamaServer.close(() => resolve())));
  const hook = (name: string, nodeIp: string, nodecomputePort: number) =>
    runBash(join(dir, 'hooks', name), {
      PATH: process.env.PATH,
      NODE_IP: nodeIp,
      NODECOMPUTE_PORT: String(nodecomputePort),
      POD_NAME: 'llama-v6',
      LLAMA_ARG_PORT: String((llamaServer.address() as { port: number }).port),
    });

  const v6 = await hook('ready.sh', '::1', port);
  t.match(v6.stdout, /^shard llama-v6 is not registered with nodecompute on ::1/, 'nodecompute answered the request');
  t.same(hosts, [`[::1]:${port}`], 'an IPv6 address is bracketed in the Host header');
  hosts.length = 0;
  await hook('deregister.sh', '127.0.0.1', port);
  t.same(hosts, [`127.0.0.1:${port}`], 'an IPv4 address is not');

  await app.close();
  const down = await hook('ready.sh', '::1', port);
  t.equal(down.code, 0);
  t.equal(down.stdout, `unverified: nodecompute on this node ([::1]:${port}) does not answer (cannot connect to [::1]:${port}), so ready on llama-server's own health. Is its DaemonSet pod running here?\n`);
  t.equal(down.stderr, '');
});
