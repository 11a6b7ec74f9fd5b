"""The end-to-end check's parts that need no GPU: the run plan, the comparison, the bar, the tiny
model configs (read by the real vLLM 0.33's ModelConfig), the realistic dummy weights and the
command line. The check itself runs in ``test_e2e_gpu.py``."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from vllm_sparse_mla_blackwell import cli, e2e
from vllm_sparse_mla_blackwell.e2e import EXACT, OURS, Run

DS, GLM = e2e.MODELS["deepseek-v3.2"], e2e.MODELS["glm-5.3-flash"]


def test_plan_on_hopper_has_both_vllm_kernels_where_they_serve():
    runs = e2e.plan_runs([DS, GLM], e2e.KV_CACHE_DTYPES, e2e.MODES, (9, 0))
    keys = {r.key for r in runs}
    assert len(keys) == len(runs)
    assert "deepseek-v3.2.FLASH_ATTN_MLA_SPARSE.bfloat16.eager" in keys
    assert "deepseek-v3.2.FLASHMLA_SPARSE.fp8_ds_mla.graphs" in keys
    assert "glm-5.3-flash.FLASHMLA_SPARSE.bfloat16.eager" in keys
    # FA3's sparse kernel has no NoPE head; vLLM's "fp8" is fp8_ds_mla, not per-tensor e4m3.
    assert not any(r.backend == "FLASH_ATTN_MLA_SPARSE" and r.model == GLM.name for r in runs)
    assert not any(r.backend not in (OURS, EXACT) and r.kv_cache_dtype == "fp8" for r in runs)
    for model in (DS, GLM):
        for kv in e2e.KV_CACHE_DTYPES:
            assert Run(model.name, EXACT, kv, False) in runs
            assert Run(model.name, OURS, kv, False) in runs and Run(model.name, OURS, kv, True) in runs
    # The exact reference of a cache dtype runs before anything that is compared with it.
    first = {}
    for i, r in enumerate(runs):
        first.setdefault((r.model, r.kv_cache_dtype), r)
    assert all(r.backend == EXACT for r in first.values())


@pytest.mark.parametrize("capability", [(12, 0), (12, 1), (8, 9)])
def test_plan_without_vllm_sparse_kernels_is_ours_against_exact(capability):
    runs = e2e.plan_runs([DS, GLM], ("bfloat16",), ("eager",), capability)
    assert sorted(r.backend for r in runs) == [EXACT, EXACT, OURS, OURS]


def _result(tokens, steps, prompts):
    return {"tokens": tokens, "step_logits": steps, "prompt_logits": prompts}


def test_agreement_compares_steps_up_to_the_first_different_token():
    torch.manual_seed(0)
    steps = torch.randn(5, 64)
    other = steps.clone()
    other[2] += 0.1 * torch.randn(64)  # the step where the greedy token first differs
    other[3:] = -steps[3:]  # different context afterwards: must not count
    prompt = torch.randn(7, 64)
    a = _result([[1, 2, 3, 4, 5]], [steps], [prompt])
    b = _result([[1, 2, 9, 4, 5]], [other], [prompt * 1.01])
    agr = e2e.agreement(a, b)
    assert (agr.tokens_same, agr.tokens_total) == (2, 5)
    want = torch.nn.functional.cosine_similarity(steps[2].double(), other[2].double(), dim=0).item()
    assert agr.min_step_cos == pytest.approx(want) and 0.99 < want < 1
    assert agr.prompt_rel_err == pytest.approx(0.01 / 1.01, rel=1e-3)
    same = e2e.agreement(a, a)
    assert (same.tokens_same, same.min_step_cos, same.prompt_rel_err) == (5, pytest.approx(1.0), 0.0)


def test_evaluate_applies_the_spread_bar(tmp_path):
    torch.manual_seed(1)
    base = torch.randn(4, 32)
    prompt = torch.randn(6, 32)

    def save(run, noise, tokens=(1, 2, 3, 4)):
        steps = base + noise * torch.randn_like(base)
        torch.save(_result([list(tokens)], [steps], [prompt + noise * torch.randn_like(prompt)]),
                   tmp_path / f"{run.key}.pt")

    runs = [Run(DS.name, EXACT, "bfloat16", False), Run(DS.name, OURS, "bfloat16", False),
            Run(DS.name, "FLASHMLA_SPARSE", "bfloat16", False), Run(DS.name, "FLASH_ATTN_MLA_SPARSE", "bfloat16", False),
            Run(DS.name, OURS, "fp8", False), Run(DS.name, EXACT, "fp8", False)]
    save(runs[0], 0.0)
    save(runs[1], 0.02)
    save(runs[2], 0.02)
    save(runs[3], 0.02)
    save(runs[4], 0.5)  # far outside the spread
    save(runs[5], 0.0)
    ok = {"ok": True, "tokens_per_s": 100.0, "kv_tokens": 1000, "impls": ["SparseMLABlackwellImpl"], "start_s": 1}
    records = {r.key: dict(ok, key=r.key) for r in runs}
    records[runs[2].key]["impls"] = records[runs[3].key]["impls"] = ["FlashMLASparseImpl"]
    report = e2e.evaluate(runs, records, tmp_path)
    model = report["models"][DS.name]
    assert model["bar"]["measured"] and len(model["pairs"]) == 3
    rows = {r["kv_cache_dtype"]: r for r in model["rows"]}
    assert rows["bfloat16"]["passed"] and rows["bfloat16"]["vs_vllm"]["backend"] == "FLASHMLA_SPARSE"
    assert rows["bfloat16"]["throughput_ratio"] == 1.0
    assert not rows["fp8"]["passed"] and not rows["fp8"]["within_bar"]
    assert not report["passed"]
    # A run that used another backend than this one fails even with matching numbers.
    records[runs[1].key]["impls"] = ["FlashMLASparseImpl"]
    assert not e2e.evaluate(runs[:4], records, tmp_path)["passed"]
    records[runs[1].key]["impls"] = ["SparseMLABlackwellImpl"]
    assert e2e.evaluate(runs[:4], records, tmp_path)["passed"]
    json.dumps(report)  # the --json output


def test_evaluate_without_vllm_kernels_uses_the_fallback_bar(tmp_path):
    runs = [Run(GLM.name, EXACT, "bfloat16", False), Run(GLM.name, OURS, "bfloat16", False)]
    r = _result([[1, 2]], [torch.ones(2, 8)], [torch.ones(3, 8)])
    for run in runs:
        torch.save(r, tmp_path / f"{run.key}.pt")
    records = {run.key: {"key": run.key, "ok": True, "tokens_per_s": 1.0, "kv_tokens": 1, "start_s": 1,
                         "impls": ["SparseMLABlackwellImpl"]} for run in runs}
    report = e2e.evaluate(runs, records, tmp_path)
    assert report["passed"] and report["models"][GLM.name]["bar"]["measured"] is False
    records[runs[1].key] = {"key": runs[1].key, "ok": False, "error": "ValueError: boom"}
    assert not e2e.evaluate(runs, records, tmp_path)["passed"]


def test_what_cannot_be_compared_fails_instead_of_agreeing(tmp_path):
    """A NaN in any prompt's logits, a missing logits row, or an empty capture: NaN, no pass."""
    good = _result([[1, 2], [3, 4]], [torch.ones(2, 8), torch.ones(2, 8)], [torch.ones(3, 8), torch.ones(3, 8)])
    nan_second = _result([[1, 2], [3, 4]], [torch.ones(2, 8), torch.ones(2, 8)],
                         [torch.ones(3, 8), torch.full((3, 8), float("nan"))])
    no_steps = _result([[1, 2], [3, 4]], [torch.empty(0, 8), torch.empty(0, 8)], [torch.ones(3, 8), torch.ones(3, 8)])
    short_prompt = _result([[1, 2], [3, 4]], [torch.ones(2, 8), torch.ones(2, 8)], [torch.ones(3, 8), torch.ones(2, 8)])
    bar = e2e.FALLBACK_BARS[DS.name]
    assert e2e.within(e2e.agreement(good, good), bar)
    for bad in (nan_second, no_steps, short_prompt):
        assert not e2e.within(e2e.agreement(bad, good), bar)
        assert not e2e.within(e2e.agreement(good, bad), bar)
    # A reference pair that could not be compared poisons the bar, in any position.
    ok, broken = e2e.agreement(good, good), e2e.agreement(nan_second, good)
    for pairs in ([ok, broken], [broken, ok]):
        assert not e2e.within(ok, e2e.spread(pairs))


def _records(runs, **overrides):
    ok = {"ok": True, "tokens_per_s": 1.0, "kv_tokens": 1, "start_s": 1, "impls": ["SparseMLABlackwellImpl"]}
    recs = {r.key: dict(ok, key=r.key) for r in runs}
    for key, value in overrides.items():
        recs[key] = value
    return recs


def test_no_bar_when_planned_vllm_kernels_did_not_run_or_disagree_wildly(tmp_path, capsys):
    torch.manual_seed(2)
    base = torch.randn(3, 16)
    runs = [Run(DS.name, EXACT, "bfloat16", False), Run(DS.name, OURS, "bfloat16", False),
            Run(DS.name, "FLASHMLA_SPARSE", "bfloat16", False)]
    for run in runs:
        torch.save(_result([[1, 2, 3]], [base], [base]), tmp_path / f"{run.key}.pt")
    assert e2e.evaluate(runs, _records(runs), tmp_path)["passed"]
    failed_ref = _records(runs, **{runs[2].key: {"key": runs[2].key, "ok": False, "error": "boom"}})
    report = e2e.evaluate(runs, failed_ref, tmp_path)
    assert not report["passed"] and "not measured" in report["models"][DS.name]["bar"]["problem"]
    assert "no run of vLLM's own kernels" in report["models"][DS.name]["bar"]["problem"]
    # The exact reference failed, vLLM's kernel ran: the problem names the exact run, not vLLM's.
    failed_exact = _records(runs, **{runs[0].key: {"key": runs[0].key, "ok": False, "error": "AssertionError"}})
    problem = e2e.evaluate(runs, failed_exact, tmp_path)["models"][DS.name]["bar"]["problem"]
    assert "exact reference did not run" in problem and "FLASHMLA_SPARSE" in problem
    torch.save(_result([[1, 2, 3]], [-base], [-base]), tmp_path / f"{runs[2].key}.pt")  # a broken reference
    report = e2e.evaluate(runs, _records(runs), tmp_path)
    assert not report["passed"] and "broken reference" in report["models"][DS.name]["bar"]["problem"]
    e2e.print_report(report, "GPU")  # the header names the figures it shows: this run's, not the H200's
    assert "shown: the spread measured in this run" in " ".join(capsys.readouterr().out.split())


def test_a_run_where_another_impl_served_some_layers_fails(tmp_path):
    runs = [Run(GLM.name, EXACT, "bfloat16", False), Run(GLM.name, OURS, "bfloat16", False)]
    for run in runs:
        torch.save(_result([[1]], [torch.ones(1, 4)], [torch.ones(1, 4)]), tmp_path / f"{run.key}.pt")
    mixed = _records(runs)
    mixed[runs[1].key]["impls"] = ["FlashMLASparseImpl", "SparseMLABlackwellImpl"]
    assert not e2e.evaluate(runs, mixed, tmp_path)["passed"]


def _scripted_workers(tmp_path, monkeypatch, script, error="x") -> list[str]:
    """Stand-in workers: each takes the next tuple of ``script``, one action per pending run, as
    worker_main would: "ok"; "fail" (records ``error``, returns RESTART); "crash" (dies, -11,
    recording nothing). Returns the keys of the runs started, in order."""
    script, started = iter(script), []

    def fake_run(cmd, timeout):
        spec = json.loads((tmp_path / "spec.json").read_text())
        with open(tmp_path / "runs.jsonl", "a") as f:
            for item, action in zip(spec["runs"], next(script)):
                key = Run(**item).key
                started.append(key)
                if action == "crash":
                    return type("P", (), {"returncode": -11})()
                f.write(json.dumps({"key": key, "ok": action == "ok", "error": "" if action == "ok" else error}) + "\n")
                if action == "fail":
                    return type("P", (), {"returncode": e2e.RESTART})()
        return type("P", (), {"returncode": 0})()

    monkeypatch.setattr(e2e.subprocess, "run", fake_run)
    return started


def test_workers_restart_after_a_failed_run_and_blame_only_a_crash(tmp_path, monkeypatch):
    """RESTART: the worker recorded its failure and asks for a fresh process (no blame); any other
    non-zero exit took the run it was in."""
    runs = [Run(GLM.name, OURS, "bfloat16", False), Run(GLM.name, OURS, "fp8", False),
            Run(GLM.name, OURS, "fp8_ds_mla", False)]
    _scripted_workers(tmp_path, monkeypatch, [("ok", "fail"), ("crash",), ("ok",)])
    records = e2e._run_workers(runs, {}, tmp_path, False, deadline=1e18)
    assert [records[r.key]["ok"] for r in runs] == [True, False, False]
    assert records[runs[1].key]["error"] == "x" and "worker exited (-11)" in records[runs[2].key]["error"]


RACE = f"AssertionError: {e2e.PROFILING_RACE}. Initial free memory 135.22 GiB, current free memory 135.76 GiB."


def test_a_run_stopped_by_vllms_memory_profiling_runs_once_more(tmp_path, monkeypatch):
    """Another process freeing GPU memory during vLLM's start-up profile is not the run's fault:
    one more try in a fresh worker, noted in the record; a second such stop stays a failure."""
    runs = [Run(GLM.name, EXACT, "bfloat16", False), Run(GLM.name, OURS, "bfloat16", False)]
    started = _scripted_workers(tmp_path, monkeypatch, [("fail",), ("ok", "fail"), ("fail",)], error=RACE)
    records = e2e._run_workers(runs, {}, tmp_path, False, deadline=1e18)
    assert records[runs[0].key]["ok"] and records[runs[0].key]["retried_after"] == RACE
    assert not records[runs[1].key]["ok"] and records[runs[1].key]["retried_after"] == RACE
    assert started == [runs[0].key, runs[0].key, runs[1].key, runs[1].key]  # no third try


def test_a_crash_in_a_retried_run_is_that_runs_and_the_rest_still_run(tmp_path, monkeypatch):
    runs = [Run(GLM.name, EXACT, "bfloat16", False), Run(GLM.name, OURS, "bfloat16", False)]
    started = _scripted_workers(tmp_path, monkeypatch, [("fail",), ("crash",), ("ok",)], error=RACE)
    records = e2e._run_workers(runs, {}, tmp_path, False, deadline=1e18)
    assert started == [runs[0].key, runs[0].key, runs[1].key]
    assert "worker exited (-11)" in records[runs[0].key]["error"] and records[runs[0].key]["retried_after"] == RACE
    assert records[runs[1].key]["ok"]


@pytest.mark.parametrize("argv", [["e2e", "--kv", "int4"], ["e2e", "--models", "llama"], ["e2e", "--modes", "fast"],
                                  ["e2e", "--time-budget", "0"], ["e2e", "--time-budget", "nan"]])
def test_cli_rejects_bad_arguments_with_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("e2e: ") and argv[-1] in err


# ---------------------------------------------------------------------------------------------
# With the real vLLM (CI installs 0.33.0)
# ---------------------------------------------------------------------------------------------


def test_model_names_are_case_insensitive(monkeypatch):
    """bench spells DeepSeek-V3.2; past the name check e2e stops at "no GPU" (3) on a CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["e2e", "--models", "DeepSeek-V3.2,GLM-5.3-Flash"]) == 3


@pytest.mark.parametrize("name", sorted(e2e.MODELS))
def test_vllm_reads_the_tiny_configs_as_sparse_mla(name, tmp_path):
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig

    model = e2e.MODELS[name]
    config = ModelConfig(model=str(e2e.write_model(model, tmp_path)), dtype=model.dtype, skip_tokenizer_init=True,
                         max_model_len=e2e.MAX_MODEL_LEN)
    text = config.hf_text_config
    assert config.use_mla and config.get_head_size() == model.head_size
    assert text.index_topk < max(model.prompt_lens)  # the indexer really selects
    assert text.num_attention_heads == model.num_heads
    assert str(config.dtype).endswith(model.dtype)


def test_realistic_dummy_weights(monkeypatch):
    pytest.importorskip("vllm")
    from vllm.model_executor.model_loader import dummy_loader

    monkeypatch.setattr(dummy_loader, "initialize_single_dummy_weight", dummy_loader.initialize_single_dummy_weight)
    e2e._install_realistic_dummy_weights()
    init = dummy_loader.initialize_single_dummy_weight
    e2e._SEEDS["next"] = 0
    w, w2 = torch.empty(256, 1024), torch.empty(256, 1024)
    norm, bias, scale = torch.empty(64), torch.empty(64), torch.tensor(-1.0)
    init(w, name="weight")
    init(w2, name="weight")
    init(norm, name="weight")
    init(bias, name="bias")
    init(scale, name="k_scale")
    bound = math.sqrt(3 / 1024)
    assert w.abs().max() <= bound and w.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert not torch.equal(w, w2)  # a seed per tensor
    assert (norm == 1).all() and (bias == 0).all() and scale.item() == -1.0
    e2e._SEEDS["next"] = 0  # every run restarts the sequence: the same model for every backend
    again = torch.empty(256, 1024)
    init(again, name="weight")
    assert torch.equal(again, w)


def test_kernel_switches_are_the_sparse_mla_variables_set(monkeypatch):
    from vllm_sparse_mla_blackwell import envs

    for name in [k for k in os.environ if k.startswith("SPARSE_MLA_")]:
        monkeypatch.delenv(name)
    assert envs.kernel_switches() == {}
    monkeypatch.setenv(envs.E4M3_PV_ENV, "1")
    monkeypatch.setenv("SPARSE_MLA_DISABLE_PDL", "0")
    monkeypatch.setenv(envs.SPARSE_MLA_ENV, "1")  # the plugin's switch, not the kernel's
    assert envs.kernel_switches() == {"SPARSE_MLA_DISABLE_PDL": "0", "SPARSE_MLA_E4M3_PV": "1"}
