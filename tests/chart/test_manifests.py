"""manifests/ (for `kubectl apply -k manifests/`) is generated from the model and the chart, and renders."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from dtrain_operator.api.crd import crd_yaml
from tests.chart.helm import CHART_DIR, REPO_ROOT, helm_template, of_kind, tool
from tests.chart.kube_schemas import validate_object

MANIFESTS = REPO_ROOT / "manifests"


def test_committed_files_equal_a_fresh_generation() -> None:
    tool("helm")  # skips, with the reason, where helm is not installed
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "generate_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, f"generated files drifted; run `make manifests`:\n{result.stderr}"


def test_crd_files_are_the_output_of_dtrain_crd() -> None:
    generated = crd_yaml()
    assert (MANIFESTS / "crd.yaml").read_text() == generated
    assert (CHART_DIR / "files" / "dtrain.dev_distributedtrainings.yaml").read_text() == generated
    # Helm would install anything in crds/ unconditionally; the chart's CRD is a template instead.
    assert not (CHART_DIR / "crds").exists()


def kustomize() -> list[dict]:
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


def test_kustomize_renders_the_chart_defaults_into_dtrain_system() -> None:
    objects = kustomize()
    namespace = of_kind(objects, "Namespace")
    assert [ns["metadata"]["name"] for ns in namespace] == ["dtrain-system"]
    assert namespace[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    def key(obj: dict) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    chart = helm_template({"crds": {"keep": False}}, namespace="dtrain-system", release="dtrain")
    by_key = {key(obj): obj for obj in objects}
    assert sorted(by_key) == sorted([key(obj) for obj in chart] + [key(namespace[0])])
    for obj in chart:
        assert by_key[key(obj)] == obj, key(obj)


def test_kustomize_output_is_valid_kubernetes() -> None:
    for obj in kustomize():
        validate_object(obj)


def test_the_documented_overlay_sets_the_operator_image(tmp_path) -> None:
    """docs/cluster.md's kustomize overlay: manifests/ has no images: entry of its own, and the
    overlay's image name is the one the manifests use, so kubectl apply -k of it runs your image."""
    guide = (REPO_ROOT / "docs" / "cluster.md").read_text()
    [block] = [b for b in guide.split("```yaml\n")[1:] if b.startswith("resources: [../manifests]")]
    overlay = yaml.safe_load(block.split("```")[0])
    # The guide's overlay folder sits beside manifests/; this one is elsewhere (kustomize takes no absolute path).
    overlay["resources"] = [os.path.relpath(MANIFESTS, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    [deployment] = of_kind([o for o in yaml.safe_load_all(result.stdout) if o], "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/ml/dtrain-operator:0.1.0"
    assert "images" not in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
