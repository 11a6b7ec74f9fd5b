"""tools/bitwise_ab.py cmp: equal folders pass, one flipped bit or a missing launch fails; save's
folder and q dtype (CPU only)."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

_TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "bitwise_ab.py"
_spec = importlib.util.spec_from_file_location("bitwise_ab", _TOOL)
bitwise_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bitwise_ab)


def _write(folder: pathlib.Path, name: str, out: torch.Tensor, lse: torch.Tensor) -> None:
    folder.mkdir(exist_ok=True)
    torch.save((out, lse), folder / name)


def _launch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = torch.randn(3, 4, 512, generator=g).to(torch.bfloat16)
    lse = torch.randn(3, 4, generator=g)
    out[0, 0, :7] = float("nan")  # poisoned or masked values compare by their bits
    lse[1, 2] = float("-inf")
    return out, lse


def test_identical_folders_pass(tmp_path, capsys):
    out, lse = _launch()
    _write(tmp_path / "a", "x.pt", out, lse)
    _write(tmp_path / "b", "x.pt", out.clone(), lse.clone())
    assert bitwise_ab.cmp(str(tmp_path / "a"), str(tmp_path / "b")) == 0
    assert "bitwise identical: 1/1 launches" in capsys.readouterr().out


def test_one_flipped_bit_fails(tmp_path, capsys):
    out, lse = _launch()
    flipped = out.clone()
    flipped.view(torch.int16)[2, 3, 100] ^= 1  # the last mantissa bit of one value
    _write(tmp_path / "a", "x.pt", out, lse)
    _write(tmp_path / "b", "x.pt", flipped, lse)
    assert bitwise_ab.cmp(str(tmp_path / "a"), str(tmp_path / "b")) == 1
    printed = capsys.readouterr().out
    assert "differs: x.pt" in printed and "bitwise identical: 0/1 launches" in printed


def test_lse_difference_fails(tmp_path):
    out, lse = _launch()
    _write(tmp_path / "a", "x.pt", out, lse)
    _write(tmp_path / "b", "x.pt", out, torch.nextafter(lse, torch.full_like(lse, 1e9)))
    assert bitwise_ab.cmp(str(tmp_path / "a"), str(tmp_path / "b")) == 1


def test_missing_launch_fails(tmp_path, capsys):
    out, lse = _launch()
    _write(tmp_path / "a", "x.pt", out, lse)
    _write(tmp_path / "a", "y.pt", out, lse)
    _write(tmp_path / "b", "x.pt", out, lse)
    assert bitwise_ab.cmp(str(tmp_path / "a"), str(tmp_path / "b")) == 1
    assert "y.pt" in capsys.readouterr().out


def test_fresh_folder_removes_earlier_launches_only(tmp_path):
    out, lse = _launch()
    _write(tmp_path / "a", "bf16_D512_H16_T1.pt", out, lse)
    (tmp_path / "a" / "notes.txt").write_text("kept")
    bitwise_ab.fresh_folder(str(tmp_path / "a"))
    bitwise_ab.fresh_folder(str(tmp_path / "new"))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["notes.txt"]
    assert (tmp_path / "new").is_dir()


def test_q_dtype_follows_the_cache_unless_given():
    assert [bitwise_ab.q_dtype_for(kv, None) for kv in bitwise_ab.KV_DTYPES] == ["bf16", "fp16", "bf16", "bf16"]
    assert [bitwise_ab.q_dtype_for(kv, "fp16") for kv in bitwise_ab.KV_DTYPES] == ["fp16"] * 4
    assert bitwise_ab.q_dtype_for("fp16", "bf16") == "bf16"
