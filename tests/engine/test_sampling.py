"""Sampling: each rule checked by hand, seeded answers reproducible, temperature 0 equal to greedy."""

import math

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest, SamplingParams
from fusionrag_llm.engine.sampling import SamplingState, filtered_probs, next_tokens, penalise
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.methods import make_plan
from method_spy import spy

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862.",
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point.",
]
REQUEST = RAGRequest(chunks=CHUNKS, question="Who kept the log?")
HOT = {"temperature": 1.5, "seed": 11, "ignore_eos": True}  # every asked token, past any end token


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1)
    return rag


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": -0.1}, r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"),
        ({"temperature": 1e-45}, r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\], got 1e-45"),
        ({"top_p": 1e-300}, r"top_p must be a number in \[1e-06, 1\]"),
        ({"repetition_penalty": 1e-45}, r"repetition_penalty must be a number in \[0.01, 100\]"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be a number in \[1e-06, 1\]"),
        ({"top_p": 1.5}, r"top_p must be a number in \[1e-06, 1\]"),
        ({"top_k": -2}, "top_k must be an int >= 0"),
        ({"top_k": 2.5}, "top_k must be an int >= 0"),
        ({"min_p": 2}, r"min_p must be a number in \[0, 1\]"),
        ({"repetition_penalty": 0}, r"repetition_penalty must be a number in \[0.01, 100\]"),
        ({"frequency_penalty": 3}, r"frequency_penalty must be a number in \[-2, 2\]"),
        ({"presence_penalty": "1"}, "presence_penalty must be a finite number"),
        ({"seed": -1}, "seed must be None or an int"),
        ({"seed": True}, "seed must be None or an int"),
        ({"stop_token_ids": "7"}, "stop_token_ids must be a list of token ids"),
        ({"stop_token_ids": [1.5]}, "stop_token_ids must hold at most 64 ints >= 0"),
        ({"temprature": 1.0}, r"unknown sampling option\(s\) \['temprature'\]; allowed: temperature, top_p"),
    ],
)
def test_bad_sampling_options_are_clear_errors(options, message):
    with pytest.raises(FusionRAGError, match=message):
        SamplingParams.of(options)


def test_top_k_minus_one_means_no_limit_as_in_other_servers():
    assert SamplingParams(top_k=-1).top_k == 0


def test_temperature_zero_equals_greedy_and_penalty_free_greedy_reads_the_argmax(rag):
    greedy = rag.generate(REQUEST, max_new_tokens=6)
    explicit = rag.generate(REQUEST, max_new_tokens=6, sampling=SamplingParams(temperature=0.0, top_p=0.5, seed=3))
    assert explicit.token_ids == greedy.token_ids and greedy.token_ids


def test_a_seeded_answer_is_reproducible_and_the_seed_matters(rag):
    first = rag.generate(REQUEST, max_new_tokens=8, sampling=HOT)
    again = rag.generate(REQUEST, max_new_tokens=8, sampling=HOT)
    assert first.token_ids == again.token_ids
    others = {tuple(rag.generate(REQUEST, max_new_tokens=8, sampling={**HOT, "seed": seed}).token_ids)
              for seed in range(4)}  # fmt: skip
    assert len(others) > 1  # a random-weight model at temperature 1.5 over 256 tokens: draws differ


def test_seeded_answers_in_one_batch_equal_each_alone(rag):
    requests = [REQUEST, RAGRequest(chunks=CHUNKS[::-1], question="When was it lit?")]
    batch = rag.generate_many(requests, max_new_tokens=6, sampling=HOT)
    alone = [rag.generate(request, max_new_tokens=6, sampling=HOT) for request in requests]
    assert [g.token_ids for g in batch] == [g.token_ids for g in alone]


def test_n_answers_share_one_prefill_and_the_first_is_the_single_answer(rag):
    method, prefills = spy("fusionrag")  # the default method, counting the prefills it starts
    out = rag.generate(REQUEST, method=method, max_new_tokens=6, sampling=HOT, n=3)
    assert len(prefills) == 1 and len(out.others) == 2
    single = rag.generate(REQUEST, max_new_tokens=6, sampling=HOT)
    assert out.token_ids == single.token_ids
    # answer i draws from seed + i: answer 2 of n equals the single answer seeded one higher
    shifted = rag.generate(REQUEST, max_new_tokens=6, sampling={**HOT, "seed": HOT["seed"] + 1})
    assert out.others[0].token_ids == shifted.token_ids
    assert all(len(other.token_ids) == 6 and other.prompt_ids == out.prompt_ids for other in out.others)


def test_n_must_be_a_small_positive_int(rag):
    for bad in (0, 17, 2.0, True):
        with pytest.raises(FusionRAGError, match=r"n must be an int in \[1, 16\]"):
            rag.generate(REQUEST, n=bad)


def test_stop_token_ids_end_the_answer_before_the_token(rag):
    greedy = rag.generate(REQUEST, max_new_tokens=8, sampling={"ignore_eos": True})
    stop = greedy.token_ids[3]
    cut = rag.generate(REQUEST, max_new_tokens=8, sampling={"stop_token_ids": [stop], "ignore_eos": True})
    assert cut.token_ids == greedy.token_ids[: greedy.token_ids.index(stop)] and cut.finish_reason == "stop"
    with pytest.raises(FusionRAGError, match=r"stop_token_ids\[0\] is 100000"):
        rag.generate(REQUEST, sampling={"stop_token_ids": [100000]})


def test_filters_keep_what_each_rule_says():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2)).tolist() == pytest.approx([2 / 3, 1 / 3, 0, 0])
    # nucleus 0.7: 0.5 alone is short of it, 0.5 + 0.25 reaches it
    assert filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.7)).tolist() == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.8)).tolist() == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    # min_p 0.3: below 0.3 * 0.5 = 0.15 goes (0.15 itself stays)
    assert filtered_probs(logits, SamplingParams(temperature=1.0, min_p=0.3)).tolist() == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    # temperature 2 flattens: probabilities proportional to sqrt(p)
    roots = torch.tensor([0.5, 0.25, 0.15, 0.1]).sqrt()
    assert filtered_probs(logits, SamplingParams(temperature=2.0)).tolist() == pytest.approx((roots / roots.sum()).tolist())


def test_the_extremes_allowed_still_give_a_distribution():
    """At the edges of the allowed ranges, a float32 row of large logits gives finite probabilities."""
    row = torch.tensor([40.0, -40.0, 39.99, 0.0])
    for params in (SamplingParams(temperature=0.01), SamplingParams(temperature=1.0, top_p=1e-6),
                   SamplingParams(temperature=1e4, min_p=1.0), SamplingParams(temperature=0.01, top_k=1)):
        probs = filtered_probs(row, params)
        assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0) and probs[0] > 0, params
    penalised = penalise(row, [0, 1], [], SamplingParams(repetition_penalty=0.01))
    assert torch.isfinite(penalised).all() and penalised[:2].tolist() == pytest.approx([4000.0, -0.4])


def test_penalties_by_hand():
    row = torch.tensor([2.0, -2.0, 1.0, 0.5])
    params = SamplingParams(repetition_penalty=2.0)
    assert penalise(row, [0], [1], params).tolist() == [1.0, -4.0, 1.0, 0.5]  # prompt and answer tokens both
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    assert penalise(row, [3], [2, 2, 0], params).tolist() == [2.0 - 0.75, -2.0, 1.0 - 1.25, 0.5]  # answer only
    greedy_penalised = SamplingState(SamplingParams(repetition_penalty=10.0), None, [0], [])
    assert next_tokens(row[None], [greedy_penalised]) == [2]  # token 0 is penalised below token 2


def test_draws_follow_the_filtered_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    params = SamplingParams(temperature=1.0, seed=5)
    state = SamplingState(params, params.generator("cpu"), [], [])
    draws = [next_tokens(logits[None], [state])[0] for _ in range(3000)]
    for token, p in enumerate([0.6, 0.3, 0.1]):
        share = draws.count(token) / len(draws)
        assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / len(draws))  # within four standard errors


def test_a_request_whose_draw_fails_fails_alone(rag, monkeypatch):
    """Batched with two others, a request whose sampling step raises ends with that error; the others
    finish with the answers they get alone (the sampled one with its seed's draws)."""
    from fusionrag_llm.engine import sampling

    other = RAGRequest(chunks=CHUNKS[::-1], question="When was it lit?")
    alone = [rag.generate(REQUEST, max_new_tokens=6), rag.generate(other, max_new_tokens=6, sampling=HOT)]
    original = sampling._one_token

    def failing(row, state):
        if state.params.seed == 13:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return original(row, state)

    monkeypatch.setattr(sampling, "_one_token", failing)
    engine, plan = rag.engine, make_plan("fusionrag", None)
    seqs = [engine.add_request(rag.segments(REQUEST), plan, 6),
            engine.add_request(rag.segments(REQUEST), plan, 6, sampling={**HOT, "seed": 13}),
            engine.add_request(rag.segments(other), plan, 6, sampling=HOT)]  # fmt: skip
    while not all(seq.finished for seq in seqs):
        engine.step()
    assert seqs[1].finish_reason == "error" and "inf, nan" in str(seqs[1].error)
    assert [seqs[0].token_ids, seqs[2].token_ids] == [alone[0].token_ids, alone[1].token_ids]
    assert seqs[0].error is None and seqs[2].error is None
