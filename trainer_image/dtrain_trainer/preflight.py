"""The pre-flight gang check: before the model is built, a broken network fails the job at once.

A wrong NCCL_SOCKET_IFNAME, a rank that cannot reach the rendezvous, mismatched torch/CUDA/NCCL
builds: in a plain DDP job each shows up as a hang, minutes after the image pulls, and ends only
at the collective timeout. Here every rank, first thing:

1. checks that the interfaces named by NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME exist in its pod
   (else it fails naming itself, the interface and the interfaces it has);
2. joins torchrun's store (the agent's, at MASTER_ADDR:MASTER_PORT) under a prefix of its own and
   waits, at most nccl.preflightTimeoutSeconds, for every rank's record there (host, pod, node,
   versions, GPUs); a rank missing by then is named, with the address and the NCCL/gloo
   variables in effect;
3. checks that torch, CUDA and NCCL versions agree across ranks, and on GPUs that each rank sees
   devicesPerNode GPUs;
4. opens a process group of its own (gloo on the CPU, NCCL on GPUs) on that store and times an
   all-reduce of PAYLOAD_BYTES (bus bandwidth) and of one element (latency).

The pre-flight group is destroyed afterwards: Lightning then creates the training group with the
full collective timeout (nccl.timeoutSeconds), which a group made here with the short pre-flight
timeout would otherwise keep. Every failure is a PreflightError (a ConfigError: exit code 78, the
job fails at once with reason InvalidTrainerConfig; a restart would meet the same network).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import statistics
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dtrain_common.errors import ConfigError
from dtrain_operator.api import contract

log = logging.getLogger("dtrain_trainer")

# The all-reduce that measures bandwidth: 4 MiB of float32, big enough to leave latency behind on
# a CPU link, small enough to cost well under a second.
PAYLOAD_BYTES = 4 * 1024 * 1024
LATENCY_REPEATS = 10
BANDWIDTH_REPEATS = 3
STORE_PREFIX = "dtrain/preflight"
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# Downward-API variables of a worker pod (render.py sets them); HOSTNAME is the pod's name.
ENV_POD_NAME = contract.ENV_POD_NAME
ENV_NODE_NAME = contract.ENV_NODE_NAME


class PreflightError(ConfigError):
    """The gang cannot train: a missing interface, a missing rank, versions that disagree."""


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def missing_interfaces(value: str, present: list[str]) -> list[str]:
    """The interfaces a *_SOCKET_IFNAME value asks for that this pod lacks (NCCL's syntax).

    `eth0,ib` are prefixes (any interface starting so), `=eth0` exact names, `^lo,docker`
    exclusions (nothing to be missing).
    """
    value = value.strip()
    if not value or value.startswith("^"):
        return []
    exact = value.startswith("=")
    wanted = [w.strip() for w in value.lstrip("=").split(",") if w.strip()]
    if exact:
        return [w for w in wanted if w not in present]
    if any(any(name.startswith(w) for name in present) for w in wanted):
        return []  # NCCL uses the first that matches
    return wanted


def check_interfaces(env: Mapping[str, str], rank: int) -> None:
    present = interfaces()
    for variable in INTERFACE_VARIABLES:
        value = env.get(variable)
        if value is None:
            continue
        missing = missing_interfaces(value, present)
        if missing:
            raise PreflightError(
                f"pre-flight: rank {rank} ({_where(env)}): {variable}={value} names "
                f"{', '.join(missing)}, which this pod does not have; its interfaces are {', '.join(present)} "
                "(fix spec.nccl.socketIfname or the GLOO_SOCKET_IFNAME variable)"
            )


def _where(env: Mapping[str, str]) -> str:
    pod = env.get(ENV_POD_NAME) or env.get("HOSTNAME") or socket.gethostname()
    node = env.get(ENV_NODE_NAME)
    return f"pod {pod}" + (f" on node {node}" if node else "")


def network_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that decide where NCCL and gloo connect (what a person needs to see in a failure)."""
    names = ("MASTER_ADDR", "MASTER_PORT")
    return {
        k: v
        for k, v in sorted(env.items())
        if k in names or k.startswith(("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_GLOO_"))
    }


def versions() -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a CPU-only build has no NCCL
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def _record(env: Mapping[str, str], rank: int, accelerator: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pod": env.get(ENV_POD_NAME) or env.get("HOSTNAME") or socket.gethostname(),
        "node": env.get(ENV_NODE_NAME),
        "versions": versions(),
        "gpus": torch.cuda.device_count() if accelerator == "gpu" else 0,
    }


def _key(rank: int) -> str:
    return f"rank/{rank}"


def _join(store: Any, rank: int, world: int, timeout: float, env: Mapping[str, str], nodes_of: Any) -> list[dict]:
    keys = [_key(r) for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:
        missing = [r for r in range(world) if not store.check([_key(r)])]
        if not missing:
            raise
        where = ", ".join(f"rank {r} (node {nodes_of(r)})" for r in missing)
        raise PreflightError(
            f"pre-flight: {where} did not join within {timeout:g} s at "
            f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} (seen from rank {rank}, {_where(env)}); "
            f"network variables in effect: {json.dumps(network_variables(env))}"
        ) from None
    return [json.loads(store.get(k)) for k in keys]


def check_agreement(records: list[dict], accelerator: str, devices_per_node: int) -> None:
    """torch, CUDA and NCCL agree on every rank; on GPUs, each rank sees devicesPerNode GPUs."""
    for name in ("torch", "cuda", "nccl"):
        seen: dict[Any, list[int]] = {}
        for record in records:
            seen.setdefault(record["versions"].get(name), []).append(record["rank"])
        if len(seen) > 1:
            detail = "; ".join(f"{v} on rank(s) {', '.join(map(str, ranks))}" for v, ranks in seen.items())
            raise PreflightError(f"pre-flight: the ranks run different {name} versions ({detail}): use one image")
    if accelerator == "gpu":
        short = [r for r in records if r["gpus"] < devices_per_node]
        if short:
            detail = ", ".join(f"rank {r['rank']} (pod {r['pod']}) sees {r['gpus']}" for r in short)
            raise PreflightError(f"pre-flight: devicesPerNode is {devices_per_node} but {detail} GPU(s)")


def _process_group(store: Any, rank: int, world: int, timeout: float, accelerator: str) -> tuple[Any, torch.device, str]:
    prefixed = dist.PrefixStore(f"{STORE_PREFIX}/pg", store)
    if accelerator == "gpu" and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(prefixed, rank, world, options), device, "nccl"
    return dist.ProcessGroupGloo(prefixed, rank, world, timedelta(seconds=timeout)), torch.device("cpu"), "gloo"


def _timed_all_reduce(group: Any, tensor: torch.Tensor, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up (connections, NCCL's channels)
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        started = time.perf_counter()
        group.allreduce([tensor]).wait()
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        times.append(time.perf_counter() - started)
    return times[1:]


def run(
    env: Mapping[str, str], accelerator: str, devices_per_node: int, timeout: float
) -> dict[str, Any] | None:
    """The pre-flight check of this rank; the measurements (status.preflight), or None when skipped."""
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    check_interfaces(env, rank)
    if timeout <= 0 or world <= 1 or not env.get("MASTER_ADDR"):
        return None
    started = time.perf_counter()
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(devices_per_node))) or 1
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timedelta(seconds=timeout)))
    except Exception as exc:  # noqa: BLE001 - the rendezvous fails in many ways; each is named in one pre-flight error
        raise PreflightError(
            f"pre-flight: rank {rank} ({_where(env)}) cannot reach the rendezvous at "
            f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} within {timeout:g} s ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); network variables in effect: "
            f"{json.dumps(network_variables(env))}"
        ) from None
    store = dist.PrefixStore(STORE_PREFIX, store)
    store.set(_key(rank), json.dumps(_record(env, rank, accelerator)))
    records = _join(store, rank, world, timeout, env, lambda r: r // local_world)
    joined = time.perf_counter() - started
    check_agreement(records, accelerator, devices_per_node)
    try:
        group, device, backend = _process_group(store, rank, world, timeout, accelerator)
        payload = torch.ones(PAYLOAD_BYTES // 4, dtype=torch.float32, device=device)
        bandwidth_times = _timed_all_reduce(group, payload, BANDWIDTH_REPEATS)
        latency_times = _timed_all_reduce(group, torch.ones(1, device=device), LATENCY_REPEATS)
    except PreflightError:
        raise
    except Exception as exc:  # noqa: BLE001 - the collectives fail in many ways; each is named in one pre-flight error
        raise PreflightError(
            f"pre-flight: rank {rank} ({_where(env)}): the all-reduce over {world} ranks failed within "
            f"{timeout:g} s ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"network variables in effect: {json.dumps(network_variables(env))}"
        ) from None
    seconds = median(bandwidth_times)
    algorithm_bandwidth = PAYLOAD_BYTES / seconds
    result = {
        "backend": backend,
        "worldSize": world,
        "seconds": round(time.perf_counter() - started, 3),
        "joinSeconds": round(joined, 3),
        "allReduceBytes": PAYLOAD_BYTES,
        "allReduceMs": round(seconds * 1000, 3),
        "latencyMs": round(median(latency_times) * 1000, 3),
        # As nccl-tests report it: what each link carries, 2(n-1)/n times the algorithm bandwidth.
        "busBandwidthGBps": round(algorithm_bandwidth * 2 * (world - 1) / world / 1e9, 4),
        "versions": records[0]["versions"],
        "ranks": [{"rank": r["rank"], "pod": r["pod"], "node": r["node"]} for r in records][:64],
    }
    _shutdown(group)
    log.info("pre-flight: %s", json.dumps(result))
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _shutdown(group: Any) -> None:
    shutdown = getattr(group, "shutdown", None) or getattr(group, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):  # what is left goes with the object
            shutdown()
