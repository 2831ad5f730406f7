"""Models by name: ``model.kind`` -> a factory, with its own ``[model]`` keys (an attrs class), without torch.

``register_model`` is the plugins' entry (re-exported by ``netsim.compute.models``, where ``build_model`` builds
through it); the built-in factories below import their torch implementations (``compute/models.py``) when
called, so ``netsim models`` and ``netsim validate`` list and check models without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from netsim.compute.model_checks import IMAGE_SIDES, ModelData, binary, image
from netsim.errors import InputError, claim, unknown_name
from netsim.scenario.schema import ModelSpec
from netsim.scenario.structure import plugin_keys

ModelFactory = Callable[[Any, ModelData], Any]  # -> a torch.nn.Module or a compute.models.Model
MODELS: dict[str, ModelFactory] = {}
MODEL_PARAMS: dict[str, type | None] = {}


def register_model(name: str, factory: ModelFactory, params: type | None = None) -> ModelFactory:
    """Make ``model.kind = name`` build ``factory(args, data)``: ``args`` is the ``[model]`` table's own keys
    structured into the attrs class ``params`` (checked like every scenario key; None without ``params``),
    ``data`` a ``ModelData``. The factory returns a ``torch.nn.Module`` (trained through ``TorchModel``, the
    generic batched path, with DP clipping by book-keeping where its layers allow) or an object of the
    ``Model`` protocol. The registries' one rule: the same factory again is a no-op, another under a taken
    name raises ValueError."""
    if params is not None:
        if not attrs.has(params):
            raise TypeError(f"params of model {name!r} must be an attrs class")
        shared = sorted(set(attrs.fields_dict(params)) & set(attrs.fields_dict(ModelSpec)))
        if shared:
            raise ValueError(f"params of model {name!r} reuse [model]'s own keys {shared}; "
                             "read them from data.spec instead")
    if MODELS.get(name) is factory and MODEL_PARAMS[name] is not params:
        raise ValueError(f"model {name!r} is already registered with other params ({MODEL_PARAMS[name]})")
    claim(MODELS, "model", name, factory)
    MODEL_PARAMS[name] = params
    return factory


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="netsim.models"):
        ep.load()


def model_names() -> list[str]:
    return sorted(MODELS)


def model_args(spec: ModelSpec) -> Any:
    """The ``[model]`` table's plugin keys structured into its model's params class (one-line errors)."""
    if spec.kind not in MODELS:
        _load_entry_points()
    if spec.kind not in MODELS:
        raise InputError("model.kind", unknown_name("model", spec.kind, model_names()))
    return plugin_keys("model", "model", spec.kind, MODEL_PARAMS[spec.kind], ModelSpec, spec.params)


def _logistic(args: None, data: ModelData):
    """Binary logistic regression, closed-form batched gradients (model.bias: the intercept)."""
    from netsim.compute.models import LogisticRegression

    binary(data)
    return LogisticRegression(data.features, data.spec.l2, data.spec.bias,
                              data.spec.batch_invariant is True)  # 'auto' outside a scenario: the default path


def _multinomial(args: None, data: ModelData):
    """Multinomial logistic regression (softmax), closed-form batched gradients."""
    from netsim.compute.models import MLP

    return MLP(data.features, data.classes, (), data.spec.l2, data.spec.bias)


def _mlp(args: None, data: ModelData):
    """Fully connected ReLU network of model.hidden widths, hand-written batched backprop."""
    from netsim.compute.models import MLP

    s = data.spec
    return MLP(data.features, data.classes, tuple(s.hidden), s.l2, s.bias, s.init)


def _cnn(args: None, data: ModelData):
    """MNIST CNN: conv5(16)-pool-conv5(32)-pool-linear, through TorchModel."""
    from netsim.compute.models import small_cnn

    c, h = image(data, "cnn", IMAGE_SIDES["cnn"])
    return small_cnn(c, data.classes, h)


def _vgg11(args: None, data: ModelData):
    """VGG-11 for 32x32 images, GroupNorm after every conv, through TorchModel."""
    from netsim.compute.models import vgg11

    return vgg11(image(data, "vgg11", IMAGE_SIDES["vgg11"])[0], data.classes)


def _resnet18(args: None, data: ModelData):
    """ResNet-18 in its CIFAR form, GroupNorm for BatchNorm, through TorchModel."""
    from netsim.compute.models import ResNet18

    return ResNet18(image(data, "resnet18", IMAGE_SIDES["resnet18"])[0], data.classes)


for _name, _factory in (("logistic", _logistic), ("multinomial", _multinomial), ("mlp", _mlp), ("cnn", _cnn),
                        ("vgg11", _vgg11), ("resnet18", _resnet18)):
    register_model(_name, _factory)
