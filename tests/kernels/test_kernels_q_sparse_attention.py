"""Q-sparse attention: reference vs a naive dense oracle, Triton vs reference, validation errors."""

import pytest
import torch
from kernel_cases import dense_attention, make_case, needs_cuda, needs_triton

from fusionrag_llm.kernels import q_sparse_attention as qsa_mod
from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention, q_sparse_attention_ref

# (nq, nk, hq, hkv, d, recompute): ragged context lengths (not multiples of 32), GQA 1/3/4, D 16/64/128.
CASES = [
    (1, 45, 4, 4, 16, False),
    (1, 77, 8, 2, 64, True),
    (3, 70, 6, 2, 64, True),
    (17, 100, 8, 2, 128, True),
    (17, 33, 3, 3, 32, False),
    (70, 150, 4, 1, 16, True),
    (70, 61, 3, 1, 16, False),
]


@pytest.mark.parametrize("nq,nk,hq,hkv,d,recompute", CASES)
def test_reference_matches_dense_oracle(nq, nk, hq, hkv, d, recompute):
    case = make_case(nq, nk, hq, hkv, d, recompute=recompute, seed=nq + nk)
    got = q_sparse_attention_ref(*case.args(), 0.3)
    want = dense_attention(*case.args(), 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reference_query_chunking(monkeypatch):
    monkeypatch.setattr(qsa_mod, "_REF_CHUNK_ELEMENTS", 300)  # forces many small query chunks
    case = make_case(17, 50, 4, 2, 16, seed=3)
    got = q_sparse_attention_ref(*case.args())
    torch.testing.assert_close(got, dense_attention(*case.args()), rtol=1e-5, atol=1e-5)


def test_row_without_visible_key_is_zero():
    case = make_case(3, 20, 2, 1, 16, recompute=False)
    case.q_positions[:] = torch.tensor([-1, 5, 30])
    case.k_valid[:] = True
    out = q_sparse_attention_ref(*case.args())
    assert torch.all(out[:, 0] == 0) and torch.all(out[:, 1:].abs().sum(-1) > 0)


def test_reference_bf16_returns_input_dtype():
    case = make_case(5, 30, 4, 2, 32, dtype=torch.bfloat16)
    out = q_sparse_attention_ref(*case.args())
    assert out.dtype == torch.bfloat16 and out.shape == case.q.shape


@needs_triton
@pytest.mark.parametrize("nq,nk,hq,hkv,d,recompute", CASES)
def test_triton_matches_reference(nq, nk, hq, hkv, d, recompute):
    case = make_case(nq, nk, hq, hkv, d, recompute=recompute, seed=nq * nk)
    got = q_sparse_attention(*case.args())
    want = q_sparse_attention_ref(*case.args())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_triton
def test_triton_zero_rows_and_all_valid_default():
    case = make_case(4, 40, 2, 2, 16, recompute=False)
    case.q_positions[:] = torch.tensor([-1, 0, 39, 100])
    got = q_sparse_attention(case.q, case.q_positions, case.k, case.v, case.k_positions, None)
    want = q_sparse_attention_ref(case.q, case.q_positions, case.k, case.v, case.k_positions, None)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.all(got[:, 0] == 0)


@needs_triton
@pytest.mark.parametrize("splits", [1, 4])
def test_the_output_is_token_major_so_the_output_projection_reads_it_without_a_copy(splits):
    from fusionrag_llm.kernels.q_sparse_attention_varlen import q_sparse_attention_spans

    case = make_case(3, 600, 4, 2, 16, recompute=False)
    offsets = torch.tensor([0, 3])
    out = q_sparse_attention_spans(*case.args()[:2], offsets, *case.args()[2:], torch.tensor([0]),
                                   torch.tensor([600]), 3, splits=splits)  # fmt: skip
    rows = out.transpose(0, 1).reshape(3, -1)  # [Nq, Hq * D], what o_proj multiplies
    assert rows.data_ptr() == out.data_ptr()  # a view of the kernel's buffer, not a copy
    torch.testing.assert_close(out, q_sparse_attention_ref(*case.args()), rtol=1e-4, atol=1e-5)


@needs_triton
def test_triton_non_contiguous_heads():
    case = make_case(5, 40, 4, 2, 16)
    k_big = torch.randn(2, case.k.shape[1], 2 * 16)
    k = k_big[..., :16]  # stride(1) = 32: a view into a wider buffer
    args = (case.q, case.q_positions, k, case.v, case.k_positions, case.k_valid)
    torch.testing.assert_close(q_sparse_attention(*args), q_sparse_attention_ref(*args), rtol=1e-4, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("shuffle_keys", [False, True])
def test_triton_long_context_scan_and_unsorted_keys(shuffle_keys):
    # > 2 scan chunks of 1024 keys; early queries make the backward scan step over invisible chunks,
    # and shuffled key positions put invisible tiles before the last visible key (exact no-ops).
    case = make_case(9, 2600, 4, 2, 16, seed=7)  # keys: 2600 context entries, then R's 9 fresh ones
    if shuffle_keys:
        perm = torch.randperm(2600, generator=torch.Generator().manual_seed(1))
        case.k_positions[:2600] = case.k_positions[:2600][perm]
    case.q_positions[:4] = torch.tensor([-5, 3, 40, 700])
    case.k_positions[2600:2603] = torch.tensor([2700, 1, 2000])
    got = q_sparse_attention(*case.args())
    want = dense_attention(*case.args())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.all(got[:, 0] == 0)


@needs_triton
def test_triton_block_sees_nothing_and_empty_context():
    case = make_case(5, 1500, 2, 1, 16, recompute=False, seed=4)
    case.q_positions[:] = torch.tensor([-3, -2, -7, -1, -9])  # no key visible: the scan finds nothing
    got = q_sparse_attention(*case.args())
    assert torch.all(got == 0)
    empty = q_sparse_attention(case.q, case.q_positions, case.k[:, :0], case.v[:, :0], case.k_positions[:0],
                               case.k_valid[:0])  # fmt: skip
    assert torch.all(empty == 0)


def _bad(case, **over):
    args = dict(q=case.q, q_positions=case.q_positions, k=case.k, v=case.v,
                k_positions=case.k_positions, k_valid=case.k_valid)
    args.update(over)
    return args


@pytest.mark.parametrize("fn", [q_sparse_attention_ref, pytest.param(q_sparse_attention, marks=needs_triton)])
def test_validation_errors(fn):
    case = make_case(3, 20, 4, 2, 16)
    bad = [
        (dict(q=case.q[0]), "q \\[Hq, Nq, D\\] must have 3 dimensions"),
        (dict(k=case.k.double()), "k \\[Hkv, Nk, D\\] has dtype"),
        (dict(q_positions=case.q_positions.int()), "q_positions \\[Nq\\] has dtype"),
        (dict(q=torch.randn(3, 3, 16)), "multiple of kv heads"),
        (dict(k_valid=case.k_valid[:-1]), "k_valid has 22 entries"),
        (dict(k_positions=case.k_positions[:1]), "k_positions has 1 entries"),
        (dict(v=case.v[:, :-1]), "v shape"),
    ]
    for over, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn(**_bad(case, **over))


@needs_triton
def test_launcher_rejects_head_dim_and_cpu_without_interpreter(monkeypatch):
    case = make_case(3, 20, 4, 2, 24)
    with pytest.raises(ValueError, match="head dim 24 is not supported"):
        q_sparse_attention(*case.args())
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        case = make_case(3, 20, 4, 2, 16)
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            q_sparse_attention(*case.args())


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("nq,nk,hq,hkv,d", [(1, 4099, 32, 8, 128), (16, 5000, 32, 8, 128), (30, 3000, 16, 4, 128),
                                            (600, 4000, 9, 3, 64), (2048, 8191, 32, 8, 128)])
def test_gpu_low_precision_parity(dtype, nq, nk, hq, hkv, d):
    case = make_case(nq, nk, hq, hkv, d, dtype=dtype, device="cuda", seed=1)
    got = q_sparse_attention(*case.args())
    want = q_sparse_attention_ref(*case.args())
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_fp32_parity():
    case = make_case(300, 3000, 8, 2, 128, device="cuda", seed=2)
    got = q_sparse_attention(*case.args())
    want = q_sparse_attention_ref(*case.args())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@needs_triton
def test_triton_unsorted_context_positions():
    """Context keys in any order (e.g. stitched out of order): visibility is by position only."""
    case = make_case(17, 90, 4, 2, 32, seed=5)
    perm = torch.randperm(case.k.shape[1])
    args = (case.q, case.q_positions, case.k[:, perm], case.v[:, perm], case.k_positions[perm],
            case.k_valid[perm])
    got = q_sparse_attention(*args)
    torch.testing.assert_close(got, dense_attention(*args), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ tiles that fit the card's shared memory

CARDS = {"H100/H200": 232448, "A100": 166912, "RTX 4090/L4": 101376, "64 KiB": 65536}  # bytes a block may opt in to


@pytest.fixture
def on_a_card(monkeypatch):
    """The launch configuration as on a CUDA card whose blocks may use ``limit`` bytes of shared memory."""
    monkeypatch.setattr(qsa_mod, "interpreting", lambda: False)
    monkeypatch.setattr(qsa_mod, "_REFUSED", {})

    def card(limit: int) -> torch.device:
        monkeypatch.setattr(qsa_mod, "_device_shared_memory", lambda index: limit)
        return torch.device("cuda", 0)

    return card


@pytest.mark.parametrize("card", CARDS)
def test_tiles_fit_the_cards_shared_memory_and_an_h100_keeps_the_swept_ones(on_a_card, card):
    device = on_a_card(CARDS[card])
    for rows, itemsize, head_dim in [(r, i, d) for r in (1, 64, 100, 512) for i in (2, 4) for d in (64, 128)]:
        swept, fitted = qsa_mod.launch_config(rows, itemsize), qsa_mod.launch_config(rows, itemsize, head_dim, device)
        assert qsa_mod.shared_memory_bytes(fitted, head_dim, itemsize) <= CARDS[card]
        assert fitted["BLOCK_M"] >= 16 and fitted["BLOCK_N"] >= 16 and fitted["num_stages"] >= 1
        if card == "H100/H200":
            assert fitted == swept  # the tiles the sweep picked there


def test_a_card_with_less_shared_memory_than_an_h100_gets_shallower_pipelines(on_a_card):
    swept = qsa_mod.launch_config(8, 2)  # decode-sized: 16 x 128 tiles, three stages (~204 KiB)
    assert qsa_mod.launch_config(8, 2, 128, on_a_card(CARDS["A100"])) == {**swept, "num_stages": 2}
    assert qsa_mod.launch_config(8, 2, 128, on_a_card(CARDS["RTX 4090/L4"])) == {**swept, "num_stages": 1}


def test_tiles_a_card_refuses_are_retried_smaller_and_remembered(on_a_card):
    from fusionrag_llm.kernels._common import OutOfResources

    device, tried = on_a_card(CARDS["H100/H200"]), []
    needs = lambda cfg: qsa_mod.shared_memory_bytes(cfg, 128, 2)  # noqa: E731

    def launch(cfg):  # a card whose compiler allocates more than the estimate: 120 KiB at most fit
        tried.append(cfg)
        if needs(cfg) > 120 * 1024:
            raise OutOfResources(needs(cfg), 120 * 1024, "shared memory")
        return "ran"

    assert qsa_mod.launch_fitting(launch, 8, 2, 128, device) == "ran"
    assert tried[0] == qsa_mod.launch_config(8, 2) and len(tried) > 1 and needs(tried[-1]) <= 120 * 1024
    assert [needs(cfg) for cfg in tried] == sorted((needs(cfg) for cfg in tried), reverse=True)
    tried.clear()
    assert qsa_mod.launch_fitting(launch, 8, 2, 128, device) == "ran" and len(tried) == 1  # the refusal is remembered

    def never(cfg):
        raise OutOfResources(needs(cfg), 0, "shared memory")

    with pytest.raises(OutOfResources):  # not even the smallest tiles: the card's own error
        qsa_mod.launch_fitting(never, 8, 2, 128, device)
