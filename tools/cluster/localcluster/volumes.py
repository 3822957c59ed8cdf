"""A pod's volumes as bind mounts for podinit.py, read from the API with the node's identity (the
Node authorizer lets a node read exactly the ConfigMaps, Secrets, claims and service-account tokens
of the pods bound to it)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from .api import Api, ApiError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin asks for in kube-api-access volumes


# The Node authorizer learns of a pod's binding from its own watch: a node's first read of the pod's
# ConfigMap or Secret can come before that and is refused with this; a kubelet retries its volume mounts
# until it is allowed. (A whole gang bound at once, after a node joins, showed it.)
NOT_YET_RELATED = "no relationship found between node"


class VolumeNotReady(Exception):
    """Something the volume needs is not there yet (a kubelet retries, the pod stays ContainerCreating)."""


def _write(folder: Path, files: dict[str, bytes], mode: int = 0o644) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)


def _differs(path: Path, content: bytes) -> bool:
    try:
        return path.read_bytes() != content
    except OSError:
        return True


def _selected(data: dict[str, bytes], items: list[dict[str, Any]] | None) -> dict[str, bytes]:
    if not items:
        return data
    return {item.get("path", item["key"]): data[item["key"]] for item in items if item["key"] in data}


class PodVolumes:
    """Resolves the volumes of one pod into folders under `folder`."""

    def __init__(self, api: Api, pod: dict[str, Any], folder: Path, field_value) -> None:
        self.api = api
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]
        self.folder = folder
        self.field_value = field_value

    async def _object(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.transient or (exc.status == 403 and NOT_YET_RELATED in exc.message):
                raise VolumeNotReady(f"{kind}/{name}: {exc}") from exc
            raise

    async def config_map_data(self, name: str, optional: bool = False) -> dict[str, bytes]:
        obj = await self._object("configmaps", name)
        if obj is None:
            if optional:
                return {}
            raise VolumeNotReady(f'configmap "{name}" not found')
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return data

    async def secret_data(self, name: str, optional: bool = False) -> dict[str, bytes]:
        obj = await self._object("secrets", name)
        if obj is None:
            if optional:
                return {}
            raise VolumeNotReady(f'secret "{name}" not found')
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    async def token(self, audience: str | None, seconds: int | None) -> bytes:
        """A service-account token from the TokenRequest API, bound to this pod, as a kubelet asks for it."""
        account = self.pod["spec"].get("serviceAccountName") or "default"
        meta = self.pod["metadata"]
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": seconds or DEFAULT_TOKEN_SECONDS,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        if not audience:
            del request["spec"]["audiences"]  # the API server's own audience
        try:
            reply = await self.api.request(
                "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
            )
        except ApiError as exc:
            if exc.transient:
                raise VolumeNotReady(f"a token for {account}: {exc}") from exc
            raise
        return reply["status"]["token"].encode()

    async def claim_path(self, claim: str) -> str:
        """The folder of the PersistentVolume bound to a claim (hostPath or local volumes)."""
        pvc = await self._object("persistentvolumeclaims", claim)
        if pvc is None:
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if not volume_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" is not bound')
        try:
            pv = await self.api.request("GET", f"/api/v1/persistentvolumes/{volume_name}")
        except ApiError as exc:
            if exc.transient:
                raise VolumeNotReady(f"persistentvolume {volume_name}: {exc}") from exc
            raise
        source = pv["spec"].get("hostPath") or pv["spec"].get("local")
        if not source:
            raise RuntimeError(f"persistentvolume {volume_name}: this kubelet mounts hostPath and local volumes only")
        Path(source["path"]).mkdir(parents=True, exist_ok=True)
        return source["path"]

    async def projected(self, volume: dict[str, Any]) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for source in volume.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = await self.token(token.get("audience"), token.get("expirationSeconds"))
            elif "configMap" in source:
                ref = source["configMap"]
                data = await self.config_map_data(ref["name"], ref.get("optional", False))
                files.update(_selected(data, ref.get("items")))
            elif "secret" in source:
                ref = source["secret"]
                files.update(_selected(await self.secret_data(ref["name"], ref.get("optional", False)), ref.get("items")))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    files[item["path"]] = self.field_value(item["fieldRef"]["fieldPath"]).encode()
        return files

    async def object_files(self, volume: dict[str, Any]) -> dict[str, bytes]:
        """The files of a ConfigMap or Secret volume, as its object holds them now."""
        if "configMap" in volume:
            ref = volume["configMap"]
            return _selected(await self.config_map_data(ref["name"], ref.get("optional", False)), ref.get("items"))
        ref = volume["secret"]
        return _selected(await self.secret_data(ref["secretName"], ref.get("optional", False)), ref.get("items"))

    async def resync(self) -> None:
        """Bring the mounted ConfigMap and Secret volumes up to date, as a kubelet's periodic sync does (a
        subPath mount is a copy and stays as it was). Projected tokens are not renewed here: they outlive
        the test runs this cluster is for."""
        for volume in self.pod["spec"].get("volumes") or []:
            folder = self.folder / "volumes" / volume["name"]
            if ("configMap" in volume or "secret" in volume) and folder.is_dir():
                try:
                    files = await self.object_files(volume)
                except (VolumeNotReady, ApiError):
                    continue  # as a kubelet: the mounted files stay until the object can be read
                _write(folder, {name: data for name, data in files.items() if _differs(folder / name, data)})

    async def mount(self, volume: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
        """podinit's description of one volume mount."""
        target, read_only = mount["mountPath"], bool(mount.get("readOnly"))
        folder = self.folder / "volumes" / volume["name"]
        if "emptyDir" in volume:
            if (volume["emptyDir"] or {}).get("medium") == "Memory":
                return {"type": "tmpfs", "target": target}
            folder.mkdir(parents=True, exist_ok=True)
            return {"type": "bind", "source": str(folder), "target": target, "readOnly": read_only}
        if "persistentVolumeClaim" in volume:
            source = await self.claim_path(volume["persistentVolumeClaim"]["claimName"])
            return {"type": "bind", "source": source, "target": target, "readOnly": read_only}
        if "hostPath" in volume:
            return {"type": "bind", "source": volume["hostPath"]["path"], "target": target, "readOnly": read_only}
        if "configMap" in volume or "secret" in volume:
            files = await self.object_files(volume)
        elif "projected" in volume:
            files = await self.projected(volume["projected"])
        elif "downwardAPI" in volume:
            files = {i["path"]: self.field_value(i["fieldRef"]["fieldPath"]).encode()
                     for i in volume["downwardAPI"].get("items") or []}
        else:
            raise RuntimeError(f"volume {volume['name']!r}: this kubelet does not mount {sorted(volume)}")
        _write(folder, files)
        if mount.get("subPath"):
            return {"type": "file", "source": str(folder / mount["subPath"]), "target": target, "readOnly": True}
        return {"type": "bind", "source": str(folder), "target": target, "readOnly": True}
