"""What a built-in model refuses of the data it is built for, without torch: ``compute.models`` builds through
these checks, and ``netsim validate`` makes them of a scenario it does not build (netsim/validation.py)."""

from __future__ import annotations

import attrs

from netsim.errors import InputError
from netsim.scenario.schema import ModelSpec
from netsim.scenario.structure import plugin_keys


@attrs.frozen
class ModelData:
    """What a model factory builds for: the data's row width, classes and image shape (``(C, H, W)``, None
    for flat rows), and the scenario's ``[model]`` keys every model shares (``spec.l2``, ``spec.bias``,
    ``spec.init``, ``spec.hidden``, ``spec.dtype``)."""

    features: int
    classes: int
    shape: tuple[int, ...] | None
    spec: ModelSpec


def image(data: ModelData, kind: str, side: int | None = None) -> tuple[int, int]:
    """(channels, side) of image data for an image model; refuses flat rows or another side."""
    if not data.shape or len(data.shape) != 3:
        raise InputError("model.kind", f"{kind!r} needs image data (data.kind = 'mnist' or 'cifar10')")
    c, h, _ = data.shape
    if side is not None and h != side:
        raise InputError("model.kind", f"{kind!r} is built for {side}x{side} images (CIFAR-10), not {h}x{h}")
    return c, h


def binary(data: ModelData) -> None:
    """The logistic model's refusal of more than two classes."""
    if data.classes > 2:
        raise InputError("model.kind", f"'logistic' is binary; the data has {data.classes} classes "
                                       "(use 'multinomial' or 'mlp')")


IMAGE_SIDES = {"cnn": None, "vgg11": 32, "resnet18": 32}
FLAT = ("logistic", "multinomial", "mlp")


def check_flat(spec: ModelSpec, data: ModelData) -> bool:
    """Every refusal ``compute.models.build_model`` makes of a built-in model for flat rows (``data.shape``
    None), in its order; False when only building tells (a plugin's kind, image data)."""
    if data.shape is not None or (spec.kind not in FLAT and spec.kind not in IMAGE_SIDES):
        return False
    plugin_keys("model", "model", spec.kind, None, ModelSpec, spec.params)  # model_args of a built-in kind
    if spec.kind == "logistic":
        binary(data)
    elif spec.kind in IMAGE_SIDES:
        image(data, spec.kind, IMAGE_SIDES[spec.kind])  # refuses flat rows
    return True
