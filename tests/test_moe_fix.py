"""Tests for the NVFP4 MoE input-scale fix (``vllm_sparse_mla_blackwell.moe_fix``).

CPU only, against the real installed vLLM: layers are built with vLLM's own
``ModelOptNvFp4Config.from_config`` -> ``FusedMoEFactory`` -> ``RoutedExperts`` ->
``ModelOptNvFp4FusedMoE.create_weights``, checkpoints are loaded through
``RoutedExperts.load_weights`` / ``weight_loader`` and post-processed by vLLM's own
``ModelOptNvFp4FusedMoE.process_weights_after_loading``. Only the GPU-kernel steps are replaced:
the NVFP4 MoE backend choice (no backend supports a CPU) and the kernel-format conversion / kernel
construction at the end of ``process_weights_after_loading``, which a spy records instead (what
vLLM would hand to its kernels is exactly what the tests check).

vLLM 0.33.0 routes a weight-only NVFP4 checkpoint itself (``quant_algo`` NVFP4 becomes
``W4A16_NVFP4``) only when it has ``config_groups`` and every group has ``input_activations:
null``; legacy ``hf_quant_config.json`` checkpoints and mixed configs still reach the W4A4 path,
so the hook decides per layer (``test_register_decides_per_checkpoint_form``).
"""

from __future__ import annotations

import copy
import logging
import math

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory  # noqa: E402
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend  # noqa: E402
from vllm.model_executor.layers.quantization import modelopt  # noqa: E402
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (  # noqa: E402
    dequantize_nvfp4_moe_weights,
)

from vllm_sparse_mla_blackwell import moe_fix, plugins  # noqa: E402

E, TOPK, HIDDEN, INTER = 8, 2, 256, 128
PREFIX = "model.layers.3.mlp.experts"
SENT = moe_fix.SENTINEL_BITS


# ---------------------------------------------------------------------------------------------
# Fixtures: a one-process vLLM "distributed" world on CPU, backend choice, spies, clean state
# ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_fix():
    moe_fix.unregister()
    yield
    moe_fix.unregister()


class KernelSpy:
    """Stands in for vLLM's GPU-only tail of ``process_weights_after_loading``: records the
    tensors vLLM passes to ``convert_to_nvfp4_moe_kernel_format`` (cloned) and returns them
    unchanged; ``_build_moe_kernel`` becomes a no-op."""

    def __init__(self):
        self.calls: list[dict[str, torch.Tensor]] = []

    def convert(self, **kw):
        self.calls.append(
            {k: v.detach().clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
        )
        return (
            kw["w13"],
            kw["w13_scale"],
            kw["w13_scale_2"],
            kw["a13_scale"],
            kw["w2"],
            kw["w2_scale"],
            kw["w2_scale_2"],
            kw["a2_scale"],
        )


@pytest.fixture()
def spy(monkeypatch):
    """No NVFP4 MoE backend runs on a CPU: pick EMULATION for W4A4 and MARLIN for W4A16 (what a
    GPU without FlashInfer/CUTLASS FP4 would get) and spy on the kernel-format conversion."""

    def select(config, weight_key, activation_key):
        if activation_key is not None:
            return NvFp4MoeBackend.EMULATION, object
        return NvFp4MoeBackend.MARLIN, object

    kernel_spy = KernelSpy()
    monkeypatch.setattr(modelopt, "select_nvfp4_moe_backend", select)
    monkeypatch.setattr(modelopt, "convert_to_nvfp4_moe_kernel_format", kernel_spy.convert)
    monkeypatch.setattr(
        modelopt.ModelOptNvFp4FusedMoE, "_build_moe_kernel", lambda self, layer: None
    )
    return kernel_spy


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, level=logging.INFO):
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture()
def fix_log():
    """Records of the fix's logger (it lives under ``vllm.``, which does not propagate to root,
    so pytest's caplog would not see them)."""
    handler = ListHandler()
    level = moe_fix.logger.level
    moe_fix.logger.setLevel(logging.INFO)  # vLLM configures logging only when an engine starts
    moe_fix.logger.addHandler(handler)
    yield handler
    moe_fix.logger.removeHandler(handler)
    moe_fix.logger.setLevel(level)


# ---------------------------------------------------------------------------------------------
# Helpers: configs, layers, checkpoints
# ---------------------------------------------------------------------------------------------


def quant_config(weight_only: bool, raw: dict | None = None):
    """vLLM's own config object for a ModelOpt NVFP4 checkpoint, as ``get_quant_config`` builds
    it from config.json's ``quantization_config`` (or ``raw``, any form vLLM reads)."""
    if raw is None:
        raw = moe_fix.WEIGHT_ONLY_NVFP4_CONFIG if weight_only else moe_fix.FULL_NVFP4_CONFIG
    return modelopt.ModelOptNvFp4Config.from_config(copy.deepcopy(raw))


def make_layer(weight_only: bool = False, prefix: str = PREFIX, raw: dict | None = None):
    """The ``RoutedExperts`` module vLLM builds for one FusedMoE layer (E=8, top-2, hidden 256,
    intermediate 128, bf16); needs the ``cpu_vllm_config`` world."""
    # A fresh config per layer: vLLM registers each layer's name in its config.
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        runner = FusedMoEFactory(
            num_experts=E,
            top_k=TOPK,
            hidden_size=HIDDEN,
            intermediate_size=INTER,
            params_dtype=torch.bfloat16,
            quant_config=quant_config(weight_only, raw),
            tp_size=1,
            dp_size=1,
            pcp_size=1,
            prefix=prefix,
        )
    layer = runner.routed_experts
    assert isinstance(layer.quant_method, modelopt.ModelOptNvFp4FusedMoE)
    return layer


PROJ = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}


def random_checkpoint(seed: int, input_scales: dict[tuple[int, str], float] | None):
    """Per-expert ModelOpt NVFP4 tensors with random bytes (the values do not matter for the
    bookkeeping tests). ``input_scales`` maps ``(expert, proj)`` to the scale the checkpoint
    provides; pairs not in it have no ``input_scale`` tensor."""
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for e in range(E):
        for proj in PROJ:
            rows, cols = (INTER, HIDDEN) if proj != "down_proj" else (HIDDEN, INTER)
            w = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8)
            s = (torch.rand(rows, cols // 16, generator=g) + 0.5).to(torch.float8_e4m3fn)
            tensors += [
                (f"{e}.{proj}.weight", w),
                (f"{e}.{proj}.weight_scale", s),
                (f"{e}.{proj}.weight_scale_2", torch.tensor(1e-3 * (e + 1))),
            ]
            if input_scales is not None and (e, proj) in input_scales:
                tensors.append(
                    (f"{e}.{proj}.input_scale", torch.tensor(input_scales[(e, proj)]))
                )
    return tensors


def load(layer, tensors):
    """vLLM's own per-layer loading path (``RoutedExperts.load_weights`` -> ``weight_loader``)."""
    loaded = set(layer.load_weights(tensors))
    assert {"w13_weight", "w2_weight", "w13_weight_scale_2"} <= loaded
    return loaded


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous().view(torch.int32)


def f32_bits(value: float) -> int:
    return int(torch.tensor(value, dtype=torch.float32).view(torch.int32))


def expected_scales(provided: dict[tuple[int, str], float], fill: float):
    """The ``[E, 2]`` w13 and ``[E]`` w2 input scales after the fix."""
    w13 = torch.full((E, 2), fill, dtype=torch.float32)
    w2 = torch.full((E,), fill, dtype=torch.float32)
    for (e, proj), v in provided.items():
        param, shard = PROJ[proj]
        if param == "w13":
            w13[e, shard] = v
        else:
            w2[e] = v
    return w13, w2


def process(layer, spy):
    n = len(spy.calls)
    layer.quant_method.process_weights_after_loading(layer)
    assert len(spy.calls) == n + 1
    return spy.calls[-1]


# ---------------------------------------------------------------------------------------------
# Which path vLLM takes; stand-down
# ---------------------------------------------------------------------------------------------


def test_probe_agrees_with_the_layers_vllm_builds(cpu_vllm_config, spy):
    """The stand-down probe's verdict matches what vLLM really builds for a FusedMoE layer: a
    weight-only layer differs from a W4A4 one (other class or activation-free path) exactly
    when the probe says vLLM handles weight-only checkpoints."""
    handled, reason = moe_fix.vllm_handles_weight_only_nvfp4()
    assert isinstance(reason, str) and reason
    wo = make_layer(weight_only=True).quant_method
    full = make_layer(weight_only=False).quant_method
    differs = type(wo) is not type(full) or getattr(wo, "use_a16", False) != getattr(
        full, "use_a16", False
    )
    assert handled is differs
    # A W4A4 layer always reads the activation scales: that is the configuration to fix.
    assert moe_fix._reads_checkpoint_input_scales(full)


@pytest.mark.skipif(
    not vllm.__version__.startswith("0.33."), reason="documents vLLM 0.33.x behaviour"
)
def test_vllm_0_33_routes_weight_only_checkpoints_to_w4a16(cpu_vllm_config, spy):
    """vLLM 0.33: input_activations=null -> quant_algo W4A16_NVFP4 -> ModelOptNvFp4FusedMoE with
    use_a16=True (no activation scales used). The fix therefore stands down on 0.33."""
    handled, reason = moe_fix.vllm_handles_weight_only_nvfp4()
    assert handled is True
    assert "W4A16_NVFP4" in reason
    assert quant_config(weight_only=True).quant_method == "W4A16_NVFP4"
    assert quant_config(weight_only=False).quant_method == "NVFP4"
    assert make_layer(weight_only=True).quant_method.use_a16 is True
    assert make_layer(weight_only=False).quant_method.use_a16 is False


# The checkpoint forms the hook decides on, as config.json / hf_quant_config.json give them to
# vLLM's ModelOptNvFp4Config.from_config, and whether vLLM 0.33 runs their MoE layers on the W4A4
# path (which reads input_scale) or on W4A16.
LEGACY_WEIGHT_ONLY = {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                                       "exclude_modules": []}}
MIXED_GROUPS = copy.deepcopy(moe_fix.FULL_NVFP4_CONFIG)
MIXED_GROUPS["config_groups"] = {
    "attention": {"targets": ["re:.*self_attn.*"], "weights": moe_fix._NVFP4_WEIGHTS,
                  "input_activations": moe_fix._NVFP4_ACTIVATIONS},
    "experts": {"targets": ["re:.*mlp.experts.*"], "weights": moe_fix._NVFP4_WEIGHTS, "input_activations": None},
}
CHECKPOINT_FORMS = {
    # name: (raw config, vLLM 0.33 reads the activation scales of its MoE layers)
    "config_groups_all_weight_only": (moe_fix.WEIGHT_ONLY_NVFP4_CONFIG, False),
    "legacy_hf_quant_config_weight_only": (LEGACY_WEIGHT_ONLY, True),
    "mixed_groups_moe_weight_only": (MIXED_GROUPS, True),
    "w4a4": (moe_fix.FULL_NVFP4_CONFIG, True),
}


@pytest.mark.skipif(
    not vllm.__version__.startswith("0.33."), reason="documents vLLM 0.33.x routing"
)
@pytest.mark.parametrize("form", sorted(CHECKPOINT_FORMS))
def test_register_decides_per_checkpoint_form(form, cpu_vllm_config, spy, fix_log):
    """Through ``register`` as vLLM calls it: the hook stays on even where vLLM 0.33 routes an
    all-weight-only config itself, leaves the layers vLLM runs on W4A16 alone, and fills the
    never-loaded scales of the legacy and mixed forms that vLLM still sends down W4A4."""
    raw, reads = CHECKPOINT_FORMS[form]
    moe_fix.register("0.75")
    moe_fix.register("0.75")  # every vLLM process may call it more than once
    assert moe_fix.hooks_installed()
    layer = make_layer(raw=raw)
    assert moe_fix._reads_checkpoint_input_scales(layer.quant_method) is reads
    assert layer.quant_method.use_a16 is (not reads)
    load(layer, random_checkpoint(11, input_scales=None))
    seen = process(layer, spy)
    if reads:
        assert torch.equal(seen["a13_scale"], torch.full((E, 2), 0.75))
        assert torch.equal(seen["a2_scale"], torch.full((E,), 0.75))
        (warning,) = fix_log.messages(logging.WARNING)
        assert PREFIX in warning and "24 of 24" in warning
    else:
        assert layer not in moe_fix._STATE.marked and moe_fix.last_summary() is None
        assert not (bits(layer.w13_input_scale) == SENT).any()
        assert any("W4A16" in m and PREFIX in m for m in fix_log.messages())
        assert not fix_log.messages(logging.WARNING)
    installs = [m for m in fix_log.messages() if "will be set to 0.75" in m]
    assert len(installs) == 1


def test_provided_scales_are_kept_with_register(cpu_vllm_config, spy, fix_log):
    """The checkpoint provides every scale: nothing changes, bit for bit, and the log says so."""
    moe_fix.register("1.0")
    layer = make_layer(raw=LEGACY_WEIGHT_ONLY)
    provided = {(e, p): 0.01 * (e + 1) for e in range(E) for p in PROJ}
    load(layer, random_checkpoint(0, provided))
    seen = process(layer, spy)
    w13, w2 = expected_scales(provided, fill=float("nan"))
    assert torch.equal(bits(seen["a13_scale"]), bits(w13))
    assert torch.equal(bits(seen["a2_scale"]), bits(w2))
    assert moe_fix.last_summary().num_filled == 0
    assert any("nothing was filled" in m for m in fix_log.messages())


def test_register_installs_hooks_once_when_vllm_does_not_handle(monkeypatch, fix_log):
    monkeypatch.setattr(
        moe_fix, "vllm_handles_weight_only_nvfp4", lambda: (False, "test: not handled")
    )
    cls = modelopt.ModelOptNvFp4FusedMoE
    originals = {n: cls.__dict__[n] for n in ("create_weights", "process_weights_after_loading")}
    moe_fix.register("1.0")
    wrapped = {n: cls.__dict__[n] for n in originals}
    moe_fix.register("1.0")
    moe_fix.register("0.5")  # a second call only updates the value
    assert moe_fix.hooks_installed()
    for name, fn in wrapped.items():
        assert cls.__dict__[name] is fn  # not wrapped twice
        assert fn.__wrapped__ is originals[name]
    assert moe_fix._STATE.value == 0.5
    assert len([m for m in fix_log.messages() if "will be set to" in m]) == 1
    moe_fix.unregister()
    for name, fn in originals.items():
        assert cls.__dict__[name] is fn


def test_probe_is_cached_per_process(monkeypatch):
    calls = []

    def probe():
        calls.append(1)
        return True, "test"

    monkeypatch.setattr(moe_fix, "vllm_handles_weight_only_nvfp4", probe)
    for _ in range(3):
        moe_fix.register("1.0")
    assert len(calls) == 1


def test_unknown_moe_method_is_reported_and_ignored(monkeypatch, fix_log):
    monkeypatch.setattr(
        moe_fix, "vllm_handles_weight_only_nvfp4", lambda: (None, "test: other class")
    )
    moe_fix.register("1.0")
    moe_fix.register("1.0")
    assert not moe_fix.hooks_installed()
    warnings = fix_log.messages(logging.WARNING)
    assert len(warnings) == 1 and "ignored" in warnings[0]


# ---------------------------------------------------------------------------------------------
# Start-up errors and inertness
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["abc", "0", "0.0", "-1", "nan", "inf", "-inf", "1e39", "1e-40", "1,0"]
)
def test_bad_value_is_a_clear_startup_error(monkeypatch, bad):
    monkeypatch.setenv(plugins.MOE_INPUT_SCALE_ENV, bad)
    with pytest.raises(ValueError, match="VLLM_GLM53_MOE_INPUT_SCALE") as info:
        plugins.register_moe_input_scale_fix()
    assert repr(bad) in str(info.value)
    assert not moe_fix.hooks_installed()
    assert moe_fix._STATE.decision is None  # failed before touching vLLM


@pytest.mark.parametrize("good,expected", [("1.0", 1.0), (" 2.5e-3 ", 2.5e-3), ("448", 448.0)])
def test_good_values_parse(good, expected):
    assert moe_fix.parse_value(good) == expected


def test_plugin_is_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv(plugins.MOE_INPUT_SCALE_ENV, raising=False)
    called = []
    monkeypatch.setattr(moe_fix, "register", lambda v: called.append(v))
    plugins.register_moe_input_scale_fix()
    monkeypatch.setenv(plugins.MOE_INPUT_SCALE_ENV, "")
    plugins.register_moe_input_scale_fix()
    assert called == []
    monkeypatch.setenv(plugins.MOE_INPUT_SCALE_ENV, "0.25")
    plugins.register_moe_input_scale_fix()
    assert called == ["0.25"]


# ---------------------------------------------------------------------------------------------
# The fill path (hooks installed; W4A4-routed layers, the ones that read the scales)
# ---------------------------------------------------------------------------------------------


def test_sentinel_is_written_at_creation(cpu_vllm_config, spy):
    moe_fix.install_hooks("1.0")
    layer = make_layer()
    assert layer.w13_input_scale.shape == (E, 2) and layer.w2_input_scale.shape == (E,)
    assert (bits(layer.w13_input_scale) == SENT).all()
    assert (bits(layer.w2_input_scale) == SENT).all()
    assert torch.isnan(layer.w13_input_scale).all()  # a NaN: never a plausible scale
    # The other parameters are untouched by the fix.
    assert not (bits(layer.w13_weight_scale_2) == SENT).all()


def test_fill_when_checkpoint_has_no_input_scales(cpu_vllm_config, spy, fix_log):
    moe_fix.install_hooks("0.75")
    layer = make_layer()
    load(layer, random_checkpoint(1, input_scales=None))
    assert (bits(layer.w13_input_scale) == SENT).all()  # the loader never wrote them
    seen = process(layer, spy)
    assert torch.equal(seen["a13_scale"], torch.full((E, 2), 0.75))
    assert torch.equal(seen["a2_scale"], torch.full((E,), 0.75))
    summary = moe_fix.last_summary()
    assert summary.num_filled == 3 * E and summary.num_total == 3 * E
    assert summary.filled_layers == [PREFIX]
    assert summary.layers[0].filled == {"w13_input_scale": 2 * E, "w2_input_scale": E}
    warnings = fix_log.messages(logging.WARNING)
    assert len(warnings) == 1
    assert PREFIX in warnings[0] and "24 of 24" in warnings[0] and "0.75" in warnings[0]


def test_provided_scales_are_kept_bit_for_bit(cpu_vllm_config, spy, fix_log):
    """Every scale comes from the checkpoint, including values a guess-from-values heuristic
    would 'repair' (0.0, a denormal, a plain NaN): all reach vLLM unchanged."""
    moe_fix.install_hooks("1.0")
    odd = [0.0, 1e-40, float("nan"), 3.0517578125e-05, 0.0123456789, 1.0, 448.0, 2.5e-3]
    provided = {}
    for e in range(E):
        for i, proj in enumerate(PROJ):
            provided[(e, proj)] = odd[(e + 3 * i) % len(odd)]
    layer = make_layer()
    load(layer, random_checkpoint(2, provided))
    seen = process(layer, spy)
    w13, w2 = expected_scales(provided, fill=-1.0)
    assert torch.equal(bits(seen["a13_scale"]), bits(w13))
    assert torch.equal(bits(seen["a2_scale"]), bits(w2))
    assert moe_fix.last_summary().num_filled == 0
    assert not fix_log.messages(logging.WARNING)
    assert any("nothing was filled" in m for m in fix_log.messages())


def test_some_experts_missing(cpu_vllm_config, spy, fix_log):
    """Per expert and per shard: gate/up/down scales present for different expert subsets."""
    moe_fix.install_hooks("1.0")
    g = torch.Generator().manual_seed(3)
    have = {
        "gate_proj": {0, 1, 2, 3},
        "up_proj": {0, 2, 4, 6},
        "down_proj": {1, 3, 5, 7},
    }
    provided = {
        (e, p): float(torch.rand((), generator=g)) * 1e-2 + 1e-4
        for p, experts in have.items()
        for e in experts
    }
    layer = make_layer()
    load(layer, random_checkpoint(3, provided))
    seen = process(layer, spy)
    w13, w2 = expected_scales(provided, fill=1.0)
    assert torch.equal(bits(seen["a13_scale"]), bits(w13))
    assert torch.equal(bits(seen["a2_scale"]), bits(w2))
    # the filled ones are exactly 1.0, the kept ones the checkpoint's float32 values
    assert bits(seen["a13_scale"])[5, 0] == f32_bits(1.0)
    assert bits(seen["a13_scale"])[2, 1] == f32_bits(provided[(2, "up_proj")])
    report = moe_fix.last_summary().layers[0]
    assert report.filled == {"w13_input_scale": 8, "w2_input_scale": 4}
    assert report.positions["w2_input_scale"] == "e0, e2, e4, e6"
    assert report.positions["w13_input_scale"].startswith("e1.w3, e3.w3, e4.w1, e5.w1")
    (warning,) = fix_log.messages(logging.WARNING)
    assert "12 of 24" in warning and "w13_input_scale 8/16" in warning


def test_one_summary_per_model_listing_the_filled_layers(cpu_vllm_config, spy, fix_log):
    moe_fix.install_hooks("1.0")
    names = [f"model.layers.{i}.mlp.experts" for i in (1, 2, 3)]
    layers = [make_layer(prefix=n) for n in names]
    everything = {(e, p): 0.02 for e in range(E) for p in PROJ}
    load(layers[0], random_checkpoint(4, everything))  # complete
    load(layers[1], random_checkpoint(5, None))  # none
    load(layers[2], random_checkpoint(6, {(0, "down_proj"): 0.02}))  # one
    for i, layer in enumerate(layers):
        process(layer, spy)
        if i < 2:
            assert moe_fix.last_summary() is None  # model not finished yet
            assert not fix_log.messages(logging.WARNING)
    summary = moe_fix.last_summary()
    assert [r.layer_name for r in summary.layers] == names
    assert summary.filled_layers == names[1:]
    assert summary.num_filled == 24 + 23 and summary.num_total == 72
    (warning,) = fix_log.messages(logging.WARNING)
    assert names[1] in warning and names[2] in warning and names[0] not in warning
    assert "47 of 72" in warning and "2 of 3 MoE layers" in warning


def test_weight_only_layer_is_left_alone_when_vllm_routes_it_itself(cpu_vllm_config, spy):
    """Even with the hooks forced on, a layer whose method does not read activation scales
    (vLLM 0.33: use_a16) is not marked and not counted."""
    moe_fix.install_hooks("1.0")
    layer = make_layer(weight_only=True)
    # vLLM's own attribute, not the function under test, says what to expect.
    method = layer.quant_method
    reads = not (getattr(method, "use_a16", False) or getattr(method, "per_token_activation", False))
    assert moe_fix._reads_checkpoint_input_scales(method) is reads
    assert (bits(layer.w13_input_scale) == SENT).all().item() is reads
    assert (layer in moe_fix._STATE.marked) is reads


def test_unfilled_scale_without_a_value_is_an_error_naming_the_layer(cpu_vllm_config, spy):
    moe_fix.install_hooks("1.0")
    layer = make_layer()
    load(layer, random_checkpoint(7, {(e, "gate_proj"): 0.5 for e in range(E)}))
    with pytest.raises(RuntimeError) as info:
        moe_fix.fill_missing_input_scales(layer, None)
    msg = str(info.value)
    assert PREFIX in msg and "w13_input_scale: 8 of 16" in msg and "e0.w3" in msg
    assert "w2_input_scale: 8 of 8" in msg and moe_fix.ENV_VAR in msg
    # nothing was written: the sentinels are still there, the provided scales too
    assert (bits(layer.w13_input_scale)[:, 1] == SENT).all()
    assert torch.equal(layer.w13_input_scale[:, 0], torch.full((E,), 0.5))
    with pytest.raises(ValueError, match=moe_fix.ENV_VAR):
        moe_fix.fill_missing_input_scales(layer, 0.0)


def test_unfilled_scale_error_in_the_hook(cpu_vllm_config, spy):
    """If the value is gone by the time vLLM post-processes the layer, loading fails there
    (naming the layer) instead of handing vLLM a NaN/garbage scale."""
    moe_fix.install_hooks("1.0")
    layer = make_layer()
    load(layer, random_checkpoint(8, None))
    moe_fix._STATE.value = None
    with pytest.raises(RuntimeError, match=PREFIX):
        layer.quant_method.process_weights_after_loading(layer)
    assert spy.calls == []  # vLLM's conversion never saw the unfilled scales


# ---------------------------------------------------------------------------------------------
# Numerics: NVFP4 experts in plain torch with alpha = weight_scale_2 * input_scale
# ---------------------------------------------------------------------------------------------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_MAX, FP4_MAX = 448.0, 6.0


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value (saturating at 6); 4-bit codes, bit 3 = sign."""
    idx = (v.abs().clamp(max=FP4_MAX).unsqueeze(-1) - E2M1).abs().argmin(-1)
    return idx | (((v < 0) & (idx > 0)).to(torch.int64) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    return E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)


def quantize_weight(w: torch.Tensor, weight_scale_2: float):
    """ModelOpt NVFP4: [N, K] -> packed uint8 [N, K/2] (low nibble first), e4m3 block scales
    [N, K/16] relative to the per-tensor ``weight_scale_2``."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // 16, 16)
    scale = (blocks.abs().amax(-1) / FP4_MAX / weight_scale_2).clamp(max=FP8_MAX)
    scale = scale.to(torch.float8_e4m3fn)
    denom = scale.float().unsqueeze(-1) * weight_scale_2
    codes = e2m1_encode(torch.where(denom > 0, blocks / denom, 0.0)).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale


def unpack_weight(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes * block scale, WITHOUT weight_scale_2 (the kernel folds that into alpha)."""
    p = packed.to(torch.int64)
    codes = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1)
    vals = e2m1_decode(codes).reshape(p.shape[0], -1, 16) * scale.float().unsqueeze(-1)
    return vals.reshape(p.shape[0], -1)


def quantize_activation(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """Dynamic NVFP4 activation quantisation as the W4A4 kernels do it: global scale
    ``1 / input_scale``, per-16 e4m3 block scale (saturating), E2M1 codes (saturating). Returns
    codes * block scale, i.e. values in the scaled domain (about x / input_scale). An all-zero
    block gets zero codes and scale (the kernels' ``vecMax != 0`` branch)."""
    gs = 1.0 / input_scale.float()  # 0.0 -> inf, as in the kernels
    t, k = x.shape
    blocks = x.float().reshape(t, k // 16, 16)
    amax = blocks.abs().amax(-1)
    sf = torch.where(amax > 0, (gs * amax / FP4_MAX).clamp(max=FP8_MAX), 0.0)
    sf = sf.to(torch.float8_e4m3fn).float()
    out_scale = torch.where(sf > 0, gs / sf, 0.0).unsqueeze(-1)
    v = torch.where(blocks == 0, 0.0, blocks * out_scale)
    return (e2m1_decode(e2m1_encode(v)) * sf.unsqueeze(-1)).reshape(t, k)


def emulate_moe(layer_tensors, x, topk_w, topk_ids):
    """W4A4 NVFP4 MoE in plain torch, from the tensors vLLM hands its kernels:
    ``gemm(A_q, W_q) * alpha`` with ``alpha = weight_scale_2 * input_scale``; the gate/up GEMM
    uses one activation scale per expert (max over the two shards, as vLLM folds it)."""
    w13_s2 = layer_tensors["w13_scale_2"]  # [E] (vLLM keeps shard 0)
    a13 = layer_tensors["a13_scale"]  # [E, 2]
    out = torch.zeros(x.shape[0], HIDDEN)
    for e in range(E):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        s13 = a13[e].max()
        w13 = unpack_weight(layer_tensors["w13"][e], layer_tensors["w13_scale"][e])
        a = quantize_activation(x[tok], s13)
        gate_up = (a @ w13.T) * (w13_s2[e] * s13)
        gate, up = gate_up[:, :INTER], gate_up[:, INTER:]
        h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
        s2 = layer_tensors["a2_scale"][e]
        w2 = unpack_weight(layer_tensors["w2"][e], layer_tensors["w2_scale"][e])
        y = (quantize_activation(h, s2) @ w2.T) * (layer_tensors["w2_scale_2"][e] * s2)
        out.index_add_(0, tok, topk_w[tok, slot].unsqueeze(-1) * y)
    return out.to(torch.bfloat16)


def bf16_reference(w1, w3, w2, x, topk_w, topk_ids):
    out = torch.zeros(x.shape[0], HIDDEN)
    for e in range(E):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        h = torch.nn.functional.silu(xe @ w1[e].T) * (xe @ w3[e].T)
        out.index_add_(0, tok, topk_w[tok, slot].unsqueeze(-1) * (h @ w2[e].T).float())
    return out.to(torch.bfloat16)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_numerics_zero_output_when_unfilled_and_nvfp4_accuracy_when_filled(cpu_vllm_config, spy):
    """E=8 experts, top-2, hidden 256, intermediate 128, 64 tokens.

    - Unfilled scale 0.0 (what torch.empty returned on a GB10): alpha = weight_scale_2 * 0 = 0,
      every expert outputs exactly zero, silently.
    - Filled by the hook with 1.0: the output agrees with the bf16 model within NVFP4 rounding.
      Bar: relative Frobenius error <= 3 * delta, where delta is the largest relative round-trip
      error NVFP4 gives these very operands (weights and activations, ~0.096 here). The output
      passes through six NVFP4-rounded operands (x and w1, x and w3 into gate*up, h and w2), so
      independent errors add to about sqrt(6) * delta = 2.45 * delta; 3 * delta is that plus
      margin. Min per-token cosine >= 0.9.
    - The weights in the layer are the checkpoint's: vLLM's own dequantize_nvfp4_moe_weights and
      this file's decoder agree; and the kernel-style GEMM (codes in the scaled domain, times
      alpha = weight_scale_2 * input_scale) equals fp32 on dequantised operands (rel <= 1e-5).
    - A badly wrong value (1e-4: activations saturate the e4m3 block scales) fails the bar:
      the bar is not vacuous, and a wrong scale is dangerous.
    """
    torch.manual_seed(0)
    w1 = (torch.randn(E, INTER, HIDDEN) / math.sqrt(HIDDEN)).to(torch.bfloat16)
    w3 = (torch.randn(E, INTER, HIDDEN) / math.sqrt(HIDDEN)).to(torch.bfloat16)
    w2 = (torch.randn(E, HIDDEN, INTER) / math.sqrt(INTER)).to(torch.bfloat16)
    x = torch.randn(64, HIDDEN).to(torch.bfloat16)
    probs = torch.softmax(torch.randn(64, E), dim=-1)
    topk_w, topk_ids = probs.topk(TOPK, dim=-1)
    topk_w = topk_w / topk_w.sum(-1, keepdim=True)

    # A weight-only NVFP4 checkpoint: weights, block scales, weight_scale_2; no input_scale.
    ckpt, ws2 = [], {}
    for e in range(E):
        s13 = max(w1[e].float().abs().max(), w3[e].float().abs().max()).item() / (6 * 448)
        s2 = w2[e].float().abs().max().item() / (6 * 448)
        ws2[e] = (s13, s2)
        for proj, w, s in (
            ("gate_proj", w1[e], s13),
            ("up_proj", w3[e], s13),
            ("down_proj", w2[e], s2),
        ):
            packed, scale = quantize_weight(w, s)
            ckpt += [
                (f"{e}.{proj}.weight", packed),
                (f"{e}.{proj}.weight_scale", scale),
                (f"{e}.{proj}.weight_scale_2", torch.tensor(s)),
            ]

    ref = bf16_reference(w1, w3, w2, x, topk_w, topk_ids)
    assert ref.float().norm() > 0

    # Without the fix: the never-loaded scales hold what the allocator returned; on a GB10, 0.0.
    plain = make_layer()
    plain.w13_input_scale.data.zero_()
    plain.w2_input_scale.data.zero_()
    load(plain, ckpt)
    unfilled = process(plain, spy)
    out0 = emulate_moe(unfilled, x, topk_w, topk_ids)
    assert torch.count_nonzero(out0) == 0  # every expert silent, no error, no NaN

    # With the fix (the hooks are what register installs on a vLLM that needs them).
    moe_fix.install_hooks("1.0")
    fixed = make_layer()
    load(fixed, ckpt)
    filled = process(fixed, spy)
    assert torch.equal(filled["a13_scale"], torch.ones(E, 2))
    assert torch.equal(filled["a2_scale"], torch.ones(E))
    assert moe_fix.last_summary().num_filled == 3 * E

    # The layer holds our quantised weights: vLLM's own dequantiser agrees with ours.
    # (process_weights_after_loading kept shard 0 of w13_weight_scale_2; gate and up share it.)
    deq13, deq2 = dequantize_nvfp4_moe_weights(
        filled["w13"],
        filled["w13_scale"],
        filled["w13_scale_2"][:, None].expand(E, 2).contiguous(),
        filled["w2"],
        filled["w2_scale"],
        filled["w2_scale_2"],
        torch.float32,
        group_size=16,
        invert_global_scales=False,
    )
    for e in range(E):
        assert filled["w13_scale_2"][e] == torch.tensor(ws2[e][0], dtype=torch.float32)
        mine13 = unpack_weight(filled["w13"][e], filled["w13_scale"][e]) * ws2[e][0]
        torch.testing.assert_close(deq13[e], mine13, rtol=1e-6, atol=0)
        mine2 = unpack_weight(filled["w2"][e], filled["w2_scale"][e]) * ws2[e][1]
        torch.testing.assert_close(deq2[e], mine2, rtol=1e-6, atol=0)

    out1 = emulate_moe(filled, x, topk_w, topk_ids)
    assert torch.isfinite(out1).all()

    # (1) alpha = weight_scale_2 * input_scale restores the scale exactly: the kernel-style GEMM
    # in the scaled domain equals fp32 on dequantised operands (any input scale, here 0.37).
    s = torch.tensor(0.37)
    a_q = quantize_activation(x, s)
    for e in range(E):
        w13_q = unpack_weight(filled["w13"][e], filled["w13_scale"][e])
        kernel = (a_q @ w13_q.T) * (filled["w13_scale_2"][e] * s)
        dequantised = (a_q * s) @ deq13[e].T
        assert rel_err(kernel, dequantised) <= 1e-5

    # (2) NVFP4 accuracy against the bf16 model.
    deltas = [rel_err(deq13[e, :INTER], w1[e]) for e in range(E)]
    deltas += [rel_err(deq13[e, INTER:], w3[e]) for e in range(E)]
    deltas += [rel_err(deq2[e], w2[e]) for e in range(E)]
    calibrated = x.float().abs().max() / (6 * 448)
    deltas.append(rel_err(quantize_activation(x, calibrated) * calibrated, x))
    delta = max(deltas)
    assert 0.05 < delta < 0.15  # NVFP4 rounding of Gaussian data, not something broken
    bar = 3 * delta
    err = rel_err(out1, ref)
    cos = torch.nn.functional.cosine_similarity(out1.float(), ref.float(), dim=-1).min().item()
    assert err <= bar, (err, bar)
    assert cos >= 0.9, cos

    # (3) A wrong value is dangerous: 1e-4 saturates the activation block scales.
    wrong = dict(filled, a13_scale=torch.full((E, 2), 1e-4), a2_scale=torch.full((E,), 1e-4))
    assert rel_err(emulate_moe(wrong, x, topk_w, topk_ids), ref) > bar
