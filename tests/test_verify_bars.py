"""verify's bars and the switch that changes one of them: pure Python, no op library needed."""

from __future__ import annotations

import pytest

from vllm_sparse_mla_blackwell import cases, envs


@pytest.mark.parametrize("value, on", [("1", True), ("10", True), ("1 ", True), ("0", False), ("", False),
                                       (None, False), ("true", False)])
def test_e4m3_pv_option_gives_fp8_ds_mla_the_bar_of_its_e4m3_mmas(monkeypatch, value, on):
    """With the e4m3 P V option, fp8_ds_mla's P V MMAs are e4m3, not fp16: its cases take the
    4e-3 bar even with fp16 q (1e-3 without the option); other caches keep theirs. The option is
    read as the library reads its SPARSE_MLA_* switches (the value's first character is 1), so
    that verify's bar and bench's record match the kernel that ran."""
    if value is None:
        monkeypatch.delenv(envs.E4M3_PV_ENV, raising=False)
    else:
        monkeypatch.setenv(envs.E4M3_PV_ENV, value)
    assert envs.flag(envs.E4M3_PV_ENV) is on
    bar = cases.max_rel_err(cases.Case(q_dtype="fp16", kv_cache_dtype="fp8_ds_mla"))
    assert bar == (cases.MAX_REL_ERR if on else cases.MAX_REL_ERR_FP16)
    assert cases.MAX_REL_ERR == 4e-3 and cases.MAX_REL_ERR_FP16 == 1e-3
    assert cases.max_rel_err(cases.Case(q_dtype="fp16", kv_cache_dtype="fp8_e4m3")) == cases.MAX_REL_ERR_FP16
