// Offline checks of the k3serve manifests (no cluster needed). For every overlay in overlays/:
//   1. `kubectl kustomize` renders it (a kustomization cycle, a missing file or a bad patch fails
//      here), and every rendered object validates against its Kubernetes (or Prometheus Operator)
//      schema (kubernetes-models);
//   2. the objects agree with each other and with the k3serve binary: selectors match pod labels,
//      Services and probes name ports the containers open, readiness probes ask for what each role
//      reports, every flag is one the role's header documents, every $(VAR) is defined, every file
//      an arg names is on a mounted volume, the coordinator address points at the coordinator
//      Service, HPAs scale existing workloads on metrics the adapter rules serve, preStop plus
//      drain fit the grace period, every pod is locked down (restricted Pod Security), the
//      coordinator is Guaranteed with a PriorityClass, the weights are staged to local disk and
//      mounted read-only (the front staging only the tokenizer), GPU pods have a GPU, a product
//      selector and /dev/shm, CPU overlays no GPU, NetworkPolicies cover every pod in both
//      directions and leave only the front public;
//   3. sizing from the model: `k3serve plan` on the overlay's model (a headers-only checkpoint
//      from k3serve random-checkpoint; gpu-h200: sizing/k3.json, K3's config from the spec) with
//      the overlay's topology; expected expert nodes x slots hold every expert, and still do with
//      one expert node lost; each pod's memory request covers what plan says its process maps;
//      on GPUs the slots and node count are plan's (experts per GPU; at least plan's GPUs plus
//      one lost node).
// It also runs the checks on broken copies (a planted kustomization cycle, a slots shortfall, a
// pod below plan's memory, ...) and fails unless each breakage is caught.
//
//   cd k8s && npm ci && node validate.mjs
// Needs kubectl (its built-in kustomize); without it, says so and skips. The sizing checks need
// the k3serve binary ($K3SERVE, else ../bazel-bin/k3serve); without it they say so and are skipped.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..");
const k3serve = process.env.K3SERVE ?? path.join(repo, "bazel-bin/k3serve");

// What each role's health reports (see the role headers). Readiness is each pod's own state, so
// a failure in one tier does not empty another tier's Services: the attention nodes' and the
// front's readiness is their gRPC server's overall health ("": up, weights or tokenizer loaded);
// routers, expert workers and the coordinator report their own named service.
const roles = {
  coordinator: { header: "coordinator/coordinator_main.h", readiness: "k3serve.cluster.v1.Coordinator" },
  attention: { header: "attention_nodes/server/attention_server.h", readiness: "", preStop: true },
  router: { header: "router/router_node.h", readiness: "k3serve.cluster.v1.RouterControl" },
  expert: { header: "expert_nodes/expert_node.h", readiness: "k3serve.cluster.v1.ExpertWorker" },
  // The HTTP front: --port is its HTTP API (port "http"), --grpc-port its gRPC API and health.
  http: { header: "http_front/http_front.h", grpcFlag: "grpc-port", httpFlag: "port", readiness: "", preStop: true },
};

// The model each overlay is sized for (random-checkpoint --config), independent of the YAML.
const sizing = {
  cpu: { config: "k3-tiny", args: [] },
  "gpu-h200": { config: path.join(here, "sizing/k3.json"), args: ["--mxfp4", "--shards=96"], gpu: "NVIDIA-H200" },
  "gpu-h200-rdma": { config: path.join(here, "sizing/k3.json"), args: ["--mxfp4", "--shards=96"], gpu: "NVIDIA-H200" },
};

// The flags a role accepts: what `k3serve ROLE --help` lists when the binary is built, else what
// the role's header documents in its comments. `where` names the source for messages.
const flagCache = new Map();
function acceptedFlags(role) {
  if (!flagCache.has(role)) {
    let flags;
    let where;
    const help = fs.existsSync(k3serve) ? spawnSync(k3serve, [role, "--help"], { encoding: "utf8" }) : null;
    if (help?.status === 0) {
      flags = new Set([...help.stdout.matchAll(/^ +(?:-[a-z],)?--([a-z][a-z0-9-]*)/gm)].map((m) => m[1]));
      where = `\`k3serve ${role} --help\``;
    } else {
      const header = roles[role].header;
      const text = fs.readFileSync(path.join(repo, header), "utf8");
      const comment = text.split("\n").filter((l) => l.trimStart().startsWith("//")).join("\n");
      flags = new Set([...comment.matchAll(/--([a-z][a-z0-9-]*)/g)].map((m) => m[1]));
      where = header;
    }
    flagCache.set(role, { flags, where });
  }
  return flagCache.get(role);
}

// The HPA metric names the Prometheus Adapter rules serve.
function adapterMetrics() {
  const values = yaml.load(fs.readFileSync(path.join(here, "prometheus-adapter/values.yaml"), "utf8"));
  return new Set((values.rules?.custom ?? []).map((r) => r.name?.as ?? r.seriesQuery.match(/^'?([a-z0-9_]+)/)[1]));
}

async function modelClass(apiVersion, kind) {
  const module =
    apiVersion === "monitoring.coreos.com/v1"
      ? `@kubernetes-models/prometheus-operator/${apiVersion}`
      : `kubernetes-models/${apiVersion}`;
  const exports = await import(module).catch(() => ({}));
  return exports[kind];
}

// Renders a kustomization folder: { docs } or { error }.
function render(dir) {
  const r = spawnSync("kubectl", ["kustomize", dir], { encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.error) return { error: `kubectl: ${r.error.message}` };
  if (r.status !== 0) return { error: r.stderr.trim() || `kubectl kustomize exited ${r.status}` };
  return { docs: yaml.loadAll(r.stdout).filter(Boolean) };
}

// Memory quantities in bytes ("144Gi", "512Mi", "1G", plain bytes).
function bytesOf(q) {
  const m = String(q ?? "").match(/^([0-9.]+)([KMGTPE]i?)?$/);
  if (!m) return NaN;
  const units = { K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50 };
  return Number(m[1]) * (m[2] ? units[m[2]] : 1);
}
const gib = (b) => `${(b / 2 ** 30).toFixed(1)} GiB`;

// `k3serve plan`'s numbers for a model and topology, parsed from its table; null without the
// binary (the caller says so).
const checkpoints = new Map();
const plans = new Map();
function plan(model, topology) {
  if (!fs.existsSync(k3serve)) return null;
  const key = JSON.stringify([model, topology]);
  if (plans.has(key)) return plans.get(key);
  let dir = checkpoints.get(model.config);
  if (!dir) {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "k3serve-sizing-"));
    const out = path.join(dir, "model");
    const r = spawnSync(k3serve, ["random-checkpoint", `--config=${model.config}`, "--headers-only",
      ...model.args, `--out=${out}`], { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`k3serve random-checkpoint ${model.config}: ${r.stderr}`);
    checkpoints.set(model.config, dir);
  }
  const r = spawnSync(k3serve, ["plan", `--model=${path.join(dir, "model")}`,
    `--attention=${topology.attention}`, `--routers=${topology.routers}`, `--experts=${topology.experts}`],
  { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`k3serve plan: ${r.stderr}`);
  const text = r.stdout;
  const num = (re) => {
    const m = text.match(re);
    if (!m) throw new Error(`k3serve plan's output has no ${re}:\n${text}`);
    return Number(m[1]);
  };
  const workers = [...text.matchAll(/^ {2}expert (\d+) +(\d+) B .*\(experts (\d+)\.\.(\d+) of (\d+) in each of (\d+) MoE layers\)/gm)]
    .map((m) => ({ bytes: Number(m[2]), experts: Number(m[4]) - Number(m[3]) + 1, numExperts: Number(m[5]), moeLayers: Number(m[6]) }));
  if (workers.length !== topology.experts) throw new Error(`k3serve plan listed ${workers.length} expert workers:\n${text}`);
  const p = {
    checkpointBytes: num(/^checkpoint: +(\d+) B/m),
    attentionBytes: num(/^ {2}attention x\d+ +(\d+) B/m),
    routerBytes: num(/^ {2}router +x\d+ +(\d+) B/m),
    workers,
    numExperts: workers[0].numExperts,
    // One expert id over every MoE layer: a worker's bytes over its experts (the plan's slices
    // differ by at most one expert; every expert of a model has the same size).
    expertIdBytes: workers[0].bytes / workers[0].experts,
    expertsPerGpu: /experts per MoE layer per GPU/.test(text) ? num(/^ {2}(\d+) experts per MoE layer per GPU/m) : null,
    minGpus: /at least \d+ GPUs/.test(text) ? num(/at least (\d+) GPUs/) : null,
  };
  for (const w of workers) {
    if (w.bytes !== w.experts * p.expertIdBytes) throw new Error(`k3serve plan: expert sizes differ:\n${text}`);
  }
  plans.set(key, p);
  return p;
}

const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const selects = (selector, labels) =>
  matches(selector?.matchLabels, labels) &&
  (selector?.matchExpressions ?? []).every((e) =>
    e.operator === "In" ? e.values.includes(labels?.[e.key])
      : e.operator === "NotIn" ? !e.values.includes(labels?.[e.key])
      : e.operator === "Exists" ? e.key in (labels ?? {}) : !(e.key in (labels ?? {})));

// Every problem found in one rendered overlay, as strings; empty when it is consistent.
async function check(name, docs, notes) {
  const errors = [];
  const model = sizing[name];
  if (!model) errors.push(`overlays/${name}: no model to size it against (add it to validate.mjs's sizing table)`);
  const where = (d) => `${name}: ${d.kind}/${d.metadata?.name}`;

  // 1. Schemas.
  for (const d of docs) {
    const Model = await modelClass(d.apiVersion, d.kind);
    if (!Model) {
      errors.push(`${where(d)}: no schema for ${d.apiVersion} ${d.kind}`);
      continue;
    }
    try {
      new Model(structuredClone(d)).validate();
    } catch (e) {
      errors.push(`${where(d)}: ${e.message}`);
    }
  }

  // 2. Consistency.
  const of = (kind) => docs.filter((d) => d.kind === kind);
  const byName = (kind, n) => of(kind).find((d) => d.metadata?.name === n);
  const ns = of("Namespace")[0];
  const namespace = ns?.metadata.name;
  if (!namespace) errors.push(`${name}: no Namespace object`);
  const clusterScoped = new Set(["Namespace", "PriorityClass"]);
  for (const d of docs) {
    if (!clusterScoped.has(d.kind) && d.metadata?.namespace !== namespace) {
      errors.push(`${where(d)}: namespace ${d.metadata?.namespace}, expected ${namespace}`);
    }
  }
  const configMaps = new Map(of("ConfigMap").map((d) => [d.metadata.name, d.data ?? {}]));
  const workloads = [...of("Deployment"), ...of("StatefulSet")];
  const podsOf = (selector) => workloads.filter((w) => matches(selector, w.spec.template.metadata?.labels));
  const flagsArg = (args, flag) => args.find((a) => a.startsWith(`--${flag}=`))?.slice(flag.length + 3);
  const roleOf = (w) => w.spec.template.spec.containers[0].args?.[0];
  const images = new Set(workloads.flatMap((w) =>
    [...w.spec.template.spec.containers, ...(w.spec.template.spec.initContainers ?? [])].map((c) => c.image)));
  if (images.size !== 1 || [...images][0] === "k3serve:latest") {
    errors.push(`${name}: containers run ${[...images].join(", ")}: one image, set by kustomization.yaml's images:`);
  }
  const settings = Object.assign({}, ...configMaps.values());
  const enforce = ns?.metadata.labels?.["pod-security.kubernetes.io/enforce"];
  const secretsNeeded = new Set();
  const adapter = adapterMetrics();
  const expand = (text, c) => text.replace(/\$\(([A-Z0-9_]+)\)/g, (all, v) =>
    (c.env ?? []).some((e) => e.name === v) ? all : settings[v] ?? all);

  const tlsEverywhere = workloads.some((w) => Boolean(flagsArg(w.spec.template.spec.containers[0].args ?? [], "tls-cert")));
  for (const w of workloads) {
    const spec = w.spec;
    const pod = spec.template.spec;
    const role = roleOf(w);
    if (!matches(spec.selector?.matchLabels, spec.template.metadata?.labels)) {
      errors.push(`${where(w)}: selector does not match the pod labels`);
    }
    const volumes = new Map((pod.volumes ?? []).map((v) => [v.name, v]));
    for (const v of volumes.values()) {
      const claim = v.persistentVolumeClaim?.claimName;
      if (claim && !byName("PersistentVolumeClaim", claim)) {
        errors.push(`${where(w)}: volume ${v.name} claims unknown PVC ${claim}`);
      }
      if (v.configMap && !configMaps.has(v.configMap.name)) {
        errors.push(`${where(w)}: volume ${v.name} names unknown ConfigMap ${v.configMap.name}`);
      }
      if (v.secret) secretsNeeded.add(v.secret.secretName);
    }
    if (w.kind === "StatefulSet" && !byName("Service", spec.serviceName)) {
      errors.push(`${where(w)}: serviceName ${spec.serviceName} has no Service`);
    }
    // Priority and, for the coordinator, Guaranteed QoS.
    if (!byName("PriorityClass", pod.priorityClassName)) {
      errors.push(`${where(w)}: priorityClassName ${pod.priorityClassName} is not a rendered PriorityClass`);
    }
    const all = [...(pod.initContainers ?? []), ...pod.containers];
    if (role === "coordinator") {
      const classes = of("PriorityClass").map((p) => p.value);
      if (byName("PriorityClass", pod.priorityClassName)?.value !== Math.max(...classes)) {
        errors.push(`${where(w)}: the coordinator must have the highest PriorityClass`);
      }
      for (const c of all) {
        const { requests = {}, limits = {} } = c.resources ?? {};
        if (!requests.cpu || !requests.memory || requests.cpu !== limits.cpu || requests.memory !== limits.memory) {
          errors.push(`${where(w)} container ${c.name}: requests must equal limits (Guaranteed QoS)`);
        }
      }
    }
    // Restricted Pod Security, on every container.
    const podSec = pod.securityContext ?? {};
    if (podSec.runAsNonRoot !== true) errors.push(`${where(w)}: runAsNonRoot is not set`);
    if (podSec.seccompProfile?.type !== "RuntimeDefault") errors.push(`${where(w)}: no RuntimeDefault seccomp profile`);
    if (pod.hostNetwork || pod.hostIPC || pod.hostPID) errors.push(`${where(w)}: uses the host's namespaces`);
    for (const c of all) {
      const s = c.securityContext ?? {};
      const name2 = `${where(w)} container ${c.name}`;
      if (s.allowPrivilegeEscalation !== false) errors.push(`${name2}: allowPrivilegeEscalation is not false`);
      if (s.readOnlyRootFilesystem !== true) errors.push(`${name2}: the root filesystem is writable`);
      if (s.privileged) errors.push(`${name2}: privileged`);
      if (!(s.capabilities?.drop ?? []).includes("ALL")) errors.push(`${name2}: capabilities are not dropped`);
      for (const cap of s.capabilities?.add ?? []) {
        if (cap !== "IPC_LOCK") errors.push(`${name2}: adds capability ${cap}`);
        else if (enforce !== "privileged") {
          errors.push(`${name2}: adds IPC_LOCK, which the namespace's "${enforce}" Pod Security level forbids`);
        }
      }
    }
    // Weights: staged by an init container onto a local volume, read-only in the serving container.
    const stage = (pod.initContainers ?? []).find((c) => c.name === "stage-weights");
    const serving = pod.containers[0];
    const modelDir = expand(flagsArg(serving.args ?? [], "model") ?? "", serving);
    if (!stage) {
      errors.push(`${where(w)}: no stage-weights init container`);
    } else {
      const [src, dst, ...patterns] = stage.args.map((a) => expand(a, stage));
      if (dst !== modelDir) errors.push(`${where(w)}: stages to ${dst}, but --model is ${modelDir}`);
      const mountOf = (c, p) => (c.volumeMounts ?? []).find((m) => p === m.mountPath || p.startsWith(`${m.mountPath}/`));
      const from = mountOf(stage, src);
      if (!from || !volumes.get(from.name)?.persistentVolumeClaim) {
        errors.push(`${where(w)}: stages from ${src}, which is not on the model volume`);
      }
      const into = mountOf(stage, dst);
      const local = into && volumes.get(into.name);
      if (!local || !(local.emptyDir || local.ephemeral)) {
        errors.push(`${where(w)}: stages into ${dst}, which is not on a local volume of the pod`);
      }
      const read = mountOf(serving, modelDir);
      if (!read || read.name !== into?.name || read.readOnly !== true) {
        errors.push(`${where(w)}: ${serving.name} does not mount the staged weights read-only at ${modelDir}`);
      }
      if ((serving.volumeMounts ?? []).some((m) => volumes.get(m.name)?.persistentVolumeClaim)) {
        errors.push(`${where(w)}: ${serving.name} mounts the shared model volume (serving reads the local copy)`);
      }
      if (role === "http" && patterns.some((p) => /safetensors|^(opt:)?config\.json$/.test(p))) {
        errors.push(`${where(w)}: the front stages ${patterns.join(" ")}, but reads only the tokenizer`);
      }
      if (role === "coordinator" && patterns.join(" ") !== "config.json") {
        errors.push(`${where(w)}: the coordinator reads only config.json, but stages ${patterns.join(" ")}`);
      }
    }
    // GPUs: only with --device=cuda:N, then with a product selector and /dev/shm.
    const gpus = Number(serving.resources?.limits?.["nvidia.com/gpu"] ?? 0);
    const device = flagsArg(serving.args ?? [], "device") ?? "cpu";
    const cudaIndex = device.match(/^cuda(?::(\d+))?$/);
    if (model && !model.gpu && (gpus > 0 || cudaIndex)) {
      errors.push(`${where(w)}: ${name} runs every kernel on the CPU, but asks for a GPU (${device}, ${gpus} GPUs)`);
    }
    if (model?.gpu && (role === "attention" || role === "expert")) {
      if (!cudaIndex) errors.push(`${where(w)}: ${role} workers run on the GPU in ${name}, but --device is ${device}`);
      else if (Number(cudaIndex[1] ?? 0) >= gpus) errors.push(`${where(w)}: --device=${device} with ${gpus} GPUs`);
      if (pod.nodeSelector?.["nvidia.com/gpu.product"] !== model.gpu) {
        errors.push(`${where(w)}: no node selector for ${model.gpu} (nvidia.com/gpu.product)`);
      }
      const shm = (serving.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm");
      if (!shm || volumes.get(shm.name)?.emptyDir?.medium !== "Memory") {
        errors.push(`${where(w)}: no memory-backed /dev/shm for NCCL`);
      }
    }
    if (gpus > 0 && !cudaIndex) errors.push(`${where(w)}: asks for ${gpus} GPUs, but runs on ${device}`);

    for (const c of pod.containers) {
      const cname = `${where(w)} container ${c.name}`;
      const args = c.args ?? [];
      const r = roles[args[0]];
      if (!r) {
        errors.push(`${cname}: first argument ${args[0]} is not a k3serve role`);
        continue;
      }
      const accepted = acceptedFlags(args[0]);
      for (const a of args.slice(1)) {
        const flag = a.match(/^--([a-z0-9-]+)(=|$)/)?.[1];
        if (!flag || !accepted.flags.has(flag)) errors.push(`${cname}: ${a} is not a flag of ${accepted.where}`);
      }
      // TLS on one process means TLS on all (every gRPC connection of the cluster uses it).
      if (Boolean(flagsArg(args, "tls-cert")) !== tlsEverywhere) {
        errors.push(`${cname}: TLS flags differ from the other processes'`);
      }
      // Variables the args expand.
      const defined = new Set((c.env ?? []).map((e) => e.name));
      for (const from of c.envFrom ?? []) {
        const data = configMaps.get(from.configMapRef?.name);
        if (!data) errors.push(`${cname}: envFrom names unknown ConfigMap ${from.configMapRef?.name}`);
        for (const key of Object.keys(data ?? {})) defined.add(key);
      }
      for (const a of args) {
        for (const [, v] of a.matchAll(/\$\(([A-Z0-9_]+)\)/g)) {
          if (!defined.has(v)) errors.push(`${cname}: ${a} uses undefined $(${v})`);
        }
      }
      // Files the args name (tokens, certificates) are on a mounted Secret.
      for (const flag of ["auth-token-file", "api-key-file", "tls-cert", "tls-key", "tls-ca"]) {
        const file = flagsArg(args, flag);
        if (!file) continue;
        const m = (c.volumeMounts ?? []).find((v) => file.startsWith(`${v.mountPath}/`));
        const secret = m && volumes.get(m.name)?.secret;
        if (!secret) errors.push(`${cname}: --${flag}=${file} is not on a mounted Secret`);
        else if (secret.items && !secret.items.some((i) => `${m.mountPath}/${i.path}` === file)) {
          errors.push(`${cname}: --${flag}=${file} is not an item of Secret ${secret.secretName}`);
        }
      }
      // Ports, probes, metrics.
      const ports = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
      const grpcPort = ports.get("grpc");
      const grpcFlag = r.grpcFlag ?? "port";
      if (String(grpcPort) !== flagsArg(args, grpcFlag)) {
        errors.push(`${cname}: grpc containerPort ${grpcPort} differs from --${grpcFlag} ${flagsArg(args, grpcFlag)}`);
      }
      if (r.httpFlag && String(ports.get("http")) !== flagsArg(args, r.httpFlag)) {
        errors.push(`${cname}: http containerPort ${ports.get("http")} differs from --${r.httpFlag} ${flagsArg(args, r.httpFlag)}`);
      }
      const metricsPort = ports.get("metrics");
      if (String(metricsPort) !== flagsArg(args, "metrics-port")) {
        errors.push(`${cname}: metrics containerPort ${metricsPort} differs from --metrics-port`);
      }
      const annotations = spec.template.metadata?.annotations ?? {};
      if (annotations["prometheus.io/scrape"] !== "true" || annotations["prometheus.io/port"] !== String(metricsPort)) {
        errors.push(`${cname}: prometheus.io annotations do not point at the metrics port`);
      }
      const tls = Boolean(flagsArg(args, "tls-cert"));
      const probePort = (p) => p?.grpc?.port ?? p?.tcpSocket?.port ?? p?.httpGet?.port;
      const portNumber = (p) => (typeof p === "string" ? ports.get(p) : p);
      for (const kind of ["livenessProbe", "readinessProbe", "startupProbe"]) {
        const probe = c[kind];
        if (!probe) {
          if (kind !== "startupProbe") errors.push(`${cname}: no ${kind}`);
          continue;
        }
        if (probe.grpc && tls) errors.push(`${cname}: ${kind} is a gRPC probe, which cannot speak TLS`);
        if (!probe.grpc && !tls) errors.push(`${cname}: ${kind} is not a gRPC probe`);
        if (tls && kind !== "readinessProbe" && portNumber(probe.tcpSocket?.port) !== grpcPort) {
          errors.push(`${cname}: under TLS, ${kind} must open a TCP connection to the gRPC port`);
        }
        const port = portNumber(probePort(probe));
        if (![...ports.values()].includes(port)) errors.push(`${cname}: ${kind} probes port ${probePort(probe)}, which it does not open`);
        if (probe.grpc && kind !== "readinessProbe" && (probe.grpc.service ?? "") !== "") {
          errors.push(`${cname}: ${kind} must ask for the overall health (service "")`);
        }
      }
      const ready = c.readinessProbe;
      if (ready?.grpc) {
        if (ready.grpc.port !== grpcPort) errors.push(`${cname}: readiness probes ${ready.grpc.port}, the gRPC server is on ${grpcPort}`);
        if ((ready.grpc.service ?? "") !== r.readiness) {
          errors.push(`${cname}: readiness asks for "${ready.grpc.service ?? ""}", ${args[0]}'s own readiness is "${r.readiness}"`);
        }
      } else if (ready?.httpGet && (ready.httpGet.path !== "/healthz" || portNumber(ready.httpGet.port) !== metricsPort)) {
        errors.push(`${cname}: an HTTP readiness probe must GET /healthz on the metrics port`);
      } else if (ready?.httpGet && (r.readiness === "")) {
        errors.push(`${cname}: /healthz reports whether the cluster behind ${args[0]} serves: its readiness would cascade`);
      } else if (ready?.tcpSocket && (r.readiness !== "" || portNumber(ready.tcpSocket.port) !== grpcPort)) {
        errors.push(`${cname}: a TCP readiness probe says only that ${args[0]}'s gRPC port is open, not "${r.readiness}"`);
      } else if (tls && ready?.httpGet === undefined && ready?.tcpSocket === undefined) {
        errors.push(`${cname}: under TLS, readiness must be GET /healthz or the gRPC port`);
      }
      const preStop = c.lifecycle?.preStop;
      const preStopSeconds = Number(preStop?.sleep?.seconds ??
        (preStop?.exec?.command?.[0] === "sleep" ? preStop.exec.command[1] : 0));
      if (r.preStop && !(preStopSeconds > 0)) errors.push(`${cname}: no preStop pause before the drain`);
      const drain = Number(flagsArg(args, "drain-timeout-ms") ?? 0);
      if (drain + 1000 * preStopSeconds >= 1000 * (pod.terminationGracePeriodSeconds ?? 30)) {
        errors.push(`${cname}: preStop (${preStopSeconds} s) plus --drain-timeout-ms ${drain} do not fit in terminationGracePeriodSeconds`);
      }
    }
  }

  for (const s of of("Service")) {
    const pods = podsOf(s.spec.selector);
    if (pods.length === 0) errors.push(`${where(s)}: selector matches no workload`);
    for (const p of s.spec.ports) {
      for (const w of pods) {
        const named = w.spec.template.spec.containers.some((c) =>
          (c.ports ?? []).some((cp) => cp.name === p.targetPort || cp.containerPort === p.targetPort));
        if (!named) errors.push(`${where(s)}: port ${p.name} targets ${p.targetPort}, which ${where(w)} does not open`);
      }
    }
  }
  for (const p of [...of("PodDisruptionBudget"), ...of("PodMonitor")]) {
    const pods = podsOf(p.spec.selector?.matchLabels);
    if (pods.length === 0) errors.push(`${where(p)}: selector matches no workload`);
    for (const e of p.spec.podMetricsEndpoints ?? []) {
      for (const w of pods) {
        if (!w.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === e.port))) {
          errors.push(`${where(p)}: ${where(w)} has no port named ${e.port}`);
        }
      }
    }
  }
  const scaled = new Set();
  for (const h of of("HorizontalPodAutoscaler")) {
    const ref = h.spec.scaleTargetRef;
    const target = byName(ref.kind, ref.name);
    if (!target) {
      errors.push(`${where(h)}: scales unknown ${ref.kind}/${ref.name}`);
      continue;
    }
    scaled.add(roleOf(target));
    if (target.spec.replicas < h.spec.minReplicas || target.spec.replicas > h.spec.maxReplicas) {
      errors.push(`${where(h)}: the ${ref.kind}'s replicas ${target.spec.replicas} are outside [minReplicas, maxReplicas]`);
    }
    if (roleOf(target) === "expert" && h.spec.minReplicas < Number(settings.K3_EXPECTED_EXPERTS)) {
      errors.push(`${where(h)}: minReplicas ${h.spec.minReplicas} is below K3_EXPECTED_EXPERTS`);
    }
    for (const m of h.spec.metrics ?? []) {
      if (m.type === "Pods" && !adapter.has(m.pods.metric.name)) {
        errors.push(`${where(h)}: metric ${m.pods.metric.name} has no rule in prometheus-adapter/values.yaml`);
      }
    }
  }
  for (const role of ["attention", "router", "expert"]) {
    if (!scaled.has(role)) errors.push(`${name}: no HorizontalPodAutoscaler for the ${role} tier`);
  }

  // The coordinator address every node dials, and the expert counts.
  const experts = workloads.find((w) => roleOf(w) === "expert");
  const expected = Number(settings.K3_EXPECTED_EXPERTS);
  const slots = Number(settings.K3_EXPERT_SLOTS);
  if (settings.K3_COORDINATOR) {
    const [host, port] = settings.K3_COORDINATOR.split(":");
    const [svcName, svcNamespace] = host.split(".");
    const svc = byName("Service", svcName);
    if (!svc || svcNamespace !== namespace || !svc.spec.ports.some((p) => String(p.port) === port)) {
      errors.push(`${name}: K3_COORDINATOR ${settings.K3_COORDINATOR} is not a coordinator Service port`);
    } else if (!podsOf(svc.spec.selector).some((w) => roleOf(w) === "coordinator")) {
      errors.push(`${name}: K3_COORDINATOR's Service does not select the coordinator`);
    }
  }
  if (!experts || !(expected > 0) || !(slots > 0)) {
    errors.push(`${name}: no expert StatefulSet, K3_EXPECTED_EXPERTS or K3_EXPERT_SLOTS`);
  } else if (experts.spec.replicas < expected) {
    errors.push(`${name}: K3_EXPECTED_EXPERTS ${expected} exceeds the expert replicas ${experts.spec.replicas}`);
  }

  // 3. Sizing from the model.
  const replicas = (role) => workloads.find((w) => roleOf(w) === role)?.spec.replicas ?? 0;
  const p = model && experts && expected > 0
    ? plan(model, { attention: replicas("attention"), routers: replicas("router"), experts: expected })
    : null;
  if (model && experts && !p) notes.add(`sizing checks skipped: no k3serve binary at ${k3serve} (bazel build //:k3serve, or set K3SERVE)`);
  if (p) {
    if (expected * slots < p.numExperts) {
      errors.push(`${name}: ${expected} expert workers x ${slots} slots < the model's ${p.numExperts} experts`);
    }
    if ((experts.spec.replicas - 1) * slots < p.numExperts) {
      errors.push(`${name}: with one of ${experts.spec.replicas} expert workers lost, ${slots} slots each hold ${(experts.spec.replicas - 1) * slots} < ${p.numExperts} experts`);
    }
    const memory = (role) => bytesOf(workloads.find((w) => roleOf(w) === role)?.spec.template.spec.containers[0].resources?.requests?.memory);
    const onGpu = (role) => /^cuda/.test(flagsArg(workloads.find((w) => roleOf(w) === role)?.spec.template.spec.containers[0].args ?? [], "device") ?? "");
    // What each process maps (plan): an expert worker up to its slots (after taking over a lost
    // node's experts), at least its planned slice; an attention worker its share, plus the router
    // share on a GPU (it runs the gates for the GPU-to-GPU path); a router its share.
    const need = {
      expert: Math.max(slots * p.expertIdBytes, ...p.workers.map((w) => w.bytes)),
      attention: p.attentionBytes + (onGpu("attention") ? p.routerBytes : 0),
      router: p.routerBytes,
    };
    for (const [role, bytes] of Object.entries(need)) {
      if (!(memory(role) >= bytes)) {
        errors.push(`${name}: ${role} pods request ${gib(memory(role))} of memory, below the ${gib(bytes)} k3serve plan says they map`);
      } else if (model.gpu && memory(role) > bytes + 16 * 2 ** 30) {
        errors.push(`${name}: ${role} pods request ${gib(memory(role))}, over 16 GiB above the ${gib(bytes)} k3serve plan says they map`);
      }
    }
    if (model.gpu) {
      if (p.expertsPerGpu === null) {
        errors.push(`${name}: k3serve plan says one expert does not fit a GPU`);
      } else {
        if (slots !== p.expertsPerGpu) {
          errors.push(`${name}: K3_EXPERT_SLOTS ${slots}, but k3serve plan says a GPU holds ${p.expertsPerGpu} experts per MoE layer`);
        }
        if (expected !== p.minGpus + 1 || experts.spec.replicas !== expected) {
          errors.push(`${name}: ${expected} expected expert workers of ${experts.spec.replicas}, but k3serve plan needs ${p.minGpus} GPUs, plus one to lose: ${p.minGpus + 1}`);
        }
      }
    }
    // The local volume the model tiers stage onto holds the files they copy (every shard).
    for (const w of workloads) {
      if (!["attention", "router", "expert"].includes(roleOf(w))) continue;
      const v = (w.spec.template.spec.volumes ?? []).find((x) => x.name === "weights");
      const size = bytesOf(v?.emptyDir?.sizeLimit ?? v?.ephemeral?.volumeClaimTemplate?.spec?.resources?.requests?.storage);
      if (!(size >= p.checkpointBytes)) {
        errors.push(`${where(w)}: its local weights volume (${gib(size)}) cannot hold the ${gib(p.checkpointBytes)} of shards it stages`);
      }
    }
  }

  // NetworkPolicies: every pod is selected by an ingress and an egress policy; a rule open to every
  // source (no `from`, or an empty selector) admits only the front's public ports; the attention
  // nodes' gRPC API admits only the front and the cluster's own tiers; named ports are ones the
  // selected pods open; sources and destinations within the namespace are the cluster's own pods.
  const publicPorts = { http: ["http", "grpc"] };
  const policies = of("NetworkPolicy");
  for (const w of workloads) {
    const labels = w.spec.template.metadata?.labels;
    for (const type of ["Ingress", "Egress"]) {
      if (!policies.some((p) => (p.spec.policyTypes ?? ["Ingress"]).includes(type) && selects(p.spec.podSelector, labels))) {
        errors.push(`${where(w)}: no ${type} NetworkPolicy selects its pods`);
      }
    }
  }
  const labelsOf = (role) => workloads.find((w) => roleOf(w) === role)?.spec.template.metadata?.labels;
  for (const p of policies) {
    const pods = workloads.filter((w) => selects(p.spec.podSelector, w.spec.template.metadata?.labels));
    if (pods.length === 0) errors.push(`${where(p)}: selects no pods`);
    for (const rule of [...(p.spec.ingress ?? []), ...(p.spec.egress ?? [])]) {
      const peers = rule.from ?? rule.to;
      const open = !peers || peers.length === 0 ||
        peers.some((f) => (f.ipBlock && f.ipBlock.cidr.endsWith("/0")) ||
          (f.namespaceSelector && Object.keys(f.namespaceSelector).length === 0));
      for (const f of peers ?? []) {
        if (f.podSelector && !f.namespaceSelector &&
            f.podSelector.matchLabels?.["app.kubernetes.io/part-of"] !== "k3serve") {
          errors.push(`${where(p)}: admits pods other than the cluster's own`);
        }
      }
      if (rule.to && open) errors.push(`${where(p)}: lets pods connect anywhere`);
      if (!rule.from && !rule.ports && p.spec.ingress?.includes(rule)) continue;
      for (const w of pods) {
        const role = roleOf(w);
        const opened = new Set(w.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((q) => q.name)));
        if (rule.from) {
          for (const port of rule.ports ?? []) {
            if (typeof port.port === "string" && !opened.has(port.port)) {
              errors.push(`${where(p)}: port ${port.port} is not one ${where(w)} opens`);
            }
          }
          if (open && (!rule.ports || !rule.ports.every((q) => (publicPorts[role] ?? []).includes(q.port)))) {
            errors.push(`${where(p)}: opens ${role} pods' non-public ports to every source`);
          }
          // Generate on attention nodes: the front and the cluster's tiers, nobody else.
          const coversGrpc = !rule.ports || rule.ports.some((q) => q.port === "grpc" || q.port === 50051);
          if (role === "attention" && coversGrpc) {
            const admitted = Object.keys(roles).filter((r) => labelsOf(r) &&
              rule.from.some((f) => f.podSelector && !f.namespaceSelector && selects(f.podSelector, labelsOf(r))));
            const outside = rule.from.some((f) => f.namespaceSelector || f.ipBlock);
            if (open || outside || !admitted.every((r) => ["http", "coordinator", "router", "expert", "attention"].includes(r))) {
              errors.push(`${where(p)}: the attention nodes' Generate port admits sources other than the front and the cluster's tiers`);
            }
          }
        }
      }
    }
    if (!rule0Ok(p)) errors.push(`${where(p)}: an ingress rule without sources or ports opens every port to everyone`);
  }
  if (!["restricted", "privileged"].includes(enforce)) {
    errors.push(`${name}: the namespace does not enforce the restricted Pod Security Standard (enforce: ${enforce})`);
  } else if (enforce === "privileged" && !workloads.some((w) =>
    [...w.spec.template.spec.containers].some((c) => (c.securityContext?.capabilities?.add ?? []).length > 0))) {
    errors.push(`${name}: the namespace is privileged, but no pod needs more than restricted allows`);
  }
  if (secretsNeeded.size > 0) notes.add(`${name} needs Secrets created beside it: ${[...secretsNeeded].sort().join(", ")}`);
  return errors;
}

// An ingress rule with neither sources nor ports admits everything on every port.
const rule0Ok = (p) => (p.spec.ingress ?? []).every((r) => r.from || r.ports);

// Breakages the checks must catch, each applied to a fresh copy of an overlay's objects (or of
// the k8s folder, for the rendering ones).
const find = (docs, kind, n) => docs.find((d) => d.kind === kind && d.metadata.name === n);
const container = (docs, kind, n) => find(docs, kind, n).spec.template.spec.containers[0];
const breakages = {
  "wrong readiness port": (d) => {
    const p = container(d, "Deployment", "k3serve-router").readinessProbe;
    (p.grpc ?? p.httpGet ?? p.tcpSocket).port = 50052;
  },
  "cascading attention readiness": (d) => {
    container(d, "Deployment", "k3serve-attention").readinessProbe = { grpc: { port: 50051, service: "k3serve.v1.K3Serve" } };
  },
  "undocumented flag": (d) => { container(d, "Deployment", "k3serve-router").args.push("--no-such-flag=1"); },
  "undefined variable": (d) => { delete find(d, "ConfigMap", "k3serve-config").data.K3_MODEL_DIR; },
  "selector mismatch": (d) => { find(d, "Service", "k3serve-http").spec.selector["app.kubernetes.io/component"] = "front"; },
  "front HTTP port differs from --port": (d) => {
    container(d, "Deployment", "k3serve-http").ports.find((p) => p.name === "http").containerPort = 8080;
  },
  "front Service targets an unopened port": (d) => { find(d, "Service", "k3serve-http").spec.ports[0].targetPort = "web"; },
  "GPU asked for on the CPU overlay / GPU without --device": (d) => {
    container(d, "Deployment", "k3serve-router").resources.limits["nvidia.com/gpu"] = "1";
  },
  "control plane open to all": (d) => { delete find(d, "NetworkPolicy", "k3serve-internal").spec.ingress[0].from; },
  "Generate open to all": (d) => { find(d, "NetworkPolicy", "k3serve-attention").spec.ingress[1].from = []; },
  "pods without a NetworkPolicy": (d) => d.splice(d.indexOf(find(d, "NetworkPolicy", "k3serve-internal")), 1),
  "no egress policy": (d) => d.splice(d.indexOf(find(d, "NetworkPolicy", "k3serve-egress")), 1),
  "NetworkPolicy names an unopened port": (d) => {
    find(d, "NetworkPolicy", "k3serve-attention").spec.ingress[1].ports[0].port = "api";
  },
  "schema violation": (d) => { find(d, "StatefulSet", "k3serve-expert").spec.replicas = "five"; },
  "slots shortfall": (d) => { find(d, "ConfigMap", "k3serve-config").data.K3_EXPERT_SLOTS = "1"; },
  "no room for a lost expert node": (d) => {
    const slots = Number(find(d, "ConfigMap", "k3serve-config").data.K3_EXPERT_SLOTS);
    find(d, "StatefulSet", "k3serve-expert").spec.replicas = Math.ceil(1 / slots);
  },
  "expert memory below plan": (d) => {
    container(d, "StatefulSet", "k3serve-expert").resources.requests.memory = "1Mi";
  },
  "attention memory below plan": (d) => {
    container(d, "Deployment", "k3serve-attention").resources.requests.memory = "1Mi";
  },
  "coordinator Burstable": (d) => { container(d, "Deployment", "k3serve-coordinator").resources.limits.memory = "2Gi"; },
  "capabilities kept": (d) => { delete container(d, "Deployment", "k3serve-http").securityContext.capabilities; },
  "no seccomp profile": (d) => { delete find(d, "StatefulSet", "k3serve-expert").spec.template.spec.securityContext.seccompProfile; },
  "namespace not restricted": (d) => { delete find(d, "Namespace", "k3serve").metadata.labels["pod-security.kubernetes.io/enforce"]; },
  "weights mounted writable": (d) => {
    container(d, "Deployment", "k3serve-attention").volumeMounts.find((m) => m.name === "weights").readOnly = false;
  },
  "front stages the weights": (d) => {
    find(d, "Deployment", "k3serve-http").spec.template.spec.initContainers[0].args.push("*.safetensors");
  },
  "no preStop on the front": (d) => { delete container(d, "Deployment", "k3serve-http").lifecycle; },
  "token file not on a Secret": (d) => {
    const c = container(d, "Deployment", "k3serve-attention");
    c.volumeMounts = c.volumeMounts.filter((m) => m.name !== "auth-token");
  },
  "HPA metric without an adapter rule": (d) => {
    find(d, "HorizontalPodAutoscaler", "k3serve-router").spec.metrics[0].pods.metric.name = "k3_router_nothing";
  },
  "no expert HPA": (d) => d.splice(d.indexOf(find(d, "HorizontalPodAutoscaler", "k3serve-expert")), 1),
};
const gpuBreakages = {
  "expert without a GPU selector": (d) => { delete find(d, "StatefulSet", "k3serve-expert").spec.template.spec.nodeSelector; },
  "attention on the CPU": (d) => {
    const c = container(d, "Deployment", "k3serve-attention");
    c.args = c.args.filter((a) => !a.startsWith("--device"));
  },
  "no /dev/shm": (d) => {
    const c = container(d, "StatefulSet", "k3serve-expert");
    c.volumeMounts = c.volumeMounts.filter((m) => m.mountPath !== "/dev/shm");
  },
  "slots above what a GPU holds": (d) => { find(d, "ConfigMap", "k3serve-config").data.K3_EXPERT_SLOTS = "100"; },
  "gRPC probe under TLS": (d) => {
    container(d, "StatefulSet", "k3serve-expert").livenessProbe = { grpc: { port: 50051 } };
  },
  "TLS on some processes only": (d) => {
    const c = container(d, "Deployment", "k3serve-router");
    c.args = c.args.filter((a) => !a.startsWith("--tls-"));
  },
  "one expert node too few": (d) => {
    find(d, "ConfigMap", "k3serve-config").data.K3_EXPECTED_EXPERTS = "10";
    find(d, "StatefulSet", "k3serve-expert").spec.replicas = 10;
  },
};
// Broken folders: a copy of k8s/ changed, then rendered (kustomize must refuse, or the checks
// must catch what it renders).
const folderBreakages = {
  // The old overlays/gpu's mistake: an overlay whose resources contain the overlay itself.
  "kustomization cycle": (root) => {
    const file = path.join(root, "overlays/cpu/kustomization.yaml");
    fs.writeFileSync(file, fs.readFileSync(file, "utf8").replace("../../base", "../.."));
    fs.writeFileSync(path.join(root, "kustomization.yaml"),
      "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - base\n");
  },
  "patch of a missing workload": (root) => {
    const file = path.join(root, "overlays/cpu/kustomization.yaml");
    fs.appendFileSync(file, "patches:\n  - target:\n      kind: Deployment\n      name: k3serve-nothing\n    patch: |-\n      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: --device=cuda:0\n");
  },
  "patch of a missing file": (root) => {
    const file = path.join(root, "overlays/cpu/kustomization.yaml");
    fs.appendFileSync(file, "patches:\n  - path: missing.yaml\n");
  },
};

// Renders overlays/<name> of the folder `root` and checks it: the errors.
async function checkOverlay(root, name, notes, mutate) {
  const rendered = render(path.join(root, "overlays", name));
  if (rendered.error) return [`overlays/${name} does not render: ${rendered.error}`];
  if (mutate) mutate(rendered.docs);
  return [...untargeted(path.join(root, "overlays", name), rendered.docs), ...await check(name, rendered.docs, notes)];
}

// Patches whose target matches no rendered object (kustomize applies those to nothing, silently),
// in a kustomization folder and the folders and components it builds on.
function untargeted(dir, docs, seen = new Set()) {
  if (seen.has(dir)) return [];
  seen.add(dir);
  const k = yaml.load(fs.readFileSync(path.join(dir, "kustomization.yaml"), "utf8"));
  const errors = [];
  for (const p of k.patches ?? []) {
    const t = p.target;
    if (t && !docs.some((d) => (!t.kind || d.kind === t.kind) && (!t.name || d.metadata?.name === t.name))) {
      errors.push(`${path.relative(here, dir) || dir}: a patch targets ${t.kind}/${t.name}, which is not rendered`);
    }
  }
  for (const r of [...(k.resources ?? []), ...(k.components ?? [])]) {
    const sub = path.resolve(dir, r);
    if (fs.existsSync(path.join(sub, "kustomization.yaml"))) errors.push(...untargeted(sub, docs, seen));
  }
  return errors;
}

if (spawnSync("kubectl", ["version", "--client"], { encoding: "utf8" }).error) {
  console.log("k8s: skipped: kubectl is not installed (its kustomize renders the overlays); install kubectl >= 1.27 to validate");
  process.exit(0);
}
const overlays = fs.readdirSync(path.join(here, "overlays")).sort();
const errors = [];
const notes = new Set();
let objects = 0;
for (const name of overlays) {
  const rendered = render(path.join(here, "overlays", name));
  if (rendered.error) {
    errors.push(`overlays/${name} does not render: ${rendered.error}`);
    continue;
  }
  objects += rendered.docs.length;
  errors.push(...untargeted(path.join(here, "overlays", name), rendered.docs), ...await check(name, rendered.docs, notes));
}
for (const name of Object.keys(sizing)) {
  if (!overlays.includes(name)) errors.push(`validate.mjs sizes overlays/${name}, which does not exist`);
}
// The self-test: every breakage must be caught (the sizing ones only where plan runs).
const sized = fs.existsSync(k3serve);
const sizingBreakages = new Set(["slots shortfall", "no room for a lost expert node", "expert memory below plan", "attention memory below plan",
  "slots above what a GPU holds", "one expert node too few"]);
const quiet = new Set();
for (const [name, set] of [["cpu", breakages], ["gpu-h200", { ...breakages, ...gpuBreakages }]]) {
  for (const [what, breakIt] of Object.entries(set)) {
    if (!sized && sizingBreakages.has(what)) continue;
    if (name === "gpu-h200" && what.startsWith("GPU asked for on the CPU")) continue;
    if ((await checkOverlay(here, name, quiet, breakIt)).length === 0) {
      errors.push(`self-test: the checks missed "${what}" in overlays/${name}`);
    }
  }
}
for (const [what, breakIt] of Object.entries(folderBreakages)) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "k3serve-k8s-"));
  for (const f of ["base", "overlays", "components", "prometheus-adapter", "sizing"]) {
    if (fs.existsSync(path.join(here, f))) fs.cpSync(path.join(here, f), path.join(root, f), { recursive: true });
  }
  breakIt(root);
  const found = await checkOverlay(root, "cpu", quiet);
  if (found.length === 0) errors.push(`self-test: the checks missed "${what}"`);
  fs.rmSync(root, { recursive: true, force: true });
}
for (const dir of new Set([...checkpoints.values()])) fs.rmSync(dir, { recursive: true, force: true });
for (const n of notes) console.log(`k8s: ${n}`);
if (errors.length > 0) {
  for (const e of errors) console.error(`error: ${e}`);
  process.exit(1);
}
console.log(`k8s: ${overlays.length} overlays (${overlays.join(", ")}), ${objects} objects, render, validate and are consistent; the self-test caught ${Object.keys(breakages).length + Object.keys(gpuBreakages).length + Object.keys(folderBreakages).length} breakages${sized ? "" : " (sizing ones skipped)"}`);
