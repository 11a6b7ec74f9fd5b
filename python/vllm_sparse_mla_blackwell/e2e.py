"""End-to-end check in vLLM: ``python -m vllm_sparse_mla_blackwell e2e``.

Serves tiny DeepSeek-V3.2 (head_size 576) and GLM-5.3-Flash (NoPE, head_size 512) models in vLLM
on this GPU, through this package's backend and through references, and compares what a user
sees: greedy tokens, the full-vocabulary logits of every generated step, the logits of every
prompt token, throughput, and vLLM's KV-cache capacity.

- Models: real architectures (``DeepseekV32ForCausalLM``, ``Glm5NextForCausalLM``) cut to two
  layers, with vLLM's dummy weights re-initialised at a realistic scale (uniform
  ``+-sqrt(3 / fan_in)`` matrices, unit norm weights, a seed per tensor): with vLLM's own +-1e-3
  attention would be uniform and the indexer's choice meaningless. Prompts are longer than the
  indexer's ``index_topk``, so attention really is sparse.
- References: this backend running the fp32 PyTorch reference attention instead of the kernel
  ("exact", on every GPU), and vLLM's own sparse-MLA backends where the GPU has them.
- The bar: two correct kernels differ on a random two-layer model (near-tied top-k choices flip),
  so the check measures that spread in the same run, between vLLM's own kernels and the exact
  reference, and asks this backend to stay within twice it. Without a vLLM kernel on the GPU the
  bar is the one measured on an H200 for that model (``FALLBACK_BARS``).

A worker process runs the configurations one after another (vLLM in-process, ``LLM(...)``) and
writes ``.pt`` results into a work folder; after a failed run a fresh worker takes the rest; the
parent compares the results.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_sparse_mla_blackwell import envs

OURS = "SPARSE_MLA_BLACKWELL"
OURS_IMPL = "SparseMLABlackwellImpl"  # backend.SparseMLABlackwellImpl, by name: no vLLM import here
EXACT = "EXACT"  # this backend with the fp32 reference attention
VLLM_BACKENDS = ("FLASHMLA_SPARSE", "FLASH_ATTN_MLA_SPARSE")
KV_CACHE_DTYPES = ("bfloat16", "fp8", "fp8_ds_mla")
MODES = ("eager", "graphs")
VOCAB_SIZE = 2048
MAX_MODEL_LEN = 4096
#: Used where vLLM has no sparse-MLA kernel on the GPU (sm_120 / sm_121, for one): per model, the
#: widest spread of vLLM's own kernels (FLASHMLA_SPARSE, FLASH_ATTN_MLA_SPARSE, against each
#: other and the exact reference) on an H200, 2026-12-02 (bench/results/2026-12-02-h200-e2e).
FALLBACK_BARS = {
    "deepseek-v3.2": {"step_cos_dev": 1.91e-3, "prompt_rel_err": 0.0577},
    "glm-5.3-flash": {"step_cos_dev": 5.41e-5, "prompt_rel_err": 0.0246},
    "deepseek-v3.2-fp16": {"step_cos_dev": 1.13e-4, "prompt_rel_err": 0.0309},
}
#: A measured spread wider than this many times the H200's is a broken reference, not a bar.
MAX_SPREAD_OVER_FALLBACK = 10.0
#: This backend may deviate from the exact reference by up to this multiple of the spread.
SPREAD_FACTOR = 2.0
#: Worker exit status after a failed run: the parent starts a fresh worker for the rest.
RESTART = 75
#: A run is not started when less than this is left of the time budget (seconds, tiny models).
RUN_ESTIMATE_S = {"eager": 30, "graphs": 60}


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    dtype: str
    num_heads: int
    kv_cache_dtypes: tuple[str, ...]
    prompt_lens: tuple[int, ...]

    @property
    def head_size(self) -> int:
        return 512 if self.name.startswith("glm") else 576

    def config(self) -> dict:
        return glm53_flash_config(self.num_heads) if self.head_size == 512 else deepseek_v32_config(self.num_heads)


def _common(num_heads: int) -> dict:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "q_lora_rank": 384,
        "kv_lora_rank": 512,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "index_head_dim": 128,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def deepseek_v32_config(num_heads: int) -> dict:
    """A two-layer DeepSeek-V3.2 (``config.json`` of deepseek-ai/DeepSeek-V3.2 cut down): MLA with
    64 rope dims (head_size 576), the DSA indexer with ``index_topk`` 512, YaRN so that
    ``sm_scale`` is the real model's 0.135234, dense MLPs (``first_k_dense_replace`` = layers)."""
    return {
        **_common(num_heads),
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "first_k_dense_replace": 2,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "index_topk": 512,
        "index_n_heads": 64,
        "max_position_embeddings": 163840,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "rope_theta": 10000,
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    }


def glm53_flash_config(num_heads: int) -> dict:
    """A two-layer GLM-5.3-Flash (``Glm5NextForCausalLM``): one KDA linear-attention layer and one
    NoPE sparse-MLA layer (head_size 512, ``sm_scale`` 1/16), ``index_topk`` 2048 with
    ``index_kpool`` 4, whose tail makes the index buffer 2176 wide as in the real model. ``mhc`` is
    off (the real model's hyper-connections need the ``tilelang`` package)."""
    return {
        **_common(num_heads),
        "architectures": ["Glm5NextForCausalLM"],
        "model_type": "glm5_next",
        "layer_types": ["linear_attention", "deepseek_sparse_attention"],
        "mlp_layer_types": ["dense", "dense"],
        "qk_nope_head_dim": 256,
        "qk_rope_head_dim": 0,
        "v_head_dim": 256,
        "mla_use_nope": True,
        "index_topk": 2048,
        "index_kpool": 4,
        "index_n_heads": 32,
        "indexer_rope_interleave": False,
        "mhc": False,
        "linear_num_heads": 8,
        "linear_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "rope_theta": 10000,
    }


MODELS = {
    m.name: m
    for m in (
        Model("deepseek-v3.2", "bfloat16", 16, KV_CACHE_DTYPES, (40, 700, 1500, 3000)),
        Model("glm-5.3-flash", "bfloat16", 64, KV_CACHE_DTYPES, (40, 700, 2500, 3500)),
        # The GGUF case: an fp16 model; vLLM's FA3 sparse backend takes fp16 as a reference.
        Model("deepseek-v3.2-fp16", "float16", 16, ("auto",), (40, 700, 1500, 3000)),
    )
}


def write_model(model: Model, root: Path) -> Path:
    """Write ``config.json`` of ``model`` into ``root/<name>`` (no weights: ``load_format=dummy``)."""
    path = root / model.name
    path.mkdir(parents=True, exist_ok=True)
    config = model.config()
    config["torch_dtype"] = model.dtype
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


# ---------------------------------------------------------------------------------------------
# The run plan
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    model: str
    backend: str  # OURS, EXACT or a vLLM backend name
    kv_cache_dtype: str
    graphs: bool

    @property
    def mode(self) -> str:
        return "graphs" if self.graphs else "eager"

    @property
    def key(self) -> str:
        return f"{self.model}.{self.backend}.{self.kv_cache_dtype}.{self.mode}"


def vllm_backends_for(model: Model, kv_cache_dtype: str, capability: tuple[int, int]) -> list[str]:
    """vLLM 0.33's own sparse-MLA backends that serve this model and cache on this GPU
    (``vllm/v1/attention/backends/mla/flashmla_sparse.py``, ``flashattn_mla_sparse.py``): both on
    sm_90 with 16-bit caches (FlashMLA bf16 models only, FA3 head_size 576); FlashMLA on sm_90 and
    sm_100 with ``fp8_ds_mla``. vLLM's ``fp8`` means ``fp8_ds_mla`` there, not this backend's
    per-tensor e4m3, so ``fp8`` has no vLLM reference."""
    major = capability[0]
    out = []
    if major in (9, 10) and model.dtype == "bfloat16" and kv_cache_dtype in ("auto", "bfloat16", "fp8_ds_mla"):
        if model.head_size == 576 or major == 9:
            out.append("FLASHMLA_SPARSE")
    if major == 9 and model.head_size == 576 and kv_cache_dtype in ("auto", "bfloat16", "float16"):
        out.append("FLASH_ATTN_MLA_SPARSE")
    return out


def plan_runs(models: list[Model], kv_dtypes: tuple[str, ...], modes: tuple[str, ...],
              capability: tuple[int, int]) -> list[Run]:
    """Per (model, cache): the exact reference (eager), then per mode this backend and vLLM's
    backends that serve it (both eager, the first with graphs)."""
    runs = []
    for model in models:
        for kv in (k for k in model.kv_cache_dtypes if k in kv_dtypes or k == "auto"):
            runs.append(Run(model.name, EXACT, kv, False))
            theirs = vllm_backends_for(model, kv, capability)
            for mode in modes:
                graphs = mode == "graphs"
                runs.append(Run(model.name, OURS, kv, graphs))
                # Both of vLLM's kernels eager (the spread); with graphs the first, for speed.
                runs += [Run(model.name, b, kv, graphs) for b in (theirs[:1] if graphs else theirs)]
    return runs


# ---------------------------------------------------------------------------------------------
# Worker: one process, vLLM in-process, several runs one after another
# ---------------------------------------------------------------------------------------------


def mla_impls(llm) -> list[str]:
    """The attention implementations (class names, sorted, each once) of every MLA layer of a
    ``vllm.LLM``, in every worker."""
    return sorted({name for names in llm.apply_model(_layer_impls) for name in names})


def _layer_impls(model) -> list[str]:  # module level: apply_model may pickle it to TP workers
    return [type(m.impl).__name__ for m in model.modules() if hasattr(m, "impl") and hasattr(m.impl, "forward_mqa")]


def _prompts(model: Model, quick: bool) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(1234)
    lens = model.prompt_lens[::2] if quick else model.prompt_lens
    return [torch.randint(16, VOCAB_SIZE, (n,), generator=gen).tolist() for n in lens]


_SEEDS = {"next": 0}


def realistic_bound(shape: tuple[int, ...]) -> float:
    """Half-width of the realistic uniform init of a tensor of two or more dims: sqrt(3 / fan_in),
    fan_in = ``shape[-1]`` (unit variance through a layer)."""
    return math.sqrt(3.0 / shape[-1])


def realistic_fill(name: str, shape: tuple[int, ...]) -> float | None:
    """The constant a 1-D tensor starts at under the realistic init: 1 for ``*weight`` (norms), 0
    for ``*bias``; None for any other tensor (drawn uniform)."""
    if len(shape) != 1:
        return None
    return 1.0 if name.endswith("weight") else 0.0 if name.endswith("bias") else None


def _install_realistic_dummy_weights() -> None:
    """Wrap vLLM's dummy initialiser: matrices uniform +-sqrt(3 / fan_in) (unit variance through a
    layer), 1-D ``weight`` (norms) 1, 1-D ``bias`` 0, a distinct seed per tensor in model order
    (restarted for every run, so that every backend serves the same weights); 0-dim tensors
    (KV-cache scale sentinels) untouched; integer tensors as vLLM does."""
    import torch
    from vllm.model_executor.model_loader import dummy_loader

    original = dummy_loader.initialize_single_dummy_weight
    if getattr(original, "_sparse_mla_e2e", False):
        return

    @torch.no_grad()
    def realistic(param, *args, name: str = "", **kwargs):
        if param.dim() == 0:
            return None  # KV-cache scale sentinels (-1): vLLM then uses scale 1, not +-1e-3
        if param.device.type == "meta" or not torch.is_floating_point(param):
            return original(param, *args, name=name, **kwargs)
        seed = 1000 + _SEEDS["next"]
        _SEEDS["next"] += 1
        if param.dim() == 1:
            fill = realistic_fill(name, tuple(param.shape))
            return param.fill_(fill) if fill is not None else original(param, seed=seed, name=name)
        bound = realistic_bound(tuple(param.shape))
        return original(param, -bound, bound, seed=seed, name=name)

    realistic._sparse_mla_e2e = True
    dummy_loader.initialize_single_dummy_weight = realistic


def _stub_missing_cutedsl() -> None:
    """vLLM 0.33's DeepSeek-V3.2 q kernel imports its CuTe-DSL variant (package
    ``nvidia-cutlass-dsl``) on every CUDA GPU but runs it only on sm_100+. Where the package is
    missing and the GPU is older, a stand-in that declines keeps the model importable."""
    import importlib.util
    import types

    import torch

    if importlib.util.find_spec("cutlass") is not None or torch.cuda.get_device_capability()[0] >= 10:
        return
    name = "vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl"
    stub = types.ModuleType(name)
    stub.fused_q_cutedsl = None
    stub.is_fused_q_cutedsl_supported = lambda *args, **kwargs: False
    sys.modules[name] = stub


def _step_logits(flat, vocab: int):
    """Full-vocabulary values per position from vLLM's ``FlatLogprobs`` (``None`` entries, e.g.
    prompt position 0, are dropped), as fp32 ``[positions, vocab]``."""
    import torch

    rows = []
    for start, end in zip(flat.start_indices, flat.end_indices):
        if end - start < vocab:
            continue
        row = torch.full((vocab,), math.nan)  # a token id vLLM did not report stays NaN: no pass
        row[torch.tensor(flat.token_ids[start:end])] = torch.tensor(flat.logprobs[start:end])
        rows.append(row)
    return torch.stack(rows) if rows else torch.empty(0, vocab)


def _one_run(run: Run, model: Model, model_dir: Path, out_dir: Path, quick: bool) -> dict:
    """One run in this worker: start vLLM on ``model_dir`` with ``run``'s backend, cache dtype and
    mode, generate greedily with full-vocabulary logprobs, time a batch, read vLLM's KV capacity,
    check that every MLA layer ran the intended implementation (and the exact path where asked),
    and save the logits to ``out_dir``. Returns the run's record (``ok``, timings, capacity)."""
    import gc

    import torch
    from vllm import LLM, SamplingParams

    from vllm_sparse_mla_blackwell import backend as ours

    ours.SparseMLABlackwellImpl._exact_reference = run.backend == EXACT
    ours.SparseMLABlackwellImpl._exact_calls = 0
    _SEEDS["next"] = 0
    kwargs = dict(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=model.dtype,
        kv_cache_dtype=run.kv_cache_dtype,
        enforce_eager=not run.graphs,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.4,
        enable_prefix_caching=False,
        seed=0,
        max_logprobs=-1,
        logprobs_mode="raw_logits",
    )
    if run.backend in VLLM_BACKENDS:
        kwargs["attention_config"] = {"backend": run.backend}
    if run.graphs:
        kwargs["compilation_config"] = {"max_cudagraph_capture_size": 64}
    llm = None
    try:
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        start_s = time.perf_counter() - t0
        cache = llm.llm_engine.vllm_config.cache_config
        kv_tokens = (cache.num_gpu_blocks or 0) * cache.block_size
        impls = mla_impls(llm)
        prompts = _prompts(model, quick)
        steps = 8 if quick else 24
        params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=-1,
                                prompt_logprobs=-1, flat_logprobs=True, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        result = {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "step_logits": [_step_logits(o.outputs[0].logprobs, VOCAB_SIZE).half() for o in outs],
            "prompt_logits": [_step_logits(o.prompt_logprobs, VOCAB_SIZE).half() for o in outs],
        }
        batch, prompt_len, new = (16, 512, 64) if quick else (64, 1024, 128)
        gen = torch.Generator().manual_seed(99)
        tp = [{"prompt_token_ids": torch.randint(16, VOCAB_SIZE, (prompt_len,), generator=gen).tolist()}
              for _ in range(batch)]
        tp_params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
        llm.generate(tp[:2], tp_params, use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        llm.generate(tp, tp_params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
    finally:  # a failed start too: the next run needs a clean process
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except Exception:  # noqa: BLE001 - best effort between runs
            pass
    exact_calls = ours.SparseMLABlackwellImpl._exact_calls
    if (run.backend == EXACT) != (exact_calls > 0):
        raise RuntimeError(f"the exact reference attention ran {exact_calls} times in a {run.backend} run "
                           "(vLLM's engine must run in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    for o, prompt, steps_got, prompt_got in zip(outs, prompts, result["step_logits"], result["prompt_logits"]):
        # Prompt position 0 has no logprobs in vLLM (nothing predicts it).
        if steps_got.shape[0] != len(o.outputs[0].token_ids) or prompt_got.shape[0] not in (len(prompt) - 1, len(prompt)):
            raise RuntimeError(f"full-vocabulary logprobs came back for {steps_got.shape[0]} steps and "
                               f"{prompt_got.shape[0]} prompt positions, expected {len(o.outputs[0].token_ids)} "
                               f"and {len(prompt) - 1}")
    torch.save(result, out_dir / f"{run.key}.pt")
    return {"key": run.key, "ok": True, "start_s": round(start_s, 1), "kv_tokens": kv_tokens, "impls": impls,
            "tokens_per_s": round(batch * (prompt_len + new) / elapsed, 1), "batch_s": round(elapsed, 3)}


def _run_or_skip(run: Run, model: Model, spec: dict, out_dir: Path) -> dict:
    if time.time() + RUN_ESTIMATE_S[run.mode] > spec["deadline"]:
        return {"key": run.key, "ok": False, "error": "skipped: over the time budget"}
    try:
        return _one_run(run, model, Path(spec["model_dirs"][run.model]), out_dir, spec["quick"])
    except Exception as exc:  # noqa: BLE001 - recorded, the next run goes on
        import traceback

        traceback.print_exc()
        return {"key": run.key, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def worker_main(spec_path: str) -> int:
    """Run the runs listed in the spec JSON one after another; append one JSON line per run to
    ``<out_dir>/runs.jsonl`` (``ok: false`` and the error where a run fails)."""
    spec = json.loads(Path(spec_path).read_text())
    # vLLM in this process: the exact-reference switch and the weight initialiser live here.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ[envs.SPARSE_MLA_ENV] = "1"
    _stub_missing_cutedsl()
    _install_realistic_dummy_weights()
    out_dir = Path(spec["out_dir"])
    for item in spec["runs"]:
        run = Run(**item)
        model = MODELS[run.model]
        print(f"[e2e] {run.key}: starting", flush=True)
        record = _run_or_skip(run, model, spec, out_dir)
        with open(out_dir / "runs.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"[e2e] {run.key}: {record}", flush=True)
        if not record["ok"] and not record["error"].startswith("skipped"):
            return RESTART  # a fresh process for the next run: a CUDA error can be sticky
    return 0


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Agreement:
    tokens_same: int  # greedy tokens equal up to the first difference, summed over prompts
    tokens_total: int
    min_step_cos: float  # full-vocabulary logits of each step with the same context
    mean_step_cos: float
    prompt_rel_err: float  # worst per-prompt ||a - b|| / ||b|| over all prompt positions


def _nanmax(values) -> float:
    values = list(values)
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


def agreement(a: dict, b: dict) -> Agreement:
    """Compare two runs' results (``_one_run``'s saved dict). Steps are compared up to and
    including the first whose greedy token differs: later ones have different contexts. Anything
    that cannot be compared (a missing or misshapen logits row, a NaN) gives NaN figures, which
    no bar admits."""
    import torch

    same = total = 0
    coses, errs = [], []
    for ta, tb, la, lb in zip(a["tokens"], b["tokens"], a["step_logits"], b["step_logits"], strict=True):
        n = min(len(ta), len(tb))
        first_diff = next((i for i in range(n) if ta[i] != tb[i]), n)
        same += first_diff
        total += n
        k = min(first_diff + 1, n)
        if k == 0 or la.shape[0] < k or lb.shape[0] < k:
            coses.append(math.nan)
            continue
        coses += torch.nn.functional.cosine_similarity(la[:k].double(), lb[:k].double(), dim=-1).tolist()
    for pa, pb in zip(a["prompt_logits"], b["prompt_logits"], strict=True):
        if pa.shape != pb.shape or pb.numel() == 0:
            errs.append(math.nan)
            continue
        errs.append(((pa.double() - pb.double()).norm() / pb.double().norm()).item())
    bad = not coses or any(math.isnan(c) for c in coses)
    return Agreement(same, total, math.nan if bad else min(coses), math.nan if bad else sum(coses) / len(coses),
                     _nanmax(errs))


def spread(pairs: list[Agreement]) -> dict | None:
    """The bar from pairs of correct kernels: their widest mean step-cosine deviation and prompt
    error. The mean over steps, not the worst step: one near-tied step decides the minimum (on an
    H200 the worst step of two correct kernels ranged 0.979-0.9994 between models). A NaN pair
    makes the bar NaN: nothing passes against a reference that could not be compared."""
    if not pairs:
        return None
    return {"step_cos_dev": _nanmax(1 - p.mean_step_cos for p in pairs),
            "prompt_rel_err": _nanmax(p.prompt_rel_err for p in pairs)}


def within(agr: Agreement, bar: dict) -> bool:
    """Whether ``agr`` (this backend against exact) stays within SPREAD_FACTOR x ``bar`` (from
    ``spread`` or FALLBACK_BARS) in mean step-cosine deviation and prompt-logit error; NaN fails."""
    return (1 - agr.mean_step_cos <= SPREAD_FACTOR * bar["step_cos_dev"]
            and agr.prompt_rel_err <= SPREAD_FACTOR * bar["prompt_rel_err"])


def evaluate(runs: list[Run], records: dict[str, dict], results_dir: Path) -> dict:
    """Rows (one per run of this backend), spread pairs and the verdict, as plain data."""
    import torch

    def load(run: Run):
        rec = records.get(run.key)
        return torch.load(results_dir / f"{run.key}.pt") if rec and rec.get("ok") else None

    loaded = {r.key: load(r) for r in runs}
    report = {"models": {}, "passed": True}
    for model_name in dict.fromkeys(r.model for r in runs):
        mruns = [r for r in runs if r.model == model_name]
        exact = {r.kv_cache_dtype: r for r in mruns if r.backend == EXACT}
        theirs = [r for r in mruns if r.backend in VLLM_BACKENDS and loaded[r.key] is not None]
        pairs = []
        for r in theirs:
            e = exact.get(r.kv_cache_dtype)
            if e is not None and loaded[e.key] is not None:
                pairs.append((f"{r.backend} {r.kv_cache_dtype} {r.mode} vs exact", agreement(loaded[r.key], loaded[e.key])))
            for o in theirs:
                if (o.backend > r.backend and o.kv_cache_dtype == r.kv_cache_dtype and o.graphs == r.graphs):
                    pairs.append((f"{r.backend} vs {o.backend} {r.kv_cache_dtype} {r.mode}",
                                  agreement(loaded[r.key], loaded[o.key])))
        bar = spread([p for _, p in pairs])
        fallback = FALLBACK_BARS[model_name]
        planned_theirs = [r for r in mruns if r.backend in VLLM_BACKENDS]
        if bar is None and planned_theirs:
            # Name what failed: with one vLLM kernel run, the exact reference is the other half of
            # the only pair (a failed exact run once read here as vLLM's kernels failing).
            ran = ", ".join(sorted({t.backend for t in theirs}))
            missing = ("no run of vLLM's own kernels succeeded" if not theirs else
                       f"the exact reference did not run, and vLLM's kernels that did ({ran}) form no pair")
            bar_problem = f"{missing}, so the spread was not measured"
        elif bar is not None and not all(bar[k] <= MAX_SPREAD_OVER_FALLBACK * fallback[k] for k in bar):
            bar_problem = f"the measured spread {bar} is over {MAX_SPREAD_OVER_FALLBACK:g}x the H200's: a broken reference"
        else:
            bar_problem = None
        measured = bar is not None
        bar = bar or fallback
        rows = []
        for r in (r for r in mruns if r.backend == OURS):
            rec = records.get(r.key, {"ok": False, "error": "not run"})
            row = {"kv_cache_dtype": r.kv_cache_dtype, "mode": r.mode, **rec}
            e = exact.get(r.kv_cache_dtype)
            if loaded[r.key] is not None and e is not None and loaded[e.key] is not None:
                agr = agreement(loaded[r.key], loaded[e.key])
                row["vs_exact"] = dataclasses.asdict(agr)
                row["within_bar"] = bar_problem is None and within(agr, bar)
            else:
                row["within_bar"] = False
            peers = [t for t in theirs if t.kv_cache_dtype == r.kv_cache_dtype and t.graphs == r.graphs]
            if peers and loaded[r.key] is not None:
                peer = peers[0]
                row["vs_vllm"] = {"backend": peer.backend, **dataclasses.asdict(agreement(loaded[r.key], loaded[peer.key]))}
                row["throughput_ratio"] = round(rec["tokens_per_s"] / records[peer.key]["tokens_per_s"], 3)
                row["kv_tokens_ratio"] = round(rec["kv_tokens"] / max(1, records[peer.key]["kv_tokens"]), 3)
            row["selected_ours"] = rec.get("impls") == [OURS_IMPL]  # every MLA layer
            row["passed"] = bool(rec.get("ok")) and row["within_bar"] and row["selected_ours"]
            report["passed"] &= row["passed"]
            rows.append(row)
        refs = [{"run": r.key, **records.get(r.key, {"ok": False, "error": "not run"})}
                for r in mruns if r.backend != OURS]
        report["models"][model_name] = {
            "bar": {**bar, "factor": SPREAD_FACTOR, "measured": measured, "problem": bar_problem},
            "pairs": {name: dataclasses.asdict(p) for name, p in pairs},
            "rows": rows,
            "references": refs,
        }
    return report


def print_report(report: dict, device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name, m in report["models"].items():
        bar = m["bar"]
        if bar["problem"]:
            shown = "the spread measured in this run" if bar["measured"] else "the H200's spread for this model"
            src = f"[red]no bar: {bar['problem']}[/red]; shown: {shown}"
        else:
            src = "measured in this run" if bar["measured"] else "no vLLM kernel here: the H200's spread for this model"
        console.print(f"\n[bold]{name}[/bold] on {device}: bar = {bar['factor']:g} x spread ({src}): "
                      f"1 - mean step cos <= {bar['factor'] * bar['step_cos_dev']:.2e}, "
                      f"prompt rel err <= {bar['factor'] * bar['prompt_rel_err']:.2%}")
        spread_table = Table("spread pair (vLLM's own kernels)", "greedy same", "min step cos", "mean step cos",
                             "prompt rel err")
        for pname, p in m["pairs"].items():
            spread_table.add_row(pname, f"{p['tokens_same']}/{p['tokens_total']}", f"{p['min_step_cos']:.6f}",
                                 f"{p['mean_step_cos']:.6f}", f"{p['prompt_rel_err']:.2%}")
        if m["pairs"]:
            console.print(spread_table)
        t = Table("kv cache", "mode", "greedy same", "mean step cos", "min step cos", "prompt rel err",
                  "vs vLLM: mean cos / err",
                  "tok/s", "x vLLM", "KV tokens", "x vLLM", "start s", "verdict", title=f"{name}: this backend vs exact")
        for r in m["rows"]:
            v, p = r.get("vs_exact"), r.get("vs_vllm")
            if not r.get("ok"):
                t.add_row(r["kv_cache_dtype"], r["mode"], *[""] * 10, f"[red]ERROR {r.get('error', '')[:60]}[/red]")
                continue
            t.add_row(
                r["kv_cache_dtype"], r["mode"],
                f"{v['tokens_same']}/{v['tokens_total']}" if v else "-",
                f"{v['mean_step_cos']:.6f}" if v else "-",
                f"{v['min_step_cos']:.6f}" if v else "-",
                f"{v['prompt_rel_err']:.2%}" if v else "-",
                f"{p['mean_step_cos']:.6f} / {p['prompt_rel_err']:.2%} ({p['backend']})" if p else "-",
                f"{r['tokens_per_s']:.0f}", f"{r['throughput_ratio']:.2f}" if p else "-",
                f"{r['kv_tokens']}", f"{r['kv_tokens_ratio']:.2f}" if p else "-", f"{r['start_s']:.0f}",
                "[green]PASS[/green]" if r["passed"] else
                ("[red]FAIL: not selected[/red]" if not r["selected_ours"] else "[red]FAIL[/red]"),
            )
        console.print(t)
        bad = [x for x in m["references"] if not x.get("ok")]
        for x in bad:
            console.print(f"[yellow]reference {x['run']} did not run: {x.get('error')}[/yellow]")
        for x in [{"run": r.get("key"), **r} for r in m["rows"]] + m["references"]:
            if x.get("retried_after"):
                second = "ok" if x.get("ok") else x.get("error", "")[:80]
                console.print(f"  {x['run']}: first try stopped ({x['retried_after'][:100]}); second try: {second}")
        for x in m["references"]:
            if x.get("ok"):
                console.print(f"  reference {x['run']}: {x['tokens_per_s']:.0f} tok/s, KV {x['kv_tokens']} tokens, "
                              f"start {x['start_s']:.0f} s")


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


# vLLM 0.33's start-up assert (v1/worker/gpu_worker.py determine_available_memory) when another
# process frees GPU memory while it profiles: a desktop's or another job's doing, not the run's.
PROFILING_RACE = "Error in memory profiling"


def _run_workers(runs: list[Run], model_dirs: dict[str, str], out_dir: Path, quick: bool,
                 deadline: float) -> dict[str, dict]:
    """Workers run the plan one after another; a worker that dies is replaced for what is left,
    the run it died in recorded as failed. A run that stopped in vLLM's memory profiling
    (PROFILING_RACE) runs once more in a fresh worker; its record keeps the first error as
    ``retried_after``."""
    log = out_dir / "runs.jsonl"
    pending = list(runs)
    retried: dict[str, str] = {}
    while pending:
        spec = out_dir / "spec.json"
        spec.write_text(json.dumps({"runs": [dataclasses.asdict(r) for r in pending], "model_dirs": model_dirs,
                                    "out_dir": str(out_dir), "quick": quick, "deadline": deadline}))
        cmd = [sys.executable, "-m", "vllm_sparse_mla_blackwell.e2e", "--worker", str(spec)]
        try:
            rc = subprocess.run(cmd, timeout=max(60.0, deadline - time.time() + 120)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        latest, tries = {}, collections.Counter()
        for line in log.read_text().splitlines() if log.exists() else []:
            rec = json.loads(line)
            latest[rec["key"]] = rec
            tries[rec["key"]] += 1
        # A retried run has finished once its second record is in.
        left = [r for r in pending if tries[r.key] < 1 + (r.key in retried)]
        again = [r for r in pending if r.key not in retried and tries[r.key] == 1
                 and PROFILING_RACE in str(latest[r.key].get("error", ""))]
        retried.update((r.key, latest[r.key]["error"]) for r in again)
        # A worker that died took the run it was in (RESTART: it recorded its failure and asks
        # for a fresh process); one that returned 0 without finishing (it should not) leaves the
        # rest unrun rather than loop.
        failed = [] if rc == RESTART else left[:1] if rc != 0 else left
        with open(log, "a") as f:
            for r in failed:
                f.write(json.dumps({"key": r.key, "ok": False, "error": f"worker exited ({rc})"}) + "\n")
        pending = again + left[len(failed):]
    records = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        records[rec["key"]] = rec
    for key, error in retried.items():
        records[key]["retried_after"] = error
    return records


def positive_seconds(flag: str, value: float) -> list[str]:
    """The argument problem of a time limit that is not a positive finite number, if any."""
    return [] if math.isfinite(value) and value > 0 else [f"{flag} must be a positive number of seconds, got {value}"]


def preflight(command: str, models: tuple[str, ...] | None, problems: list[str],
              gpus: int = 1) -> tuple[tuple[str, ...], int | None]:
    """The common start of ``e2e`` and ``serve``: the model names (lower case; default the first
    two of MODELS) and the exit status to stop with, if any: 2 for unknown models or the caller's
    argument ``problems`` (printed), 3 without vLLM or with fewer than ``gpus`` CUDA GPUs."""
    names = tuple(n.lower() for n in models) if models else ("deepseek-v3.2", "glm-5.3-flash")
    unknown = [n for n in names if n not in MODELS]
    problems = ([f"unknown models {unknown} (known: {list(MODELS)})"] if unknown else []) + problems
    if problems:
        print(f"{command}: " + "; ".join(problems), file=sys.stderr)
        return names, 2
    import torch

    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"{command} needs vLLM installed ({exc})", file=sys.stderr)
        return names, 3
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < gpus:
        print(f"{command} needs {gpus} CUDA GPU(s); {visible} visible", file=sys.stderr)
        return names, 3
    return names, None


def main(models: tuple[str, ...] | None = None, kv_dtypes: tuple[str, ...] | None = None,
         modes: tuple[str, ...] | None = None, quick: bool = False, json_path: str | None = None,
         work_dir: str | None = None, time_budget_s: float = 3600) -> int:
    """Exit 0 when every run of this backend is selected, runs, and stays within the bar; 1 when one
    does not; 2 for bad arguments; 3 when there is no GPU or no vLLM."""
    bad_kv = [k for k in (kv_dtypes or ()) if k not in KV_CACHE_DTYPES]
    bad_modes = [m for m in (modes or ()) if m not in MODES]
    names, status = preflight("e2e", models, (
        ([f"unknown kv cache dtypes {bad_kv} (known: {list(KV_CACHE_DTYPES)})"] if bad_kv else [])
        + ([f"unknown modes {bad_modes} (known: {list(MODES)})"] if bad_modes else [])
        + positive_seconds("--time-budget", time_budget_s)))
    if status is not None:
        return status
    import torch
    import vllm

    capability = torch.cuda.get_device_capability()
    device = f"{torch.cuda.get_device_name()} (sm_{capability[0]}{capability[1]}), vLLM {vllm.__version__}"
    out_dir = Path(work_dir or tempfile.mkdtemp(prefix="sparse_mla_e2e_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "runs.jsonl").unlink(missing_ok=True)
    chosen = [MODELS[n] for n in names]
    model_dirs = {m.name: str(write_model(m, out_dir / "models")) for m in chosen}
    runs = plan_runs(chosen, kv_dtypes or KV_CACHE_DTYPES, modes or MODES, capability)
    switches = envs.kernel_switches()
    shown = "".join(f", {k}={v}" for k, v in switches.items())
    print(f"e2e on {device}: {len(runs)} runs, results in {out_dir}{shown}", flush=True)
    t0 = time.perf_counter()
    records = _run_workers(runs, model_dirs, out_dir, quick, time.time() + time_budget_s)
    report = evaluate(runs, records, out_dir)
    report.update(device=device, seconds=round(time.perf_counter() - t0), quick=quick, kernel_switches=switches,
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print_report(report, device)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    print(f"\n{'PASS' if report['passed'] else 'FAIL'}: {sum(r['passed'] for m in report['models'].values() for r in m['rows'])}"
          f"/{sum(len(m['rows']) for m in report['models'].values())} runs of this backend within the bar "
          f"on {device} ({report['seconds']} s)")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    sys.exit(worker_main(parser.parse_args().worker))
