"""bench/ncu_stalls.py: stall samples and shared-memory wavefronts from an ncu source page (CPU only)."""

from __future__ import annotations

import csv
import importlib.util
import pathlib
import subprocess
import sys

import pytest

_TOOL = pathlib.Path(__file__).resolve().parent.parent / "bench" / "ncu_stalls.py"
_spec = importlib.util.spec_from_file_location("ncu_stalls", _TOOL)
ncu_stalls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_stalls)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_short_sb", "stall_wait",
          "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared"]
ROWS = [
    ["0x10", "      LDSM.16.M88.4 R4, [R2]", "10", "8", "2", "0", "4,000"],
    ["0x20", "      LDSM.16.MT88.4 R8, [R2+0x40]", "5", "5", "0", "0", "2,000"],
    ["0x30", "      STS [R3+0x100], R1", "1", "0", "1", "500", "1,000"],
    ["0x40", "  @P0 STS.64 [R3], R6", "0", "0", "0", "0", "1,000"],
    ["0x50", "      HMMA.16816.F32.BF16 R8, R4, R6, R8", "20", "0", "20", "0", "0"],
]


def _page(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "rep.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "sparse_mla_fwd_kernel"])
        w.writerow(HEADER)
        w.writerows(ROWS)
    return path


def test_shared_wavefronts_by_opcode_keep_the_width_and_transpose():
    total, excess, conflicted = ncu_stalls.shared_wavefronts(HEADER, ROWS)
    assert dict(total) == {"LDSM.16.M88": 4000, "LDSM.16.MT88": 2000, "STS": 1000, "STS.64": 1000}
    assert dict(excess) == {"LDSM.16.M88": 0, "LDSM.16.MT88": 0, "STS": 500, "STS.64": 0}
    assert conflicted == [(500, 1000, "STS [R3+0x100], R1")]


def test_shared_wavefronts_read_blank_cells_and_short_rows_as_zero():
    rows = [
        ["0x10", "  @!P1 LDS.U.128 R4, [R2]", "", "", "", "-", "300"],
        ["0x20", "      STSM.16.MT88.4 [R2], R4", "", "", "", "", "100"],
        ["0x30", "      LDSM.16.M88.4 R4, [R2]", "", "", ""],  # ends before both columns
        ["0x40", "      EXIT"],
    ]
    total, excess, conflicted = ncu_stalls.shared_wavefronts(HEADER, rows)
    assert dict(total) == {"LDS.128": 300, "STSM.16.MT88": 100}
    assert sum(excess.values()) == 0 and conflicted == []


@pytest.mark.parametrize(
    "header, row, message",
    [
        (HEADER[:5], ROWS[0][:5], "no 'L1 Wavefronts Shared' column"),
        (HEADER[:6], ROWS[0][:6], "no 'L1 Wavefronts Shared' column"),
        (HEADER[:5] + HEADER[6:], ROWS[0][:5] + ROWS[0][6:], "no 'L1 Wavefronts Shared Excessive' column"),
        (HEADER, ["0x10", "STS [R3], R1", "0", "0", "0", "0", "1.000.000"], "row 1, column 'L1 Wavefronts Shared': cannot read"),
        (HEADER, ["0x10", "STS [R3], R1", "0", "0", "0", "0", "nan"], "cannot read 'nan'"),
        (HEADER, ["0x10", "STS [R3], R1", "0", "0", "0", "200", "100"], "200 excessive of 100"),
        (["Address", "Instruction"], ["0x10", "STS [R3], R1"], "no 'Source' column"),
    ],
)
def test_shared_wavefronts_refuse_what_they_cannot_count(header, row, message):
    with pytest.raises(SystemExit, match=message):
        ncu_stalls.shared_wavefronts(header, [row])


def test_command_line_refuses_two_kernels(tmp_path):
    path = tmp_path / "two.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for name in ("kernel_a", "kernel_b"):  # two kernels under one header row
            w.writerow(["Kernel Name", name])
            if name == "kernel_a":
                w.writerow(HEADER)
            w.writerows(ROWS)
    run = subprocess.run([sys.executable, str(_TOOL), "--shared", str(path)], capture_output=True, text=True)
    assert run.returncode == 1 and "2 kernels" in run.stderr


def test_command_line_prints_shares_and_stalls(tmp_path):
    page = _page(tmp_path)
    shared = subprocess.run([sys.executable, str(_TOOL), "--shared", str(page)], capture_output=True, text=True, check=True)
    assert "shared wavefronts 8000, excessive 500 (6.2 %)" in shared.stdout
    assert "LDSM.16.M88    50.0 %" in shared.stdout
    stalls = subprocess.run([sys.executable, str(_TOOL), str(page)], capture_output=True, text=True, check=True)
    assert "Warp Stall Sampling (All Samples): 36 samples" in stalls.stdout
    assert "HMMA        55.6 %" in stalls.stdout
    assert "by reason: wait 63.9 %, short_sb 36.1 %" in stalls.stdout
