"""The ``vllm serve`` check's parts that need no GPU: the checkpoints (loaded by vLLM 0.33's own
model classes and default loader, built on the CPU), the comparison, the log evidence, the
per-process hooks, the shutdown and the command line. The check itself needs a GPU."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from vllm_sparse_mla_blackwell import checkpoint, cli, e2e, serve_check

# vLLM builds the CUDA model classes (vllm/models/deepseek_v32/nvidia/model.py and
# vllm/models/glm5next/common/model.py) on a CUDA platform object; on a CPU-only machine the
# platform is mocked as tests/test_vllm_backend.py does, CUDA custom ops (looked up, never called
# while loading) are stand-ins, buffers live on the CPU, and this backend is the MLA choice. Then
# every parameter is set to NaN and vLLM's DefaultModelLoader loads the checkpoint directory.
_VLLM_LOAD = r"""
import json, math, sys, types
import torch
from vllm.model_executor.model_loader import DefaultModelLoader
from vllm.model_executor.model_loader.utils import initialize_model
try:
    import vllm.platforms.cuda as cuda_platform
except (ImportError, OSError):
    sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    import vllm.platforms.cuda as cuda_platform
import vllm.platforms
from vllm.platforms.interface import DeviceCapability

class AnyOp:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None

torch.ops.__dict__["_C"] = AnyOp()
platform = cuda_platform.CudaPlatform()
platform.device_type = "cpu"
cuda_platform.CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))
vllm.platforms._current_platform = platform
stub = types.ModuleType("vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl")
stub.is_fused_q_cutedsl_supported = lambda *a, **k: False
sys.modules[stub.__name__] = stub
from vllm_sparse_mla_blackwell import backend, ops
ops.extension_available = lambda: True
ops.compiled_targets = lambda: ["90"]
backend.register()

from vllm.config import DeviceConfig, LoadConfig, ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.utils.torch_utils import set_default_torch_dtype
import vllm.model_executor.layers.attention.sparse_mla_attention as sparse_mla_attention
from vllm.v1.worker import workspace
from safetensors.torch import load_file

model_dir, port = sys.argv[1], int(sys.argv[2])
mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=4096)
config = VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"), load_config=LoadConfig(load_format="auto"),
                    scheduler_config=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=8, max_model_len=4096,
                                                     is_encoder_decoder=False),
                    additional_config={"kda_prefill_backend": "triton"})  # FlashKDA needs its CUDA library
with set_current_vllm_config(config):
    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 local_rank=0, backend="gloo")
    initialize_model_parallel(1, 1)
    sparse_mla_attention.PIN_MEMORY = False
    workspace.init_workspace_manager(torch.device("cpu"))
    with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
        model = initialize_model(vllm_config=config)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(math.nan)
    DefaultModelLoader(config.load_config).load_weights(model, mc)
ckpt = load_file(f"{model_dir}/model.safetensors")
fused = {"fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"], "wk_weights_proj": ["wk", "weights_proj"],
         "gate_up_proj": ["gate_proj", "up_proj"],
         "in_proj_qkvbfg_a": ["q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"]}
mismatch = []
for name, p in params.items():
    parts = next(([name.replace(f, x) for x in xs] for f, xs in fused.items() if f"{f}." in name), [name])
    want = torch.cat([ckpt[n].flatten() for n in parts]).to(p.dtype)
    if not torch.equal(p.detach().flatten(), want):
        mismatch.append(name)
print("RESULT " + json.dumps({
    "model_class": f"{type(model).__module__}.{type(model).__name__}",
    "impls": sorted({type(m.impl).__name__ for m in model.modules() if hasattr(m, "impl") and hasattr(m.impl, "forward_mqa")}),
    "unwritten": [n for n, p in params.items() if p.isnan().any()],
    "param_numel": sum(p.numel() for p in params.values()),
    "checkpoint_numel": sum(t.numel() for t in ckpt.values()),
    "mismatch": mismatch,
}))
"""

CLASSES = {"deepseek_v32": "vllm.models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM",
           "glm5_next": "vllm.models.glm5next.common.model.Glm5NextForCausalLM"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_load(model_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _VLLM_LOAD, str(model_dir), str(_port())], capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: checkpoint.save_checkpoint(name, root) for name in e2e.MODELS}


@pytest.mark.parametrize("name", sorted(e2e.MODELS))
def test_vllm_loads_exactly_the_checkpoint(name, checkpoints):
    """Every parameter of vLLM's model is written from the file (none left NaN, vLLM's own
    'not initialized from checkpoint' check passes), with the file's values in the right fused
    slots, and the file holds nothing more (equal element counts)."""
    pytest.importorskip("vllm")
    proc = _vllm_load(checkpoints[name])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["model_class"] == CLASSES[e2e.MODELS[name].config()["model_type"]]
    assert out["impls"] == ["SparseMLABlackwellImpl"]
    assert out["unwritten"] == [] and out["mismatch"] == []
    assert out["param_numel"] == out["checkpoint_numel"]


@pytest.mark.parametrize("change", ["drop", "extra"])
def test_vllm_refuses_a_checkpoint_with_a_missing_or_unexpected_tensor(change, tmp_path):
    pytest.importorskip("vllm")
    from safetensors.torch import load_file, save_file

    path = checkpoint.save_checkpoint("deepseek-v3.2", tmp_path)
    tensors = load_file(path / checkpoint.WEIGHTS_FILE)
    if change == "drop":
        del tensors["model.layers.1.self_attn.indexer.k_norm.bias"]
    else:
        tensors["model.layers.1.self_attn.indexer.extra.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(tensors, str(path / checkpoint.WEIGHTS_FILE), metadata={"format": "pt"})
    proc = _vllm_load(path)
    assert proc.returncode != 0
    assert ("k_norm.bias" if change == "drop" else "indexer.extra.weight") in proc.stderr


def test_checkpoint_scale_dtype_and_determinism(tmp_path):
    from safetensors.torch import load_file

    a = checkpoint.save_checkpoint("GLM-5.3-Flash", tmp_path / "a")
    b = checkpoint.save_checkpoint("glm-5.3-flash", tmp_path / "b")
    assert (a / checkpoint.WEIGHTS_FILE).read_bytes() == (b / checkpoint.WEIGHTS_FILE).read_bytes()
    assert json.loads((a / "config.json").read_text()) == json.loads(
        (e2e.write_model(e2e.MODELS["glm-5.3-flash"], tmp_path / "c") / "config.json").read_text())
    tensors = load_file(a / checkpoint.WEIGHTS_FILE)
    assert set(tensors) == set(checkpoint.tensor_shapes(e2e.MODELS["glm-5.3-flash"].config()))
    for name, t in tensors.items():
        assert t.dtype == torch.bfloat16, name
        x = t.float()
        if t.dim() >= 2:
            bound = math.sqrt(3 / t.shape[-1])
            assert x.abs().max() <= bound * 1.01, name  # bf16 rounding
            if t.numel() >= 4096:
                assert x.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), name
        elif name.endswith("weight"):
            assert (x == 1).all(), name
        elif name.endswith("bias"):
            assert (x == 0).all(), name
        else:  # A_log: fan-in 1
            assert x.abs().max() <= math.sqrt(3) * 1.01 and x.abs().max() > 0.1, name
    q, k = (tensors[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qk")
    assert not torch.equal(q, k)  # a seed per tensor
    fp16 = load_file(checkpoint.save_checkpoint("deepseek-v3.2-fp16", tmp_path) / checkpoint.WEIGHTS_FILE)
    assert {t.dtype for t in fp16.values()} == {torch.float16}


def test_checkpoint_refuses_what_it_does_not_write(tmp_path):
    config = e2e.MODELS["deepseek-v3.2"].config()
    with pytest.raises(ValueError, match="MoE"):
        checkpoint.tensor_shapes({**config, "first_k_dense_replace": 1})
    with pytest.raises(ValueError, match="unknown model"):
        checkpoint.save_checkpoint("llama", tmp_path)


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------


def _answer(tokens, logprobs, gaps):
    """An answer whose chosen token leads the runner-up by ``gaps[i]`` at step i."""
    top = [{t: lp, t + 1: lp - g, t + 2: lp - g - 1.0} for t, lp, g in zip(tokens, logprobs, gaps)]
    return {"tokens": list(tokens), "logprobs": list(logprobs), "top": top}


TOL = serve_check.tolerances("deepseek-v3.2")


def test_tolerances_follow_the_measured_spreads():
    ds, glm = serve_check.tolerances("deepseek-v3.2"), serve_check.tolerances("glm-5.3-flash")
    assert ds["logprob"] == pytest.approx(5 * math.sqrt(2 * 1.91e-3), rel=1e-3)
    assert glm["logprob"] == pytest.approx(max(0.05, 5 * math.sqrt(2 * 5.41e-5)), rel=1e-3)
    assert glm["logprob"] < ds["logprob"]
    assert all(t["tie"] == pytest.approx(math.sqrt(2) * t["logprob"], rel=1e-3) for t in (ds, glm))


def test_compare_passes_identical_answers():
    ref = [_answer([5, 6, 7], [-4.0, -4.1, -4.2], [1.0, 1.0, 1.0]), _answer([9, 8], [-3.0, -3.5], [2.0, 2.0])]
    res = serve_check.compare(ref, ref, TOL)
    assert res["passed"] and (res["steps_compared"], res["steps_total"]) == (5, 5) and res["max_logprob_diff"] == 0


def test_compare_fails_a_token_mismatch_that_is_not_a_near_tie():
    ref = [_answer([5, 6, 7], [-4.0, -4.1, -4.2], [1.0, 1.0, 1.0])]
    got = [_answer([5, 60, 7], [-4.0, -4.1, -4.2], [1.0, 1.0, 1.0])]
    res = serve_check.compare(got, ref, TOL)
    assert not res["passed"] and res["steps_compared"] == 1 and "step 1" in res["notes"][0]


def test_compare_passes_a_divergence_at_a_near_tie_and_stops_there():
    ref = [_answer([5, 6, 7, 8], [-4.0, -4.1, -4.2, -4.3], [1.0, TOL["tie"] / 2, 1.0, 1.0])]
    got = [_answer([5, 7, 99, 98], [-4.0, -4.15, -1.0, -1.0], [1.0, 1.0, 1.0, 1.0])]  # later steps: another context
    res = serve_check.compare(got, ref, TOL)
    assert res["passed"] and res["steps_compared"] == 1 and "near tie" in res["notes"][0]


@pytest.mark.parametrize("bad", ["logprob", "nan", "length", "prompts"])
def test_compare_fails_logprobs_off_nan_and_missing_steps(bad):
    ref = [_answer([5, 6, 7], [-4.0, -4.1, -4.2], [1.0, 1.0, 1.0])] * 2
    got = [_answer([5, 6, 7], [-4.0, -4.1, -4.2], [1.0, 1.0, 1.0])] * 2
    if bad == "logprob":
        got[1] = _answer([5, 6, 7], [-4.0, -4.1 + 2 * TOL["logprob"], -4.2], [1.0] * 3)
    elif bad == "nan":
        got[1] = _answer([5, 6, 7], [-4.0, math.nan, -4.2], [1.0] * 3)
    elif bad == "length":
        got[1] = _answer([5, 6], [-4.0, -4.1], [1.0] * 2)
    else:
        got = got[:1]
    assert not serve_check.compare(got, ref, TOL)["passed"]


def test_parse_choice_reads_token_id_strings():
    choice = {"text": "", "index": 0, "finish_reason": "length",
              "logprobs": {"tokens": ["token_id:17", "token_id:4"], "token_logprobs": [-1.5, -0.25],
                           "top_logprobs": [{"token_id:17": -1.5, "token_id:3": -2.0}, {"token_id:4": -0.25}],
                           "text_offset": [0, 0]}}
    assert serve_check.parse_choice(choice) == {"tokens": [17, 4], "logprobs": [-1.5, -0.25],
                                                "top": [{17: -1.5, 3: -2.0}, {4: -0.25}]}


# ---------------------------------------------------------------------------------------------
# The log evidence, the hooks in every process, the environment, the shutdown
# ---------------------------------------------------------------------------------------------


def _line(proc, pid, message):
    return f"({proc} pid={pid}) INFO 12-02 05:10:11 [x.py:1] {message}"


OURS_PATH = "vllm_sparse_mla_blackwell.backend.SparseMLABlackwellBackend"  # backend.BACKEND_CLASS_PATH
RECORD = f"{serve_check.SELECTION_RECORD} {OURS_PATH}"
VLLM_LINE = "Using SPARSE_MLA_BLACKWELL attention backend out of potential backends: ['SPARSE_MLA_BLACKWELL']."


def test_backend_evidence_needs_every_worker():
    two = [_line("APIServer", 1, "started"), _line("Worker_TP0", 10, RECORD), _line("Worker_TP0", 10, VLLM_LINE),
           _line("Worker_TP1", 11, RECORD)]
    assert serve_check.backend_evidence("\n".join(two), 2)["passed"]
    assert not serve_check.backend_evidence("\n".join(two[:3]), 2)["passed"]  # one worker without a record
    other = two + [_line("Worker_TP1", 11, f"{serve_check.SELECTION_RECORD} vllm.FlashMLASparseBackend")]
    assert not serve_check.backend_evidence("\n".join(other), 2)["passed"]
    assert not serve_check.backend_evidence("\n".join(two[:1] + two[1:2] + two[3:]), 2)["passed"]  # no vLLM line
    ignored = two + [f"ERROR x {serve_check.IGNORED_MESSAGE}: ..."]
    assert not serve_check.backend_evidence("\n".join(ignored), 2)["passed"]
    one = [_line("EngineCore", 7, "\x1b[0;36m" + RECORD + "\x1b[0m"), _line("EngineCore", 7, VLLM_LINE)]
    assert serve_check.backend_evidence("\n".join(one), 1)["passed"]


def test_the_selection_record_path_is_the_backends():
    pytest.importorskip("vllm")
    from vllm_sparse_mla_blackwell import backend

    assert OURS_PATH == backend.BACKEND_CLASS_PATH  # the path these tests' log lines carry


_HOOKED = r"""
import sys, types, json
import torch
sys.modules["cutlass"] = None  # as on the GPU image: nvidia-cutlass-dsl missing
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
import vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl as q
try:
    import vllm.platforms.cuda as cuda_platform
except (ImportError, OSError):
    sys.modules.pop("vllm.platforms.cuda", None)
    sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    from vllm_sparse_mla_blackwell import serve_check
    serve_check.install_hooks()  # the first import failed; the hook was spent on it
    import vllm.platforms.cuda as cuda_platform
from vllm_sparse_mla_blackwell import serve_check
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
configure_logging(LoggingConfig())  # as vLLM's engine and workers do before they build the model
wrapped = cuda_platform.CudaPlatform.get_attn_backend_cls.__func__.__name__ == "selected"
fake = types.SimpleNamespace(CudaPlatform=type("P", (), {"get_attn_backend_cls": classmethod(lambda cls, *a: "vllm_sparse_mla_blackwell.backend.SparseMLABlackwellBackend")}))
serve_check._log_selections(fake)
fake.CudaPlatform.get_attn_backend_cls("x")
print("RESULT " + json.dumps({"stub": q.is_fused_q_cutedsl_supported(), "chained": bool(__import__("os").environ.get("CHAINED_MARK")),
                              "wrapped": wrapped}), flush=True)
"""


def test_sitecustomize_installs_the_stand_in_and_the_record_in_a_new_process(tmp_path):
    pytest.importorskip("vllm")
    hook = serve_check.write_sitecustomize(tmp_path / "hook")
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_MARK'] = '1'\n")
    env = serve_check.server_env(hook, {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(other), *filter(None, [os.environ.get("PYTHONPATH")])])})
    proc = subprocess.run([sys.executable, "-c", _HOOKED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out == {"stub": False, "chained": True, "wrapped": True}
    evidence = serve_check.backend_evidence(proc.stdout + proc.stderr, 1)  # vLLM's own logger and format
    assert (evidence["processes"], evidence["ours"]) == (1, 1)


def test_server_env_keeps_everything_and_prepends_the_hook(tmp_path):
    env = serve_check.server_env(tmp_path, {"PYTHONPATH": "/tmp/proj:/tmp/site33", "LD_PRELOAD": "/tmp/shim/x.so",
                                            "CUDA_HOME": "/usr/local/cuda"})
    assert env["PYTHONPATH"] == f"{tmp_path}:/tmp/proj:/tmp/site33"
    assert env["LD_PRELOAD"] == "/tmp/shim/x.so" and env["CUDA_HOME"] == "/usr/local/cuda"
    assert env[serve_check.SPARSE_MLA_ENV] == "1" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert serve_check.server_env(tmp_path, {})["PYTHONPATH"] == str(tmp_path)


def _group(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, preexec_fn=serve_check.default_sigint)
    time.sleep(1.5)  # let it start its child and set its handlers
    return proc


CHILD = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "


def test_shutdown_of_a_group_that_stops_on_sigint():
    pytest.importorskip("psutil")
    res = serve_check.shutdown(_group(CHILD + "time.sleep(60)"), grace_s=10)
    assert res["passed"] and res["signals"] == ["SIGINT"] and res["leftover"] == []


def test_processes_started_where_sigint_is_ignored_get_its_default():
    """A check run from a shell job (`cmd &` in a script) inherits SIGINT ignored; the servers it
    starts must still stop on shutdown's SIGINT, as they would from a terminal."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        inherited, reset = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           preexec_fn=fn).stdout.strip() for fn in (None, serve_check.default_sigint))
    finally:
        signal.signal(signal.SIGINT, before)
    assert (inherited, reset) == ("False", "True")


def test_shutdown_kills_a_group_that_ignores_signals_and_fails():
    pytest.importorskip("psutil")
    ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    res = serve_check.shutdown(_group(ignore + CHILD + "time.sleep(60)"), grace_s=1)
    assert not res["passed"] and res["signals"] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert res["exit_code"] == -signal.SIGKILL


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["serve", "--models", "llama"], ["serve", "--tensor-parallel-size", "0"],
                                  ["serve", "--timeout", "0"], ["serve", "--timeout", "nan"]])
def test_cli_rejects_bad_arguments_with_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("serve: ") and argv[-1] in err


def test_cli_rejects_a_non_integer_tensor_parallel_size():
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--tensor-parallel-size", "two"])
    assert exc.value.code == 2


@pytest.mark.parametrize("gpus", [0, 1])
def test_without_enough_gpus_exit_3_before_anything_starts(gpus, monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("started a process"))
    assert cli.main(["serve", "--models", "DeepSeek-V3.2", "--tensor-parallel-size", "2",
                     "--work-dir", str(tmp_path / "w")]) == 3
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# The orchestration against a stand-in server (no GPU): start, health, openai client, threads,
# log evidence, shutdown, reference, report
# ---------------------------------------------------------------------------------------------

_FAKE_SERVER = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def answer(prompt):
    toks = [(sum(prompt) * 7 + i) % 2000 + 16 for i in range(20)]
    return {"tokens": [f"token_id:{t}" for t in toks], "token_logprobs": [-4.0 - i / 100 for i in range(20)],
            "top_logprobs": [{f"token_id:{t}": -4.0 - i / 100, f"token_id:{t + 1}": -5.0} for i, t in enumerate(toks)],
            "text_offset": [0] * 20}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.time() > START + 1 else 503)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["return_tokens_as_token_ids"] and body["ignore_eos"] and body["temperature"] == 0
        out = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                          "choices": [{"index": 0, "text": "", "finish_reason": "length",
                                       "logprobs": answer(body["prompt"])}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass

START = time.time()
pid = os.getpid()
print(f"(EngineCore pid={pid}) INFO [x.py:1] serve check: attention backend selected: "
      "vllm_sparse_mla_blackwell.backend.SparseMLABlackwellBackend", flush=True)
print(f"(EngineCore pid={pid}) INFO [cuda.py:509] Using SPARSE_MLA_BLACKWELL attention backend out of "
      "potential backends: ['SPARSE_MLA_BLACKWELL'].", flush=True)
try:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
except KeyboardInterrupt:
    print("shut down", flush=True)
"""


@pytest.mark.parametrize("reference", ["same", "other_impl", "other_tokens"])
def test_check_model_against_a_stand_in_server(reference, tmp_path, monkeypatch, capsys):
    pytest.importorskip("psutil")
    popen = subprocess.Popen
    seen = {}

    def fake_popen(cmd, **kwargs):
        if "--reference" in cmd:  # the in-process LLM's answers, as the stand-in server's
            spec = json.loads(open(cmd[-1]).read())
            answers = []
            for p in spec["prompts"]:
                toks = [(sum(p) * 7 + i) % 2000 + 16 + 3 * (reference == "other_tokens") for i in range(20)]
                answers.append({"tokens": toks, "logprobs": [-4.0 - i / 100 + 0.01 for i in range(20)],
                                "top": [{t: -4.0 - i / 100, t + 1: -5.0} for i, t in enumerate(toks)]})
            impl = "FlashMLASparseImpl" if reference == "other_impl" else "SparseMLABlackwellImpl"
            open(spec["out"], "w").write(json.dumps({"answers": answers, "impls": [impl]}))
            return popen([sys.executable, "-c", "pass"], **kwargs)
        seen["cmd"], seen["env"] = cmd, kwargs["env"]
        return popen([sys.executable, "-c", _FAKE_SERVER, cmd[cmd.index("--port") + 1]], **kwargs)

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    row = serve_check.check_model("deepseek-v3.2", 1, tmp_path, time.time() + 120)
    assert seen["cmd"][1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"] and "--enforce-eager" not in seen["cmd"]
    assert seen["env"]["PYTHONPATH"].startswith(str(tmp_path / "hook"))
    assert row["error"] is None and row["backend"]["passed"] and row["shutdown"]["passed"], row
    assert row["shutdown"]["signals"] == ["SIGINT"]
    assert row["concurrent_vs_sequential"]["steps_compared"] == 80
    if reference == "same":
        assert row["server_vs_in_process"]["passed"]
        assert row["server_vs_in_process"]["max_logprob_diff"] == pytest.approx(0.01)
    assert row["server_vs_in_process"]["passed"] is (reference != "other_tokens")
    assert row["passed"] is (reference == "same")
    serve_check.print_report([row], "stand-in")
    assert ("PASS" if reference == "same" else "FAIL") in capsys.readouterr().out
    json.dumps(row)  # the report is plain data
