"""The CUDA kernels' own source run on a CPU (cuda_emulation.h, runtime.cpp): ``build`` compiles
the emulator library with CMake (target ``sparse_mla_emulator``, a host build of every kernel
configuration), ``Emulator.forward`` runs the forward on CPU tensors through the same argument
checks as the GPU op, with the kernel variant, split and combine layout chosen by the caller;
``Emulator.concat_and_cache`` the cache writer.
Slow (each CUDA thread a fiber): cases of a few tokens and tiles."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
import threading

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = "libsparse_mla_emulator.so"
# params.h FwdVariant
VARIANTS = {"main": 0, "one_stage": 1, "decoded_fp8": 2, "paired_scores": 3, "e4m3_pv": 4}
# runtime.h emu::Schedule: the order in which a block's warps go on between barriers.
SCHEDULES = {"lockstep": 0, "warps_ahead": 1, "warps_ahead_reversed": 2}
# api.h ScalarType
_SCALAR_TYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.int32: 3, torch.int64: 4,
                 torch.uint8: 5, torch.float8_e4m3fn: 6}


# The emulator runs one launch at a time: its block state and shared memory are global.
_LOCK = threading.Lock()


class EmulationError(RuntimeError):
    """What the emulation found wrong (a hang, lanes that disagree, copies in flight at exit) or
    a bad argument, with the C++ side's message."""


def nvcc() -> str | None:
    """The CUDA toolkit's nvcc (CMake needs it to configure the project), or None."""
    found = shutil.which("nvcc")
    return found or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def unavailable() -> str | None:
    """Why the emulator cannot be built here (a pytest skip reason), or None."""
    if nvcc() is None or shutil.which("cmake") is None:
        return "needs CMake and the CUDA toolkit (its headers; nvcc configures the project)"
    return None


def build(build_dir: pathlib.Path, jobs: int = 2, root: pathlib.Path = ROOT,
          target: str = "sparse_mla_emulator") -> pathlib.Path:
    """Configures the project at ``root`` (this checkout, or a copy with a change applied) in
    ``build_dir`` (tests on, no torch module) and builds ``target``: the emulator library (its
    path returned), or ``sparse_mla_race_check`` (the same kernels under ThreadSanitizer, a
    program: tests/emulation/race_check.cpp; its path returned). Raises
    subprocess.CalledProcessError with CMake's output."""
    env = dict(os.environ)
    env.setdefault("CUDACXX", nvcc() or "nvcc")
    for cmd in (["cmake", "-S", str(root), "-B", str(build_dir), "-DSPARSE_MLA_BUILD_TESTS=ON",
                 "-DSPARSE_MLA_BUILD_TORCH=OFF", "-DGLM53_ARCHS=80", "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)]):
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise subprocess.CalledProcessError(run.returncode, cmd, run.stdout[-4000:], run.stderr[-4000:])
    return build_dir / (LIBRARY if target == "sparse_mla_emulator" else target)


class _Tensor(ctypes.Structure):
    _fields_ = [("defined", ctypes.c_int32), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("dim", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4), ("element_size", ctypes.c_int64)]


class _FwdArgs(ctypes.Structure):
    _fields_ = [(name, _Tensor) for name in ("q", "q_pe", "kv_cache", "indices", "topk_len", "k_scale", "out", "lse")] + [
        ("sm_scale", ctypes.c_double), ("topk", ctypes.c_int64), ("kv_cache_dtype", ctypes.c_char_p),
        ("block_heads", ctypes.c_int64), ("variant", ctypes.c_int32), ("num_splits", ctypes.c_int32),
        ("combine_split_groups", ctypes.c_int32), ("schedule", ctypes.c_int32)]


class _CacheArgs(ctypes.Structure):
    _fields_ = [(name, _Tensor) for name in ("kv_c", "k_pe", "kv_cache", "slot_mapping", "k_scale")] + [
        ("kv_cache_dtype", ctypes.c_char_p), ("schedule", ctypes.c_int32)]


def _named(table: dict[str, int], name: str, what: str) -> int:
    if name not in table:
        raise EmulationError(f"{what} must be one of {', '.join(table)}, got {name!r}")
    return table[name]


def _describe(t: torch.Tensor | None) -> _Tensor:
    d = _Tensor()
    if t is None:
        return d
    d.defined = 1
    if t.device.type != "cpu" or t.dim() > 4:
        raise ValueError(f"the emulator takes CPU tensors of at most 4 dims, got {t.device} {tuple(t.shape)}")
    d.data = t.data_ptr()
    d.dtype = _SCALAR_TYPES.get(t.dtype, 7)
    d.dim = t.dim()
    for i in range(t.dim()):
        d.sizes[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    d.element_size = t.element_size()
    return d


class Emulator:
    def __init__(self, library: pathlib.Path):
        self._lib = ctypes.CDLL(str(library))
        self._lib.sparse_mla_emulate_fwd.argtypes = [ctypes.POINTER(_FwdArgs), ctypes.c_char_p, ctypes.c_int]
        self._lib.sparse_mla_emulate_concat_and_cache.argtypes = [ctypes.POINTER(_CacheArgs), ctypes.c_char_p,
                                                                  ctypes.c_int]
        for entry in (self._lib.sparse_mla_emulate_fwd, self._lib.sparse_mla_emulate_concat_and_cache):
            entry.restype = ctypes.c_int

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, *, sm_scale: float, kv_cache_dtype: str, q_pe: torch.Tensor | None = None,
                topk_len: torch.Tensor | None = None, k_scale: torch.Tensor | None = None, topk: int = -1,
                block_heads: int = 0, variant: str = "main", num_splits: int = 1,
                combine_split_groups: int = 1, schedule: str = "lockstep") -> None:
        """The sparse-MLA forward into ``out`` [T, H, 512] (q's dtype) and ``lse`` [T, H] fp32,
        on CPU tensors laid out as for the GPU op (``ops.sparse_mla_fwd``). ``variant``: a key of
        VARIANTS the configuration has; ``num_splits`` > 1 splits the top-k axis into that many
        ranges of whole tiles and runs the combine kernel in ``combine_split_groups`` (1 or 4)
        groups. ``schedule``: a key of SCHEDULES. Raises EmulationError."""
        args = _FwdArgs()
        tensors = dict(q=q, q_pe=q_pe, kv_cache=kv_cache, indices=indices, topk_len=topk_len, k_scale=k_scale,
                       out=out, lse=lse)
        for name, t in tensors.items():
            setattr(args, name, _describe(t))
        args.sm_scale = sm_scale
        args.topk = topk
        args.kv_cache_dtype = kv_cache_dtype.encode()
        args.block_heads = block_heads
        args.variant = _named(VARIANTS, variant, "variant")
        args.num_splits = num_splits
        args.combine_split_groups = combine_split_groups
        args.schedule = _named(SCHEDULES, schedule, "schedule")
        self._call(self._lib.sparse_mla_emulate_fwd, args)

    def run_case(self, case, **launch):
        """verify's inputs of ``case`` (``cases.make_inputs`` on the CPU: NaN-poisoned out and
        unreferenced rows) through ``forward``; returns ``(inputs, lse)``, out written into
        ``inputs.out`` [T, H, 512] and lse [T, H] fp32. ``launch``: forward's ``variant``,
        ``num_splits``, ``combine_split_groups``, ``schedule``. Raises EmulationError."""
        from vllm_sparse_mla_blackwell import cases

        inputs = cases.make_inputs(case, "cpu")
        lse = torch.full((case.num_tokens, case.num_heads), float("nan"))
        self.forward(inputs.q, inputs.kv_cache, inputs.indices, inputs.out, lse, sm_scale=case.sm_scale,
                     kv_cache_dtype=inputs.kv_cache_dtype, q_pe=inputs.q_pe, topk_len=inputs.topk_len,
                     k_scale=inputs.k_scale, topk=case.topk, block_heads=case.block_heads or 0, **launch)
        return inputs, lse

    def concat_and_cache(self, kv_c: torch.Tensor, k_pe: torch.Tensor | None, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor | None = None,
                         *, schedule: str = "lockstep") -> None:
        """The cache writer (``ops.concat_and_cache_sparse_mla``'s kernel) on CPU tensors: kv_c
        ``[T, 512]``, k_pe ``[T, 64]`` or None, the cache ``[num_blocks, block_size, W]`` or
        ``[num_rows, W]`` written in place, slot_mapping int64 ``[T]`` (-1 and slots outside the
        cache skipped). Raises EmulationError."""
        args = _CacheArgs()
        for name, t in dict(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping,
                            k_scale=k_scale).items():
            setattr(args, name, _describe(t))
        args.kv_cache_dtype = kv_cache_dtype.encode()
        args.schedule = _named(SCHEDULES, schedule, "schedule")
        self._call(self._lib.sparse_mla_emulate_concat_and_cache, args)

    @staticmethod
    def _call(entry, args) -> None:
        error = ctypes.create_string_buffer(4096)
        with _LOCK:
            rc = entry(ctypes.byref(args), error, len(error))
        if rc != 0:
            raise EmulationError(error.value.decode(errors="replace"))
