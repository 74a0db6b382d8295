// Offline checks of the k3serve manifests (no cluster needed):
//   1. every object validates against its Kubernetes (or Prometheus Operator) schema
//      (kubernetes-models);
//   2. the objects agree with each other and with the k3serve binary: selectors match pod labels,
//      Services and probes name ports the containers open, readiness probes ask for the health
//      service each role reports, every flag is one the role's header documents, every $(VAR) is
//      defined, the coordinator address points at the coordinator Service, the HTTP front's
//      ports and /healthz readiness match its flags, no container asks for a GPU (the base runs
//      every kernel on the CPU; overlays/gpu adds them, must target existing workloads, and the
//      flags it adds must be documented ones), and so on.
// It also runs itself on broken copies of the manifests and fails unless each breakage is caught.
//
//   cd k8s && npm ci && node validate.mjs
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..");

// The health service each role's readiness reports (see the role headers below).
const roles = {
  coordinator: { header: "coordinator/coordinator_main.h", readiness: "k3serve.cluster.v1.Coordinator" },
  attention: { header: "attention_nodes/attention_server.h", readiness: "k3serve.v1.K3Serve" },
  router: { header: "router/router_node.h", readiness: "k3serve.cluster.v1.RouterControl" },
  expert: { header: "expert_nodes/expert_node.h", readiness: "k3serve.cluster.v1.ExpertWorker" },
  // The HTTP front: --port is its HTTP API (port "http"), --grpc-port its liveness; readiness is
  // GET /healthz on the metrics port (200 while some attention node answers).
  http: { header: "http_front/http_front.h", grpcFlag: "grpc-port", httpFlag: "port", readinessPath: "/healthz" },
};

// The flags a role's header documents in its leading comment.
function documentedFlags(header) {
  const text = fs.readFileSync(path.join(repo, header), "utf8");
  const comment = text.split("\n").filter((l) => l.startsWith("//")).join("\n");
  return new Set([...comment.matchAll(/--([a-z][a-z0-9-]*)/g)].map((m) => m[1]));
}

async function modelClass(apiVersion, kind) {
  const module =
    apiVersion === "monitoring.coreos.com/v1"
      ? `@kubernetes-models/prometheus-operator/${apiVersion}`
      : `kubernetes-models/${apiVersion}`;
  const exports = await import(module).catch(() => ({}));
  return exports[kind];
}

function loadManifests() {
  const kustomization = yaml.load(fs.readFileSync(path.join(here, "kustomization.yaml"), "utf8"));
  const docs = [];
  for (const file of kustomization.resources) {
    const text = fs.readFileSync(path.join(here, file), "utf8");
    for (const doc of yaml.loadAll(text)) if (doc) docs.push({ file, doc });
  }
  return { kustomization, docs };
}

const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

// Every problem found, as strings; empty when the manifests are consistent.
async function check({ kustomization, docs }) {
  const errors = [];
  const where = ({ file, doc }) => `${file}: ${doc.kind}/${doc.metadata?.name}`;
  const listed = new Set(kustomization.resources);
  for (const f of fs.readdirSync(here)) {
    if (f.endsWith(".yaml") && f !== "kustomization.yaml" && !listed.has(f)) {
      errors.push(`${f} is not listed in kustomization.yaml`);
    }
  }

  // 1. Schemas.
  for (const d of docs) {
    const Model = await modelClass(d.doc.apiVersion, d.doc.kind);
    if (!Model) {
      errors.push(`${where(d)}: no schema for ${d.doc.apiVersion} ${d.doc.kind}`);
      continue;
    }
    try {
      new Model(structuredClone(d.doc)).validate();
    } catch (e) {
      errors.push(`${where(d)}: ${e.message}`);
    }
  }

  // 2. Consistency.
  const of = (kind) => docs.filter((d) => d.doc.kind === kind);
  const byName = (kind, name) => of(kind).find((d) => d.doc.metadata?.name === name);
  const namespace = of("Namespace")[0]?.doc.metadata.name;
  if (!namespace) errors.push("no Namespace object");
  for (const d of docs) {
    if (d.doc.kind !== "Namespace" && d.doc.metadata?.namespace !== namespace) {
      errors.push(`${where(d)}: namespace ${d.doc.metadata?.namespace}, expected ${namespace}`);
    }
  }
  if (kustomization.namespace !== namespace) {
    errors.push(`kustomization.yaml: namespace ${kustomization.namespace}, expected ${namespace}`);
  }
  const imageNames = new Set((kustomization.images ?? []).map((i) => i.name));
  const configMaps = new Map(of("ConfigMap").map((d) => [d.doc.metadata.name, d.doc.data ?? {}]));
  const workloads = [...of("Deployment"), ...of("StatefulSet")];
  const podsOf = (selector) => workloads.filter((w) => matches(selector, w.doc.spec.template.metadata?.labels));
  const flagsArg = (args, flag) => args.find((a) => a.startsWith(`--${flag}=`))?.split("=")[1];

  for (const w of workloads) {
    const spec = w.doc.spec;
    const pod = spec.template;
    if (!matches(spec.selector?.matchLabels, pod.metadata?.labels)) {
      errors.push(`${where(w)}: selector does not match the pod labels`);
    }
    for (const v of pod.spec.volumes ?? []) {
      const claim = v.persistentVolumeClaim?.claimName;
      if (claim && !byName("PersistentVolumeClaim", claim)) {
        errors.push(`${where(w)}: volume ${v.name} claims unknown PVC ${claim}`);
      }
    }
    if (w.doc.kind === "StatefulSet" && !byName("Service", spec.serviceName)) {
      errors.push(`${where(w)}: serviceName ${spec.serviceName} has no Service`);
    }
    for (const c of pod.spec.containers) {
      const name = `${where(w)} container ${c.name}`;
      if (!imageNames.has(c.image.split(":")[0])) {
        errors.push(`${name}: image ${c.image} is not one kustomization.yaml sets`);
      }
      const args = c.args ?? [];
      const role = roles[args[0]];
      if (!role) {
        errors.push(`${name}: first argument ${args[0]} is not a k3serve role`);
        continue;
      }
      const allowed = documentedFlags(role.header);
      for (const a of args.slice(1)) {
        const flag = a.match(/^--([a-z0-9-]+)(=|$)/)?.[1];
        if (!flag || !allowed.has(flag)) {
          errors.push(`${name}: ${a} is not a flag ${role.header} documents`);
        }
      }
      // Variables the args expand.
      const defined = new Set((c.env ?? []).map((e) => e.name));
      for (const from of c.envFrom ?? []) {
        const data = configMaps.get(from.configMapRef?.name);
        if (!data) errors.push(`${name}: envFrom names unknown ConfigMap ${from.configMapRef?.name}`);
        for (const key of Object.keys(data ?? {})) defined.add(key);
      }
      for (const a of args) {
        for (const [, v] of a.matchAll(/\$\(([A-Z0-9_]+)\)/g)) {
          if (!defined.has(v)) errors.push(`${name}: ${a} uses undefined $(${v})`);
        }
      }
      // Ports, probes, metrics.
      const ports = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
      const grpcPort = ports.get("grpc");
      const grpcFlag = role.grpcFlag ?? "port";
      if (String(grpcPort) !== flagsArg(args, grpcFlag)) {
        errors.push(`${name}: grpc containerPort ${grpcPort} differs from --${grpcFlag} ${flagsArg(args, grpcFlag)}`);
      }
      if (role.httpFlag && String(ports.get("http")) !== flagsArg(args, role.httpFlag)) {
        errors.push(`${name}: http containerPort ${ports.get("http")} differs from --${role.httpFlag} ${flagsArg(args, role.httpFlag)}`);
      }
      for (const [resource] of Object.entries({ ...c.resources?.requests, ...c.resources?.limits })) {
        if (resource.includes("gpu")) {
          errors.push(`${name}: asks for ${resource}, but the base runs every kernel on the CPU (GPUs belong in overlays/gpu)`);
        }
      }
      const metricsPort = ports.get("metrics");
      if (String(metricsPort) !== flagsArg(args, "metrics-port")) {
        errors.push(`${name}: metrics containerPort ${metricsPort} differs from --metrics-port`);
      }
      const annotations = pod.metadata?.annotations ?? {};
      if (annotations["prometheus.io/scrape"] !== "true" || annotations["prometheus.io/port"] !== String(metricsPort)) {
        errors.push(`${name}: prometheus.io annotations do not point at the metrics port`);
      }
      for (const kind of role.readinessPath ? ["livenessProbe"] : ["livenessProbe", "readinessProbe"]) {
        const probe = c[kind];
        if (!probe?.grpc) {
          errors.push(`${name}: ${kind} is not a gRPC probe`);
        } else if (probe.grpc.port !== grpcPort) {
          errors.push(`${name}: ${kind} probes port ${probe.grpc.port}, the gRPC server is on ${grpcPort}`);
        }
      }
      if ((c.livenessProbe?.grpc?.service ?? "") !== "") {
        errors.push(`${name}: liveness must ask for the overall health (service "")`);
      }
      if (role.readinessPath) {
        const get = c.readinessProbe?.httpGet;
        if (get?.path !== role.readinessPath || (get?.port !== "metrics" && get?.port !== metricsPort)) {
          errors.push(`${name}: readiness must GET ${role.readinessPath} on the metrics port`);
        }
      } else if (c.readinessProbe?.grpc?.service !== role.readiness) {
        errors.push(`${name}: readiness asks for ${c.readinessProbe?.grpc?.service}, ${args[0]} reports ${role.readiness}`);
      }
      const drain = Number(flagsArg(args, "drain-timeout-ms") ?? 0);
      if (drain >= 1000 * (pod.spec.terminationGracePeriodSeconds ?? 30)) {
        errors.push(`${name}: --drain-timeout-ms ${drain} does not fit in terminationGracePeriodSeconds`);
      }
    }
  }

  for (const s of of("Service")) {
    const pods = podsOf(s.doc.spec.selector);
    if (pods.length === 0) errors.push(`${where(s)}: selector matches no workload`);
    for (const p of s.doc.spec.ports) {
      for (const w of pods) {
        const named = w.doc.spec.template.spec.containers.some((c) =>
          (c.ports ?? []).some((cp) => cp.name === p.targetPort || cp.containerPort === p.targetPort));
        if (!named) errors.push(`${where(s)}: port ${p.name} targets ${p.targetPort}, which ${where(w)} does not open`);
      }
    }
  }
  for (const p of [...of("PodDisruptionBudget"), ...of("PodMonitor")]) {
    const pods = podsOf(p.doc.spec.selector?.matchLabels);
    if (pods.length === 0) errors.push(`${where(p)}: selector matches no workload`);
    for (const e of p.doc.spec.podMetricsEndpoints ?? []) {
      for (const w of pods) {
        if (!w.doc.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === e.port))) {
          errors.push(`${where(p)}: ${where(w)} has no port named ${e.port}`);
        }
      }
    }
  }
  for (const h of of("HorizontalPodAutoscaler")) {
    const ref = h.doc.spec.scaleTargetRef;
    const target = byName(ref.kind, ref.name);
    if (!target) errors.push(`${where(h)}: scales unknown ${ref.kind}/${ref.name}`);
    else if (target.doc.spec.replicas < h.doc.spec.minReplicas) {
      errors.push(`${where(h)}: minReplicas exceeds the ${ref.kind}'s replicas`);
    }
  }

  // The coordinator address every node dials, and the expert counts.
  for (const [cmName, data] of configMaps) {
    if (!data.K3_COORDINATOR) continue;
    const [host, port] = data.K3_COORDINATOR.split(":");
    const [svcName, svcNamespace] = host.split(".");
    const svc = byName("Service", svcName);
    if (!svc || svcNamespace !== namespace || !svc.doc.spec.ports.some((p) => String(p.port) === port)) {
      errors.push(`ConfigMap/${cmName}: K3_COORDINATOR ${data.K3_COORDINATOR} is not a coordinator Service port`);
    } else if (!podsOf(svc.doc.spec.selector).some((w) => w.doc.spec.template.spec.containers[0].args?.[0] === "coordinator")) {
      errors.push(`ConfigMap/${cmName}: K3_COORDINATOR's Service does not select the coordinator`);
    }
    const experts = workloads.find((w) => w.doc.spec.template.spec.containers[0].args?.[0] === "expert");
    if (experts && experts.doc.spec.replicas < Number(data.K3_EXPECTED_EXPERTS)) {
      errors.push(`ConfigMap/${cmName}: K3_EXPECTED_EXPERTS exceeds the expert replicas`);
    }
  }
  // NetworkPolicies: every pod is selected by one; a rule open to every source (no `from`, or an
  // empty selector) admits only the public ports (the attention nodes' gRPC API, the HTTP front's
  // OpenAI and gRPC APIs); named ports are ones the selected pods open; sources within the namespace are the
  // cluster's own pods.
  const selects = (selector, labels) =>
    matches(selector?.matchLabels, labels) &&
    (selector?.matchExpressions ?? []).every((e) =>
      e.operator === "In" ? e.values.includes(labels?.[e.key])
        : e.operator === "NotIn" ? !e.values.includes(labels?.[e.key])
        : e.operator === "Exists" ? e.key in (labels ?? {}) : !(e.key in (labels ?? {})));
  const publicPorts = { attention: ["grpc"], http: ["http", "grpc"] };
  const policies = of("NetworkPolicy");
  for (const w of workloads) {
    const labels = w.doc.spec.template.metadata?.labels;
    if (!policies.some((p) => selects(p.doc.spec.podSelector, labels))) {
      errors.push(`${where(w)}: no NetworkPolicy selects its pods`);
    }
  }
  for (const p of policies) {
    const pods = workloads.filter((w) => selects(p.doc.spec.podSelector, w.doc.spec.template.metadata?.labels));
    if (pods.length === 0) errors.push(`${where(p)}: selects no pods`);
    for (const rule of p.doc.spec.ingress ?? []) {
      const open = !rule.from || rule.from.length === 0 ||
        rule.from.some((f) => (f.ipBlock && f.ipBlock.cidr.endsWith("/0")) ||
          (f.namespaceSelector && Object.keys(f.namespaceSelector).length === 0));
      for (const f of rule.from ?? []) {
        if (f.podSelector && !f.namespaceSelector &&
            f.podSelector.matchLabels?.["app.kubernetes.io/part-of"] !== "k3serve") {
          errors.push(`${where(p)}: admits pods other than the cluster's own`);
        }
      }
      for (const w of pods) {
        const role = w.doc.spec.template.spec.containers[0].args?.[0];
        const opened = new Set(w.doc.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((q) => q.name)));
        for (const port of rule.ports ?? []) {
          if (typeof port.port === "string" && !opened.has(port.port)) {
            errors.push(`${where(p)}: port ${port.port} is not one ${where(w)} opens`);
          }
        }
        if (open && (!rule.ports || !rule.ports.every((q) => (publicPorts[role] ?? []).includes(q.port)))) {
          errors.push(`${where(p)}: opens ${role} pods' non-public ports to every source`);
        }
      }
    }
  }
  // The GPU overlay patches workloads that exist, and the flags it adds are ones the role documents.
  for (const p of overlay.patches ?? []) {
    const target = byName(p.target.kind, p.target.name);
    if (!target) {
      errors.push(`overlays/gpu: patches unknown ${p.target.kind}/${p.target.name}`);
      continue;
    }
    const role = roles[target.doc.spec.template.spec.containers[0].args?.[0]];
    for (const op of yaml.load(p.patch) ?? []) {
      if (!role || !op.path.endsWith("/args/-")) continue;
      const flag = String(op.value).match(/^--([a-z0-9-]+)(=|$)/)?.[1];
      if (!flag || !documentedFlags(role.header).has(flag)) {
        errors.push(`overlays/gpu: adds ${op.value} to ${p.target.name}, not a flag ${role.header} documents`);
      }
    }
  }
  return errors;
}

const overlay = yaml.load(fs.readFileSync(path.join(here, "overlays/gpu/kustomization.yaml"), "utf8"));

// Breakages the checks must catch, each applied to a fresh copy of the manifests.
const breakages = {
  "wrong readiness port": (m) => {
    const c = m.docs.find((d) => d.doc.metadata.name === "k3serve-attention" && d.doc.kind === "Deployment");
    c.doc.spec.template.spec.containers[0].readinessProbe.grpc.port = 50052;
  },
  "undocumented flag": (m) => {
    const c = m.docs.find((d) => d.doc.metadata.name === "k3serve-router");
    c.doc.spec.template.spec.containers[0].args.push("--no-such-flag=1");
  },
  "undefined variable": (m) => {
    const c = m.docs.find((d) => d.doc.kind === "ConfigMap");
    delete c.doc.data.K3_EXPERT_SLOTS;
  },
  "selector mismatch": (m) => {
    const s = m.docs.find((d) => d.doc.metadata.name === "k3serve-generate");
    s.doc.spec.selector["app.kubernetes.io/component"] = "attn";
  },
  "front readiness not on /healthz": (m) => {
    const c = m.docs.find((d) => d.doc.metadata.name === "k3serve-http" && d.doc.kind === "Deployment");
    c.doc.spec.template.spec.containers[0].readinessProbe.httpGet.path = "/";
  },
  "front HTTP port differs from --port": (m) => {
    const c = m.docs.find((d) => d.doc.metadata.name === "k3serve-http" && d.doc.kind === "Deployment");
    c.doc.spec.template.spec.containers[0].ports.find((p) => p.name === "http").containerPort = 8080;
  },
  "front Service targets an unopened port": (m) => {
    const s = m.docs.find((d) => d.doc.metadata.name === "k3serve-http" && d.doc.kind === "Service");
    s.doc.spec.ports[0].targetPort = "web";
  },
  "GPU request in the base": (m) => {
    const d = m.docs.find((d) => d.doc.kind === "StatefulSet");
    d.doc.spec.template.spec.containers[0].resources.requests["nvidia.com/gpu"] = "1";
  },
  "control plane open to all": (m) => {
    const p = m.docs.find((d) => d.doc.metadata.name === "k3serve-internal" && d.doc.kind === "NetworkPolicy");
    delete p.doc.spec.ingress[0].from;
  },
  "pods without a NetworkPolicy": (m) => {
    m.docs = m.docs.filter((d) => d.doc.metadata.name !== "k3serve-internal");
  },
  "NetworkPolicy names an unopened port": (m) => {
    const p = m.docs.find((d) => d.doc.metadata.name === "k3serve-attention" && d.doc.kind === "NetworkPolicy");
    p.doc.spec.ingress[1].ports[0].port = "api";
  },
  "schema violation": (m) => {
    const d = m.docs.find((d) => d.doc.kind === "StatefulSet");
    d.doc.spec.replicas = "five";
  },
};

const manifests = loadManifests();
const errors = await check(manifests);
for (const [name, breakIt] of Object.entries(breakages)) {
  const copy = structuredClone(manifests);
  breakIt(copy);
  if ((await check(copy)).length === 0) errors.push(`self-test: the checks missed "${name}"`);
}
if (errors.length > 0) {
  for (const e of errors) console.error(`error: ${e}`);
  process.exit(1);
}
console.log(`k8s: ${manifests.docs.length} objects in ${manifests.kustomization.resources.length} files are valid and consistent`);
