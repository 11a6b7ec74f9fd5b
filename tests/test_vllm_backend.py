"""The vLLM integration against the real vLLM (pinned 0.33.0), on CPU.

- the ``vllm.general_plugins`` entry point is found by vLLM's own loader and is inert without
  ``VLLM_GLM53_CUDA_SPARSE_MLA`` (in a subprocess, so this process's registry stays clean);
- vLLM's selector (the CUDA platform, with the compute capability mocked) picks the backend for
  sparse MLA without ``--attention-backend``, accepts it by name, and rejects dense MLA and
  non-MLA with vLLM's own reasons;
- the KV-cache spec/shape per cache dtype, from vLLM's own spec code;
- the metadata builder + index conversion against a plain-Python reference;
- the impl's forward on CPU against the fp32 reference, for every cache dtype (needs the
  compiled op library; CI builds it before pytest).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm.config import (  # noqa: E402
    AttentionConfig,
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

from vllm_sparse_mla_blackwell import formats, ops, reference  # noqa: E402

PINNED_VLLM = "0.33.0"
REPO = Path(__file__).resolve().parents[1]
# Where this process imports the package from (the checkout's python/ or an installed copy):
# subprocesses import the same one.
PACKAGE_ROOT = str(Path(ops.__file__).resolve().parents[1])
BACKEND_NAME = "SPARSE_MLA_BLACKWELL"
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_ds_mla")
CAPABILITIES = ((8, 0), (8, 6), (8, 9), (9, 0), (12, 0), (12, 1))
TOPK_WIDTH = 2176  # GLM-5.x: round_up(index_topk + index_kpool - 1, 128)


def test_vllm_is_the_pinned_release():
    assert vllm.__version__ == PINNED_VLLM


# --------------------------------------------------------------------------------------------
# Plugin loading (subprocess: vLLM's registry is process-global)
# --------------------------------------------------------------------------------------------

_PLUGIN_PROBE = textwrap.dedent(
    """
    import json, logging, os, sys
    import vllm.plugins
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_general_plugins, load_plugins_by_group
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm_sparse_mla_blackwell import plugins

    result = {}
    found = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    result["found"] = sorted(found)
    result["is_ours"] = found.get("sparse_mla_blackwell") is plugins.register_sparse_mla_backend

    os.environ.pop("VLLM_GLM53_CUDA_SPARSE_MLA", None)
    load_general_plugins()
    result["registered_without_env"] = "SPARSE_MLA_BLACKWELL" in AttentionBackendEnum.__members__
    result["backend_imported_without_env"] = "vllm_sparse_mla_blackwell.backend" in sys.modules
    # Switched off by value ("0", an empty scale): still inert, and vLLM's strict check of
    # VLLM_* names (--fail-on-environ-validation) knows both.
    from vllm.platforms.interface import Platform
    os.environ.update(VLLM_GLM53_CUDA_SPARSE_MLA="0", VLLM_GLM53_MOE_INPUT_SCALE="")
    vllm.plugins.plugins_loaded = False
    load_general_plugins()
    result["registered_when_off"] = "SPARSE_MLA_BLACKWELL" in AttentionBackendEnum.__members__
    try:
        Platform.validate_environ(hard_fail=True)
        result["environ_error_when_off"] = None
    except ValueError as exc:
        result["environ_error_when_off"] = str(exc)
    del os.environ["VLLM_GLM53_MOE_INPUT_SCALE"]

    configure_logging(LoggingConfig())  # as every vLLM process does before loading plugins
    lines = []
    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logging.getLogger("vllm.vllm_sparse_mla_blackwell.backend").addHandler(Collect())

    os.environ["VLLM_GLM53_CUDA_SPARSE_MLA"] = "1"
    for _ in range(3):  # vLLM loads general plugins in every process, possibly repeatedly
        vllm.plugins.plugins_loaded = False
        load_general_plugins()
    member = AttentionBackendEnum.__members__.get("SPARSE_MLA_BLACKWELL")
    result["registered_with_env"] = member is not None
    result["resolves_to"] = member.get_class().__qualname__ if member else None
    result["log_lines"] = lines
    try:
        Platform.validate_environ(hard_fail=True)
        result["environ_error"] = None
    except ValueError as exc:
        result["environ_error"] = str(exc)
    print("RESULT " + json.dumps(result))
    """
)


def _installed_entry_points() -> bool:
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    return any(ep.name == "sparse_mla_blackwell" for ep in eps)


def _write_dist_info(root: Path) -> None:
    """What ``pip install`` writes for the entry points of pyproject.toml, for an uninstalled
    checkout (CI installs the package, so there the real metadata is used)."""
    import tomllib  # Python >= 3.11; only needed for an uninstalled checkout

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dist = root / "vllm_sparse_mla_blackwell-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {target}" for name, target in entries.items())
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_entry_point_loaded_by_vllm_and_inert_without_variable(tmp_path):
    path = [PACKAGE_ROOT]
    if not _installed_entry_points():
        _write_dist_info(tmp_path)
        path.append(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GLM53_")}
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _PLUGIN_PROBE],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])

    assert "sparse_mla_blackwell" in result["found"]
    assert result["is_ours"]
    assert not result["registered_without_env"]
    assert not result["backend_imported_without_env"]
    assert result["registered_with_env"]
    assert result["resolves_to"] == "SparseMLABlackwellBackend"
    ours = [line for line in result["log_lines"] if "vllm_sparse_mla_blackwell" in line]
    assert len(ours) == 1, result["log_lines"]
    assert BACKEND_NAME in ours[0]
    assert result["environ_error"] is None
    assert not result["registered_when_off"]
    assert result["environ_error_when_off"] is None


_OLD_VLLM_PROBE = textwrap.dedent(
    """
    import json, logging, os, sys, types
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    # What vLLM 0.26 lacks (seen with a real 0.26.0 install): the shared sparse-MLA base classes.
    sys.modules["vllm.model_executor.layers.attention.sparse_mla_attention"] = types.ModuleType("gone")
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm_sparse_mla_blackwell import plugins

    configure_logging(LoggingConfig())
    records = []
    class Collect(logging.Handler):
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))
    logging.getLogger("vllm").addHandler(Collect())
    os.environ["VLLM_GLM53_CUDA_SPARSE_MLA"] = "1"
    for _ in range(3):  # every vLLM process, possibly repeatedly
        plugins.register_sparse_mla_backend()
    print("RESULT " + json.dumps({
        "records": [r for r in records if "vllm_sparse_mla_blackwell" in r[1]],
        "registered": "SPARSE_MLA_BLACKWELL" in AttentionBackendEnum.__members__,
    }))
    """
)


def test_plugin_on_a_vllm_that_cannot_host_the_backend_logs_one_error_and_stands_aside(tmp_path):
    """vLLM must still start: one error line, nothing registered. (With a real vLLM 0.26.0 the
    line names the version needed: docs/vllm_backend.md.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GLM53_")}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _OLD_VLLM_PROBE], env=env, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert not result["registered"]
    assert len(result["records"]) == 1, result
    level, message = result["records"][0]
    assert level == "ERROR"
    assert "VLLM_GLM53_CUDA_SPARSE_MLA=1 is ignored" in message and "ImportError" in message
    # On the pinned release itself this is a load failure, not a version problem.
    assert f"failed to load on vLLM {vllm.__version__}" in message and "needs vLLM" not in message


@pytest.mark.parametrize("version, than, older", [("0.26.0", "0.33.0", True), ("0.33.0", "0.33.0", False),
                                                  ("0.33.1.dev4+gabc", "0.33.0", False), ("0.4.2", "0.33.0", True),
                                                  ("1.0.0", "0.33.0", False)])
def test_plugin_version_comparison(version, than, older):
    from vllm_sparse_mla_blackwell import plugins

    assert plugins._older(version, than) is older


# --------------------------------------------------------------------------------------------
# vLLM's selector on a (mocked) CUDA platform
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_platform_module():
    """``vllm.platforms.cuda`` importable on a CPU-only machine, and the backend registered.

    The module imports ``vllm._C_stable_libtorch`` for its kernels, which links libcuda; the
    selector needs none of those kernels, so without a driver an empty stand-in is used while the
    module imports. The priority hook is undone afterwards (the enum member stays: vLLM offers
    no way to remove one).
    """
    stand_in = None
    try:
        import vllm.platforms.cuda as cuda_module
    except (ImportError, OSError):
        stand_in = types.ModuleType("vllm._C_stable_libtorch")
        sys.modules["vllm._C_stable_libtorch"] = stand_in
        import vllm.platforms.cuda as cuda_module
    from vllm_sparse_mla_blackwell import backend

    original = cuda_module._get_backend_priorities
    backend.register()
    backend.register()  # idempotent
    assert getattr(cuda_module._get_backend_priorities, "_sparse_mla_blackwell", False)
    assert cuda_module._get_backend_priorities.__wrapped__ is original
    yield cuda_module
    cuda_module._get_backend_priorities = original
    backend._REGISTERED = False
    if stand_in is not None and sys.modules.get("vllm._C_stable_libtorch") is stand_in:
        del sys.modules["vllm._C_stable_libtorch"]


@pytest.fixture
def on_cuda(cuda_platform_module, monkeypatch):
    """Returns ``select(capability, ..., **config)``: vLLM's ``get_attn_backend`` on a CUDA
    platform with the given compute capability (the op library counts as built: its absence is
    tested separately)."""
    import vllm.platforms
    from vllm.v1.attention import selector

    platform_cls = cuda_platform_module.CudaPlatform
    platform = platform_cls()
    monkeypatch.setattr(vllm.platforms, "_current_platform", platform)
    monkeypatch.setattr(ops, "extension_available", lambda: True)
    monkeypatch.setattr(ops, "compiled_targets", lambda: ["80", "90", "120a", "121a"])

    def select(capability, head_size, dtype, kv_cache_dtype, *, use_mla=True, use_sparse=True,
               backend=None, block_size=None):
        cap = vllm.platforms.interface.DeviceCapability(*capability)
        monkeypatch.setattr(platform_cls, "get_device_capability",
                            classmethod(lambda cls, device_id=0: cap))
        selector._cached_get_attn_backend.cache_clear()
        cache = CacheConfig(block_size=block_size) if block_size else CacheConfig()
        config = VllmConfig(
            device_config=DeviceConfig(device="cpu"),
            cache_config=cache,
            attention_config=AttentionConfig(backend=backend),
        )
        with set_current_vllm_config(config):
            return selector.get_attn_backend(
                head_size, dtype, kv_cache_dtype, use_mla=use_mla, use_sparse=use_sparse,
                num_heads=64,
            )

    yield select
    selector._cached_get_attn_backend.cache_clear()


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("head_size", formats.HEAD_SIZES)
def test_selector_picks_backend_for_sparse_mla(on_cuda, capability, head_size):
    for dtype in (torch.bfloat16, torch.float16):
        for kv_cache_dtype in KV_CACHE_DTYPES:
            chosen = on_cuda(capability, head_size, dtype, kv_cache_dtype)
            assert chosen.get_name() == BACKEND_NAME, (dtype, kv_cache_dtype)


@pytest.mark.parametrize("block_size", (16, 32, 64, 256))
def test_selector_accepts_vllm_block_sizes(on_cuda, block_size):
    chosen = on_cuda((12, 0), 576, torch.bfloat16, "fp8", block_size=block_size)
    assert chosen.get_name() == BACKEND_NAME


def test_selector_by_name(on_cuda):
    # `--attention-backend SPARSE_MLA_BLACKWELL` parses to the registered member.
    assert AttentionConfig(backend=BACKEND_NAME).backend is AttentionBackendEnum[BACKEND_NAME]
    chosen = on_cuda((8, 6), 512, torch.bfloat16, "fp8_ds_mla", backend=BACKEND_NAME)
    assert chosen.get_name() == BACKEND_NAME


def test_selector_rejects_dense_mla_and_non_mla_by_name(on_cuda):
    invalid = r"is not valid for this configuration. Reason: \[.*"
    with pytest.raises(ValueError, match=invalid + "non-sparse not supported"):
        on_cuda((12, 0), 576, torch.bfloat16, "auto", use_sparse=False, backend=BACKEND_NAME)
    with pytest.raises(ValueError, match=invalid + "non-MLA not supported"):
        on_cuda((12, 0), 128, torch.bfloat16, "auto", use_mla=False, use_sparse=False,
                backend=BACKEND_NAME)
    with pytest.raises(ValueError, match=r"compute capability not supported"):
        on_cuda((7, 5), 576, torch.float16, "auto", backend=BACKEND_NAME)


def test_dense_mla_falls_through_to_vllm_backends(on_cuda, cuda_platform_module):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(576, torch.bfloat16, "auto", None, use_mla=True)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        valid, invalid = cuda_platform_module.CudaPlatform.get_valid_backends(
            vllm.platforms.interface.DeviceCapability(12, 0), config
        )
    ours = AttentionBackendEnum[BACKEND_NAME]
    assert invalid[ours] == (0, ["non-sparse not supported"])  # tried first, refused
    assert all(c.backend is not ours for c in valid)
    dense = on_cuda((12, 0), 576, torch.bfloat16, "auto", use_sparse=False)
    assert dense.get_name() != BACKEND_NAME


def test_missing_extension_is_a_selection_reason(cuda_platform_module, monkeypatch):
    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellBackend

    monkeypatch.setattr(ops, "extension_available", lambda: False)
    reasons = SparseMLABlackwellBackend.validate_configuration(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True,
        has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=vllm.platforms.interface.DeviceCapability(12, 0), attn_type="decoder",
    )
    assert len(reasons) == 1 and "op library did not load" in reasons[0]


# --------------------------------------------------------------------------------------------
# A tiny sparse-MLA model config, the distributed/workspace state the impl expects
# --------------------------------------------------------------------------------------------


def _model_dir(root: Path, rope: int) -> Path:
    path = root / f"dsv32_rope{rope}"
    path.mkdir(exist_ok=True)
    config = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": formats.KV_LORA_RANK,
        "q_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": rope,
        "v_head_dim": 64,
        "index_topk": 2048,
        "index_n_heads": 4,
        "index_head_dim": 128,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def model_configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    cache: dict[tuple[int, torch.dtype], ModelConfig] = {}

    def get(head_size: int, dtype: torch.dtype) -> ModelConfig:
        key = (head_size, dtype)
        if key not in cache:
            cache[key] = ModelConfig(
                model=str(_model_dir(root, head_size - formats.KV_LORA_RANK)),
                skip_tokenizer_init=True, max_model_len=1024, dtype=dtype,
            )
        return cache[key]

    return get


@pytest.fixture
def cpu_runtime(cpu_vllm_config, monkeypatch):
    """A fresh vLLM workspace manager on the CPU; no pinned host memory without a driver."""
    import vllm.model_executor.layers.attention.sparse_mla_attention as sparse_mla_attention
    from vllm.v1.worker import workspace

    monkeypatch.setattr(sparse_mla_attention, "PIN_MEMORY", False)
    workspace.reset_workspace_manager()
    workspace.init_workspace_manager(torch.device("cpu"))
    yield workspace
    workspace.reset_workspace_manager()


def _vllm_config(model_config, kv_cache_dtype, block_size, max_tokens=64):
    return VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max_tokens, max_num_seqs=16, max_model_len=1024,
            is_encoder_decoder=False,
        ),
    )


def _kv_cache_spec(vllm_config, head_size, kv_cache_dtype):
    """The layer's spec as vLLM's ``MLAAttention.get_kv_cache_spec`` builds it, customised by
    the backend as vLLM's runner does."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellBackend

    layer = types.SimpleNamespace(
        kv_cache_dtype=kv_cache_dtype, head_size=head_size, sliding_window=None,
        topk_buffer_width=TOPK_WIDTH, indexer=object(), non_causal_multi_token_decode=False,
    )
    spec = MLAAttention.get_kv_cache_spec(layer, vllm_config)
    return SparseMLABlackwellBackend.customize_spec(spec)


# --------------------------------------------------------------------------------------------
# KV-cache layout per cache dtype
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_size", formats.HEAD_SIZES)
@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
def test_kv_cache_layout(model_configs, head_size, kv_cache_dtype):
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes

    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellBackend

    dtype = torch.float16 if kv_cache_dtype == "float16" else torch.bfloat16
    config = _vllm_config(model_configs(head_size, dtype), kv_cache_dtype, 64)
    spec = _kv_cache_spec(config, head_size, kv_cache_dtype)
    blocks, heads, tokens, row_bytes = compute_layer_kv_cache_shape_bytes(spec, 10)
    fmt = {"auto": "bfloat16", "fp8": "fp8_e4m3"}.get(kv_cache_dtype, kv_cache_dtype)
    expected = formats.kv_row_bytes(fmt, head_size)
    assert (blocks, heads, tokens, row_bytes) == (10, 1, 64, expected)
    assert spec.block_stride_alignment == expected  # blocks are whole rows apart
    shape = SparseMLABlackwellBackend.get_kv_cache_shape(10, 64, 1, head_size, kv_cache_dtype)
    assert shape == (10, 64, expected // spec.dtype.itemsize)
    assert spec.dtype == (dtype if fmt in ("bfloat16", "float16") else torch.uint8)


# --------------------------------------------------------------------------------------------
# Metadata builder and logical -> physical indices
# --------------------------------------------------------------------------------------------


def _batch(query_lens, seq_lens, block_size, *, width=TOPK_WIDTH, invalid_rows=(), seed=0,
           num_padded_tokens=0, max_blocks=None):
    """A batch as vLLM's runner hands it to the builder: decodes first, shuffled block table,
    and the indexer's logical top-k (causal, random -1 holes, some all-invalid rows)."""
    gen = torch.Generator().manual_seed(seed)
    num_reqs = len(query_lens)
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max_blocks or max(max(blocks_per_req), 1) + 1
    num_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    block_table = torch.zeros(num_reqs, max_blocks, dtype=torch.int32)
    for r, n in enumerate(blocks_per_req):
        block_table[r, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    num_tokens = int(qsl[-1]) + num_padded_tokens
    req_of_token, position = [], []
    for r, (q, s) in enumerate(zip(query_lens, seq_lens)):
        req_of_token += [r] * q
        position += list(range(s - q, s))
    topk = torch.full((num_tokens, width), -1, dtype=torch.int32)
    for t, p in enumerate(position):
        if t in invalid_rows:
            continue
        keep = torch.randperm(p + 1, generator=gen)[: min(p + 1, width // 2)]
        cols = torch.randperm(width, generator=gen)[: len(keep)]
        topk[t, cols] = keep.to(torch.int32)
    req_of_token += [0] * num_padded_tokens  # vLLM maps padding tokens to request 0
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    slots = torch.full((num_tokens,), -1, dtype=torch.int64)
    for t, p in enumerate(position):
        r = req_of_token[t]
        slots[t] = int(block_table[r, p // block_size]) * block_size + p % block_size
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=num_reqs,
        num_actual_tokens=num_tokens, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=slots, seq_lens_cpu_upper_bound=seq,
    )
    return types.SimpleNamespace(
        common=common, topk=topk, req_of_token=req_of_token, block_table=block_table,
        num_blocks=num_blocks, seq_lens=seq_lens, query_lens=query_lens,
    )


def _physical_reference(topk, req_of_token, block_table, block_size, stride):
    rows = []
    for t, logical in enumerate(topk.tolist()):
        blocks = block_table[req_of_token[t]].tolist()
        rows.append([
            -1 if i < 0 or i // block_size >= len(blocks)
            else blocks[i // block_size] * stride + i % block_size
            for i in logical
        ])
    return torch.tensor(rows, dtype=torch.int32)


def _builder(vllm_config, spec, layer_name="model.layers.0.self_attn.attn"):
    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellMetadataBuilder

    # The sparse-MLA base builder reads the layer's (absent) dense-MHA prefill backend.
    vllm_config.compilation_config.static_forward_context[layer_name] = types.SimpleNamespace(
        prefill_backend=None
    )
    return SparseMLABlackwellMetadataBuilder(spec, [layer_name], vllm_config, torch.device("cpu"))


@pytest.mark.parametrize(
    "query_lens,seq_lens,block_size,width,invalid_rows",
    [
        ((1, 1, 1, 1), (17, 64, 3, 40), 16, TOPK_WIDTH, (2,)),        # decode
        ((1, 1, 5, 3), (20, 33, 12, 40), 16, TOPK_WIDTH, (0, 4)),     # mixed prefill/decode
        ((7, 1, 9), (7, 200, 9), 64, 2048, ()),                        # prefill first
        ((1, 2, 4), (300, 2, 260), 256, TOPK_WIDTH, (0, 1, 2, 3)),    # all-invalid rows
        ((1, 3), (33, 35), 32, 100, ()),                                # width not a tile multiple
    ],
)
def test_builder_physical_indices(cpu_runtime, model_configs, query_lens, seq_lens, block_size,
                                  width, invalid_rows):
    from vllm_sparse_mla_blackwell.backend import logical_to_physical_topk

    config = _vllm_config(model_configs(576, torch.bfloat16), "auto", block_size)
    with set_current_vllm_config(config):
        builder = _builder(config, _kv_cache_spec(config, 576, "auto"))
        assert builder.get_cudagraph_support(config, None) is AttentionCGSupport.UNIFORM_BATCH
        batch = _batch(query_lens, seq_lens, block_size, width=width, invalid_rows=invalid_rows)
        metadata = builder.build(0, batch.common)

    num_tokens = batch.topk.shape[0]
    assert metadata.req_id_per_token[:num_tokens].tolist() == batch.req_of_token
    assert metadata.block_size == block_size and metadata.block_table is batch.block_table
    decodes = next((i for i, q in enumerate(query_lens) if q > 1), len(query_lens))
    assert (metadata.num_decodes, metadata.num_prefills) == (decodes, len(query_lens) - decodes)
    assert metadata.prefill is None  # no dense-MHA prefill: every token takes the sparse path

    for stride in (block_size, 3 * block_size):  # 3x: other layers' pages packed in between
        out = torch.empty_like(batch.topk)
        physical = logical_to_physical_topk(
            batch.topk, metadata, block_stride_rows=stride, out=out
        )
        expected = _physical_reference(
            batch.topk, batch.req_of_token, batch.block_table, block_size, stride
        )
        assert physical is out
        assert torch.equal(physical, expected)
        assert torch.equal(physical < 0, batch.topk < 0)  # -1 kept in place, nothing added
    for t in invalid_rows:
        assert bool((physical[t] == -1).all())


_TRITON_PROBE = textwrap.dedent(
    """
    import json, sys, types, torch
    from vllm_sparse_mla_blackwell.backend import logical_to_physical_topk

    failures = []
    for case in torch.load(sys.argv[1]):
        metadata = types.SimpleNamespace(
            req_id_per_token=case["req_id"], block_table=case["block_table"],
            block_size=case["block_size"],
        )
        out = torch.empty_like(case["topk"])
        got = logical_to_physical_topk(
            case["topk"], metadata, block_stride_rows=case["stride"], out=out, use_triton=True
        )
        if got is not out or not torch.equal(got, case["expected"]):
            failures.append(case["name"])
    print("RESULT " + json.dumps({"cases": len(torch.load(sys.argv[1])), "failures": failures}))
    """
)


def test_vllm_triton_helper_matches_reference(tmp_path):
    """The CUDA path's conversion (vLLM's Triton helper, as the backend calls it), run by Triton's
    interpreter on the CPU, against the same plain-Python reference."""
    cases = []
    for name, (query_lens, seq_lens, block_size, width) in {
        "decode": ((1, 1, 1), (17, 64, 3), 16, TOPK_WIDTH),
        "mixed": ((1, 1, 5, 3), (20, 33, 12, 40), 16, TOPK_WIDTH),
        "glm_width_2176_bs64": ((2, 7), (70, 7), 64, TOPK_WIDTH),
        "width_96_bs256": ((1, 3), (300, 5), 256, 96),
    }.items():
        batch = _batch(query_lens, seq_lens, block_size, width=width, invalid_rows=(1,))
        for stride in (block_size, 2 * block_size):
            cases.append({
                "name": f"{name}/stride{stride}",
                "topk": batch.topk,
                "req_id": torch.tensor(batch.req_of_token, dtype=torch.int32),
                "block_table": batch.block_table,
                "block_size": block_size,
                "stride": stride,
                "expected": _physical_reference(
                    batch.topk, batch.req_of_token, batch.block_table, block_size, stride
                ),
            })
    torch.save(cases, tmp_path / "cases.pt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GLM53_")}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
    # An empty device list keeps vLLM's Triton import active without a GPU driver.
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_PROBE, str(tmp_path / "cases.pt")],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result == {"cases": len(cases), "failures": []}


def test_out_of_table_blocks_are_invalid():
    from vllm_sparse_mla_blackwell.backend import convert_req_index_to_global_index_torch

    block_table = torch.tensor([[5, 2]], dtype=torch.int32)
    logical = torch.tensor([[0, 15, 16, 31, 32, -1, -7, 1 << 30]], dtype=torch.int32)
    physical = convert_req_index_to_global_index_torch(
        torch.zeros(1, dtype=torch.int32), block_table, logical, 16
    )
    assert physical.tolist() == [[80, 95, 32, 47, -1, -1, -1, -1]]


# --------------------------------------------------------------------------------------------
# The impl's forward on CPU against the fp32 reference
# --------------------------------------------------------------------------------------------

needs_op = pytest.mark.skipif(
    not ops.extension_available(), reason=f"op library not built: {ops.EXTENSION_ERROR}"
)

_POISON = {torch.bfloat16: float("nan"), torch.float16: float("nan"), torch.uint8: 0xFF}


def _impl(head_size, kv_cache_dtype, num_heads, topk_buffer, scale, *, group_builder,
          has_indexer):
    """The impl as ``MLAAttention`` constructs it: the indexer layer passes its indexer, a
    layer without one passes the shared ``topk_indices_buffer``."""
    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellBackend

    indexer = types.SimpleNamespace(topk_indices_buffer=topk_buffer) if has_indexer else None
    rope = head_size - formats.KV_LORA_RANK
    return SparseMLABlackwellBackend.get_impl_cls()(
        num_heads=num_heads, head_size=head_size, scale=scale, num_kv_heads=1,
        alibi_slopes=None, sliding_window=None, kv_cache_dtype=kv_cache_dtype,
        logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
        q_lora_rank=128, kv_lora_rank=formats.KV_LORA_RANK, qk_nope_head_dim=64,
        qk_rope_head_dim=rope, qk_head_dim=64 + rope, v_head_dim=64, kv_b_proj=None,
        indexer=indexer, topk_indices_buffer=topk_buffer, index_group_builder=group_builder,
    )


@needs_op
@pytest.mark.parametrize("head_size", formats.HEAD_SIZES)
@pytest.mark.parametrize(
    "kv_cache_dtype,dtype",
    [
        ("auto", torch.bfloat16),
        ("auto", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp8", torch.bfloat16),
        ("fp8_e4m3", torch.float16),
        ("fp8_ds_mla", torch.bfloat16),
    ],
)
def test_impl_forward_matches_reference(cpu_runtime, model_configs, head_size, kv_cache_dtype,
                                        dtype):
    from vllm.v1.attention.backends.mla.index_group import SparseMLAIndexGroupBuilder

    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellImpl

    num_heads, block_size, sm_scale = 8, 16, 1 / 16
    rope = head_size - formats.KV_LORA_RANK
    config = _vllm_config(model_configs(head_size, dtype), kv_cache_dtype, block_size)
    # Two decodes, two prefills (one all-invalid token), one padding token of a CUDA graph.
    batch = _batch((1, 1, 5, 3), (20, 37, 12, 40), block_size, invalid_rows=(3,),
                   num_padded_tokens=1, seed=1)
    num_tokens = batch.topk.shape[0]
    topk_buffer = torch.full((64, TOPK_WIDTH), -1, dtype=torch.int32)
    topk_buffer[:num_tokens] = batch.topk

    with set_current_vllm_config(config):
        spec = _kv_cache_spec(config, head_size, kv_cache_dtype)
        builder = _builder(config, spec)
        group_builder = SparseMLAIndexGroupBuilder(topk_buffer, 16)
        impl, follower = (
            _impl(head_size, kv_cache_dtype, num_heads, topk_buffer, sm_scale,
                  group_builder=group_builder, has_indexer=has_indexer)
            for has_indexer in (True, False)
        )
        metadata = builder.build(0, batch.common)
    assert isinstance(impl, SparseMLABlackwellImpl) and not impl.supports_dense_mha_prefill
    assert impl.index_group is follower.index_group and impl.index_group.num_layers == 2
    assert follower.topk_indices_buffer is impl.topk_indices_buffer

    # The cache as vLLM allocates it, every row poisoned; then each request's context written
    # through the impl (slot -1 = skipped, as for padding).
    row_width = spec.state_content_size_bytes // spec.dtype.itemsize
    kv_cache = torch.full((batch.num_blocks, block_size, row_width), _POISON[spec.dtype],
                          dtype=spec.dtype)
    k_scale = torch.tensor(0.03 if kv_cache_dtype in ("fp8", "fp8_e4m3") else 1.0)
    gen = torch.Generator().manual_seed(2)
    for r, s in enumerate(batch.seq_lens):
        kv_c = torch.randn(s, formats.KV_LORA_RANK, generator=gen).to(dtype)
        k_pe = torch.randn(s, 1, rope, generator=gen).to(dtype)
        blocks = batch.block_table[r].long()
        pos = torch.arange(s)
        slots = blocks[pos // block_size] * block_size + pos % block_size
        slots[s // 2] = -1  # a skipped token stays poisoned and must never be read
        impl.do_kv_cache_update(kv_c, k_pe, kv_cache, slots, kv_cache_dtype, k_scale)
    # Tokens only ever select positions that were written.
    for t, r in enumerate(batch.req_of_token[: num_tokens - 1]):
        row = topk_buffer[t]
        row[row == batch.seq_lens[r] // 2] = -1

    q = torch.randn(num_tokens, num_heads, 64 + rope + formats.KV_LORA_RANK, generator=gen)
    q = q.to(dtype)
    q_pe = q[..., 64 : 64 + rope]  # a strided view, as MLAAttention.forward_impl passes it
    ql_nope = q[..., 64 + rope :]
    # MLAAttention.forward_impl hands per-tensor fp8 caches over as e4m3.
    fp8 = kv_cache_dtype in ("fp8", "fp8_e4m3")
    kv_view = kv_cache.view(torch.float8_e4m3fn) if fp8 else kv_cache
    layer = types.SimpleNamespace(_k_scale=k_scale)

    cpu_runtime.lock_workspace()  # the forward may not grow vLLM's workspace
    out, lse = impl.forward_mqa((ql_nope, q_pe), kv_view, metadata, layer)
    assert out.shape == (num_tokens, num_heads, formats.HEAD_SIZE_V)
    assert out.dtype == dtype

    physical = _physical_reference(
        topk_buffer[:num_tokens], batch.req_of_token, batch.block_table, block_size, block_size
    )
    rows = reference.dequantize_kv_cache(kv_cache, kv_cache_dtype, head_size, k_scale)
    ref_out, ref_lse = reference.sparse_mla_reference(
        ql_nope, rows, physical, sm_scale, q_pe=q_pe if rope else None
    )
    empty = (physical < 0).all(dim=1)
    assert empty.tolist() == [t in (3, num_tokens - 1) for t in range(num_tokens)]
    assert bool((out[empty] == 0).all())
    got, want = out[~empty].float(), ref_out[~empty]
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert float(rel.max()) <= 4e-3 and float(cos.min()) >= 0.99999
    assert torch.isfinite(got).all()
    assert bool(torch.isneginf(lse[empty]).all())
    assert float((lse[~empty] - ref_lse[~empty]).abs().max()) <= 1e-3

    # A layer without its own indexer reads the same buffer and gives the same result.
    out_follower, _ = follower.forward_mqa((ql_nope, q_pe), kv_view, metadata, layer)
    assert torch.equal(out_follower, out)


@needs_op
@pytest.mark.parametrize(
    "head_size,kv_cache_dtype", [(576, "auto"), (576, "fp8"), (512, "fp8_ds_mla"), (512, "fp8")]
)
def test_mla_layer_end_to_end(cpu_runtime, model_configs, head_size, kv_cache_dtype):
    """vLLM's own ``MLAAttention`` layer with this backend: cache write through
    ``update_kv_cache``, then ``forward_impl`` (q absorption, fp8 cache view, top-k MQA for every
    token, V up-projection), against absorbed MLA computed here in fp32."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from vllm_sparse_mla_blackwell.backend import SparseMLABlackwellBackend, SparseMLABlackwellImpl

    num_heads, nope, v_dim, block_size, sm_scale = 8, 64, 64, 16, 0.1
    rope = head_size - formats.KV_LORA_RANK
    dtype = torch.bfloat16
    config = _vllm_config(model_configs(head_size, dtype), kv_cache_dtype, block_size)
    batch = _batch((1, 3), (20, 12), block_size, width=TOPK_WIDTH, seed=3)
    num_tokens = batch.topk.shape[0]
    topk_buffer = torch.full((64, TOPK_WIDTH), -1, dtype=torch.int32)
    topk_buffer[:num_tokens] = batch.topk
    gen = torch.Generator().manual_seed(4)

    with set_current_vllm_config(config):
        kv_b_proj = ColumnParallelLinear(
            formats.KV_LORA_RANK, num_heads * (nope + v_dim), bias=False, params_dtype=dtype,
            prefix="model.layers.0.self_attn.kv_b_proj",
        )
        kv_b_proj.weight.data.copy_(0.05 * torch.randn(kv_b_proj.weight.shape, generator=gen))
        layer = MLAAttention(
            num_heads=num_heads, scale=sm_scale, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
            v_head_dim=v_dim, q_lora_rank=None, kv_lora_rank=formats.KV_LORA_RANK,
            kv_b_proj=kv_b_proj, cache_config=config.cache_config,
            prefix="model.layers.0.self_attn.attn", attn_backend=SparseMLABlackwellBackend,
            use_sparse=True, indexer=None, topk_indices_buffer=topk_buffer,
        )
        layer.process_weights_after_loading(dtype)
        spec = SparseMLABlackwellBackend.customize_spec(layer.get_kv_cache_spec(config))
        builder = SparseMLABlackwellBackend.get_builder_cls()(
            spec, [layer.layer_name], config, torch.device("cpu")
        )
        metadata = builder.build(0, batch.common)
    assert isinstance(layer.impl, SparseMLABlackwellImpl) and layer.prefill_backend is None
    assert layer.kv_cache_dtype == kv_cache_dtype  # "fp8" stays per-tensor e4m3 here

    row_width = spec.state_content_size_bytes // spec.dtype.itemsize
    kv_cache = torch.full((batch.num_blocks, block_size, row_width), _POISON[spec.dtype],
                          dtype=spec.dtype)
    if kv_cache_dtype == "fp8":
        layer._k_scale.fill_(0.02)
        layer._k_scale_float = 0.02
    slots, kv_c, k_pe = [], [], []
    for r, s in enumerate(batch.seq_lens):
        pos = torch.arange(s)
        slots.append(batch.block_table[r].long()[pos // block_size] * block_size + pos % block_size)
        kv_c.append(torch.randn(s, formats.KV_LORA_RANK, generator=gen).to(dtype))
        k_pe.append(torch.randn(s, 1, rope, generator=gen).to(dtype))
    layer.update_kv_cache(torch.cat(kv_c), torch.cat(k_pe), kv_cache, torch.cat(slots), metadata,
                          layer.kv_cache_dtype, layer._k_scale)

    q = torch.randn(num_tokens, num_heads, nope + rope, generator=gen).to(dtype)
    output = torch.empty(num_tokens, num_heads * v_dim, dtype=dtype)
    with set_current_vllm_config(config):
        layer.forward_impl(q, kv_c[0][:num_tokens], k_pe[0][:num_tokens], kv_cache, metadata,
                           output=output)

    rows = reference.dequantize_kv_cache(kv_cache, kv_cache_dtype, head_size, layer._k_scale)
    physical = _physical_reference(batch.topk, batch.req_of_token, batch.block_table,
                                   block_size, block_size)
    ql_nope = torch.einsum("thp,hpl->thl", q[..., :nope].float(), layer.W_UK_T.float())
    latent, _ = reference.sparse_mla_reference(
        ql_nope, rows, physical, sm_scale, q_pe=q[..., nope:].float() if rope else None
    )
    expected = torch.einsum("thl,hlv->thv", latent, layer.W_UV.float()).reshape(num_tokens, -1)
    rel = (output.float() - expected).norm(dim=-1) / expected.norm(dim=-1)
    assert float(rel.max()) <= 1e-2, rel  # bf16 q absorption and up-projection


def test_selector_rejects_a_library_built_for_another_gpu(on_cuda, monkeypatch):
    """A GB10-only build (GLM53_ARCHS=121a) is refused on an RTX 5090 (sm_120), with the fix."""
    monkeypatch.setattr(ops, "compiled_targets", lambda: ["121a"])
    invalid = r"is not valid for this configuration. Reason: \[.*"
    with pytest.raises(ValueError, match=invalid + "rebuild with GLM53_ARCHS=120a"):
        on_cuda((12, 0), 576, torch.bfloat16, "bfloat16", backend=BACKEND_NAME)
    assert on_cuda((12, 1), 576, torch.bfloat16, "bfloat16").get_name() == BACKEND_NAME
