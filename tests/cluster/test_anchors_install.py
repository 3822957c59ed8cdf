"""How `localcluster anchors` installs JobSet, Kubeflow Trainer and the Training Operator: their own
manifests, changed only where this cluster needs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from localcluster import anchors


def test_the_releases_are_the_ones_go_mod_pins() -> None:
    assert [(a.key, a.version()) for a in anchors.ANCHORS] == [
        ("jobset", "v0.12.0"), ("trainer", "v2.3.0"), ("training-operator", "v1.9.4")]
    assert [a.image() for a in anchors.ANCHORS] == [
        "localhost/anchors/jobset:v0.12.0", "localhost/anchors/trainer:v2.3.0",
        "localhost/anchors/training-operator:v1.9.4"]


def _deployment(anchor: anchors.Anchor) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": anchor.deployment, "namespace": anchor.namespace},
            "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": "upstream/manager:tag",
                                                           "command": ["/manager"]}]}}}}


@pytest.mark.parametrize("anchor", anchors.ANCHORS, ids=lambda a: a.key)
def test_each_manager_runs_the_image_built_here(anchor: anchors.Anchor) -> None:
    objects = anchors.manifests(anchor, [_deployment(anchor)])
    container = objects[0]["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == (anchor.image(), "Never")
    assert container["command"] == ["/manager"]  # where controllers.manager_image puts the binary


def test_pytorchjob_workers_get_no_init_container_through_the_operators_own_flag() -> None:
    objects = anchors.manifests(anchors.TRAINING_OPERATOR, [_deployment(anchors.TRAINING_OPERATOR)])
    deployment, config_map = objects[0], objects[-1]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (flag,) = [a for a in container["args"] if a.startswith("--pytorch-init-container-template-file=")]
    path = Path(flag.split("=", 1)[1])
    (mount,) = container["volumeMounts"]
    assert Path(mount["mountPath"]) == path.parent
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_map["metadata"]["namespace"] == anchors.TRAINING_OPERATOR.namespace
    assert yaml.safe_load(config_map["data"][path.name]) == []  # the operator parses it as a list of containers
    # JobSet's and Trainer's Deployments are left as upstream wrote them.
    assert len(anchors.manifests(anchors.JOBSET, [_deployment(anchors.JOBSET)])) == 1


def test_trainers_overlay_is_rendered_without_the_jobset_it_would_download(tmp_path: Path) -> None:
    module = tmp_path / "module"
    overlay = module / "manifests" / "overlays" / "manager"
    overlay.mkdir(parents=True)
    (module / "manifests" / "base" / "crds").mkdir(parents=True)
    (overlay / "namespace.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kubeflow-system\n")
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": "kubeflow-system",
        "resources": ["namespace.yaml", "../../base/crds", anchors.TRAINER_THIRD_PARTY_JOBSET],
        "images": [{"name": "ghcr.io/kubeflow/trainer/trainer-controller-manager", "newTag": "v2.3.0"}],
    }))
    folder = tmp_path / "rendered"
    folder.mkdir()
    kustomization = yaml.safe_load((anchors.overlay_without_jobset(overlay, folder) / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "namespace.yaml" and (folder / "namespace.yaml").is_file()
    assert (folder / kustomization["resources"][1]).resolve() == (module / "manifests" / "base" / "crds").resolve()
    assert len(kustomization["resources"]) == 2  # no third-party JobSet
    assert kustomization["images"][0]["newTag"] == "v2.3.0"  # the rest as upstream wrote it


def test_an_overlay_that_no_longer_installs_jobset_so_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": []}))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RuntimeError, match="no longer lists"):
        anchors.overlay_without_jobset(tmp_path, out)
