"""The kernels' own source run on the CPU (tests/emulation): verify's bars (cases.compare against
the fp32 reference, NaN-poisoned outputs and unreferenced cache rows) on a case matrix that
reaches every kernel configuration and variant, split launches and every combine kernel, each in
three warp schedules; and checks of the emulation itself (its MMA fragments against a plain
product; the hangs, disagreeing lanes and early reads it must report). Not a GPU test: it runs
in CI, which has none; what only a GPU shows (timing, races beyond a missing barrier, the
hardware's own rounding) stays with the `gpu` tests."""

from __future__ import annotations

import ctypes
import itertools
import re
import threading

import pytest
import torch

import emulation
from vllm_sparse_mla_blackwell import cases, envs

pytestmark = pytest.mark.skipif(emulation.unavailable() is not None, reason=str(emulation.unavailable()))

SCHEDULES = tuple(emulation.SCHEDULES)


def run(emulator: emulation.Emulator, case: cases.Case, **launch) -> cases.CaseResult:
    inputs, lse = emulator.run_case(case, **launch)
    return cases.compare(case, inputs, inputs.out, lse)


@pytest.fixture(autouse=True)
def _default_bars(monkeypatch):
    # The e4m3 P V option loosens fp8_ds_mla's bar (cases.max_rel_err); the emulation has no e4m3 MMA.
    monkeypatch.delenv(envs.E4M3_PV_ENV, raising=False)


def check(emulator, case, **launch):
    r = run(emulator, case, **launch)
    assert r.passed, (f"{case.label()} {launch}: rel {r.max_rel_err:.3g} (bar {cases.max_rel_err(case):g}), "
                      f"cos {r.min_cosine:.8f}, lse {r.max_lse_err:.3g}, masked exact {r.masked_exact}, "
                      f"all written {r.all_written}")


# Every configuration (q dtype x cache x D x heads per block; 32-head blocks run the WideWarps
# kernel but for fp16 q with a bf16 cache), 3 tiles with random masking.
CONFIGURATIONS = list(itertools.product(("bf16", "fp16"), ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"), (512, 576),
                                        (16, 32)))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("q_dtype,kv,head_size,block_heads", CONFIGURATIONS)
def test_every_configuration(emulator, q_dtype, kv, head_size, block_heads, schedule):
    case = cases.Case(head_size=head_size, num_heads=block_heads, topk=96, num_tokens=2, q_dtype=q_dtype,
                      kv_cache_dtype=kv, masking="random", block_heads=block_heads)
    check(emulator, case, schedule=schedule)


# Every configuration that has a variant (kernel_traits.h): OneStage for 16-head blocks of 16-bit
# caches, DecodedFp8 for fp8 caches, PairedScores for 16-head fp8_ds_mla blocks at D = 576.
VARIANTS = [("one_stage", q, kv, d, 16) for q, kv, d in itertools.product(("bf16", "fp16"), ("bf16", "fp16"), (512, 576))]
VARIANTS += [("decoded_fp8", q, kv, d, h) for q, kv, d, h in itertools.product(("bf16", "fp16"), ("fp8_e4m3", "fp8_ds_mla"),
                                                                                (512, 576), (16, 32))]
VARIANTS += [("paired_scores", q, "fp8_ds_mla", 576, 16) for q in ("bf16", "fp16")]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("variant,q_dtype,kv,head_size,block_heads", VARIANTS)
def test_variants(emulator, variant, q_dtype, kv, head_size, block_heads, schedule):
    case = cases.Case(head_size=head_size, num_heads=block_heads, topk=96, num_tokens=2, q_dtype=q_dtype,
                      kv_cache_dtype=kv, masking="random", block_heads=block_heads)
    check(emulator, case, variant=variant, schedule=schedule)


def test_a_variant_the_configuration_lacks_is_refused(emulator):
    case = cases.Case(num_heads=16, topk=64, num_tokens=1, kv_cache_dtype="bf16")
    with pytest.raises(emulation.EmulationError, match="does not exist for this configuration"):
        run(emulator, case, variant="paired_scores")


# Split launches: the combine kernel of one thread group, of four (decode) and of four with more
# loads per round (65-68 splits), each with bf16 and fp16 out; later rounds of loads (more splits
# than the groups' loads per round: G = 1 past 8, G = 4 past 64 and 68); splits that some tokens
# leave empty (topk_len, or more splits than tiles).
SPLITS = [
    dict(case=dict(num_heads=16, topk=256, num_tokens=2), num_splits=3, combine_split_groups=1),
    dict(case=dict(num_heads=32, topk=256, num_tokens=2, block_heads=32), num_splits=4, combine_split_groups=4),
    dict(case=dict(num_heads=16, topk=2176, num_tokens=1, head_size=512), num_splits=68, combine_split_groups=4),
    dict(case=dict(num_heads=16, topk=256, num_tokens=4, masking="topk_len", kv_cache_dtype="fp8_ds_mla"),
         num_splits=8, combine_split_groups=4),
    dict(case=dict(num_heads=32, topk=160, num_tokens=3, block_heads=32, q_dtype="fp16", kv_cache_dtype="fp8_e4m3"),
         num_splits=2, combine_split_groups=1),
    dict(case=dict(num_heads=16, topk=384, num_tokens=2, q_dtype="fp16", kv_cache_dtype="fp16"), num_splits=12,
         combine_split_groups=1),
    dict(case=dict(num_heads=16, topk=256, num_tokens=1, q_dtype="fp16", kv_cache_dtype="fp16"), num_splits=4,
         combine_split_groups=4),
    dict(case=dict(num_heads=16, topk=2176, num_tokens=1, head_size=512, q_dtype="fp16", kv_cache_dtype="fp8_ds_mla"),
         num_splits=68, combine_split_groups=4),
    dict(case=dict(num_heads=16, topk=2400, num_tokens=1, masking="random"), num_splits=75, combine_split_groups=4),
    dict(case=dict(num_heads=16, topk=3200, num_tokens=1, q_dtype="fp16", kv_cache_dtype="fp16"), num_splits=128,
         combine_split_groups=4),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("split", SPLITS,
                         ids=lambda s: f"{s['case'].get('q_dtype', 'bf16')}-{s['num_splits']}x{s['combine_split_groups']}")
def test_split_launches(emulator, split, schedule):
    check(emulator, cases.Case(**split["case"]), num_splits=split["num_splits"],
          combine_split_groups=split["combine_split_groups"], schedule=schedule)


# Masking, layouts and inputs verify's matrix covers, on the 32-head kernels (WideWarps) and the
# 16-head ones.
INPUTS = [
    dict(masking="invalid"), dict(masking="all_masked"), dict(masking="causal", num_tokens=5),
    dict(masking="topk_len"), dict(layout="strided"), dict(layout="split_q"), dict(index_width=150),
    dict(num_heads=20), dict(num_heads=40), dict(num_tokens=1), dict(sm_scale=cases.SM_SCALES[1]),
    dict(block_size=16, topk=70), dict(value_scale_log2=20), dict(value_scale_log2=-20),
    # The lazy rescale's rising maxima (fp16 P: fp16 caches, fp8 caches).
    dict(row_ramp=3.0, kv_cache_dtype="fp16", q_dtype="fp16", topk=256),
    dict(row_ramp=16.0, kv_cache_dtype="fp8_e4m3", topk=256),
    dict(row_ramp=3.0, kv_cache_dtype="fp8_ds_mla", topk=256),
    dict(row_ramp=3.0, kv_cache_dtype="fp8_ds_mla", q_dtype="fp16", topk=256),
    dict(row_spread=12, kv_cache_dtype="fp8_ds_mla"), dict(row_spread=12, kv_cache_dtype="fp8_ds_mla", q_dtype="fp16"),
]


@pytest.mark.parametrize("block_heads", (16, 32))
@pytest.mark.parametrize("inputs", INPUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_inputs(emulator, inputs, block_heads):
    fields = dict(num_heads=32, topk=128, num_tokens=3, block_heads=block_heads) | inputs
    check(emulator, cases.Case(**fields), schedule=SCHEDULES[INPUTS.index(inputs) % len(SCHEDULES)])


# The emulation itself.
def _check(emulator: emulation.Emulator, name: str) -> str:
    lib = emulator._lib
    result = ctypes.create_string_buffer(4096)
    assert lib.sparse_mla_emulator_check(name.encode(), result, len(result)) == 0, result.value.decode()
    return result.value.decode()


@pytest.mark.parametrize("name", ("mma_bf16", "mma_fp16", "mma_fp16_b_rows"))
def test_mma_fragments_give_the_matrix_product(emulator, name):
    assert float(_check(emulator, name)) < 1e-5


def test_shuffles_votes_and_reductions(emulator):
    assert _check(emulator, "shuffles") == "ok"


@pytest.mark.parametrize("name,message", [
    ("shuffle_after_exit", "deadlock: no thread can go on (a hang on the GPU)"),
    ("named_barrier_short", "deadlock: no thread can go on (a hang on the GPU); block (0, 0) thread 0 at barrier 1"),
    ("divergent_warp_ops", "the lanes of a warp wait at different warp operations"),
    ("copy_in_flight_at_exit", "cp.async copies still in flight when block (0, 0) thread 0 exited"),
    ("divergent_barrier_sites", "the lanes of a warp wait at barrier 0 from different call sites"),
    ("barrier_sites_across_warps", "warps wait at aligned barrier 0 from different call sites"),
    ("unaligned_barrier_sites_across_warps", "no error"),
    ("roles_pass_different_barriers", "warps reach barrier 0, which every warp waits at, having passed 1 and 0 barriers"),
    ("roles_pass_as_many_barriers", "no error"),
    ("ldmatrix_misaligned", "ldmatrix: a 16-byte row outside the block's shared memory or not 16-byte aligned"),
    # Not a hang: bar.sync counts a warp once its threads that have not exited are there.
    ("named_barrier_with_exited_lanes", "no error"),
    ("barrier_arrived_twice", "arrived twice at barrier 1 before it completed (block (0, 0) thread 32)"),
    ("barrier_arrival_never_completed", "barrier 1: threads arrived that no barrier completed"),
    ("mbarrier_before_init", "mbarrier: used before mbarrier.init (block (0, 0) thread 0)"),
    ("mbarrier_init_misaligned", "mbarrier.init: 8 bytes of the block's shared memory, 8-byte aligned"),
    ("mbarrier_init_no_arrivals", "mbarrier.init: a positive arrival count"),
    ("mbarrier_arrival_never_completed", "mbarrier: threads arrived that no phase completed"),
    ("mbarrier_never_completes", "deadlock: no thread can go on (a hang on the GPU); block (0, 0) thread 0 at an mbarrier"),
])
def test_what_would_hang_or_misbehave_on_the_gpu_is_reported_and_only_that(emulator, name, message):
    assert _check(emulator, name).startswith(message)


def test_copies_read_before_their_wait_read_nan(emulator):
    assert int(_check(emulator, "copy_read_before_wait")) > 100  # of 128 reads
    assert int(_check(emulator, "copy_read_after_wait")) == 0


def test_a_missing_barrier_shows_when_the_reading_warp_runs_ahead(emulator):
    # Stale reads per schedule: lockstep, warps ahead, warps ahead reversed (2 blocks x 32 reads).
    assert _check(emulator, "missing_barrier").split() == ["0", "0", "64"]


def test_an_arrival_hands_over_what_was_written_before_it(emulator):
    # bar.arrive by the writing warp, bar.sync by the reading one, in every schedule, twice.
    assert _check(emulator, "arrive_handoff") == "no error: 0; " * 3


def test_a_read_placed_after_an_arrival_shows_when_the_arrival_waits(emulator):
    # Stale reads per schedule (2 blocks x 32 reads): warps_ahead holds an arriving warp until the
    # waiting one has gone on and written.
    assert _check(emulator, "arrive_before_the_read").split() == ["0", "64", "0"]


def test_an_mbarrier_hands_over_what_was_written_before_the_arrivals(emulator):
    # 32 arrivals by the writing warp, a wait for the phase's parity by the reading one, three rounds.
    assert _check(emulator, "mbarrier_handoff") == "no error: 0; " * 3


def test_a_wait_for_the_wrong_parity_reads_early_or_hangs(emulator):
    # The other parity's phase has completed: the reader goes on before the writer (2 blocks x 32
    # reads x 3 rounds) where it runs first, and waits forever where the writer arrived first.
    seen = _check(emulator, "mbarrier_wrong_parity")  # per schedule "error: stale reads; "
    assert seen.startswith("no error: 192; no error: 192; deadlock: no thread can go on (a hang on the GPU)")
    assert seen.endswith(" at an mbarrier: 0; ")


def test_a_read_placed_after_an_mbarrier_arrival_shows_when_the_arrival_waits(emulator):
    assert _check(emulator, "mbarrier_arrive_before_the_read").split() == ["0", "64", "0"]


def test_a_missing_warp_sync_shows_when_the_lanes_run_from_the_last(emulator):
    # Stale reads per schedule (2 blocks x 2 warps x 31 reads): warps_ahead_reversed runs lanes
    # from 31 down.
    assert _check(emulator, "missing_warp_sync").split() == ["0", "0", "124"]


def test_every_shared_array_of_the_kernels_is_static_or_extern():
    # On the host a plain `__shared__ T x[N];` in a function is one array per thread (fiber):
    # `static __shared__`, the same thing to nvcc, is one per block, as on the GPU.
    root = emulation.ROOT / "csrc"
    plain = [f"{path.relative_to(root)}:{n}: {line.strip()}"
             for path in sorted(root.rglob("*")) if path.suffix in (".cu", ".cuh", ".h")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b__shared__\b", line) and not re.search(r"\b(static|extern)\s+__shared__\b", line)
             and not line.strip().startswith("//")]
    assert not plain, plain


def test_zero_tokens_and_empty_tensors_take_the_gpu_paths_checks(emulator):
    # An empty tensor is given, not absent: zero tokens are a no-op, an empty k_scale is refused.
    q = torch.zeros(0, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(64, 576, dtype=torch.bfloat16)
    emulator.forward(q, kv, torch.zeros(0, 64, dtype=torch.int32), torch.zeros(0, 16, 512, dtype=torch.bfloat16),
                     torch.zeros(0, 16), sm_scale=0.1, kv_cache_dtype="auto")
    emulator.concat_and_cache(torch.zeros(0, 512, dtype=torch.bfloat16), None, kv[:, :512].clone(),
                              torch.zeros(0, dtype=torch.int64), "auto")
    cache = torch.zeros(64, 576, dtype=torch.uint8)
    with pytest.raises(emulation.EmulationError, match="k_scale"):
        emulator.concat_and_cache(torch.ones(2, 512, dtype=torch.bfloat16), torch.ones(2, 64, dtype=torch.bfloat16),
                                  cache, torch.arange(2), "fp8_e4m3", torch.zeros(0))
    assert (cache == 0).all()
    with pytest.raises(emulation.EmulationError, match="variant must be one of"):
        run(emulator, cases.Case(num_heads=16, topk=64, num_tokens=1), variant="nope")


def test_calls_from_two_threads_take_turns(emulator):
    case = cases.Case(num_heads=16, topk=64, num_tokens=2)
    results = []
    threads = [threading.Thread(target=lambda: results.extend(run(emulator, case) for _ in range(3)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(r.passed for r in results)
