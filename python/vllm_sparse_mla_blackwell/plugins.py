"""vLLM ``general_plugins`` entry points (see ``pyproject.toml``).

vLLM calls every ``vllm.general_plugins`` entry point in every process it starts
(``vllm.plugins.load_general_plugins``). Each function here is therefore idempotent and
does nothing unless its environment variable is set; the heavy imports happen only then.
"""

from __future__ import annotations

import logging
import os

from vllm_sparse_mla_blackwell.envs import MOE_INPUT_SCALE_ENV, SPARSE_MLA_ENV

#: The oldest vLLM release the backend is written and tested against.
MIN_VLLM_VERSION = "0.33.0"
#: How the one error line about an unusable backend begins (the serve check looks for it).
IGNORED_MESSAGE = f"vllm_sparse_mla_blackwell: {SPARSE_MLA_ENV}=1 is ignored"

_BACKEND_ERROR_LOGGED = False


def register_sparse_mla_backend() -> None:
    """Register the CUDA sparse-MLA attention backend when ``VLLM_GLM53_CUDA_SPARSE_MLA=1``.

    Never stops vLLM from starting: where the running vLLM cannot host the backend (an older
    release lacks the sparse-MLA base classes it builds on), one error line names the vLLM
    version needed, once per process, and vLLM's own backend choice is left unchanged.
    """
    global _BACKEND_ERROR_LOGGED
    if SPARSE_MLA_ENV in os.environ:  # set at all, "0" included: vLLM checks every VLLM_* name
        _declare_to_vllm(SPARSE_MLA_ENV)
    if os.environ.get(SPARSE_MLA_ENV, "0") not in ("1", "true", "True"):
        return
    try:
        from vllm_sparse_mla_blackwell import backend

        backend.register()
    except Exception as exc:  # noqa: BLE001 - any failure here must leave vLLM running
        if not _BACKEND_ERROR_LOGGED:
            _BACKEND_ERROR_LOGGED = True
            version = _vllm_version()
            too_old = isinstance(exc, ImportError) and version is not None and _older(version, MIN_VLLM_VERSION)
            # vLLM's logger (its handler and format).
            logging.getLogger("vllm").error(
                "%s: %s (%s: %s). vLLM's own attention backend choice is unchanged.",
                IGNORED_MESSAGE,
                f"this vLLM ({version}) cannot host the sparse-MLA backend; it needs vLLM >= "
                f"{MIN_VLLM_VERSION}" if too_old else f"the sparse-MLA backend failed to load on vLLM {version}",
                type(exc).__name__,
                exc,
            )


def _declare_to_vllm(name: str) -> None:
    """Add ``name`` to vLLM's table of its environment variables (``vllm.envs.environment_variables``),
    which its check of ``VLLM_*`` variables reads (``Platform.validate_environ``): else every
    process warns "Unknown vLLM environment variable", and ``--fail-on-environ-validation``
    refuses to start. A declared variable also enters vLLM's compile-cache key
    (``envs.compile_factors``): a change of backend gets its own compiled graphs. Idempotent;
    never raises."""
    try:
        from vllm import envs

        envs.environment_variables.setdefault(name, lambda: os.environ.get(name))
    except Exception:  # noqa: BLE001 - an older or newer vLLM without the table: only the warning stays
        pass


def _vllm_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001
        return None


def _older(version: str, than: str) -> bool:
    """``version < than`` by release numbers (``0.26.0`` < ``0.33.0``; dev/local suffixes ignored;
    False for a version string that is not PEP 440)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release < Version(than).release
    except InvalidVersion:
        return False


def register_moe_input_scale_fix() -> None:
    """Install the NVFP4 MoE input-scale fix when ``VLLM_GLM53_MOE_INPUT_SCALE`` is set."""
    value = os.environ.get(MOE_INPUT_SCALE_ENV)
    if value is not None:  # set at all, empty included: vLLM checks every VLLM_* name
        _declare_to_vllm(MOE_INPUT_SCALE_ENV)
    if value is None or value == "":
        return
    from vllm_sparse_mla_blackwell import moe_fix

    moe_fix.register(value)
