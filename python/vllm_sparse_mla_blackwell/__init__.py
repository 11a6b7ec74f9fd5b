"""vLLM sparse-MLA attention for consumer Blackwell (sm_120/121), Ampere, Ada and Hopper.

The kernel library lives in ``csrc/``; ``ops`` wraps its PyTorch ops, ``reference`` is the fp32
reference, ``backend`` the vLLM attention backend, ``moe_fix`` the NVFP4 MoE input-scale fix,
``e2e`` the end-to-end check in vLLM and ``cli`` the ``verify`` / ``bench`` / ``e2e`` command line
(``python -m vllm_sparse_mla_blackwell``).
"""

__version__ = "0.1.0"
