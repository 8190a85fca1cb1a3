#!/usr/bin/env python3
"""test_image.py - the minimal container image (deploy/Dockerfile's `minimal` target), built and run.

Docker has no engine here; podman (Debian) builds and runs OCI images without a daemon. The
image is the Dockerfile's `minimal` stage as written there, over the root file system that
scripts/minimal-rootfs.sh assembles from this tree's build (the Dockerfile's `rootfs` stage
runs the same script inside its build stage). Checked: the image holds no shell, the server in
it starts, answers /health and a completion from the demo model as the host binary does, and
exits 0 on SIGTERM (`podman stop`). Everything podman writes (images, containers, its
database) lives in a temporary directory removed at the end.

Skipped, with the reason, where podman or an OCI runtime cannot run a container here (a
FROM-scratch probe image with a static hello program is tried first).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

from common import ROOT, DEMO_MODEL, Suite, binary, free_port

s = Suite("image")


def podman(base, *args, timeout=300, check=False):
    r = subprocess.run(["podman", *base, *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, CONTAINERS_CONF=base_conf))
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: exit {r.returncode}: {r.stderr[-800:]}")
    return r


def minimal_stage():
    """The minimal stage's instructions from deploy/Dockerfile, with its COPY from the rootfs
    stage turned into a COPY of the context's rootfs/ folder."""
    text = re.sub(r"\\\n", " ", open(os.path.join(ROOT, "deploy", "Dockerfile")).read())
    out, inside = [], False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            if inside:
                break
            inside = line.split()[-1] == "minimal"
            if inside:
                out.append("FROM scratch")
            continue
        if inside:
            out.append(line.replace("COPY --from=rootfs /rootfs/ /", "COPY rootfs/ /"))
    return out


def get(url, body=None, timeout=10):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


tmp = tempfile.mkdtemp(prefix="sampan-image-")
base_conf = os.path.join(tmp, "containers.conf")
try:
    exe = binary()
    runtime = shutil.which("runc") or shutil.which("crun")
    if exe is None:
        s.skip("all", "sampan not built")
    elif not shutil.which("podman") or runtime is None:
        s.skip("all", "podman or an OCI runtime (runc) is not installed (scripts/deps.sh --test)")
    elif not shutil.which("gcc"):
        s.skip("all", "no gcc for the probe image")
    else:
        # Containers inherit no rlimits from a config (an unprivileged sandbox may not raise
        # them), and the cgroups v1 manager of the host is used as it is.
        with open(base_conf, "w") as f:
            f.write("[containers]\ndefault_ulimits = []\n")
        base = ["--root", os.path.join(tmp, "root"), "--runroot", os.path.join(tmp, "run"),
                "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", runtime,
                "--events-backend", "none"]
        probe = os.path.join(tmp, "probe")
        os.makedirs(probe)
        with open(os.path.join(probe, "hello.c"), "w") as f:
            f.write('#include <stdio.h>\nint main(void) { puts("probe ok"); return 0; }\n')
        subprocess.run(["gcc", "-static", "-O1", "-o", os.path.join(probe, "hello"),
                        os.path.join(probe, "hello.c")], check=True)
        with open(os.path.join(probe, "Containerfile"), "w") as f:
            f.write('FROM scratch\nCOPY hello /hello\nENTRYPOINT ["/hello"]\n')
        r = podman(base, "build", "-q", "-t", "localhost/sampan-probe:t", probe)
        r2 = podman(base, "run", "--rm", "--network", "none", "localhost/sampan-probe:t") if r.returncode == 0 else r
        if r.returncode != 0 or "probe ok" not in r2.stdout:
            why = (r2.stderr or r.stderr).strip().splitlines()
            s.skip("all", f"podman cannot run a container on this machine: {why[-1] if why else '?'}")
        else:
            ctx = os.path.join(tmp, "ctx")
            os.makedirs(ctx)
            t0 = time.time()
            rc = subprocess.run([os.path.join(ROOT, "scripts", "minimal-rootfs.sh"),
                                 os.path.join(ctx, "rootfs"), exe], capture_output=True, text=True)
            s.case("scripts/minimal-rootfs.sh assembles the root file system", rc.returncode == 0,
                   rc.stderr[-500:])
            stage = minimal_stage()
            s.case("deploy/Dockerfile has the minimal stage (FROM scratch, COPY of the rootfs)",
                   stage[:2] == ["FROM scratch", "COPY rootfs/ /"], str(stage))
            with open(os.path.join(ctx, "Containerfile"), "w") as f:
                f.write("\n".join(stage) + "\n")
            r = podman(base, "build", "-q", "-t", "localhost/sampan-minimal:test", ctx)
            s.case("podman builds the minimal image", r.returncode == 0, r.stderr[-800:])
            size = podman(base, "image", "inspect", "--format", "{{.Size}}",
                          "localhost/sampan-minimal:test").stdout.strip()
            mb = int(size) / 1e6 if size.isdigit() else -1
            s.case(f"image size {mb:.0f} MB (binary, plugins, their libraries, the demo model)",
                   0 < mb < 200, size)
            r = podman(base, "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh",
                       "localhost/sampan-minimal:test", "-c", "true", timeout=60)
            s.case("no shell in the image", r.returncode != 0, r.stderr[-300:])
            port = free_port()
            r = podman(base, "run", "-d", "--name", "sampan-min", "--network", "host",
                       "localhost/sampan-minimal:test", "serve", "--host", "127.0.0.1",
                       "--port", str(port), "--model-repository", "/models", timeout=60)
            s.case("the container starts (the image's entrypoint and demo repository)",
                   r.returncode == 0, r.stderr[-500:])
            st = None
            deadline = time.time() + 30
            while time.time() < deadline:
                st, _ = get(f"http://127.0.0.1:{port}/health", timeout=2)
                if st == 200:
                    break
                time.sleep(0.2)
            s.case("GET /health 200 from the container", st == 200, st)
            body = json.dumps({"model": "stories260K", "prompt": "Once upon a time",
                               "max_tokens": 12, "temperature": 0}).encode()
            st, text = get(f"http://127.0.0.1:{port}/v1/completions", body)
            got = json.loads(text)["choices"][0]["text"] if st == 200 else text
            # the same greedy completion from the host binary, run here
            hp = free_port()
            host = subprocess.Popen([exe, "serve", "--port", str(hp), "--model", f"stories260K={DEMO_MODEL}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                want = None
                deadline = time.time() + 20
                while time.time() < deadline and want is None:
                    hs, ht = get(f"http://127.0.0.1:{hp}/v1/completions", body, timeout=5)
                    if hs == 200:
                        want = json.loads(ht)["choices"][0]["text"]
                    else:
                        time.sleep(0.2)
            finally:
                host.terminate()
                host.wait(10)
            s.case("a completion from the container equals the host binary's", st == 200 and got == want,
                   f"{got!r} vs {want!r}")
            r = podman(base, "stop", "-t", "20", "sampan-min", timeout=60)
            code = podman(base, "inspect", "--format", "{{.State.ExitCode}}", "sampan-min").stdout.strip()
            logs = podman(base, "logs", "sampan-min").stderr
            s.case("podman stop (SIGTERM): drains and exits 0", r.returncode == 0 and code == "0"
                   and "event=stopped status=0" in logs, f"exit {code}: {logs[-300:]}")
            podman(base, "rm", "-f", "sampan-min")
            print(f"image: built and checked in {time.time() - t0:.1f} s", flush=True)
finally:
    try:
        if os.path.isdir(os.path.join(tmp, "root")):
            podman(["--root", os.path.join(tmp, "root"), "--runroot", os.path.join(tmp, "run"),
                    "--storage-driver", "vfs"], "system", "reset", "-f", timeout=120)
    except Exception:
        pass
    shutil.rmtree(tmp, ignore_errors=True)
s.finish()
