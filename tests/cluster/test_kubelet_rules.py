"""The local kubelet's rules that a runtime and a kubelet define: the command from the image and the
spec, who the container runs as (and the kubelet's refusals), paths inside an image's root, and which
refusals of a volume's object are retried."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from localcluster import images, podinit, podsetup
from localcluster.api import ApiError
from localcluster.securitycontext import container_user
from localcluster.volumes import PodVolumes, VolumeNotReady

IMAGE = images.ImageConfig(entrypoint=["python", "-m", "app"], cmd=["--serve"])


@pytest.mark.parametrize(
    "container,argv",
    [
        ({}, ["python", "-m", "app", "--serve"]),
        ({"args": ["--once"]}, ["python", "-m", "app", "--once"]),
        ({"command": ["sh", "-c"]}, ["sh", "-c"]),  # command replaces the ENTRYPOINT, and the CMD goes with it
        ({"command": ["sh", "-c"], "args": ["true"]}, ["sh", "-c", "true"]),
        ({"args": []}, ["python", "-m", "app"]),
    ],
)
def test_command_and_args_merge_with_the_image_as_kubernetes_does(container, argv):
    assert images.argv(container, IMAGE) == argv


@pytest.fixture
def root(tmp_path: Path) -> str:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\ndtrain:x:10001:0::/home/dtrain:/bin/sh\n")
    (tmp_path / "etc" / "group").write_text("root:x:0:\nvideo:x:44:\n")
    return str(tmp_path)


def pod(context=None, container_context=None):
    container = {"name": "trainer", **({"securityContext": container_context} if container_context else {})}
    spec = {"containers": [container], **({"securityContext": context} if context else {})}
    return {"metadata": {"name": "job-0", "namespace": "ml", "uid": "u1"}, "spec": spec}, container


@pytest.mark.parametrize(
    "image_user,context,container_context,expected",
    [
        ("10001:0", None, None, (10001, 0)),
        ("dtrain", None, None, (10001, 0)),  # a name, from the image's /etc/passwd
        ("dtrain:video", None, None, (10001, 44)),
        ("", None, None, (0, 0)),
        ("10001:0", {"runAsUser": 2000, "runAsGroup": 3000}, None, (2000, 3000)),
        ("10001:0", {"runAsUser": 2000}, {"runAsUser": 4000}, (4000, 0)),  # the container's over the pod's
    ],
)
def test_the_user_comes_from_the_security_context_over_the_image(root, image_user, context, container_context, expected):
    spec, container = pod(context, container_context)
    user, refused = container_user(spec, container, image_user, root)
    assert refused is None and (user["uid"], user["gid"]) == expected


def test_fs_group_and_supplemental_groups_join_the_user(root):
    spec, container = pod({"fsGroup": 10001, "supplementalGroups": [44]})
    user, _ = container_user(spec, container, "10001:0", root)
    assert user["groups"] == [10001, 44]


@pytest.mark.parametrize(
    "image_user,container_context,message",
    [
        ("", {"runAsNonRoot": True}, "container has runAsNonRoot and image will run as root"),
        ("0:0", {"runAsNonRoot": True}, "container has runAsNonRoot and image will run as root"),
        ("dtrain", {"runAsNonRoot": True}, ("container has runAsNonRoot and image has non-numeric user (dtrain), "
         "cannot verify user is non-root")),
        ("10001", {"runAsNonRoot": True, "runAsUser": 0}, "container has runAsNonRoot and image will run as root"),
    ],
)
def test_run_as_non_root_is_refused_with_the_kubelets_own_message(root, image_user, container_context, message):
    spec, container = pod(None, container_context)
    user, refused = container_user(spec, container, image_user, root)
    assert user is None
    assert refused == f'{message} (pod: "job-0_ml(u1)", container: trainer)'


def test_run_as_non_root_accepts_a_numeric_non_root_user(root):
    spec, container = pod({"runAsNonRoot": True})
    assert container_user(spec, container, "10001:0", root)[1] is None
    assert container_user(spec, container, "dtrain", root)[1] is not None
    spec, container = pod({"runAsNonRoot": True, "runAsUser": 10001})
    assert container_user(spec, container, "dtrain", root)[1] is None


def test_paths_inside_an_images_root_never_lead_out_of_it(tmp_path: Path):
    image = tmp_path / "rootfs"
    (image / "run").mkdir(parents=True)
    (image / "var").mkdir()
    (image / "var" / "run").symlink_to("/run")  # absolute, as in Debian's images
    (image / "escape").symlink_to("../../..")
    assert podinit._in_root(str(image), "/var/run/secrets") == str(image / "run" / "secrets")
    assert podinit._in_root(str(image), "/escape/etc/passwd") == str(image / "etc" / "passwd")


class RefusingApi:
    """An API server that answers every request with one error."""

    def __init__(self, status: int, message: str) -> None:
        self.error = ApiError(status, message)

    async def request(self, method: str, path: str, body=None):
        raise self.error


POD = {"metadata": {"name": "job-0", "namespace": "default"}, "spec": {}}


def test_a_configmap_read_before_the_node_authorizer_knows_the_binding_is_retried(tmp_path: Path):
    refused = RefusingApi(403, 'configmaps "job-config" is forbidden: User "system:node:node-1" cannot get resource '
                               '"configmaps" in API group "" in the namespace "default": no relationship found between '
                               "node 'node-1' and this object")
    with pytest.raises(VolumeNotReady, match="no relationship found"):
        asyncio.run(PodVolumes(refused, POD, tmp_path, None).config_map_data("job-config"))


def test_any_other_refusal_is_not_retried(tmp_path: Path):
    refused = RefusingApi(403, 'configmaps "other" is forbidden: User "system:node:node-1" cannot get resource')
    with pytest.raises(ApiError):
        asyncio.run(PodVolumes(refused, POD, tmp_path, None).config_map_data("other"))


def test_the_kubelets_status_patch_keeps_the_conditions_of_others():
    """Conditions merge by type (Kueue's TerminationTarget, the eviction API's DisruptionTarget stay); the
    container statuses are replaced whole, so that a terminated state does not keep a running one beside it."""
    from localcluster.podstatus import status_patch

    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}
    patch = status_patch(status)
    assert patch["conditions"] == status["conditions"]
    assert patch["containerStatuses"] == [*status["containerStatuses"], {"$patch": "replace"}]
    assert "containerStatuses" not in status_patch({"phase": "Pending"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--master-addr=$(MASTER_ADDR)", "--master-addr=job-master-0"),
        ("$(MASTER_ADDR):$(MASTER_PORT)", "job-master-0:23456"),
        ("$(UNDEFINED) stays", "$(UNDEFINED) stays"),
        ("$$(MASTER_ADDR) is escaped", "$(MASTER_ADDR) is escaped"),
        ("no reference", "no reference"),
    ],
)
def test_variable_references_expand_as_kubernetes_expands_them(text, expected):
    assert podsetup.expand(text, {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}) == expected
