#!/usr/bin/env python3
"""Validates the Kubernetes manifests under deploy/kubernetes, offline.

- Kubernetes' own kinds against the Kubernetes JSON schemas that ship in the
  kubernetes-validate wheel, strict (unknown fields are errors), for the oldest version the
  manifests need (1.28: the StatefulSet pod-index label) and the newest the wheel knows.
- KServe's kinds against the openAPIV3Schema of KServe's own CRDs (schemas/kserve, taken
  from the kserve/kserve repository: see schemas/kserve/NOTICE), also strict.
- What no schema sees: every kustomization lists exactly the manifests beside it, selectors
  match their pod templates, probes reach the health routes, the shard count equals the
  replicas, the HPA's metric is one the server exports, embedded config.toml files parse.

Usage: validate.py [DIR]   (default: the directory of this file). Exit status 1 on any
error, each printed as "file: kind/name: problem".
"""

import functools
import gzip
import importlib.resources
import json
import re
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KUBERNETES_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
KSERVE_SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservices.v1beta1.json.gz",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "clusterservingruntimes.v1alpha1.json.gz",
}
KUSTOMIZATION = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
HEALTH_PATHS = {"readinessProbe": "/health/ready", "livenessProbe": "/health/live"}
TELEMETRY = ROOT / "crates/engine/src/telemetry.rs"


def exported_metrics():
    """The metric names the engine registers (its `pub const NAME: &str = "..."`)."""
    return set(re.findall(r'pub const \w+: &str = "(peregrine_\w+)"', TELEMETRY.read_text()))


def closed(schema):
    """`schema` with unknown fields made errors, as the API server's pruning would drop
    them silently (a misspelt field would do nothing): every object that lists its
    properties and neither keeps unknown fields nor says what extra ones may be."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def kserve_schema(file_name, cache={}):
    if file_name not in cache:
        with gzip.open(HERE / "schemas" / "kserve" / file_name) as f:
            cache[file_name] = closed(json.load(f))
    return cache[file_name]


def schema_errors(doc):
    """What the kind's schema says is wrong with `doc`."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in KSERVE_SCHEMAS:
        validator = jsonschema.Draft7Validator(kserve_schema(KSERVE_SCHEMAS[key]))
        return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in validator.iter_errors(doc)]
    if key == KUSTOMIZATION:
        return []  # checked against its directory instead (kustomization_errors)
    errors = []
    for version in KUBERNETES_VERSIONS:
        validator = kubernetes_validator(version, *key)
        if validator is None:
            errors.append(f"Kubernetes {version} has no {key[1]} in {key[0]}")
            continue
        errors += [f"Kubernetes {version}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                   for e in validator.iter_errors(doc)]
    return errors


@functools.cache
def kubernetes_validator(version, api_version, kind):
    """The strict schema of `kind` in `version`, from kubernetes-validate's wheel, loaded once
    (kubernetes_validate.validate reads its 4 MB of shared definitions on every call, which
    made the tests' 15 passes over the tree take 17 s); None for a kind it does not know."""
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    directory = schemas / f"v{version}-local-strict"
    # rbac.authorization.k8s.io/v1 -> rbac-v1, as the wheel names its files.
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_file = directory / f"{kind.lower()}-{group_version}.json"
    if not schema_file.is_file():
        return None
    schema = json.loads(schema_file.read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())
    registry = referencing.Resource.from_contents(definitions) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def kustomization_errors(path, doc):
    listed = set(doc.get("resources", []))
    beside = {p.name for p in path.parent.glob("*.yaml") if p.name != path.name}
    errors = [f"lists {name}, which does not exist" for name in sorted(listed - beside)]
    errors += [f"does not list {name}" for name in sorted(beside - listed)]
    return errors


def pod_template_errors(doc):
    spec = doc["spec"]
    selector = spec["selector"].get("matchLabels", {})
    labels = spec["template"]["metadata"].get("labels", {})
    errors = [f"selector {k}={v} does not match the pod template's labels"
              for k, v in selector.items() if labels.get(k) != v]
    pod = spec["template"]["spec"]
    volumes = {v["name"] for v in pod.get("volumes", [])}
    volumes |= {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    for container in pod["containers"]:
        ports = {p.get("name") for p in container.get("ports", [])}
        for probe, want in HEALTH_PATHS.items():
            get = container.get(probe, {}).get("httpGet")
            if not get or get.get("path") != want:
                errors.append(f"{container['name']}: {probe} must GET {want}")
            elif isinstance(get.get("port"), str) and get["port"] not in ports:
                errors.append(f"{container['name']}: {probe} names port {get['port']}, which it does not have")
        errors += [f"{container['name']}: mounts {m['name']}, which is no volume"
                   for m in container.get("volumeMounts", []) if m["name"] not in volumes]
        env = {e["name"]: e for e in container.get("env", [])}
        if doc["kind"] == "StatefulSet" and "PEREGRINE_SHARD_INDEX" in env:
            count = env.get("PEREGRINE_SHARD_COUNT", {}).get("value")
            if count != str(spec.get("replicas", 1)):
                errors.append(f"PEREGRINE_SHARD_COUNT is {count}, replicas {spec.get('replicas', 1)}")
    return errors


def hpa_errors(doc):
    known = exported_metrics()
    names = [m["pods"]["metric"]["name"] for m in doc["spec"]["metrics"] if m["type"] == "Pods"]
    return [f"scales on {n}, which the server does not export ({TELEMETRY.name})"
            for n in names if n not in known]


def config_errors(doc):
    errors = []
    for key, text in doc.get("data", {}).items():
        if key.endswith(".toml"):
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                errors.append(f"{key}: {e}")
    return errors


def cross_errors(docs):
    """Checks between documents of one directory: Services select some workload's pods."""
    pod_labels = [d["spec"]["template"]["metadata"].get("labels", {}) for _, d in docs
                  if d.get("kind") in ("Deployment", "StatefulSet")]
    errors = []
    for path, d in docs:
        if d.get("kind") == "Service" and pod_labels:
            selector = d["spec"].get("selector", {})
            if not any(all(l.get(k) == v for k, v in selector.items()) for l in pod_labels):
                errors.append((path, d, f"selector {selector} matches no pod template here"))
    return errors


def document_errors(path, doc):
    errors = schema_errors(doc)
    if errors:
        return errors  # the checks below assume a well-formed document
    kind = doc.get("kind")
    if (doc.get("apiVersion"), kind) == KUSTOMIZATION:
        return kustomization_errors(path, doc)
    if kind in ("Deployment", "StatefulSet"):
        return pod_template_errors(doc)
    if kind == "HorizontalPodAutoscaler":
        return hpa_errors(doc)
    if kind == "ConfigMap":
        return config_errors(doc)
    return []


def validate_tree(top):
    """Every problem under `top`, as "file: kind/name: problem" lines; [] when all is well."""
    problems = []
    files = sorted(p for p in Path(top).rglob("*.yaml"))
    if not files:
        return [f"{top}: no manifests"]
    by_directory = {}
    for path in files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{path}: not YAML: {e}")
            continue
        for doc in docs:
            if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                problems.append(f"{path}: a document without apiVersion and kind")
                continue
            name = doc.get("metadata", {}).get("name", "")
            problems += [f"{path}: {doc['kind']}/{name}: {e}" for e in document_errors(path, doc)]
            by_directory.setdefault(path.parent, []).append((path, doc))
    for docs in by_directory.values():
        problems += [f"{p}: {d['kind']}/{d['metadata']['name']}: {e}" for p, d, e in cross_errors(docs)]
    return problems


def main():
    top = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    problems = validate_tree(top)
    for line in problems:
        print(line, file=sys.stderr)
    count = len(list(top.rglob("*.yaml")))
    print(f"validate: {count} manifest files, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
