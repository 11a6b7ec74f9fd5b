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


def test_decodes_a_real_instruction():
    # An index load of main's sm_90 build as cuobjdump 13.0 prints it: write scoreboard 5, read 2.
    sass = ("\tarch = sm_90\n\t\tFunction : _ZN10sparse_mla21sparse_mla_fwd_kernelEv\n"
            "        /*20b0*/              @!P6 LDG.E.CONSTANT R39, desc[UR8][R108.64] ;  /* 0x000000086c27e981 */\n"
            "                                                                             /* 0x000562000c1e9900 */\n")
    (arch, name, instructions), = sass_waits.kernels(sass)
    assert (arch, name) == ("sm_90", "_ZN10sparse_mla21sparse_mla_fwd_kernelEv")
    address, text, control = instructions[0]
    assert (address, text) == (0x20B0, "@!P6 LDG.E.CONSTANT R39, desc[UR8][R108.64]")
    assert (control & 15, (control >> 5) & 7, (control >> 8) & 7, (control >> 11) & 0x3F) == (1, 5, 2, 0)
    assert sass_waits.opcode(text) == "LDG.E.CONSTANT"


def test_reports_an_mma_waiting_on_the_loop_s_next_load():
    # The tile loop's shape on main: the first S MMA waits on scoreboard 5, which the index load
    # at the loop's end sets for the next trip (and its LDSM on 2).
    body = (_line(0x10, "BAR.SYNC.DEFER_BLOCKING 0x0")
            + _line(0x20, "LDSM.16.M88.4 R172, [R194+0x4100]", write_sb=2)
            + _line(0x30, "HMMA.16816.F32.BF16 R124, R56, R172, RZ", wait=(2, 5))
            + _line(0x40, "HMMA.16816.F32.BF16 R120, R28, R164, RZ", wait=(2,))
            + _line(0x50, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", write_sb=5)
            + _line(0x60, "@P0 BRA 0x10"))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.loops(instructions) == [(0, 5)]
    assert sass_waits.mma_waits_on_loads(instructions) == [(0x30, "HMMA.16816.F32.BF16 R124, R56, R172, RZ", 5)]


def test_a_wait_on_a_load_before_the_loop_is_not_reported():
    body = (_line(0x10, "LDG.E.CONSTANT R56, desc[UR8][R24.64]", write_sb=5)
            + _line(0x20, "LDSM.16.M88.4 R172, [R194+0x4100]", write_sb=2)
            + _line(0x30, "HMMA.16816.F32.BF16 R124, R56, R172, RZ", wait=(2, 5))
            + _line(0x40, "@P0 BRA 0x20"))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.mma_waits_on_loads(instructions) == []


def test_a_scoreboard_reused_by_a_shared_load_is_not_reported():
    body = (_line(0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", write_sb=5)
            + _line(0x20, "LDSM.16.M88.4 R172, [R194+0x4100]", write_sb=5)
            + _line(0x30, "@P0 HMMA.16816.F32 R124, R56, R172, RZ", wait=(5,))
            + _line(0x40, "BRA 0x10"))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.mma_waits_on_loads(instructions) == []


def test_a_wait_on_a_load_releasing_its_address_registers_is_not_reported():
    body = (_line(0x10, "LDG.E.CONSTANT R6, desc[UR8][R24.64]", write_sb=5, read_sb=2)
            + _line(0x20, "HMMA.16816.F32 R24, R56, R172, RZ", wait=(2,))
            + _line(0x30, "BRA 0x10"))
    (_, _, instructions), = sass_waits.kernels(_sass(body))
    assert sass_waits.mma_waits_on_loads(instructions) == []


def test_loops_closed_by_a_uniform_predicate_branch():
    # sm_120a's tile loops close with "BRA.U !UP0, target"; "@!P0 BRA !P2, target" has a predicate operand too.
    body = [(0x00, "NOP", 0), (0x10, "HMMA.16816.F32 R0, R4, R8, R0", 0), (0x20, "BRA.U !UP0, 0x10", 0),
            (0x30, "@!P0 BRA !P2, 0x0", 0), (0x40, "BRA 0x40", 0)]
    assert sass_waits.loops(body) == [(1, 2), (0, 3)]
