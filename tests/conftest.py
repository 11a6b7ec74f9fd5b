"""Shared pytest setup: tests marked ``gpu`` skip cleanly when no CUDA device is visible; a
one-process vLLM world for the vLLM tests."""

import os
import tempfile

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    """The kernel emulation (tests/emulation), built once per session."""
    import emulation

    if emulation.unavailable():
        pytest.skip(emulation.unavailable())
    return emulation.Emulator(emulation.build(tmp_path_factory.mktemp("emulator")))


@pytest.fixture
def same_package_env():
    """``env(**extra)``: this process's environment plus ``extra``, with PYTHONPATH leading first
    to the copy of the package this process imported, so that a subprocess tests the same code."""
    from vllm_sparse_mla_blackwell import ops

    root = os.path.dirname(os.path.dirname(ops.__file__))

    def env(**extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), **extra}

    return env


@pytest.fixture(scope="module")
def cpu_vllm_config():
    """A ``VllmConfig`` on the CPU, with a one-rank gloo world and TP = PP = 1 around it (vLLM's
    layers and parameters read the TP rank). Tears down only what it started."""
    pytest.importorskip("vllm")
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    started = False
    with set_current_vllm_config(config):
        if not torch.distributed.is_initialized():
            fd, path = tempfile.mkstemp(prefix="vllm_dist_")
            os.close(fd)
            os.unlink(path)  # the file store creates it
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                            distributed_init_method=f"file://{path}", backend="gloo")
            started = True
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(1, 1)
    yield config
    if started:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
