"""`python -m localcluster up --schedulers`' rules, without a cluster, root or Go: which names it takes, the
coscheduling scheduler's configuration, RBAC and command line, the port it needs, and that its Go module
pins one Kubernetes release."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from localcluster import controlplane, layout, schedulers
from localcluster.__main__ import main
from localcluster.cluster import cluster_config, ports_needed


@pytest.mark.parametrize("text,names", [
    ("", []),
    ("coscheduling", ["coscheduling"]),
    (" coscheduling, coscheduling ,", ["coscheduling"]),
])
def test_the_schedulers_value_names_known_schedulers_or_none(text, names):
    assert schedulers.parse(text) == names


def test_an_unknown_scheduler_is_refused_naming_the_known_ones(capsys):
    with pytest.raises(ValueError, match="unknown scheduler 'volcano': SCHEDULERS takes coscheduling"):
        schedulers.parse("coscheduling,volcano")
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--schedulers", "kueue"])
    assert exit_.value.code == 2
    assert "argument --schedulers: unknown scheduler 'kueue': SCHEDULERS takes coscheduling" in capsys.readouterr().err


def test_the_coscheduling_profile_adds_the_plugin_and_its_queue_sort_under_its_own_name():
    config = schedulers.config(Path("/state/pki/scheduler.kubeconfig"))
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert config["clientConnection"] == {"kubeconfig": "/state/pki/scheduler.kubeconfig"}
    assert config["leaderElection"] == {"leaderElect": False}
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == schedulers.SCHEDULER_NAME == "scheduler-plugins-scheduler"
    assert profile["plugins"] == {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                                  "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}}
    assert profile["pluginConfig"] == [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}]


def test_the_scheduler_may_read_podgroups_with_kube_schedulers_credentials_and_nothing_more():
    role, binding = schedulers.rbac()["items"]
    assert role["rules"] == [{"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"],
                              "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "system:kube-scheduler"}]


def test_the_scheduler_serves_beside_kube_scheduler_on_its_own_port():
    argv = schedulers.argv(Path("/c.json"), Path("/k"), Path("/s.crt"), Path("/s.key"))
    assert argv[0] == str(layout.BIN / "scheduler-plugins")
    assert "--config=/c.json" in argv and "--bind-address=127.0.0.1" in argv
    # A gang rejected at Permit is retried on the queue's flush, not on a node joining: 10 s, not 5 min.
    assert "--pod-max-in-unschedulable-pods-duration=10s" in argv
    assert f"--secure-port={layout.COSCHEDULING_PORT}" in argv and layout.COSCHEDULING_PORT != layout.SCHEDULER_PORT
    assert layout.COSCHEDULING_PORT not in ports_needed([layout.Node(1)])
    assert ports_needed([layout.Node(1)], second_schedulers=["coscheduling"])[layout.COSCHEDULING_PORT] == (
        "the coscheduling scheduler")


def test_cluster_json_records_the_second_schedulers():
    assert cluster_config(2, 1, "4", "16Gi", "host", ["coscheduling"])["schedulers"] == ["coscheduling"]
    assert cluster_config(2, 1, "4", "16Gi", "host")["schedulers"] == []


def test_the_module_pins_scheduler_plugins_and_one_kubernetes_release_for_every_k8s_module():
    go_mod = (schedulers.MODULE / "go.mod").read_text()
    assert f"tool {schedulers.COMMAND}\n" in go_mod
    plugins, kubernetes = schedulers.pinned_versions()
    assert re.fullmatch(r"v0\.\d+\.\d+", plugins) and re.fullmatch(r"v1\.\d+\.\d+", kubernetes)
    replaced = dict(re.findall(r"^\s*k8s\.io/([\w-]+) => k8s\.io/[\w-]+ (v\S+)$", go_mod, re.MULTILINE))
    assert replaced.pop("kubernetes") == kubernetes
    assert len(replaced) > 20 and set(replaced.values()) == {kubernetes.replace("v1.", "v0.", 1)}


def test_a_binary_built_from_the_same_files_and_flags_is_not_built_again(tmp_path, monkeypatch):
    module = tmp_path / "module"
    module.mkdir()
    for name in ("go.mod", "go.sum", "main.go"):
        (module / name).write_text(name)
    binary = tmp_path / "bin" / "tool"
    binary.parent.mkdir()
    binary.write_text("built")
    flags = ["-ldflags=-X k8s.io/component-base/version.gitVersion=v1.34.12"]
    binary.with_name("tool.stamp").write_text(controlplane.module_stamp(module, ".", flags))
    monkeypatch.setattr(controlplane.subprocess, "run", lambda *a, **k: pytest.fail(f"built again: {a}"))
    controlplane.build_from_module(module, ".", binary, flags, "building")
    stamp = binary.with_name("tool.stamp").read_text()
    assert controlplane.module_stamp(module, ".", ["-ldflags=-X k8s.io/component-base/version.gitVersion=v0.34.7"]) != stamp
    (module / "main.go").write_text("changed")
    assert controlplane.module_stamp(module, ".", flags) != stamp
