"""tools/phase_clocks.py: parses the measurement build's lines into cycles per tile (CPU only)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

_TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "phase_clocks.py"
_spec = importlib.util.spec_from_file_location("phase_clocks", _TOOL)
phase_clocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(phase_clocks)

LINES = [
    "noise before\n",
    "phase_clocks block 0 warp 0 tiles 10 loop 30000: 1000 2000 12000 3000 9000 2000\n",
    "phase_clocks block 1 warp 0 tiles 20 loop 50000: 4000 2000 24000 2000 14000 2000\n",
    "phase_clocks block 0 warp 1 tiles 10 loop 30000: 1000 500 12000 500 14000 1000\n",
    "phase_clocks block 2 warp 1 tiles 0 loop 12: 0 0 0 0 0 0\n",  # a block without tiles
    "block_clocks block 0 sm 3 start_ns 1000 end_ns 11000 prologue 1000 loop 15000 epilogue 2000 tiles 10\n",
    "block_clocks block 1 sm 4 start_ns 2000 end_ns 22000 prologue 3000 loop 30000 epilogue 3000 tiles 20\n",
    "block_clocks block 2 sm 5 start_ns 2000 end_ns 2000 prologue 5 loop 0 epilogue 5 tiles 0\n",
]


def test_cycles_per_tile_per_warp_and_over_all():
    s = phase_clocks.summarise(phase_clocks.parse(LINES))
    assert s["warp 0"] == pytest.approx([2750, 150, 150, 1200, 200, 800, 150])
    assert s["warp 1"] == pytest.approx([3000, 100, 50, 1200, 50, 1400, 100])
    assert s["all"][0] == pytest.approx((3000 + 2500 + 3000) / 3)
    assert set(s) == {"warp 0", "warp 1", "all"}


def test_whole_blocks_medians_and_implied_clock():
    blocks = phase_clocks.parse_blocks(LINES)
    assert [b["sm"] for b in blocks] == [3, 4, 5]
    s = phase_clocks.summarise_blocks(blocks)
    assert s["prologue"] == 1000 and s["loop"] == 15000 and s["epilogue"] == 2000
    assert s["block ns"] == 10000
    # 18000 cycles in 10000 ns and 36000 in 20000; the block of no time is left out of the clock
    assert s["GHz"] == pytest.approx(1.8)


def test_input_without_clock_lines_is_an_error():
    with pytest.raises(ValueError, match="measurement build"):
        phase_clocks.parse(["DeepSeek-V3.2 H128 T1024 bf16: out finite = True\n"])
    r = subprocess.run([sys.executable, str(_TOOL)], input="nothing\n", capture_output=True, text=True)
    assert r.returncode == 1 and "measurement build" in r.stderr


def test_command_prints_the_table():
    r = subprocess.run([sys.executable, str(_TOOL)], input="".join(LINES), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warp 1" in r.stdout and "3000" in r.stdout
    assert "whole blocks" in r.stdout and "1.800" in r.stdout


PINGPONG_LINES = [
    "phase_clocks block 0 warp 0 tiles 10 loop 20000: 500 3000 100 9000 400 1000\n",
    "phase_clocks block 0 warp 9 tiles 10 loop 20000: 2000 3000 4000 500 9000 0\n",
]


def test_pingpong_build_is_split_by_warp_role():
    roles = phase_clocks.split_roles(phase_clocks.parse(PINGPONG_LINES))
    assert set(roles) == {"S warps", "P V warps"}
    assert phase_clocks.summarise(roles["S warps"])["warp 0"] == pytest.approx([2000, 50, 300, 10, 900, 40, 100])
    assert phase_clocks.summarise(roles["P V warps"])["all"] == pytest.approx([2000, 200, 300, 400, 50, 900, 0])
    r = subprocess.run([sys.executable, str(_TOOL), "--pingpong"], input="".join(PINGPONG_LINES), capture_output=True,
                       text=True, env={**os.environ, "COLUMNS": "200"})  # rich: no wrapped headers
    assert r.returncode == 0, r.stderr
    assert "S warps: cycles per tile" in r.stdout and "P V warps: cycles per tile" in r.stdout
    assert "scores' hand-over" in r.stdout and "softmax + P" in r.stdout
