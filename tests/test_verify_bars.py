"""verify's bars and the switch that changes one of them: pure Python, no op library needed."""

from __future__ import annotations

import pytest

from vllm_sparse_mla_blackwell import cases, envs


def test_e4m3_pv_option_gives_fp8_ds_mla_the_bar_of_its_e4m3_mmas(monkeypatch):
    """With the e4m3 P V option, fp8_ds_mla's P V MMAs are e4m3, not fp16: its cases take the
    4e-3 bar even with fp16 q; other caches keep theirs."""
    fp16_ds_mla = cases.Case(q_dtype="fp16", kv_cache_dtype="fp8_ds_mla")
    fp16_e4m3 = cases.Case(q_dtype="fp16", kv_cache_dtype="fp8_e4m3")
    monkeypatch.delenv(envs.E4M3_PV_ENV, raising=False)
    assert cases.max_rel_err(fp16_ds_mla) == cases.MAX_REL_ERR_FP16 == 1e-3
    monkeypatch.setenv(envs.E4M3_PV_ENV, "1")
    assert cases.max_rel_err(fp16_ds_mla) == cases.MAX_REL_ERR == 4e-3
    assert cases.max_rel_err(fp16_e4m3) == cases.MAX_REL_ERR_FP16


@pytest.mark.parametrize("value, on", [("1", True), ("10", True), ("1 ", True), ("0", False), ("", False),
                                       (None, False), ("true", False)])
def test_switches_read_as_the_kernel_library_reads_them(monkeypatch, value, on):
    """The library turns SPARSE_MLA_* switches on by the value's first character being 1; verify
    and bench read the e4m3 P V option the same way, so that their bar and records match the
    kernel that ran."""
    if value is None:
        monkeypatch.delenv(envs.E4M3_PV_ENV, raising=False)
    else:
        monkeypatch.setenv(envs.E4M3_PV_ENV, value)
    assert envs.flag(envs.E4M3_PV_ENV) is on
    bar = cases.max_rel_err(cases.Case(q_dtype="fp16", kv_cache_dtype="fp8_ds_mla"))
    assert bar == (cases.MAX_REL_ERR if on else cases.MAX_REL_ERR_FP16)
