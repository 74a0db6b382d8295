// Runs the cpu overlay as local processes and serves a chat request through it: the proof that
// the manifests' command lines, environment, ports and probes are the ones the binary serves.
//
// It renders overlays/cpu with `kubectl kustomize`, writes a random k3-tiny checkpoint (with its
// tokenizer) as the shared model volume, and starts every pod of every Deployment and StatefulSet
// (all replicas): first its init containers, in order, to completion, then its containers, each
// with the container's exact command and args (the image's entrypoint is the k3serve binary) and
// environment (the ConfigMaps' envFrom, env, $(VAR) expansion as the kubelet does it). What a
// cluster provides is mapped, and only that:
//   - each pod gets a loopback address of its own (127.0.0.x) as its IP: status.podIP, and a
//     wildcard listen address (0.0.0.0) binds it, as in the pod's network namespace;
//   - Service names resolve to the pods they select: a ClusterIP Service's name to one of them, a
//     headless Service's `dns:///` target to every one (the front's --server list);
//   - the pod's interface (UCX_NET_DEVICES=eth0) is the loopback interface;
//   - each volume mount is a folder: the PVC the checkpoint folder, an emptyDir a folder of the pod,
//     a ConfigMap or a Secret its keys as files (the Secrets the overlay needs get test values).
// Then it waits for every container's startup, liveness and readiness probes to pass (gRPC
// health checks, HTTP GETs, TCP connections, on the pod's address and the probe's port), sends
// `GET /v1/models` and a chat completion through the k3serve-http Service's http port (its
// targetPort on a front pod) with the bearer token, checks the answer, and stops every process
// with SIGTERM.
//
//   cd k8s && npm ci && node simulate.mjs     (K3SERVE_SIMULATE_VERBOSE=1 prints each command line)
// Needs kubectl and the k3serve binary ($K3SERVE, else ../bazel-bin/k3serve); without either it
// says so and skips.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const k3serve = process.env.K3SERVE ?? path.join(here, "../bazel-bin/k3serve");
const overlay = "cpu";
const kTimeoutMs = 180_000;

function skip(why) {
  console.log(`k8s simulate: skipped: ${why}`);
  process.exit(0);
}
if (spawnSync("kubectl", ["version", "--client"]).error) skip("kubectl is not installed");
if (!fs.existsSync(k3serve)) skip(`no k3serve binary at ${k3serve} (bazel build //:k3serve, or set K3SERVE)`);

const rendered = spawnSync("kubectl", ["kustomize", path.join(here, "overlays", overlay)], { encoding: "utf8" });
if (rendered.status !== 0) throw new Error(`overlays/${overlay} does not render: ${rendered.stderr}`);
const docs = yaml.loadAll(rendered.stdout).filter(Boolean);
const of = (kind) => docs.filter((d) => d.kind === kind);
const matches = (selector, labels) => Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

const root = fs.mkdtempSync(path.join(os.tmpdir(), "k3serve-simulate-"));
const shared = path.join(root, "shared");  // the PVC
const children = [];
let failed = false;

function cleanup() {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  if (!failed) fs.rmSync(root, { recursive: true, force: true });
}
process.on("exit", cleanup);

// The shared model volume: the checkpoint folder the ConfigMap names (K3_MODEL_SOURCE under the
// PVC's mount).
const settings = Object.assign({}, ...of("ConfigMap").map((c) => c.data ?? {}));
const pvcMount = "/models";
const source = settings.K3_MODEL_SOURCE;
if (!source?.startsWith(`${pvcMount}/`)) throw new Error(`K3_MODEL_SOURCE ${source} is not under ${pvcMount}`);
const written = spawnSync(k3serve, ["random-checkpoint", "--config=k3-tiny", "--seed=7",
  `--out=${path.join(shared, source.slice(pvcMount.length + 1))}`], { encoding: "utf8" });
if (written.status !== 0) throw new Error(`random-checkpoint: ${written.stderr}`);

// The Secrets the pods mount, with test values.
const token = "simulated-bearer-token";
const secretData = { "k3serve-auth-token": { token } };

// Pods: every replica of every workload, each with a loopback address.
const workloads = [...of("Deployment"), ...of("StatefulSet")];
const pods = [];
for (const w of workloads) {
  for (let i = 0; i < (w.spec.replicas ?? 1); ++i) {
    pods.push({ name: `${w.metadata.name}-${i}`, workload: w, ip: `127.0.0.${20 + pods.length}`,
      labels: w.spec.template.metadata.labels, spec: w.spec.template.spec });
  }
}
// Service names (every form a pod could dial) to the pods they select.
const serviceNames = [];
for (const s of of("Service")) {
  const selected = pods.filter((p) => matches(s.spec.selector, p.labels));
  const n = s.metadata.name;
  const ns = s.metadata.namespace;
  for (const host of [`${n}.${ns}.svc.cluster.local`, `${n}.${ns}.svc`, `${n}.${ns}`]) {
    serviceNames.push({ host, service: s, pods: selected });
  }
}

// A value as the pod sees it, mapped to this machine: Service names, wildcard binds, mounts.
function mapValue(value, pod, mounts) {
  let v = value;
  for (const { host, service, pods: selected } of serviceNames) {
    if (!v.includes(host)) continue;
    if (selected.length === 0) throw new Error(`${pod.name}: ${value} names Service ${service.metadata.name}, which selects no pod`);
    const dns = new RegExp(`dns:///${host.replace(/\./g, "\\.")}:(\\d+)`);
    if (service.spec.clusterIP === "None" && dns.test(v)) {
      v = v.replace(dns, (all, port) => selected.map((p) => `${p.ip}:${port}`).join(","));
    } else {
      v = v.split(host).join(selected[0].ip);
    }
  }
  if (/^--(host)=0\.0\.0\.0$/.test(v)) v = v.replace("0.0.0.0", pod.ip);
  for (const [mountPath, local] of [...mounts].sort((a, b) => b[0].length - a[0].length)) {
    if (v === mountPath || v.startsWith(`${mountPath}/`)) {
      v = local + v.slice(mountPath.length);
      break;
    }
    v = v.split(`=${mountPath}/`).join(`=${local}/`);
  }
  return v;
}

// A container's environment and its $(VAR) expansion (the kubelet's rules: defined names only).
function environment(c, pod) {
  const env = {};
  for (const from of c.envFrom ?? []) {
    const cm = of("ConfigMap").find((m) => m.metadata.name === from.configMapRef.name);
    Object.assign(env, cm.data);
  }
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env[e.name] = e.value;
    else if (e.valueFrom?.fieldRef?.fieldPath === "status.podIP") env[e.name] = pod.ip;
    else throw new Error(`${pod.name}: env ${e.name} from ${JSON.stringify(e.valueFrom)} is not simulated`);
  }
  if (env.UCX_NET_DEVICES === "eth0") env.UCX_NET_DEVICES = "lo";  // the pod's interface
  return env;
}
const expand = (s, env) => s.replace(/\$\(([A-Za-z0-9_]+)\)/g, (all, v) => (v in env ? env[v] : all));

// The pod's volumes as folders, and a container's mounts (mountPath -> folder).
function volumesOf(pod) {
  const folders = new Map();
  for (const v of pod.spec.volumes ?? []) {
    const dir = path.join(root, "pods", pod.name, v.name);
    if (v.persistentVolumeClaim) {
      folders.set(v.name, shared);
      continue;
    }
    fs.mkdirSync(dir, { recursive: true });
    const files = v.configMap ? of("ConfigMap").find((m) => m.metadata.name === v.configMap.name)?.data
      : v.secret ? secretData[v.secret.secretName] : null;
    if ((v.configMap || v.secret) && !files) {
      throw new Error(`${pod.name}: volume ${v.name} needs ${v.configMap ? "ConfigMap" : "Secret"} ${v.configMap?.name ?? v.secret.secretName}`);
    }
    for (const [k, text] of Object.entries(files ?? {})) {
      fs.writeFileSync(path.join(dir, k), text, { mode: (v.configMap ?? v.secret).defaultMode ?? 0o644 });
    }
    folders.set(v.name, dir);
  }
  pod.folders = folders;
}
const mountsOf = (c, pod) => new Map((c.volumeMounts ?? []).map((m) => [m.mountPath, pod.folders.get(m.name)]));

function start(c, pod) {
  const env = environment(c, pod);
  const mounts = mountsOf(c, pod);
  const argv = [...(c.command ?? [k3serve]), ...(c.args ?? [])].map((a) => mapValue(expand(a, env), pod, mounts));
  const log = fs.openSync(path.join(root, `${pod.name}.${c.name}.log`), "w");
  const child = spawn(argv[0], argv.slice(1), { env: { PATH: process.env.PATH, ...env }, stdio: ["ignore", log, log] });
  child.argv = argv;
  if (process.env.K3SERVE_SIMULATE_VERBOSE) console.log(`${pod.name}/${c.name}: ${argv.join(" ")}`);
  child.label = `${pod.name}/${c.name}`;
  children.push(child);
  return child;
}

const exited = (child) => new Promise((resolve) => {
  if (child.exitCode !== null) resolve(child.exitCode);
  else child.on("exit", (code, signal) => resolve(code ?? signal));
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// grpc.health.v1.Health/Check over plaintext HTTP/2: SERVING or not.
function grpcHealth(ip, port, service) {
  return new Promise((resolve) => {
    const session = http2.connect(`http://${ip}:${port}`);
    const done = (ok) => {
      session.close();
      resolve(ok);
    };
    session.on("error", () => done(false));
    session.setTimeout(2000, () => done(false));
    const name = Buffer.from(service ?? "");
    const message = name.length > 0 ? Buffer.concat([Buffer.from([0x0a, name.length]), name]) : Buffer.alloc(0);
    const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, message.length]), message]);
    const req = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc", te: "trailers" });
    const chunks = [];
    req.on("data", (d) => chunks.push(d));
    req.on("error", () => done(false));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      // HealthCheckResponse{status = 1 (SERVING)}: field 1, varint 1.
      done(body.length >= 7 && body[5] === 0x08 && body[6] === 1);
    });
    req.end(frame);
  });
}
function tcpOpen(ip, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host: ip, port }, () => { s.destroy(); resolve(true); });
    s.on("error", () => resolve(false));
    s.setTimeout(2000, () => { s.destroy(); resolve(false); });
  });
}
async function probeOk(probe, c, pod) {
  const port = (p) => (typeof p === "string" ? c.ports.find((q) => q.name === p)?.containerPort : p);
  if (probe.grpc) return grpcHealth(pod.ip, port(probe.grpc.port), probe.grpc.service);
  if (probe.tcpSocket) return tcpOpen(pod.ip, port(probe.tcpSocket.port));
  if (probe.httpGet) {
    const r = await fetch(`http://${pod.ip}:${port(probe.httpGet.port)}${probe.httpGet.path}`).catch(() => null);
    return r !== null && r.status >= 200 && r.status < 400;
  }
  throw new Error(`${pod.name}/${c.name}: a probe of no simulated kind`);
}

async function main() {
  // Every pod: its init containers in order, each to exit 0; then its containers.
  for (const pod of pods) volumesOf(pod);
  await Promise.all(pods.map(async (pod) => {
    for (const c of pod.spec.initContainers ?? []) {
      const child = start(c, pod);
      const code = await exited(child);
      if (code !== 0) throw new Error(`init container ${child.label} exited ${code}: ${child.argv.join(" ")}`);
    }
    pod.running = pod.spec.containers.map((c) => ({ c, child: start(c, pod) }));
  }));
  // Every probe passes (startup first, as the kubelet runs them), before kTimeoutMs.
  const deadline = Date.now() + kTimeoutMs;
  for (const pod of pods) {
    for (const { c, child } of pod.running) {
      for (const kind of ["startupProbe", "livenessProbe", "readinessProbe"]) {
        if (!c[kind]) continue;
        while (!(await probeOk(c[kind], c, pod))) {
          if (child.exitCode !== null) throw new Error(`${child.label} exited ${child.exitCode}: ${child.argv.join(" ")}`);
          if (Date.now() > deadline) throw new Error(`${child.label}: ${kind} ${JSON.stringify(c[kind])} never passed: ${child.argv.join(" ")}`);
          await sleep(250);
        }
      }
    }
  }
  console.log(`k8s simulate: ${pods.length} pods of overlays/${overlay} up, every probe passing`);

  // A chat request through the front's Service: its http port's targetPort on a pod it selects.
  const svc = of("Service").find((s) => s.metadata.name === "k3serve-http");
  const front = pods.find((p) => matches(svc.spec.selector, p.labels));
  const httpPort = svc.spec.ports.find((p) => p.name === "http");
  const container = front.spec.containers[0];
  const target = typeof httpPort.targetPort === "string"
    ? container.ports.find((p) => p.name === httpPort.targetPort).containerPort : httpPort.targetPort;
  const base = `http://${front.ip}:${target}/v1`;
  const fetch = (url, init) => globalThis.fetch(url, init).catch((e) => {
    throw new Error(`${init?.method ?? "GET"} ${url}: ${e.cause?.message ?? e.message}`);
  });
  const auth = { Authorization: `Bearer ${token}` };
  const unauthorized = await fetch(`${base}/models`);
  if (unauthorized.status !== 401) throw new Error(`GET /v1/models without the token: ${unauthorized.status}, not 401`);
  const models = await (await fetch(`${base}/models`, { headers: auth })).json();
  const model = models.data?.[0]?.id;
  if (!model) throw new Error(`GET /v1/models: ${JSON.stringify(models)}`);
  const reply = await fetch(`${base}/chat/completions`, {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "Hello from the cpu overlay" }],
      max_tokens: 8, temperature: 0 }),
  });
  const answer = await reply.json();
  if (reply.status !== 200 || answer.choices?.[0]?.message?.role !== "assistant" ||
      !(answer.usage?.completion_tokens > 0)) {
    throw new Error(`chat completion: ${reply.status} ${JSON.stringify(answer)}`);
  }
  console.log(`k8s simulate: a chat completion through k3serve-http: ${answer.usage.completion_tokens} tokens, ` +
    `finish_reason ${answer.choices[0].finish_reason}`);

  // SIGTERM, as a pod's deletion sends it; each process ends within its grace period.
  await Promise.all(pods.flatMap((pod) => pod.running.map(async ({ child }) => {
    child.kill("SIGTERM");
    const grace = 1000 * (pod.spec.terminationGracePeriodSeconds ?? 30);
    const code = await Promise.race([exited(child), sleep(grace).then(() => "timeout")]);
    if (code === "timeout") throw new Error(`${child.label} did not exit within its ${grace / 1000} s grace period`);
  })));
  console.log("k8s simulate: every process exited on SIGTERM within its grace period");
}

main().catch((e) => {
  failed = true;
  console.error(`k8s simulate: error: ${e.message}\n(logs in ${root})`);
  process.exit(1);
});
