#!/usr/bin/env python3
"""Regenerate the wrapper Go modules under tests/cluster/go/ from the upstream go.mod files.

k8s.io/kubernetes cannot be `go install`ed at a version: its go.mod requires every staging
module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging/src/...,
and replace directives of a dependency are ignored. The wrapper module requires
k8s.io/kubernetes at KUBE_VERSION and replaces each of those staging modules with the
published tag v0.<minor>.<patch>. The list is read from the upstream go.mod, never hard-coded.

etcd's server module is wrapped the same way: its `replace go.etcd.io/etcd/<x>/v3 => ../<x>`
siblings are pinned to the same published version.

CoreDNS (go/coredns) is our own main package importing only the plugins the test cluster uses;
its go.mod requires github.com/coredns/coredns at COREDNS_VERSION.

Usage: tests/cluster/gen_gomod.py [kubernetes] [etcd] [coredns]   (versions from versions.env)
Needs only `go` and the Go module proxy. Rewrites go.mod, then `go mod tidy` writes go.sum.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "go"

K8S_TOOLS = [
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kubectl",
    "k8s.io/kubernetes/cmd/kube-proxy",
]
ETCD_TOOLS = ["go.etcd.io/etcd/server/v3"]


def read_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, val = line.partition("=")
        out[key.strip()] = os.environ.get(key.strip(), val.strip().strip('"'))
    return out


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def download_gomod(module: str, version: str) -> str:
    res = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        check=True, capture_output=True, text=True, env=go_env(), cwd="/",
    )
    info = json.loads(res.stdout)
    if info.get("Error"):
        raise SystemExit(f"go mod download {module}@{version}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


def parse_replaces(gomod: str) -> list[tuple[str, str]]:
    """All `old => ./path` or `old => ../path` (local) replaces, single-line or block form."""
    out = []
    in_block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if line.startswith("replace "):
            line = line[len("replace "):].strip()
        elif not in_block:
            continue
        m = re.match(r"^(\S+)(?:\s+\S+)?\s*=>\s*(\S+)$", line)
        if m and m.group(2).startswith("."):
            out.append((m.group(1), m.group(2)))
    return out


def parse_requires(gomod: str) -> dict[str, str]:
    out = {}
    in_block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("require ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if line.startswith("require "):
            line = line[len("require "):].strip()
        elif not in_block:
            continue
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def go_directive(gomod: str) -> str:
    m = re.search(r"^go\s+(\S+)", gomod, re.M)
    return m.group(1) if m else "1.24"


def write_module(path: Path, name: str, godir: str, require: dict[str, str],
                 replace: dict[str, str], tools: list[str], header: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"// {h}".rstrip() for h in header.splitlines()]
    lines += [f"module {name}", "", f"go {godir}", "", "require ("]
    lines += [f"\t{m} {v}" for m, v in sorted(require.items())]
    lines += [")", "", "replace ("]
    lines += [f"\t{m} => {m} {v}" for m, v in sorted(replace.items())]
    lines += [")", "", "tool ("]
    lines += [f"\t{t}" for t in tools]
    lines += [")", ""]
    (path / "go.mod").write_text("\n".join(lines))
    (path / "go.sum").unlink(missing_ok=True)
    subprocess.run(["go", "mod", "tidy"], check=True, cwd=path, env=go_env())


def gen_kubernetes(version: str) -> None:
    gomod = download_gomod("k8s.io/kubernetes", version)
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    requires = parse_requires(gomod)
    replace = {}
    for mod, target in parse_replaces(gomod):
        if not target.startswith("./staging/src/"):
            continue
        # Only modules k8s.io/kubernetes actually requires enter the module graph; the rest
        # (e.g. k8s.io/sample-cli-plugin) are not published and must not be named.
        if mod in requires:
            replace[mod] = staging_version
    if not replace:
        raise SystemExit("no ./staging/src replaces found in k8s.io/kubernetes go.mod")
    write_module(
        GO_DIR / "kubernetes", "rljob.io/testcluster/kubernetes", go_directive(gomod),
        {"k8s.io/kubernetes": version}, replace, K8S_TOOLS,
        f"Generated by tests/cluster/gen_gomod.py from k8s.io/kubernetes@{version}'s go.mod.\n"
        f"Staging modules pinned to their published {staging_version}. Do not edit by hand.",
    )
    print(f"kubernetes {version}: {len(replace)} staging modules -> {staging_version}")


def gen_etcd(version: str) -> None:
    gomod = download_gomod("go.etcd.io/etcd/server/v3", version)
    replace = {}
    for mod, _target in parse_replaces(gomod):
        if mod.startswith("go.etcd.io/etcd/") and mod.endswith("/v3"):
            replace[mod] = version
    write_module(
        GO_DIR / "etcd", "rljob.io/testcluster/etcd", go_directive(gomod),
        {"go.etcd.io/etcd/server/v3": version}, replace, ETCD_TOOLS,
        f"Generated by tests/cluster/gen_gomod.py from go.etcd.io/etcd/server/v3@{version}'s go.mod.\n"
        f"Sibling etcd modules pinned to {version}. Do not edit by hand.",
    )
    print(f"etcd {version}: {len(replace)} sibling modules -> {version}")


def gen_coredns(version: str) -> None:
    """go/coredns is a main package of our own (main.go picks the plugins): only its go.mod
    requirement and go.sum are generated."""
    path = GO_DIR / "coredns"
    header = ("Generated by tests/cluster/gen_gomod.py: CoreDNS with the plugins main.go imports.\n"
              "Do not edit by hand.")
    lines = [f"// {h}" for h in header.splitlines()]
    lines += ["module rljob.io/testcluster/coredns", "",
              f"go {go_directive(download_gomod('github.com/coredns/coredns', version))}", "",
              f"require github.com/coredns/coredns {version}", ""]
    (path / "go.mod").write_text("\n".join(lines))
    (path / "go.sum").unlink(missing_ok=True)
    subprocess.run(["go", "mod", "tidy"], check=True, cwd=path, env=go_env())
    print(f"coredns {version}")


def main() -> int:
    v = read_versions()
    which = sys.argv[1:] or ["kubernetes", "etcd", "coredns"]
    if "kubernetes" in which:
        gen_kubernetes(v["KUBE_VERSION"])
    if "etcd" in which:
        gen_etcd(v["ETCD_VERSION"])
    if "coredns" in which:
        gen_coredns(v["COREDNS_VERSION"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
