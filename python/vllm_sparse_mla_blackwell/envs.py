"""The environment variables this package reads (one place, imported by the plugin entry points,
the MoE fix and the end-to-end check; importing it costs nothing)."""

import os

#: ``1``: register the sparse-MLA attention backend and make it vLLM's first choice for sparse MLA.
SPARSE_MLA_ENV = "VLLM_GLM53_CUDA_SPARSE_MLA"
#: ``<positive float>``: the NVFP4 MoE activation input scale a checkpoint does not provide.
MOE_INPUT_SCALE_ENV = "VLLM_GLM53_MOE_INPUT_SCALE"
#: ``1``: fp8_ds_mla launches run P V on e4m3 MMAs where they can (a measuring option, docs/kernel.md).
E4M3_PV_ENV = "SPARSE_MLA_E4M3_PV"


def flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a value starting with ``1``: the rule by
    which the kernel library reads its own switches (``SPARSE_MLA_*``, csrc/sparse_mla)."""
    return os.environ.get(name, "")[:1] == "1"


def kernel_switches() -> dict[str, str]:
    """The kernel library's switches (``SPARSE_MLA_*``) set in this process's environment, by name,
    so that a measurement can record which kernels it ran (e.g. ``{"SPARSE_MLA_E4M3_PV": "1"}``)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPARSE_MLA_")}
