"""The e2e check's tiny models as real checkpoints (``config.json`` + ``model.safetensors``).

``e2e`` serves its models with ``load_format="dummy"``; ``vllm serve`` and ``serve_check`` need
weights on disk that vLLM 0.33's default loader (``load_format="auto"``) reads without a missing
or an unexpected name. The names are the Hugging Face checkpoint names that these loaders consume:

- ``DeepseekV32ForCausalLM``: ``vllm/models/deepseek_v32/nvidia/model.py``
  (``DeepseekV32Model.load_weights``: ``q_a_proj`` + ``kv_a_proj_with_mqa`` -> ``fused_qkv_a_proj``,
  indexer ``wk`` + ``weights_proj`` -> ``wk_weights_proj``, ``gate_proj`` + ``up_proj`` ->
  ``gate_up_proj``; ``vllm/models/deepseek_v32/attention.py`` for the attention's modules);
- ``Glm5NextForCausalLM``: ``vllm/models/glm5next/common/model.py`` (the same fusions, plus the KDA
  layer's ``q/k/v/b/f_a/g_a_proj`` -> ``in_proj_qkvbfg_a``), ``common/kda.py`` (1-D ``A_log``, conv
  weights ``[dim, 1, kernel]``) and ``common/attention.py`` (the indexer's ``index_kpool_*``).

They were written from that source; ``tests/test_serve_check.py`` builds both models with vLLM
0.33 on the CPU and loads these files through vLLM's ``DefaultModelLoader``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from vllm_sparse_mla_blackwell.e2e import MODELS, realistic_bound, realistic_fill, write_model

WEIGHTS_FILE = "model.safetensors"


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint for ``config`` (an ``e2e`` model config dict), by Hugging Face
    name, with its shape.

    Covers what the tiny configs use: MLA + DSA indexer layers (DeepSeek-V3.2 with RoPE; GLM-5.3
    NoPE with the kpool indexer), GLM's KDA linear-attention layers, dense SwiGLU MLPs, untied
    ``lm_head``. Raises ``ValueError`` for configs with MoE layers, MTP layers, tied embeddings or
    GLM's hyper-connections (``mhc``), which these files do not write.
    """
    h, vocab, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    glm = config["model_type"] == "glm5_next"
    if glm:
        moe = [i for i, t in enumerate(config["mlp_layer_types"]) if t != "dense"]
    else:
        moe = [i for i in range(layers) if i >= config["first_k_dense_replace"]]
    unsupported = ([f"MoE layers {moe}"] if moe and config.get("n_routed_experts") else []) + \
        (["MTP layers"] if config.get("num_nextn_predict_layers") else []) + \
        (["tied embeddings"] if config.get("tie_word_embeddings") else []) + \
        (["mhc"] if config.get("mhc") else [])
    if unsupported:
        raise ValueError(f"checkpoint: not supported in this config: {', '.join(unsupported)}")
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (config["intermediate_size"], h),
            p + "mlp.up_proj.weight": (config["intermediate_size"], h),
            p + "mlp.down_proj.weight": (h, config["intermediate_size"]),
        })
        kda = glm and config["layer_types"][i] == "linear_attention"
        shapes.update(_kda(config, p + "self_attn.") if kda else _mla(config, p + "self_attn."))
    return shapes


def _mla(c: dict, p: str) -> dict[str, tuple[int, ...]]:
    h, n, q_lora, kv_lora = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ih, idim = c["index_n_heads"], c["index_head_dim"]
    out = {
        p + "q_a_proj.weight": (q_lora, h),
        p + "q_a_layernorm.weight": (q_lora,),
        p + "q_b_proj.weight": (n * (nope + rope), q_lora),
        # NoPE checkpoints have no RoPE rows here (GLM's loader pads them when rope > 0).
        p + "kv_a_proj_with_mqa.weight": (kv_lora + rope, h),
        p + "kv_a_layernorm.weight": (kv_lora,),
        p + "kv_b_proj.weight": (n * (nope + v), kv_lora),
        p + "o_proj.weight": (h, n * v),
        p + "indexer.wq_b.weight": (ih * idim, q_lora),
        p + "indexer.wk.weight": (idim, h),
        p + "indexer.k_norm.weight": (idim,),
        p + "indexer.k_norm.bias": (idim,),
        p + "indexer.weights_proj.weight": (ih, h),
    }
    if c.get("index_kpool"):
        out[p + "indexer.index_kpool_compress_ape"] = (c["index_kpool"], idim)
        out[p + "indexer.index_kpool_compress_gate"] = (idim, h)
    return out


def _kda(c: dict, p: str) -> dict[str, tuple[int, ...]]:
    h, heads, dim, kernel = c["hidden_size"], c["linear_num_heads"], c["linear_head_dim"], c["linear_conv_kernel_dim"]
    proj = heads * dim
    out = {p + f"{x}_proj.weight": (proj, h) for x in "qkv"}
    out.update({f"{p}{x}_conv1d.weight": (proj, 1, kernel) for x in "qkv"})
    out.update({
        p + "b_proj.weight": (heads, h),
        p + "f_a_proj.weight": (dim, h),
        p + "g_a_proj.weight": (dim, h),
        p + "f_b_proj.weight": (proj, dim),
        p + "g_b_proj.weight": (proj, dim),
        p + "dt_bias": (proj,),
        p + "A_log": (heads,),
        p + "o_norm.weight": (dim,),
        p + "o_proj.weight": (h, proj),
    })
    return out


def init_bound(name: str, shape: tuple[int, ...]) -> float | None:
    """The realistic scale of ``e2e._install_realistic_dummy_weights``: tensors of two or more
    dimensions uniform in ``+-e2e.realistic_bound``; 1-D ``*weight`` / ``*bias`` constant
    (``e2e.realistic_fill``; returns ``None`` for both); other 1-D tensors (``A_log``, which vLLM
    holds as ``[1, 1, heads, 1]``, so e2e draws it with fan-in 1) uniform in ``+-sqrt(3)``."""
    if len(shape) >= 2:
        return realistic_bound(shape)
    return None if realistic_fill(name, shape) is not None else realistic_bound((1,))


def tensor_seed(name: str) -> int:
    """The per-tensor seed: CRC-32 of the name, so a tensor's values do not depend on the others."""
    return zlib.crc32(name.encode())


def make_tensors(config: dict, dtype: str) -> dict:
    """``{name: tensor}`` for ``config`` in ``dtype`` (``"bfloat16"`` / ``"float16"``; every tensor,
    norms and fp32-held parameters too, is stored in it), CPU, contiguous, drawn in fp32 with
    ``torch.Generator().manual_seed(tensor_seed(name))`` at ``init_bound``'s scale."""
    import torch

    out = {}
    for name, shape in tensor_shapes(config).items():
        bound = init_bound(name, shape)
        if bound is None:
            t = torch.full(shape, realistic_fill(name, shape))
        else:
            gen = torch.Generator().manual_seed(tensor_seed(name))
            t = (torch.rand(shape, generator=gen) * 2 - 1) * bound
        out[name] = t.to(getattr(torch, dtype)).contiguous()
    return out


def save_checkpoint(model_name: str, root) -> Path:
    """Write ``root/<model_name>/config.json`` (as ``e2e.write_model``) and
    ``root/<model_name>/model.safetensors`` (``make_tensors`` of that config in the model's dtype,
    bf16 or fp16; safetensors metadata ``{"format": "pt"}``) and return the directory.

    ``model_name``: a key of ``e2e.MODELS`` (case-insensitive). Deterministic: the same name gives
    the same bytes. Raises ``ValueError`` for an unknown name; ``OSError`` from writing.
    Sizes: about 72 MB (DeepSeek-V3.2, bf16 or fp16) and 128 MB (GLM-5.3-Flash).
    """
    from safetensors.torch import save_file

    model = MODELS.get(model_name.lower())
    if model is None:
        raise ValueError(f"unknown model {model_name!r} (known: {list(MODELS)})")
    path = write_model(model, Path(root))
    save_file(make_tensors(model.config(), model.dtype), str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    return path
