"""tools/sass_waits.py: the SASS control bits it decodes and the waits it reports (CPU only)."""

from __future__ import annotations

import importlib.util
import pathlib

_TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "sass_waits.py"
_spec = importlib.util.spec_from_file_location("sass_waits", _TOOL)
sass_waits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_waits)


def _line(address: int, text: str, write_sb: int = 7, read_sb: int = 7, wait: tuple[int, ...] = ()) -> str:
    """One instruction as cuobjdump -sass prints it: two lines, the control bits in the high word."""
    control = 1 | (write_sb << 5) | (read_sb << 8) | (sum(1 << s for s in wait) << 11)
    high = (control << 41) | 0x000FE2
    return (f"        /*{address:04x}*/                   {text} ;   /* 0x0000000000007919 */\n"
            f"                                                          /* 0x{high:016x} */\n")


def _sass(body: str) -> str:
    return ("\n\tcode for sm_90\n\t\tFunction : _ZN10sparse_mla21sparse_mla_fwd_kernelEv\n"
            "\t.headerflags\t@\"EF_CUDA_SM90\"\n" + body)


def test_decodes_control_bits():
    (arch, name, instructions), = sass_waits.kernels(_sass(_line(0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", 5, 2)))
    assert name == "_ZN10sparse_mla21sparse_mla_fwd_kernelEv"
    address, text, control = instructions[0]
    assert (address, text) == (0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]")
    assert (control >> 5) & 7 == 5 and (control >> 8) & 7 == 2 and (control >> 11) & 0x3F == 0


def test_reports_an_mma_waiting_on_a_load_it_does_not_read():
    body = (_line(0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", write_sb=5)
            + _line(0x20, "LDSM.16.M88.4 R172, [R194+0x4100]", write_sb=2)
            + _line(0x30, "HMMA.16816.F32.BF16 R124, R56, R172, RZ", wait=(2, 5))
            + _line(0x40, "HMMA.16816.F32.BF16 R120, R28, R164, RZ", wait=(2,)))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.mma_waits_on_loads(instructions) == [(0x30, "HMMA.16816.F32.BF16 R124, R56, R172, RZ", 5)]


def test_a_scoreboard_reused_by_a_shared_load_is_not_reported():
    body = (_line(0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", write_sb=5)
            + _line(0x20, "LDSM.16.M88.4 R172, [R194+0x4100]", write_sb=5)
            + _line(0x30, "@P0 HMMA.16816.F32 R124, R56, R172, RZ", wait=(5,)))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.mma_waits_on_loads(instructions) == []
