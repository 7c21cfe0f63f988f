"""The sharding a checkpoint recorded for a leaf, as a jax Sharding on this process's devices.

Orbax writes one JSON description per ``jax.Array`` leaf into the item's ``_sharding`` file
(a ``NamedSharding``: mesh shape, axis names, partition spec and the device ids of the mesh;
or a ``SingleDeviceSharding``: the device's name). Restoring with no sharding given, Orbax
uses it. So does `suture.load`, on the same devices; where this process does not have the
devices the description names, the error says which leaf and how to give it a sharding,
rather than placing the array somewhere else without a word.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import CorruptCheckpointError, UnsupportedError
from .._json import loads as loads_json


def recorded_sharding(description: str | dict, path: str) -> Any:
    """The jax Sharding that Orbax's `description` of leaf `path` names.

    Raises:
        SurgeryError: the description names devices this process lacks, or is unreadable.
    """
    import jax  # heavy: loaded on first use, not at import

    try:
        fields = loads_json(description) if isinstance(description, str) else description
        kind = fields["sharding_type"]
    except (ValueError, TypeError, KeyError) as error:
        raise CorruptCheckpointError(
            f"Leaf {path!r}: the checkpoint's recorded sharding {description!r:.120} is not "
            f"readable ({error}). {_HOW_TO_GIVE_ONE}"
        ) from error
    if kind == "SingleDeviceSharding":
        wanted = _device_name(fields.get("device_str", ""))
        for device in jax.local_devices():
            if _device_name(str(device)) == wanted:
                return jax.sharding.SingleDeviceSharding(device)
        raise UnsupportedError(
            f"Leaf {path!r}: the checkpoint was saved on device {wanted!r}, which this process "
            f"does not have (it has {_names(jax.local_devices())}). {_HOW_TO_GIVE_ONE}"
        )
    if kind == "NamedSharding":
        return _named_sharding(fields, path)
    raise UnsupportedError(
        f"Leaf {path!r}: the checkpoint records a {kind}, which suture cannot rebuild. "
        f"{_HOW_TO_GIVE_ONE}"
    )


def metadata_sharding(metadata: Any, path: str) -> Any:
    """Orbax's ``ShardingMetadata`` (from its metadata trees) as a jax Sharding."""
    try:
        return metadata.to_jax_sharding()
    except ValueError as error:
        raise UnsupportedError(
            f"Leaf {path!r}: the target's Orbax metadata records a sharding on devices this "
            f"process does not have ({error}). {_HOW_TO_GIVE_ONE}"
        ) from error


_HOW_TO_GIVE_ONE = (
    "Give the target leaf a sharding for this topology "
    "(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))), or load it as "
    "numpy (np.ndarray)."
)


def _named_sharding(fields: dict, path: str) -> Any:
    import jax  # heavy: loaded on first use, not at import

    shape = tuple(int(n) for n in fields["shape"])
    by_id = {device.id: device for device in jax.devices()}
    recorded = fields.get("device_mesh")
    if recorded:
        ids = [entry["id"] for entry in _leaves(recorded["mesh"])]
        absent = [device_id for device_id in ids if device_id not in by_id]
        if absent:
            raise UnsupportedError(
                f"Leaf {path!r}: the checkpoint was saved sharded over a mesh {dict(zip(fields['axis_names'], shape, strict=False))} "
                f"of devices with ids {_short(ids)}, but this process has no device with id "
                f"{_short(absent)} (it has {len(by_id)} devices). {_HOW_TO_GIVE_ONE}"
            )
        devices = [by_id[device_id] for device_id in ids]
    else:
        devices = jax.devices()
    if len(devices) != int(np.prod(shape)):
        raise UnsupportedError(
            f"Leaf {path!r}: the checkpoint was saved sharded over a mesh of shape {shape}, "
            f"but this process has {len(devices)} devices. {_HOW_TO_GIVE_ONE}"
        )
    mesh = jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(shape), fields["axis_names"])
    spec = [
        tuple(entry) if isinstance(entry, list) else entry for entry in fields["partition_spec"]
    ]
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def _leaves(nested: Any) -> list[Any]:
    if isinstance(nested, list):
        return [leaf for item in nested for leaf in _leaves(item)]
    return [nested]


def _device_name(name: str) -> str:
    return name.replace("TFRT_CPU_", "cpu:")  # jax renamed CPU devices; Orbax maps both


def _names(devices: list[Any]) -> str:
    return _short([_device_name(str(device)) for device in devices])


def _short(items: list[Any]) -> str:
    shown = ", ".join(str(item) for item in items[:8])
    return f"[{shown}{', ...' if len(items) > 8 else ''}]"
