"""The tiny models through ``vllm serve``: ``python -m vllm_sparse_mla_blackwell serve``.

Per model (``e2e.MODELS``): write a real checkpoint (``checkpoint.save_checkpoint``), start vLLM's
OpenAI-compatible server on it as a user would (a subprocess, default multiprocessing, CUDA graphs
on, ``VLLM_GLM53_CUDA_SPARSE_MLA=1``), send ``e2e``'s prompts as token ids to ``/v1/completions``
one by one and then all at once, shut the server down with SIGINT, and compare with vLLM's
in-process ``LLM`` on the same checkpoint (a child process). Passes when every answer agrees
(``compare``), the log shows this backend in every process that runs attention
(``backend_evidence``), and the server and its children exit without SIGKILL.

Where ``nvidia-cutlass-dsl`` is missing, every process of the server needs e2e's stand-in for
vLLM's CuTe-DSL q kernel: a ``sitecustomize.py`` on the front of ``PYTHONPATH`` runs
``install_hooks`` in each Python process (the stand-in, and one log line per attention backend
vLLM selects there), the rest of the environment passed unchanged.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from vllm_sparse_mla_blackwell import e2e
from vllm_sparse_mla_blackwell.checkpoint import save_checkpoint
from vllm_sparse_mla_blackwell.envs import SPARSE_MLA_ENV
from vllm_sparse_mla_blackwell.plugins import IGNORED_MESSAGE

STEPS = 20  # greedy tokens per prompt
NUM_LOGPROBS = 5  # top logprobs per step (vLLM's server allows up to 20)
#: Tolerances in units of sigma, the per-logit error (nats) of vLLM's own kernels on H200 for the
#: model: logits here have unit RMS (unit final norm, lm_head +-sqrt(3/hidden)), and
#: 1 - cos ~ rel_err^2 / 2, so sigma = sqrt(2 * e2e.FALLBACK_BARS step_cos_dev) (DeepSeek 0.062,
#: GLM 0.010, fp16 0.015). The worst single step of two vLLM kernels was 3.3 sigma (DeepSeek) and
#: 2 sigma (GLM), bench/results/2026-12-02-h200-e2e; this compares one kernel with itself.
LOGPROB_SIGMAS = 5.0
LOGPROB_FLOOR = 0.05  # bf16 logits near 3 are 1/64 apart: a rounding flip is 0.016
SHUTDOWN_GRACE_S = 60.0
CUTEDSL_MODULE = "vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl"
SELECTION_RECORD = "serve check: attention backend selected:"
RECORDED = re.compile(re.escape(SELECTION_RECORD) + r" (\S+)")
SELECTED = re.compile(r"Using (\S+) attention backend out of potential backends")  # vllm/platforms/cuda.py
PROCESS = re.compile(r"\((\S+) pid=(\d+)\)")  # vLLM's log prefix (vllm/logger.py _FORMAT)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tolerances(model_name: str) -> dict:
    """``{"logprob": nats, "tie": nats}`` for ``model_name`` (see ``LOGPROB_SIGMAS``): a chosen
    token's logprob may differ by ``logprob``; tokens may part where the reference's top-2 gap is
    under ``tie`` (two tokens' errors together: sqrt(2) x ``logprob``)."""
    sigma = math.sqrt(2 * e2e.FALLBACK_BARS[model_name]["step_cos_dev"])
    lp = max(LOGPROB_FLOOR, LOGPROB_SIGMAS * sigma)
    return {"logprob": round(lp, 4), "tie": round(math.sqrt(2) * lp, 4)}


def compare(got: list[dict], ref: list[dict], tol: dict) -> dict:
    """Compare per-prompt greedy answers ``{"tokens": [int], "logprobs": [float] (the chosen
    token's, nats), "top": [{token_id: logprob}]}`` with a reference's. Per prompt, step by step
    while the tokens are equal: the chosen logprobs within ``tol["logprob"]``. The first different
    token ends the prompt's comparison (the contexts part): a pass where the reference's top-2 gap
    there is under ``tol["tie"]`` (a near tie), else a failure. Different lengths, NaN or a
    missing prompt fail. Returns ``{"passed", "steps_compared", "steps_total", "max_logprob_diff",
    "notes"}``."""
    ok = len(got) == len(ref)
    notes = [] if ok else [f"{len(got)} answers for {len(ref)} prompts"]
    compared = total = 0
    worst = 0.0
    for k, (g, r) in enumerate(zip(got, ref)):
        total += len(r["tokens"])
        if len(g["tokens"]) != len(r["tokens"]):
            ok = False
            notes.append(f"prompt {k}: {len(g['tokens'])} tokens, reference {len(r['tokens'])}")
            continue
        for i, (a, b) in enumerate(zip(g["tokens"], r["tokens"])):
            if a != b:
                top2 = sorted(r["top"][i].values(), reverse=True)[:2]
                gap = top2[0] - top2[1] if len(top2) == 2 else math.inf
                tie = gap < tol["tie"]
                ok &= tie
                notes.append(f"prompt {k} step {i}: token {a} vs {b}, top-2 gap {gap:.3f} "
                             + ("(near tie)" if tie else "FAIL"))
                break
            diff = abs(g["logprobs"][i] - r["logprobs"][i])
            worst = max(worst, diff) if not math.isnan(diff) else math.nan
            if not diff <= tol["logprob"]:
                ok = False
                notes.append(f"prompt {k} step {i}: logprob differs by {diff:.3f} FAIL")
                break
            compared += 1
    return {"passed": bool(ok), "steps_compared": compared, "steps_total": total,
            "max_logprob_diff": worst, "notes": notes}


def parse_choice(choice: dict) -> dict:
    """One ``/v1/completions`` choice (as JSON, asked with ``logprobs`` and
    ``return_tokens_as_token_ids``: tokens read ``"token_id:<id>"``) as ``compare``'s answer."""
    lp = choice["logprobs"]
    ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
    top = [{int(t.split(":", 1)[1]): v for t, v in step.items()} for step in lp["top_logprobs"]]
    return {"tokens": ids, "logprobs": [float(v) for v in lp["token_logprobs"]], "top": top}


def backend_evidence(log: str, tp: int) -> dict:
    """From a server log: the processes that build attention layers are the ones that select a
    backend (``SELECTION_RECORD`` lines, written by ``_log_selections`` in each process: vLLM
    itself logs its choice on local rank 0 only, ``info_once`` with scope ``local``); there must be
    ``tp`` of them (the ``EngineCore``, or ``tp`` workers) and every choice must be this backend.
    vLLM's own selection line must name it too, and nothing may say the plugin was ignored."""
    from vllm_sparse_mla_blackwell.backend import BACKEND_CLASS_PATH as OURS_PATH

    lines = [ANSI.sub("", x) for x in log.splitlines()]
    records = [(int(p[2]), m[1]) for x in lines if (m := RECORDED.search(x)) and (p := PROCESS.search(x))]
    procs = {pid for pid, _ in records}
    others = sorted({path for _, path in records if path != OURS_PATH})
    selected = sorted({m[1] for x in lines if (m := SELECTED.search(x))})
    problems = ([f"{len(procs)} processes selected an attention backend, expected {tp}"] if len(procs) != tp else []) + \
        ([f"other backends selected: {others}"] if others else []) + \
        ([f"vLLM's selection line names {selected or 'nothing'}"] if selected != [e2e.OURS] else []) + \
        (["the plugin was ignored"] if any(IGNORED_MESSAGE in x for x in lines) else [])
    return {"passed": not problems, "processes": len(procs), "ours": len({p for p, path in records if path == OURS_PATH}),
            "selected": selected, "problems": problems}


# ---------------------------------------------------------------------------------------------
# In every process of the server: the stand-in, and a record of the attention backend chosen
# ---------------------------------------------------------------------------------------------


class _StandIn:
    """Meta-path finder: at the first import of vLLM's CuTe-DSL q-kernel module (torch and CUDA are
    in use by then) run ``e2e._stub_missing_cutedsl`` and serve its stand-in if it made one."""

    def find_spec(self, name, path=None, target=None):
        if name != CUTEDSL_MODULE:
            return None
        sys.meta_path.remove(self)
        e2e._stub_missing_cutedsl()
        stub = sys.modules.pop(name, None)
        return None if stub is None else importlib.util.spec_from_loader(name, _Ready(stub))


class _Ready:
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


class _AfterImport:
    """Meta-path finder: run ``then(module)`` once ``name`` has been imported (its real spec)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda module: (run(module), self.then(module))
        return spec


def _log_selections(cuda_platform) -> None:
    """Log every attention backend ``vllm.platforms.cuda.CudaPlatform.get_attn_backend_cls``
    returns in this process (one line, vLLM's logger and process prefix); the choice is unchanged."""
    import logging

    cls = cuda_platform.CudaPlatform
    original, log = cls.get_attn_backend_cls, logging.getLogger("vllm.serve_check")

    def selected(_cls, *args, **kwargs):
        path = original(*args, **kwargs)
        log.info("%s %s", SELECTION_RECORD, path)
        return path

    cls.get_attn_backend_cls = classmethod(selected)


def install_hooks() -> None:
    """Install the stand-in and the selection record in this process (idempotent). Imports nothing
    heavy: it runs at interpreter start, from the ``sitecustomize.py`` of ``write_sitecustomize``."""
    if not any(isinstance(f, (_StandIn, _AfterImport)) for f in sys.meta_path):
        sys.meta_path[:0] = [_StandIn(), _AfterImport("vllm.platforms.cuda", _log_selections)]


_SITECUSTOMIZE = """\
# vllm_sparse_mla_blackwell.serve_check: e2e's CuTe-DSL stand-in in every process of the server.
import importlib.machinery, importlib.util, os, sys
try:
    from vllm_sparse_mla_blackwell.serve_check import install_hooks
    install_hooks()
except Exception as exc:
    print(f"sitecustomize: serve check hooks not installed: {exc!r}", file=sys.stderr)
# This file shadows any other sitecustomize on the path: run that one too.
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
"""


def write_sitecustomize(folder: Path) -> Path:
    """Write ``folder/sitecustomize.py`` (runs ``install_hooks``); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return folder


def server_env(hook_dir: Path, base: dict | None = None) -> dict:
    """The environment of the server and the reference: ``base`` (default ``os.environ``)
    unchanged (``LD_PRELOAD`` and the rest), ``hook_dir`` prepended to ``PYTHONPATH``, this
    backend on, flashinfer's sampler off (flashinfer is not in the GPU bundle)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH")) if p)
    env.update({SPARSE_MLA_ENV: "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"})
    return env


# ---------------------------------------------------------------------------------------------
# Server, client, reference
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(proc: subprocess.Popen, port: int, deadline: float) -> str | None:
    """``None`` once ``GET /health`` answers 200; else why not."""
    while time.time() < deadline:
        if proc.poll() is not None:
            return f"server exited ({proc.returncode}) before it was healthy"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(1)
    return "server not healthy within the time limit"


def _complete(port: int, model: str, prompt: list[int], timeout: float) -> dict:
    """One greedy completion of ``prompt`` (token ids) through the ``openai`` client where it is
    installed, else plain HTTP; the first choice as ``parse_choice`` reads it."""
    extra = {"return_tokens_as_token_ids": True, "ignore_eos": True}
    args = dict(model=model, prompt=prompt, max_tokens=STEPS, temperature=0.0, logprobs=NUM_LOGPROBS)
    if importlib.util.find_spec("openai") is not None:
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=timeout, max_retries=0)
        return parse_choice(client.completions.create(**args, extra_body=extra).model_dump()["choices"][0])
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps({**args, **extra}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return parse_choice(json.load(r)["choices"][0])


def default_sigint() -> None:
    """``preexec_fn`` of the processes this check starts: SIGINT at its default action. Started from
    a shell job whose SIGINT is ignored (``cmd &`` in a script), they would inherit that, and Python
    then installs no KeyboardInterrupt handler, so ``shutdown``'s SIGINT (Ctrl-C) would not stop them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shutdown(proc: subprocess.Popen, grace_s: float = SHUTDOWN_GRACE_S) -> dict:
    """Stop a server started in its own session as Ctrl-C does: SIGINT to its process group, then
    SIGTERM, ``grace_s`` seconds each for it and its children (listed with ``psutil`` first);
    SIGKILL only to what is left after that, which fails the check. Returns ``passed``, the
    signals sent, the server's exit code and the pids left over."""
    import psutil

    def alive(p):
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    signals = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        if proc.poll() is not None and not any(alive(c) for c in children):
            break
        signals.append(sig.name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        end = time.time() + grace_s
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs(children, timeout=max(0.0, end - time.time()))
    left = [c.pid for c in children if alive(c)]
    killed = proc.poll() is None or bool(left)
    if killed:
        signals.append("SIGKILL")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in left:  # one that left the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    return {"passed": not killed, "signals": signals, "exit_code": proc.returncode, "leftover": left}


def reference_main(spec_path: str) -> int:
    """Child process: ``LLM`` in-process on the checkpoint (``spec``: ``model_dir``, ``tp``,
    ``prompts``, ``out``), the same greedy requests; writes answers and the MLA impls to ``out``."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as e2e's worker
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model across TP workers
    install_hooks()
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model_dir"], skip_tokenizer_init=True, load_format="auto", tensor_parallel_size=spec["tp"],
              max_model_len=e2e.MAX_MODEL_LEN, gpu_memory_utilization=0.4, seed=0)
    impls = e2e.mla_impls(llm)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=NUM_LOGPROBS, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params, use_tqdm=False)
    answers = [{"tokens": list(o.outputs[0].token_ids),
                "logprobs": [s[t].logprob for s, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)],
                "top": [{k: v.logprob for k, v in s.items()} for s in o.outputs[0].logprobs]} for o in outs]
    Path(spec["out"]).write_text(json.dumps({"answers": answers, "impls": impls}))
    return 0


def _load_answers(path: Path) -> dict:
    data = json.loads(path.read_text())
    for a in data["answers"]:  # JSON keys are strings
        a["top"] = [{int(k): v for k, v in s.items()} for s in a["top"]]
    return data


def check_model(name: str, tp: int, work: Path, deadline: float) -> dict:
    """The whole check for one model; a dict of plain data (``passed`` and each part's result)."""
    model = e2e.MODELS[name]
    tol = tolerances(name)
    row = {"model": name, "tp": tp, "tolerances": tol, "passed": False}
    model_dir = save_checkpoint(name, work / "models")
    env = server_env(write_sitecustomize(work / "hook"))
    prompts = e2e._prompts(model, quick=False)
    port, log_path = _free_port(), work / f"{name}.server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--skip-tokenizer-init",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(e2e.MAX_MODEL_LEN),
           "--gpu-memory-utilization", "0.4"] + (["--tensor-parallel-size", str(tp)] if tp > 1 else [])
    row.update(command=" ".join(cmd), server_log=str(log_path))
    print(f"[serve] {name}: {row['command']}", flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=default_sigint)
    seq = conc = None
    try:
        row["error"] = _wait_health(proc, port, deadline - SHUTDOWN_GRACE_S)
        row["start_s"] = round(time.time() - t0, 1)
        if row["error"] is None:
            timeout = max(30.0, deadline - SHUTDOWN_GRACE_S - time.time())
            seq = [_complete(port, str(model_dir), p, timeout) for p in prompts]
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                conc = list(pool.map(lambda p: _complete(port, str(model_dir), p, timeout), prompts))
    except Exception as exc:  # noqa: BLE001 - reported; the server is shut down below either way
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        row["shutdown"] = shutdown(proc)
    row["backend"] = backend_evidence(log_path.read_text(errors="replace"), tp)
    if seq is None or conc is None:
        return row
    row["concurrent_vs_sequential"] = compare(conc, seq, tol)
    spec, ref_log = work / f"{name}.reference.json", work / f"{name}.reference.log"
    spec.write_text(json.dumps({"model_dir": str(model_dir), "tp": tp, "prompts": prompts,
                                "out": str(work / f"{name}.reference.out.json")}))
    with open(ref_log, "w") as log:  # its own session: a timeout stops its TP workers too
        ref_proc = subprocess.Popen([sys.executable, "-m", "vllm_sparse_mla_blackwell.serve_check", "--reference",
                                     str(spec)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=default_sigint)
    try:
        rc = ref_proc.wait(max(60.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        rc = f"timeout, {shutdown(ref_proc, 10)['signals']}"
    if rc != 0:
        row["error"] = f"in-process reference failed ({rc}): {ref_log}"
        return row
    ref = _load_answers(work / f"{name}.reference.out.json")
    row["reference_impls"] = ref["impls"]
    row["server_vs_in_process"] = compare(seq, ref["answers"], tol)
    row["passed"] = (row["error"] is None and row["shutdown"]["passed"] and row["backend"]["passed"]
                     and ref["impls"] == [e2e.OURS_IMPL]
                     and row["concurrent_vs_sequential"]["passed"] and row["server_vs_in_process"]["passed"])
    return row


def print_report(rows: list[dict], device: str) -> None:
    """One table row per model (``check_model``'s dicts), then each row's problems, one a line."""
    from rich.console import Console
    from rich.table import Table

    def cmp(c):
        return "-" if c is None else (f"{'[green]ok[/green]' if c['passed'] else '[red]FAIL[/red]'} "
                                      f"{c['steps_compared']}/{c['steps_total']}, max dlp {c['max_logprob_diff']:.3f}")

    t = Table("model", "TP", "start s", "backend (attention procs)", "concurrent vs sequential",
              "server vs in-process", "shutdown", "verdict", title=f"vllm serve on {device}")
    for r in rows:
        b, s = r["backend"], r["shutdown"]
        t.add_row(r["model"], str(r["tp"]), f"{r.get('start_s', '-')}",
                  f"{'ok' if b['passed'] else '[red]FAIL[/red]'} {b['ours']}/{b['processes']} {','.join(b['selected'])}",
                  cmp(r.get("concurrent_vs_sequential")), cmp(r.get("server_vs_in_process")),
                  f"{'ok' if s['passed'] else '[red]FAIL[/red]'} exit {s['exit_code']} {'/'.join(s['signals'])}",
                  "[green]PASS[/green]" if r["passed"] else "[red]FAIL[/red]")
    console = Console()
    console.print(t)
    for r in rows:
        left = r["shutdown"]["leftover"]
        for line in ([r["error"]] if r.get("error") else []) + r["backend"]["problems"] + \
                ([f"left running after SIGINT/SIGTERM (killed): pids {left}"] if left else []) + \
                ([f"in-process MLA impls: {r['reference_impls']}"] if r.get("reference_impls", [e2e.OURS_IMPL]) != [e2e.OURS_IMPL] else []) + \
                [n for k in ("concurrent_vs_sequential", "server_vs_in_process") for n in r.get(k, {}).get("notes", [])]:
            console.print(f"  {r['model']}: {line}", markup=False)


def main(models: tuple[str, ...] | None = None, tp: int = 1, json_path: str | None = None,
         work_dir: str | None = None, timeout_s: float = 1200) -> int:
    """Exit 0 when every model passes; 1 when a check fails; 2 for bad arguments; 3 when there is
    no vLLM or fewer CUDA GPUs than ``tp``. ``timeout_s`` bounds the whole run (servers included;
    a server's shutdown may take ``SHUTDOWN_GRACE_S`` more)."""
    names, status = e2e.preflight("serve", models, ([f"--tensor-parallel-size must be >= 1, got {tp}"] if tp < 1 else [])
                                  + e2e.positive_seconds("--timeout", timeout_s), gpus=max(tp, 1))
    if status is not None:
        return status
    import torch
    import vllm

    device = f"{torch.cuda.get_device_name()} x{tp}, vLLM {vllm.__version__}"
    work = Path(work_dir or tempfile.mkdtemp(prefix="sparse_mla_serve_"))
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + timeout_s
    rows = [check_model(n, tp, work, deadline) for n in names]
    print_report(rows, device)
    passed = all(r["passed"] for r in rows)
    if json_path:
        Path(json_path).write_text(json.dumps({"device": device, "passed": passed, "models": rows}, indent=1))
    print(f"\n{'PASS' if passed else 'FAIL'}: {sum(r['passed'] for r in rows)}/{len(rows)} models through "
          f"vllm serve on {device}; logs in {work}")
    return 0 if passed else 1


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", required=True)
    sys.exit(reference_main(parser.parse_args().reference))
