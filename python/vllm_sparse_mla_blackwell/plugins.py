"""vLLM ``general_plugins`` entry points (see ``pyproject.toml``).

vLLM calls every ``vllm.general_plugins`` entry point in every process it starts
(``vllm.plugins.load_general_plugins``). Each function here is therefore idempotent and
does nothing unless its environment variable is set; the heavy imports happen only then.
"""

from __future__ import annotations

import os

SPARSE_MLA_ENV = "VLLM_GLM53_CUDA_SPARSE_MLA"
MOE_INPUT_SCALE_ENV = "VLLM_GLM53_MOE_INPUT_SCALE"


def register_sparse_mla_backend() -> None:
    """Register the CUDA sparse-MLA attention backend when ``VLLM_GLM53_CUDA_SPARSE_MLA=1``."""
    if os.environ.get(SPARSE_MLA_ENV, "0") not in ("1", "true", "True"):
        return
    from vllm_sparse_mla_blackwell import backend

    backend.register()


def register_moe_input_scale_fix() -> None:
    """Install the NVFP4 MoE input-scale fix when ``VLLM_GLM53_MOE_INPUT_SCALE`` is set."""
    value = os.environ.get(MOE_INPUT_SCALE_ENV)
    if value is None or value == "":
        return
    from vllm_sparse_mla_blackwell import moe_fix

    moe_fix.register(value)
