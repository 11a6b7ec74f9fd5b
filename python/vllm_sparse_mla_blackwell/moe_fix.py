"""NVFP4 MoE input-scale fix: no silent zero from an activation scale the checkpoint never filled.

The fault
----------------------------
vLLM's ModelOpt NVFP4 MoE method, ``ModelOptNvFp4FusedMoE`` in
``vllm/model_executor/layers/quantization/modelopt.py``, registers two per-tensor activation
("input") scales in ``create_weights`` with ``torch.empty``:

- ``w13_input_scale``: float32 ``[E, S]`` (E experts, S = 2 shards w1/gate and w3/up for gated
  activations, else 1),
- ``w2_input_scale``: float32 ``[E]``,

where E is the local expert count, or the global one when the backend uses global scale factors.
They are meant to be filled by the checkpoint's ``experts.{e}.{gate,up,down}_proj.input_scale``
tensors. A weight-only NVFP4 checkpoint (``"input_activations": null``) has no such tensors, so the
W4A4 kernels use whatever the allocator left in memory for
``alpha = weight_scale_2 * input_scale`` (and ``1 / input_scale`` to quantise activations): 0.0
gives all-zero expert outputs, a denormal or NaN gives inf/NaN on some prompts only. No error.

What this module does
---------------------
With ``VLLM_GLM53_MOE_INPUT_SCALE=<float>`` (read by
``vllm_sparse_mla_blackwell.plugins.register_moe_input_scale_fix``), :func:`register`:

1. validates the value (positive, finite) and fails start-up with a clear error otherwise;
2. asks the running vLLM how it treats a weight-only NVFP4 config
   (:func:`vllm_handles_weight_only_nvfp4`), for the log line only: vLLM 0.33 promotes
   ``quant_algo`` ``NVFP4`` to ``W4A16_NVFP4`` when every config group has
   ``input_activations: null``, but a legacy ``hf_quant_config.json`` checkpoint (no
   ``config_groups``) and a mixed config (only some groups weight-only) still take the W4A4 path
   with scales nobody loads, so the decision is made per layer below;
3. wraps, at run time and idempotently, ``ModelOptNvFp4FusedMoE.create_weights`` and
   ``ModelOptNvFp4FusedMoE.process_weights_after_loading`` (no vLLM file is modified):

   - right after ``create_weights`` both input-scale tensors are overwritten with a sentinel bit
     pattern (a quiet float32 NaN with a payload, :data:`SENTINEL_BITS`);
   - right before vLLM's own ``process_weights_after_loading`` every element still holding the
     sentinel is one the checkpoint did not provide; it takes the configured value (per layer, per
     expert, per shard). Elements the checkpoint provided are left untouched, bit for bit;
   - once every marked layer of a model has been processed, one log line says how many scales were
     filled and in which layers;
   - a layer whose method does not read activation scales (vLLM 0.33: ``use_a16``, the W4A16
     path; ``per_token_activation``, where vLLM sets them to 1.0 itself) is left alone.

A sentinel that survives to the end of loading with no value to fill is a ``RuntimeError`` naming
the layer (:func:`fill_missing_input_scales` with ``value=None``), never a silent zero.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import threading
import weakref
from typing import Any

import torch
from vllm.logger import init_logger

from vllm_sparse_mla_blackwell.envs import MOE_INPUT_SCALE_ENV as ENV_VAR  # the value's variable

# Under the "vllm." hierarchy so that vLLM's logging configuration (handler, format, level)
# applies; a logger outside it would print nothing below WARNING.
logger = init_logger("vllm." + __name__)

#: The NVFP4 MoE parameters this fix watches: ``w13_input_scale`` float32 ``[E, S]`` and
#: ``w2_input_scale`` float32 ``[E]`` (``ModelOptNvFp4FusedMoE.create_weights``).
INPUT_SCALE_PARAMS: tuple[str, ...] = ("w13_input_scale", "w2_input_scale")

#: Bit pattern written into the input-scale tensors before loading: a quiet float32 NaN whose
#: payload no quantiser emits (a checkpoint scale is a positive finite float). Detection compares
#: the raw 32-bit pattern, so a NaN the checkpoint itself might hold is not mistaken for it.
SENTINEL_BITS = 0x7FD1A5E5

_SHARD_NAMES = ("w1", "w3")  # w13 shard index -> checkpoint shard id (gate_proj, up_proj)
_WRAP_MARK = "_glm53_moe_input_scale_fix"  # attribute set on our wrapper functions
_HOOKED_METHODS = ("create_weights", "process_weights_after_loading")

# A ModelOpt config.json ``quantization_config`` (the compressed-tensors-style layout that carries
# ``config_groups``) for NVFP4 weights, without and with quantised activations. Only the presence
# of ``input_activations`` differs between the two.
_NVFP4_WEIGHTS = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
_NVFP4_ACTIVATIONS = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
WEIGHT_ONLY_NVFP4_CONFIG: dict[str, Any] = {
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "group_size": 16,
    "ignore": [],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": _NVFP4_WEIGHTS,
            "input_activations": None,
        }
    },
}
FULL_NVFP4_CONFIG: dict[str, Any] = copy.deepcopy(WEIGHT_ONLY_NVFP4_CONFIG)
FULL_NVFP4_CONFIG["config_groups"]["group_0"]["input_activations"] = _NVFP4_ACTIVATIONS


# --------------------------------------------------------------------------------------------
# Value parsing
# --------------------------------------------------------------------------------------------


def parse_value(value: str | float) -> float:
    """Parse and validate the fill value given through ``VLLM_GLM53_MOE_INPUT_SCALE``.

    Args:
        value: the variable's text (e.g. ``"1.0"``, ``"2.5e-3"``) or a number.

    Returns:
        The value as a Python float (stored into float32 tensors when filling, so it is rounded to
        float32 there).

    Raises:
        ValueError: the text is not a float, or the float is not finite and > 0 (0 would zero the
            experts, a negative scale flips their sign, inf/NaN poison every output). The message
            names ``VLLM_GLM53_MOE_INPUT_SCALE``.
    """
    text = value if isinstance(value, str) else repr(value)
    try:
        scale = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{ENV_VAR}={text!r} is not a number: expected a positive finite float, the NVFP4 "
            "activation input scale to use where the checkpoint provides none (e.g. 1.0), or "
            "leave the variable unset to disable the fix."
        ) from None
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(
            f"{ENV_VAR}={text!r} is not a positive finite float (got {scale!r}): an input scale "
            "of 0 zeroes every expert output, a negative one flips its sign and inf/NaN poison "
            "it. Use e.g. 1.0, or leave the variable unset to disable the fix."
        )
    as_f32 = float(torch.tensor(scale, dtype=torch.float32))
    inv_f32 = (
        float(torch.tensor(1.0 / as_f32, dtype=torch.float32))
        if 0.0 < as_f32 < math.inf
        else math.inf
    )
    if not (0.0 < as_f32 < math.inf and math.isfinite(inv_f32)):
        raise ValueError(
            f"{ENV_VAR}={text!r} is out of range for float32, the dtype of vLLM's input-scale "
            "tensors (the kernels also use 1/scale): use a value between 3e-38 and 3e38, "
            "e.g. 1.0."
        )
    return scale


# --------------------------------------------------------------------------------------------
# Stand-down probe
# --------------------------------------------------------------------------------------------


def _vllm_classes() -> tuple[type, type]:
    """vLLM's ``(ModelOptNvFp4Config, ModelOptNvFp4FusedMoE)``.

    Source: ``vllm/model_executor/layers/quantization/modelopt.py``. Raises ImportError when the
    running vLLM has neither (then there is nothing to fix).
    """
    from vllm.model_executor.layers.quantization.modelopt import (
        ModelOptNvFp4Config,
        ModelOptNvFp4FusedMoE,
    )

    return ModelOptNvFp4Config, ModelOptNvFp4FusedMoE


def _moe_method_class(quant_config: Any, default: type) -> type:
    """The ``FusedMoEMethodBase`` subclass that ``quant_config.get_quant_method`` builds for a
    ``FusedMoE``/``RoutedExperts`` layer.

    vLLM 0.33 reads it from the config class attribute ``FusedMoEMethodCls``
    (``ModelOptQuantConfigBase.get_quant_method``); older releases construct
    ``ModelOptNvFp4FusedMoE`` directly, which ``default`` stands for.
    """
    cls = getattr(quant_config, "FusedMoEMethodCls", None)
    if isinstance(cls, type) and cls.__name__ != "FusedMoEMethodBase":
        return cls
    return default


def vllm_handles_weight_only_nvfp4() -> tuple[bool | None, str]:
    """Does the running vLLM already route weight-only NVFP4 MoE checkpoints correctly?

    Decided from vLLM's behaviour, not its version string: vLLM's own
    ``ModelOptNvFp4Config.from_config`` is fed the same ModelOpt ``quantization_config`` twice,
    with ``input_activations: null`` (:data:`WEIGHT_ONLY_NVFP4_CONFIG`) and with NVFP4 activations
    (:data:`FULL_NVFP4_CONFIG`), and the two results are compared on what selects the MoE path:

    - the MoE method class the config builds for a FusedMoE layer (``FusedMoEMethodCls``), and
    - the quantisation algorithm it settles on (``quant_method``: vLLM 0.33 turns ``NVFP4`` into
      ``W4A16_NVFP4`` for weight-only configs, and ``ModelOptNvFp4FusedMoE`` then sets
      ``use_a16`` and never reads the activation scales).

    If vLLM treats both configs identically, a weight-only checkpoint goes down the W4A4 path and
    its activation scales stay uninitialised: not handled.

    Returns:
        ``(handled, reason)``: ``handled`` is True when vLLM distinguishes the weight-only config
        (the fix stands down), False when it does not (the fix installs its hooks), None when the
        configs build a MoE method other than ``ModelOptNvFp4FusedMoE`` for both (the fix has
        nothing it knows how to hook); ``reason`` says what was observed.

    Raises:
        ImportError: vLLM has no ``ModelOptNvFp4Config`` / ``ModelOptNvFp4FusedMoE``.
    """
    config_cls, method_cls = _vllm_classes()
    try:
        weight_only = config_cls.from_config(copy.deepcopy(WEIGHT_ONLY_NVFP4_CONFIG))
    except Exception as exc:  # vLLM rejects the config outright: it does not handle it
        return False, f"vLLM rejects a weight-only NVFP4 config ({type(exc).__name__}: {exc})"
    try:
        full = config_cls.from_config(copy.deepcopy(FULL_NVFP4_CONFIG))
    except Exception as exc:
        return False, f"vLLM rejects a W4A4 NVFP4 config ({type(exc).__name__}: {exc})"

    wo_cls = _moe_method_class(weight_only, method_cls)
    full_cls = _moe_method_class(full, method_cls)
    if wo_cls is not full_cls:
        return True, (
            f"a weight-only config builds MoE method {wo_cls.__name__}, a W4A4 one "
            f"{full_cls.__name__}"
        )
    if not issubclass(wo_cls, method_cls):
        return None, (
            f"NVFP4 MoE layers are built by {wo_cls.__module__}.{wo_cls.__name__}, not by "
            f"{method_cls.__name__}, which this fix knows how to hook"
        )
    wo_algo = getattr(weight_only, "quant_method", None)
    full_algo = getattr(full, "quant_method", None)
    if wo_algo != full_algo:
        return True, (
            f"a config with input_activations=null is routed as quant_algo {wo_algo!r} instead "
            f"of {full_algo!r}: the weight-only path, which does not use activation scales"
        )
    return False, (
        f"a config with input_activations=null is treated exactly like a W4A4 one (quant_algo "
        f"{wo_algo!r}, MoE method {wo_cls.__name__}), so its activation scales are read but "
        "never loaded"
    )


# --------------------------------------------------------------------------------------------
# Sentinel marking and filling (usable on any layer object holding the two parameters)
# --------------------------------------------------------------------------------------------


def _layer_name(layer: torch.nn.Module) -> str:
    """The layer's prefix as vLLM knows it (``RoutedExperts.layer_name`` in vLLM 0.33,
    ``FusedMoE.layer_name`` before), else a description of the object."""
    for attr in ("layer_name", "prefix"):
        name = getattr(layer, attr, None)
        if isinstance(name, str) and name:
            return name
    return f"<{type(layer).__name__} at {id(layer):#x}>"


def _float32_data(layer: torch.nn.Module, name: str) -> torch.Tensor | None:
    """``getattr(layer, name).data`` if it is a float32 tensor, else None."""
    param = getattr(layer, name, None)
    if not isinstance(param, torch.Tensor):
        return None
    data = param.data
    return data if data.dtype == torch.float32 else None


def mark_input_scales_unloaded(
    layer: torch.nn.Module, param_names: tuple[str, ...] = INPUT_SCALE_PARAMS
) -> tuple[str, ...]:
    """Overwrite the layer's input-scale tensors with the sentinel (before any weight is loaded).

    Args:
        layer: the module ``ModelOptNvFp4FusedMoE.create_weights`` registered the parameters on
            (vLLM 0.33: ``RoutedExperts``; before: ``FusedMoE``).
        param_names: which parameters; each must be a float32 tensor (``w13_input_scale``
            ``[E, S]``, ``w2_input_scale`` ``[E]``) to be marked.

    Returns:
        The names that were marked; a missing or non-float32 parameter is skipped with a warning
        (the sentinel is a float32 bit pattern) and is then never filled.
    """
    marked = []
    for name in param_names:
        data = _float32_data(layer, name)
        if data is None:
            if getattr(layer, name, None) is not None:
                logger.warning(
                    "%s: %s.%s is %s, not float32; the NVFP4 input-scale fix leaves it alone.",
                    ENV_VAR,
                    _layer_name(layer),
                    name,
                    getattr(getattr(layer, name), "dtype", type(getattr(layer, name))),
                )
            continue
        data.view(torch.int32).fill_(SENTINEL_BITS)
        marked.append(name)
    return tuple(marked)


def unloaded_input_scale_mask(
    layer: torch.nn.Module, name: str
) -> torch.Tensor | None:
    """Boolean mask (same shape as the parameter) of the elements of ``layer.<name>`` that still
    hold the sentinel, i.e. that no checkpoint tensor was copied into; None if the parameter is
    absent or not float32."""
    data = _float32_data(layer, name)
    if data is None:
        return None
    return data.view(torch.int32) == SENTINEL_BITS


def _describe_positions(mask: torch.Tensor) -> str:
    """``"e0.w1, e0.w3, e5.w3"`` for ``[E, S]`` masks, ``"e0, e5"`` for ``[E]`` ones."""
    positions = mask.nonzero().tolist()
    items = []
    for pos in positions[:24]:
        if len(pos) == 2:
            shard = _SHARD_NAMES[pos[1]] if pos[1] < len(_SHARD_NAMES) else f"s{pos[1]}"
            items.append(f"e{pos[0]}.{shard}")
        elif len(pos) == 1:
            items.append(f"e{pos[0]}")
        else:
            items.append(str(tuple(pos)))
    more = len(positions) - len(items)
    return ", ".join(items) + (f", ... (+{more})" if more > 0 else "")


@dataclasses.dataclass(frozen=True)
class LayerFillReport:
    """What :func:`fill_missing_input_scales` found in one layer.

    Attributes:
        layer_name: the layer's prefix (e.g. ``model.layers.3.mlp.experts``).
        filled: per parameter name, how many elements were filled (held the sentinel).
        total: per parameter name, its element count.
        positions: per parameter name with fills, which experts/shards (``"e0.w1, e3"``).
    """

    layer_name: str
    filled: dict[str, int]
    total: dict[str, int]
    positions: dict[str, str]

    @property
    def num_filled(self) -> int:
        return sum(self.filled.values())

    @property
    def num_total(self) -> int:
        return sum(self.total.values())


def fill_missing_input_scales(
    layer: torch.nn.Module,
    value: float | None,
    param_names: tuple[str, ...] = INPUT_SCALE_PARAMS,
    layer_name: str | None = None,
) -> LayerFillReport:
    """Give every input-scale element that still holds the sentinel the value ``value``.

    Call after the checkpoint has been loaded into a layer marked by
    :func:`mark_input_scales_unloaded`, before vLLM converts the scales into kernel format
    (``ModelOptNvFp4FusedMoE.process_weights_after_loading``). Elements the checkpoint wrote are
    not touched (bit for bit).

    Args:
        layer: the module holding ``w13_input_scale`` (float32 ``[E, S]``) and ``w2_input_scale``
            (float32 ``[E]``), on any device.
        value: the fill value (a positive finite float; see :func:`parse_value`), or None when
            there is none.
        param_names: which parameters to check.
        layer_name: name for messages; default: the layer's ``layer_name`` attribute.

    Returns:
        A :class:`LayerFillReport`.

    Raises:
        RuntimeError: some element still holds the sentinel and ``value`` is None. The message
            names the layer, the parameter and the experts/shards, so an uninitialised scale is
            never used silently.
        ValueError: ``value`` is not a positive finite float.
    """
    name = layer_name or _layer_name(layer)
    masks: dict[str, torch.Tensor] = {}
    total: dict[str, int] = {}
    for pname in param_names:
        mask = unloaded_input_scale_mask(layer, pname)
        if mask is None:
            continue
        masks[pname] = mask
        total[pname] = mask.numel()
    counts = {pname: int(mask.sum().item()) for pname, mask in masks.items()}
    positions = {
        pname: _describe_positions(masks[pname]) for pname, n in counts.items() if n
    }
    if any(counts.values()):
        if value is None:
            detail = "; ".join(
                f"{pname}: {counts[pname]} of {total[pname]} ({positions[pname]})"
                for pname in positions
            )
            raise RuntimeError(
                f"NVFP4 MoE layer {name!r}: activation input scales were never loaded from the "
                f"checkpoint and no value is set to fill them ({detail}). Using them would make "
                f"the layer's experts output zeros or NaN. Set {ENV_VAR}=<positive float> (e.g. "
                "1.0) or use a checkpoint that provides input_scale for every expert."
            )
        scale = parse_value(value)
        for pname, mask in masks.items():
            if counts[pname]:
                getattr(layer, pname).data.masked_fill_(mask, scale)
    return LayerFillReport(
        layer_name=name,
        filled=dict(counts),
        total=total,
        positions=positions,
    )


# --------------------------------------------------------------------------------------------
# Per-model bookkeeping and the once-per-model log line
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelFillSummary:
    """The fills of one model load (every marked layer processed).

    Attributes:
        value: the fill value in use.
        layers: one :class:`LayerFillReport` per NVFP4 MoE layer, in processing order.
    """

    value: float | None
    layers: list[LayerFillReport]

    @property
    def num_filled(self) -> int:
        return sum(r.num_filled for r in self.layers)

    @property
    def num_total(self) -> int:
        return sum(r.num_total for r in self.layers)

    @property
    def filled_layers(self) -> list[str]:
        return [r.layer_name for r in self.layers if r.num_filled]


class _State:
    """Module state, guarded by ``_LOCK``."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.decision: tuple[bool | None, str] | None = None  # probe result, once per process
        self.stand_down_logged = False
        self.skip_logged = False  # the one line about layers on vLLM's W4A16 path
        self.originals: dict[str, Any] = {}  # method name -> class __dict__ entry (or _ABSENT)
        self.hooked_class: type | None = None
        # Layers marked in create_weights and not yet processed: layer -> marked names.
        self.marked: weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, ...]] = (
            weakref.WeakKeyDictionary()
        )
        self.current: list[LayerFillReport] = []
        self.last_summary: ModelFillSummary | None = None


_LOCK = threading.RLock()
_STATE = _State()
_ABSENT = object()


def last_summary() -> ModelFillSummary | None:
    """The summary logged for the most recent model load in this process (None before any)."""
    with _LOCK:
        return _STATE.last_summary


def _emit_summary() -> None:
    """Log the finished model's fills once and start a new record. Caller holds ``_LOCK``."""
    summary = ModelFillSummary(value=_STATE.value, layers=list(_STATE.current))
    _STATE.current = []
    _STATE.last_summary = summary
    if summary.num_filled:
        per_layer = "; ".join(
            f"{r.layer_name}: "
            + ", ".join(
                f"{pname} {r.filled[pname]}/{r.total[pname]}" for pname in r.positions
            )
            for r in summary.layers
            if r.num_filled
        )
        logger.warning(
            "%s=%g: the checkpoint provided no NVFP4 MoE activation input scale for %d of %d "
            "scales; they were set to %g in %d of %d MoE layers [%s]. The %d scales the "
            "checkpoint provided were kept unchanged.",
            ENV_VAR,
            summary.value,
            summary.num_filled,
            summary.num_total,
            summary.value,
            len(summary.filled_layers),
            len(summary.layers),
            per_layer,
            summary.num_total - summary.num_filled,
        )
    else:
        logger.info(
            "%s=%g: all %d NVFP4 MoE activation input scales in %d MoE layers came from the "
            "checkpoint; nothing was filled.",
            ENV_VAR,
            summary.value,
            summary.num_total,
            len(summary.layers),
        )


def _reads_checkpoint_input_scales(method: Any) -> bool:
    """False when vLLM's method instance will not use the checkpoint's activation scales:
    ``use_a16`` (weight-only W4A16 path, vLLM 0.33) or ``per_token_activation`` (vLLM overwrites
    them with 1.0 itself). Older releases have neither attribute: True."""
    return not (getattr(method, "use_a16", False) or getattr(method, "per_token_activation", False))


def _after_create_weights(method: Any, layer: torch.nn.Module) -> None:
    with _LOCK:
        if _STATE.value is None:
            return
        if not _reads_checkpoint_input_scales(method):
            if not _STATE.skip_logged:
                _STATE.skip_logged = True
                logger.info(
                    "%s: %s and layers like it run on vLLM's weight-only (W4A16) or per-token "
                    "path, which reads no checkpoint activation scales; left as they are.",
                    ENV_VAR,
                    _layer_name(layer),
                )
            return
        marked = mark_input_scales_unloaded(layer)
        if marked:
            _STATE.marked[layer] = marked


def _before_process_weights(method: Any, layer: torch.nn.Module) -> None:
    with _LOCK:
        marked = _STATE.marked.pop(layer, None)
        if marked is None:
            return
        report = fill_missing_input_scales(layer, _STATE.value, param_names=marked)
        _STATE.current.append(report)
        if report.num_filled:
            logger.debug(
                "%s: %s: filled %s",
                ENV_VAR,
                report.layer_name,
                "; ".join(f"{p}: {pos}" for p, pos in report.positions.items()),
            )
        if len(_STATE.marked) == 0:
            _emit_summary()


# --------------------------------------------------------------------------------------------
# Installing / removing the wrappers
# --------------------------------------------------------------------------------------------


def _make_wrapper(name: str, original: Any) -> Any:
    if name == "create_weights":

        @functools.wraps(original)
        def create_weights(self, layer, *args, **kwargs):
            result = original(self, layer, *args, **kwargs)
            _after_create_weights(self, layer)
            return result

        wrapper = create_weights
    else:

        @functools.wraps(original)
        def process_weights_after_loading(self, layer, *args, **kwargs):
            _before_process_weights(self, layer)
            return original(self, layer, *args, **kwargs)

        wrapper = process_weights_after_loading
    setattr(wrapper, _WRAP_MARK, True)
    return wrapper


def hooks_installed(method_cls: type | None = None) -> bool:
    """True when ``ModelOptNvFp4FusedMoE`` (or ``method_cls``) carries this module's wrappers."""
    if method_cls is None:
        method_cls = _vllm_classes()[1]
    return all(
        getattr(method_cls.__dict__.get(name), _WRAP_MARK, False) for name in _HOOKED_METHODS
    )


def install_hooks(value: float | str, method_cls: type | None = None) -> bool:
    """Wrap ``create_weights`` and ``process_weights_after_loading`` of vLLM's
    ``ModelOptNvFp4FusedMoE`` (``vllm/model_executor/layers/quantization/modelopt.py``) so that
    missing input scales take ``value``. Idempotent: a second call only updates the value.

    :func:`register` calls this only when vLLM does not handle weight-only checkpoints itself;
    calling it directly forces the fill path (tests do, since vLLM 0.33 stands down).

    Args:
        value: the fill value (validated with :func:`parse_value`).
        method_cls: the class to wrap; default ``ModelOptNvFp4FusedMoE``.

    Returns:
        True if the wrappers were installed by this call, False if they already were.

    Raises:
        ValueError: bad ``value``. ImportError: vLLM lacks the class.
    """
    scale = parse_value(value)
    if method_cls is None:
        method_cls = _vllm_classes()[1]
    with _LOCK:
        _STATE.value = scale
        if hooks_installed(method_cls):
            return False
        if _STATE.hooked_class is not None and _STATE.hooked_class is not method_cls:
            raise RuntimeError(
                f"the NVFP4 input-scale fix already wraps {_STATE.hooked_class.__name__}"
            )
        for name in _HOOKED_METHODS:
            entry = method_cls.__dict__.get(name, _ABSENT)
            original = getattr(method_cls, name)
            _STATE.originals[name] = entry
            setattr(method_cls, name, _make_wrapper(name, original))
        _STATE.hooked_class = method_cls
        return True


def unregister() -> None:
    """Undo :func:`register` / :func:`install_hooks`: restore the original methods and forget the
    value, the cached probe result and all bookkeeping (mainly for tests)."""
    with _LOCK:
        cls = _STATE.hooked_class
        if cls is not None:
            for name, entry in _STATE.originals.items():
                if entry is _ABSENT:
                    if name in cls.__dict__:
                        delattr(cls, name)
                else:
                    setattr(cls, name, entry)
        _STATE.__init__()


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def register(value: str) -> None:
    """Install the NVFP4 MoE input-scale fix; called by
    ``vllm_sparse_mla_blackwell.plugins.register_moe_input_scale_fix`` (a
    ``vllm.general_plugins`` entry point, run in every vLLM process) when
    ``VLLM_GLM53_MOE_INPUT_SCALE`` is set.

    Idempotent: the probe runs once per process, the wrappers are installed once, each message
    is logged once. The wrappers decide per layer: a layer vLLM runs on its W4A16 path, and every
    scale the checkpoint provides, is left alone; the rest take ``value``. Only a vLLM without
    ``ModelOptNvFp4FusedMoE`` makes the hook stand down as a whole.

    Args:
        value: the variable's text, e.g. ``"1.0"``.

    Raises:
        ValueError: ``value`` is not a positive finite float (start-up fails with a message naming
            ``VLLM_GLM53_MOE_INPUT_SCALE``).
    """
    scale = parse_value(value)
    with _LOCK:
        if _STATE.decision is None:
            try:
                _STATE.decision = vllm_handles_weight_only_nvfp4()
            except ImportError as exc:
                _STATE.decision = (None, f"vLLM has no ModelOpt NVFP4 MoE method ({exc})")
        handled, reason = _STATE.decision
        if handled is None:
            if not _STATE.stand_down_logged:
                _STATE.stand_down_logged = True
                logger.warning(
                    "%s=%s is ignored: %s. Nothing is changed.", ENV_VAR, value, reason
                )
            return
        # Decided per layer, not per vLLM: even a vLLM that routes an all-weight-only config to
        # W4A16 (0.33) sends legacy hf_quant_config.json checkpoints and mixed configs down the
        # W4A4 path with never-loaded scales. The hooks leave W4A16 layers and provided scales.
        if install_hooks(scale):
            logger.info(
                "%s=%g: NVFP4 MoE activation input scales that the checkpoint does not provide "
                "will be set to %g in layers vLLM runs on its W4A4 path; layers on its W4A16 "
                "path and scales the checkpoint provides are left as they are (%s).",
                ENV_VAR,
                scale,
                scale,
                reason,
            )
