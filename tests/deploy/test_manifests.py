"""The Kubernetes manifests validate, and the validator fails on broken copies of them."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
_spec = importlib.util.spec_from_file_location("validate", MANIFESTS / "validate.py")
validate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate)


def test_the_manifests_are_valid():
    assert validate.validate_tree(MANIFESTS) == []


# (file, text in it, replacement, a problem the validator must then report)
BREAKAGES = [
    ("image-server/deployment.yaml", "          args: [\"serve\"]",
     "          args: [\"serve\"]\n          imagePullPolicyy: Always",
     "Additional properties are not allowed ('imagePullPolicyy'"),
    ("image-server/deployment.yaml", "  replicas: 2", "  replicas: two", "'two' is not of type"),
    ("image-server/deployment.yaml", "path: /health/ready", "path: /healthz",
     "readinessProbe must GET /health/ready"),
    ("image-server/deployment.yaml", "              mountPath: /tmp", "              mountPath: /tmp\n            - name: cache\n              mountPath: /cache",
     "mounts cache, which is no volume"),
    ("image-server/service.yaml", "    app.kubernetes.io/component: image-server\n  ports",
     "    app.kubernetes.io/component: imageserver\n  ports", "matches no pod template here"),
    ("image-server/hpa.yaml", "name: peregrine_in_flight_requests", "name: peregrine_inflight",
     "scales on peregrine_inflight, which the server does not export"),
    ("image-server/kustomization.yaml", "  - hpa.yaml\n", "", "does not list hpa.yaml"),
    ("image-server/configmap.yaml", "    instances = 1", "    instances = ", "config.toml: "),
    ("video/statefulset.yaml", "  replicas: 3", "  replicas: 4", "PEREGRINE_SHARD_COUNT is 3, replicas 4"),
    ("kserve/inferenceservice.yaml", "      runtime: peregrine", "      runtme: peregrine",
     "Additional properties are not allowed ('runtme'"),
    ("kserve/inferenceservice.yaml", "  predictor:", "  predictr:", "'predictor' is a required property"),
    ("kserve/clusterservingruntime.yaml", "      autoSelect: false", "      autoSelect: \"no\"",
     "'no' is not of type 'boolean'"),
    ("video/service.yaml", "  clusterIP: None", "  clusterIP: [None", "not YAML"),
]


@pytest.mark.parametrize("file,old,new,expected", BREAKAGES, ids=[f"{b[0]}:{b[3][:30]}" for b in BREAKAGES])
def test_a_broken_manifest_is_reported(tmp_path, file, old, new, expected):
    tree = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, tree, ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / file
    text = path.read_text()
    assert old in text, f"{file} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))
    problems = validate.validate_tree(tree)
    assert any(expected in p and file in p for p in problems), problems


def test_the_command_fails_on_a_broken_tree(tmp_path):
    tree = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "kserve" / "extra.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {}\n")
    broken = subprocess.run([sys.executable, str(MANIFESTS / "validate.py"), str(tree)], capture_output=True, text=True)
    assert broken.returncode == 1, broken.stderr
    assert "does not list extra.yaml" in broken.stderr
