// k8s_validate.mjs - offline schema checks of Kubernetes manifests (tests/py/test_deploy.py).
//
//   node tests/node/k8s_validate.mjs FILE.yaml ...      (multi-document YAML; "-" = stdin)
//   node tests/node/k8s_validate.mjs --parse FILE ...    (parse only: values files, rule files)
//
// Prints one JSON object: {"results": [{file, index, apiVersion, kind, name, ok, errors}],
// "docs": [{file, index, doc}]}; the documents are handed back parsed so that the caller's
// semantic checks see exactly what was validated. Exit status 0 when every document passed.
//
// Built-in kinds are validated with kubernetes-models@4 (the Kubernetes 1.27 OpenAPI schemas:
// types, required fields, enums). Those schemas accept unknown fields (a typo such as
// `livenesProbe` would pass), so the objects that matter most (pod spec, containers, probes,
// security contexts, mounts) are also checked against allow-lists of their field names. The
// custom resources (ServiceMonitor, ScaledObject, InferencePool, HTTPRoute, ServingRuntime,
// InferenceService) have no schema package for Node 20: their required fields and enums are
// checked here by hand, and their embedded containers with the core Container schema.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { ConfigMap, Service, ServiceAccount, Container } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";

const BUILTIN = {
  "v1/ConfigMap": ConfigMap,
  "v1/Service": Service,
  "v1/ServiceAccount": ServiceAccount,
  "apps/v1/Deployment": Deployment,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "autoscaling/v2/HorizontalPodAutoscaler": HorizontalPodAutoscaler,
};

// Field names per object (Kubernetes 1.27 to 1.33), for the unknown-field pass.
const FIELDS = {
  objectMeta: ["name", "namespace", "labels", "annotations", "generateName", "finalizers", "ownerReferences"],
  deploymentSpec: ["minReadySeconds", "paused", "progressDeadlineSeconds", "replicas",
    "revisionHistoryLimit", "selector", "strategy", "template"],
  podTemplate: ["metadata", "spec"],
  podSpec: ["activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers",
    "dnsConfig", "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "hostAliases", "hostIPC",
    "hostNetwork", "hostPID", "hostUsers", "hostname", "imagePullSecrets", "initContainers",
    "nodeName", "nodeSelector", "os", "overhead", "preemptionPolicy", "priority",
    "priorityClassName", "readinessGates", "resourceClaims", "resources", "restartPolicy",
    "runtimeClassName", "schedulerName", "schedulingGates", "securityContext", "serviceAccount",
    "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace", "subdomain",
    "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints", "volumes"],
  container: ["args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
    "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "resources",
    "restartPolicy", "securityContext", "startupProbe", "stdin", "stdinOnce",
    "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts",
    "workingDir"],
  probe: ["exec", "failureThreshold", "grpc", "httpGet", "initialDelaySeconds", "periodSeconds",
    "successThreshold", "tcpSocket", "terminationGracePeriodSeconds", "timeoutSeconds"],
  httpGet: ["host", "httpHeaders", "path", "port", "scheme"],
  lifecycle: ["postStart", "preStop", "stopSignal"],
  handler: ["exec", "httpGet", "sleep", "tcpSocket"],
  containerPort: ["containerPort", "hostIP", "hostPort", "name", "protocol"],
  resources: ["claims", "limits", "requests"],
  securityContext: ["allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged",
    "procMount", "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser",
    "seLinuxOptions", "seccompProfile", "windowsOptions"],
  podSecurityContext: ["appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup",
    "runAsNonRoot", "runAsUser", "seLinuxChangePolicy", "seLinuxOptions", "seccompProfile",
    "supplementalGroups", "supplementalGroupsPolicy", "sysctls", "windowsOptions"],
  volumeMount: ["mountPath", "mountPropagation", "name", "readOnly", "recursiveReadOnly", "subPath",
    "subPathExpr"],
  topologySpread: ["labelSelector", "matchLabelKeys", "maxSkew", "minDomains", "nodeAffinityPolicy",
    "nodeTaintsPolicy", "topologyKey", "whenUnsatisfiable"],
  toleration: ["effect", "key", "operator", "tolerationSeconds", "value"],
  servicePort: ["appProtocol", "name", "nodePort", "port", "protocol", "targetPort"],
  serviceMonitorEndpoint: ["authorization", "basicAuth", "bearerTokenFile", "bearerTokenSecret",
    "enableHttp2", "filterRunning", "followRedirects", "honorLabels", "honorTimestamps", "interval",
    "metricRelabelings", "oauth2", "params", "path", "port", "proxyUrl", "relabelings", "scheme",
    "scrapeTimeout", "targetPort", "tlsConfig", "trackTimestampsStaleness"],
};

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const DNS1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DURATION = /^([0-9]+(ms|s|m|h))+$/;

function unknownFields(obj, set, where, errors) {
  if (!isObj(obj)) return;
  const allowed = FIELDS[set];
  for (const k of Object.keys(obj)) {
    if (!allowed.includes(k)) errors.push(`${where}: unknown field "${k}"`);
  }
}

function checkContainer(c, where, errors) {
  unknownFields(c, "container", where, errors);
  for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    if (!c[p]) continue;
    unknownFields(c[p], "probe", `${where}.${p}`, errors);
    unknownFields(c[p].httpGet, "httpGet", `${where}.${p}.httpGet`, errors);
  }
  if (c.lifecycle) {
    unknownFields(c.lifecycle, "lifecycle", `${where}.lifecycle`, errors);
    for (const h of ["postStart", "preStop"]) {
      unknownFields(c.lifecycle[h], "handler", `${where}.lifecycle.${h}`, errors);
    }
  }
  (c.ports || []).forEach((p, i) => unknownFields(p, "containerPort", `${where}.ports[${i}]`, errors));
  unknownFields(c.resources, "resources", `${where}.resources`, errors);
  unknownFields(c.securityContext, "securityContext", `${where}.securityContext`, errors);
  (c.volumeMounts || []).forEach((m, i) => unknownFields(m, "volumeMount", `${where}.volumeMounts[${i}]`, errors));
}

function checkPodSpec(spec, where, errors) {
  unknownFields(spec, "podSpec", where, errors);
  unknownFields(spec.securityContext, "podSecurityContext", `${where}.securityContext`, errors);
  (spec.containers || []).forEach((c, i) => checkContainer(c, `${where}.containers[${i}]`, errors));
  (spec.initContainers || []).forEach((c, i) => checkContainer(c, `${where}.initContainers[${i}]`, errors));
  (spec.topologySpreadConstraints || []).forEach((t, i) =>
    unknownFields(t, "topologySpread", `${where}.topologySpreadConstraints[${i}]`, errors));
  (spec.tolerations || []).forEach((t, i) => unknownFields(t, "toleration", `${where}.tolerations[${i}]`, errors));
  // Every mount names a volume of the pod.
  const vols = new Set((spec.volumes || []).map((v) => v.name));
  (spec.containers || []).forEach((c, i) => (c.volumeMounts || []).forEach((m, j) => {
    if (!vols.has(m.name)) errors.push(`${where}.containers[${i}].volumeMounts[${j}]: no volume "${m.name}"`);
  }));
}

function schemaErrors(Model, obj, where, errors) {
  try {
    new Model(obj).validate();
  } catch (e) {
    errors.push(`${where}: ${e.message}`);
  }
}

function need(cond, msg, errors) {
  if (!cond) errors.push(msg);
}

// --- custom resources: required fields and enums, by hand

function checkServiceMonitor(d, errors) {
  const s = d.spec || {};
  need(isObj(s.selector), "spec.selector: required", errors);
  need(Array.isArray(s.endpoints) && s.endpoints.length > 0, "spec.endpoints: at least one", errors);
  (s.endpoints || []).forEach((e, i) => {
    unknownFields(e, "serviceMonitorEndpoint", `spec.endpoints[${i}]`, errors);
    need(e.port !== undefined || e.targetPort !== undefined, `spec.endpoints[${i}]: port or targetPort required`, errors);
    for (const k of ["interval", "scrapeTimeout"]) {
      if (e[k] !== undefined) need(DURATION.test(String(e[k])), `spec.endpoints[${i}].${k}: not a duration`, errors);
    }
    if (e.authorization) {
      need(isObj(e.authorization.credentials) && e.authorization.credentials.name && e.authorization.credentials.key,
        `spec.endpoints[${i}].authorization.credentials: name and key required`, errors);
    }
  });
}

function checkScaledObject(d, errors) {
  const s = d.spec || {};
  need(isObj(s.scaleTargetRef) && typeof s.scaleTargetRef.name === "string", "spec.scaleTargetRef.name: required", errors);
  need(Array.isArray(s.triggers) && s.triggers.length > 0, "spec.triggers: at least one", errors);
  for (const k of ["minReplicaCount", "maxReplicaCount", "idleReplicaCount", "pollingInterval", "cooldownPeriod"]) {
    if (s[k] !== undefined) need(Number.isInteger(s[k]) && s[k] >= 0, `spec.${k}: must be an integer >= 0`, errors);
  }
  if (s.minReplicaCount !== undefined && s.maxReplicaCount !== undefined) {
    need(s.minReplicaCount <= s.maxReplicaCount, "spec.minReplicaCount > maxReplicaCount", errors);
  }
  if (s.idleReplicaCount !== undefined) {
    need(s.idleReplicaCount < (s.minReplicaCount ?? 0) || s.minReplicaCount === undefined,
      "spec.idleReplicaCount must be below minReplicaCount", errors);
  }
  if (s.fallback) {
    need(Number.isInteger(s.fallback.failureThreshold) && Number.isInteger(s.fallback.replicas),
      "spec.fallback: failureThreshold and replicas (integers) required", errors);
  }
  (s.triggers || []).forEach((t, i) => {
    need(typeof t.type === "string", `spec.triggers[${i}].type: required`, errors);
    need(isObj(t.metadata), `spec.triggers[${i}].metadata: required`, errors);
    // KEDA's trigger metadata is map[string]string: a number here is refused by the API server.
    for (const [k, v] of Object.entries(t.metadata || {})) {
      need(typeof v === "string", `spec.triggers[${i}].metadata.${k}: must be a string`, errors);
    }
    if (t.type === "prometheus") {
      for (const k of ["serverAddress", "query", "threshold"]) {
        need(t.metadata && t.metadata[k], `spec.triggers[${i}].metadata.${k}: required`, errors);
      }
    }
  });
}

function checkInferencePool(d, errors) {
  const s = d.spec || {};
  const ml = s.selector && s.selector.matchLabels;
  need(isObj(ml) && Object.keys(ml).length > 0, "spec.selector.matchLabels: at least one label", errors);
  need(Array.isArray(s.targetPorts) && s.targetPorts.length >= 1 && s.targetPorts.length <= 8,
    "spec.targetPorts: 1 to 8 ports", errors);
  (s.targetPorts || []).forEach((p, i) =>
    need(Number.isInteger(p.number) && p.number >= 1 && p.number <= 65535, `spec.targetPorts[${i}].number: 1-65535`, errors));
  const e = s.endpointPickerRef;
  need(isObj(e) && typeof e.name === "string" && e.name.length > 0, "spec.endpointPickerRef.name: required", errors);
  if (isObj(e)) {
    if ((e.kind || "Service") === "Service") {
      need(isObj(e.port) && Number.isInteger(e.port.number), "spec.endpointPickerRef.port.number: required for a Service", errors);
    }
    if (e.failureMode !== undefined) {
      need(["FailOpen", "FailClose"].includes(e.failureMode), "spec.endpointPickerRef.failureMode: FailOpen or FailClose", errors);
    }
  }
}

function checkHTTPRoute(d, errors) {
  const s = d.spec || {};
  need(Array.isArray(s.parentRefs) && s.parentRefs.length > 0, "spec.parentRefs: at least one", errors);
  need(Array.isArray(s.rules) && s.rules.length > 0, "spec.rules: at least one", errors);
  (s.rules || []).forEach((r, i) => (r.backendRefs || []).forEach((b, j) =>
    need(typeof b.name === "string", `spec.rules[${i}].backendRefs[${j}].name: required`, errors)));
}

function checkServingRuntime(d, errors) {
  const s = d.spec || {};
  need(Array.isArray(s.containers) && s.containers.length > 0, "spec.containers: at least one", errors);
  need((s.containers || []).some((c) => c.name === "kserve-container"), "spec.containers: none named kserve-container", errors);
  (s.containers || []).forEach((c, i) => {
    schemaErrors(Container, c, `spec.containers[${i}]`, errors);
    checkContainer(c, `spec.containers[${i}]`, errors);
  });
  need(Array.isArray(s.supportedModelFormats) && s.supportedModelFormats.length > 0,
    "spec.supportedModelFormats: at least one", errors);
  (s.supportedModelFormats || []).forEach((f, i) =>
    need(typeof f.name === "string", `spec.supportedModelFormats[${i}].name: required`, errors));
  // The values KServe's InferenceServiceProtocol knows.
  (s.protocolVersions || []).forEach((p, i) =>
    need(["v1", "v2", "grpc-v1", "grpc-v2"].includes(p), `spec.protocolVersions[${i}]: "${p}" is not v1, v2, grpc-v1 or grpc-v2`, errors));
  for (const [k, v] of Object.entries(s.annotations || {})) {
    need(typeof v === "string", `spec.annotations.${k}: must be a string`, errors);
  }
}

function checkInferenceService(d, errors) {
  const m = d.spec && d.spec.predictor && d.spec.predictor.model;
  need(isObj(m), "spec.predictor.model: required", errors);
  if (isObj(m)) {
    need(isObj(m.modelFormat) && typeof m.modelFormat.name === "string", "spec.predictor.model.modelFormat.name: required", errors);
    need(typeof m.storageUri === "string", "spec.predictor.model.storageUri: required", errors);
    if (m.protocolVersion !== undefined) {
      need(["v1", "v2", "grpc-v1", "grpc-v2"].includes(m.protocolVersion), "spec.predictor.model.protocolVersion: unknown", errors);
    }
  }
}

const CUSTOM = {
  "monitoring.coreos.com/v1/ServiceMonitor": checkServiceMonitor,
  "keda.sh/v1alpha1/ScaledObject": checkScaledObject,
  "inference.networking.k8s.io/v1/InferencePool": checkInferencePool,
  "gateway.networking.k8s.io/v1/HTTPRoute": checkHTTPRoute,
  "serving.kserve.io/v1alpha1/ServingRuntime": checkServingRuntime,
  "serving.kserve.io/v1beta1/InferenceService": checkInferenceService,
};

function validate(doc) {
  const errors = [];
  const key = `${doc.apiVersion}/${doc.kind}`;
  if (!isObj(doc.metadata) || typeof doc.metadata.name !== "string") {
    errors.push("metadata.name: required");
  } else if (!DNS1123.test(doc.metadata.name) || doc.metadata.name.length > 253) {
    errors.push(`metadata.name: "${doc.metadata.name}" is not a DNS-1123 name`);
  }
  unknownFields(doc.metadata, "objectMeta", "metadata", errors);
  if (BUILTIN[key]) {
    schemaErrors(BUILTIN[key], doc, key, errors);
  } else if (CUSTOM[key]) {
    CUSTOM[key](doc, errors);
  } else {
    errors.push(`${key}: no schema or check for this apiVersion/kind`);
  }
  if (doc.kind === "Deployment" && isObj(doc.spec)) {
    unknownFields(doc.spec, "deploymentSpec", "spec", errors);
    unknownFields(doc.spec.template, "podTemplate", "spec.template", errors);
    if (doc.spec.template && isObj(doc.spec.template.spec)) checkPodSpec(doc.spec.template.spec, "spec.template.spec", errors);
  }
  if (doc.kind === "Service" && isObj(doc.spec)) {
    (doc.spec.ports || []).forEach((p, i) => unknownFields(p, "servicePort", `spec.ports[${i}]`, errors));
  }
  return errors;
}

const out = { results: [], docs: [] };
let failed = 0;
let args = process.argv.slice(2);
const parseOnly = args[0] === "--parse";
if (parseOnly) args = args.slice(1);
for (const file of args) {
  const text = readFileSync(file === "-" ? 0 : file, "utf8");
  parseAllDocuments(text).forEach((d, index) => {
    if (d.errors.length) {
      failed++;
      out.results.push({ file, index, ok: false, errors: d.errors.map((e) => e.message) });
      return;
    }
    const doc = d.toJS();
    if (doc === null || doc === undefined) return; // an empty document (a template rendered nothing)
    if (parseOnly) {
      out.docs.push({ file, index, doc });
      return;
    }
    const errors = isObj(doc) ? validate(doc) : ["not a mapping"];
    if (errors.length) failed++;
    out.results.push({ file, index, apiVersion: doc.apiVersion, kind: doc.kind, name: doc.metadata && doc.metadata.name,
      ok: errors.length === 0, errors });
    out.docs.push({ file, index, doc });
  });
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(failed ? 1 : 0);
