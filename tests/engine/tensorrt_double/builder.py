"""The TensorRT double's builder: optimisation profiles, timing caches, the builder config and the build."""

from __future__ import annotations

import json

import tensorrt_double
from tensorrt_double.basics import (
    BUILDS,
    CACHE_MAGIC,
    DEVICE_NAME,
    MIN_POOL_BYTES,
    PLAN_MAGIC,
    PRECISION_FLAGS,
    BuilderFlag,
    DataType,
    Dims,
    HardwareCompatibilityLevel,
    ILogger,
    MemoryPoolType,
    ProfilingVerbosity,
    _error,
)
from tensorrt_double.network import INetworkDefinition, _quantized_flags


def _major() -> int:
    return int(tensorrt_double.__version__.split(".")[0])


# --- Builder ----------------------------------------------------------------------------------


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Dims, Dims, Dims]] = {}

    def set_shape(self, input: str, min: Dims, opt: Dims, max: Dims) -> None:
        self.shapes[input] = (Dims(min), Dims(opt), Dims(max))


class ITimingCache:
    def __init__(self, device: str):
        self.device = device

    def serialize(self) -> bytes:
        return CACHE_MAGIC + self.device.encode()


class IHostMemory:
    def __init__(self, data: bytes):
        self._data = data

    def __bytes__(self) -> bytes:
        return self._data


class IBuilderConfig:
    def __init__(self, network_holder: Builder):
        self._builder = network_holder
        self.flags: set[BuilderFlag] = {BuilderFlag.TF32}
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self.timing_cache: ITimingCache | None = None
        self.builder_optimization_level = 3
        self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.plugins_to_serialize: list[str] = []

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        self.pools[pool] = int(pool_size)

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self.flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        network = self._builder.last_network
        for tensor in network.inputs if network else []:
            if tensor.name not in profile.shapes:
                return -1
            low, opt, high = profile.shapes[tensor.name]
            if not len(low) == len(opt) == len(high) == len(tensor.shape):
                return -1
            for axis, fixed in enumerate(tensor.shape):
                if not low[axis] <= opt[axis] <= high[axis] or low[axis] < 0 or (fixed >= 0 and not low[axis] == high[axis] == fixed):
                    return -1
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache | None:
        data = bytes(serialized_timing_cache)
        if not data:
            return ITimingCache(DEVICE_NAME)
        if not data.startswith(CACHE_MAGIC):
            return None
        return ITimingCache(data[len(CACHE_MAGIC):].decode(errors="replace"))

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if not isinstance(cache, ITimingCache):
            raise TypeError("set_timing_cache(): incompatible function arguments: cache must be an ITimingCache")
        if cache.device != DEVICE_NAME and not ignore_mismatch:
            return False
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        return self.timing_cache or ITimingCache(DEVICE_NAME)


class Builder:
    def __init__(self, logger: ILogger):
        self.logger = logger
        self.last_network: INetworkDefinition | None = None

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        self.last_network = INetworkDefinition(flags)
        return self.last_network

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def _refusal(self, network: INetworkDefinition, config: IBuilderConfig) -> str | None:
        if network.model is None:
            return "the network is empty (nothing was parsed)"
        if _major() >= 11 and not network.strongly_typed:
            return "TensorRT 11 builds strongly typed networks only"
        if config.pools.get(MemoryPoolType.WORKSPACE, MIN_POOL_BYTES) < MIN_POOL_BYTES:
            return f"workspace pool limit of {config.pools[MemoryPoolType.WORKSPACE]} bytes is below 1 MiB (limits are bytes)"
        if any(-1 in tensor.shape for tensor in network.inputs) and not config.profiles:
            return "Network has dynamic or shape inputs, but no optimization profile has been defined."
        precision_flags = config.flags & PRECISION_FLAGS
        if network.strongly_typed and precision_flags:
            return f"builder flags {sorted(f.name for f in precision_flags)} are not allowed with a strongly typed network"
        missing = _quantized_flags(network.model) - config.flags
        if not network.strongly_typed and missing:
            return f"Q/DQ layers need builder flag(s) {sorted(f.name for f in missing)} in a weakly typed network"
        for layer in network.layers:
            if not layer.precision_is_set:
                continue
            if network.strongly_typed:
                return f"layer {layer.name}: precision cannot be set on a strongly typed network"
            needs = {DataType.HALF: BuilderFlag.FP16, DataType.BF16: BuilderFlag.BF16}.get(layer.precision)
            if needs is not None and needs not in config.flags:
                return f"layer {layer.name}: precision {layer.precision.name} set, but {needs.name} is not enabled"
        return None

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        refusal = self._refusal(network, config)
        if refusal is not None:
            _error(self.logger, f"IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error ({refusal})")
            return None
        assert network.model is not None
        header = {
            "inputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.inputs],
            "outputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.outputs],
            "profiles": [{n: [list(d) for d in s] for n, s in p.shapes.items()} for p in config.profiles],
            "flags": sorted(f.name for f in config.flags),
            "strongly_typed": network.strongly_typed,
            "detailed": config.profiling_verbosity == ProfilingVerbosity.DETAILED,
            "layers": [[layer.name, layer.type, layer.outputs, layer.precision.name] for layer in network.layers],
        }
        BUILDS.append({
            **header, "workspace_bytes": config.pools.get(MemoryPoolType.WORKSPACE),
            "builder_optimization_level": config.builder_optimization_level,
            "hardware_compatibility_level": config.hardware_compatibility_level.name,
            "plugins_to_serialize": list(config.plugins_to_serialize),
        })
        return IHostMemory(PLAN_MAGIC + json.dumps(header).encode() + b"\n" + network.model.SerializeToString())
