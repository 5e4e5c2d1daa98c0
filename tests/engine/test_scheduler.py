"""The scheduler is bookkeeping over sequences: testable without a model or a tensor."""

import pytest

from fusionrag_llm.engine.scheduler import DEVICE_DEFAULTS, Scheduler, SchedulerConfig
from fusionrag_llm.engine.sequence import Sequence, Status
from fusionrag_llm.methods import make_plan


def _seq(request_id, prompt_tokens=10, prefetch=0):
    return Sequence(request_id, [], make_plan("full_reuse"), 4, list(range(prompt_tokens)), frozenset({0}),
                    prefetch=prefetch)  # fmt: skip


def _run(scheduler, step):
    for seq in step.prefills:
        seq.accept(7)
    scheduler.update(step)


def test_admits_within_the_limits_and_decodes_the_running():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=3, max_prefill_tokens=25))
    seqs = [_seq(i) for i in range(5)]
    for seq in seqs:
        scheduler.add(seq)
    step = scheduler.schedule(lambda s: True)
    assert step.prefills == seqs[:2] and not step.decodes  # 10 + 10 tokens fit, a third would not
    _run(scheduler, step)
    step = scheduler.schedule(lambda s: True)
    assert step.decodes == seqs[:2] and step.prefills == seqs[2:3]  # three sequences at most
    assert all(s.status is Status.RUNNING for s in seqs[:2])


def test_loaded_sequences_are_admitted_first_then_the_others_while_there_is_room():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=2))
    loading, loaded, later = _seq(0, prefetch=4), _seq(1, prefetch=4), _seq(2, prefetch=4)
    for seq in (loading, loaded, later):
        scheduler.add(seq)
    step = scheduler.schedule(lambda s: s is loaded)
    assert step.prefills == [loaded, loading]  # the ready one first; the batch has room for one more
    _run(scheduler, step)
    step = scheduler.schedule(lambda s: True)
    assert step.prefills == [] and step.decodes == [loaded, loading]  # full: decode on, `later` waits


def test_a_request_of_n_answers_takes_n_places():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=3))
    two, other, one = _seq(0), _seq(1), _seq(2)
    two.n = other.n = 2
    for seq in (two, other, one):
        scheduler.add(seq)
    step = scheduler.schedule(lambda s: True)
    assert step.prefills == [two]  # 2 of 3 places taken: the next request of 2 answers waits (so does the one behind it)
    wide = _seq(3)
    wide.n = 4  # more answers than the batch holds: it runs, alone
    alone = Scheduler(SchedulerConfig(max_num_seqs=3))
    alone.add(wide)
    alone.add(_seq(4))
    assert alone.schedule(lambda s: True).prefills == [wide]


def test_a_prompt_over_the_token_budget_still_runs_alone():
    scheduler = Scheduler(SchedulerConfig(max_prefill_tokens=5))
    big = _seq(0, prompt_tokens=50)
    scheduler.add(big)
    assert scheduler.schedule(lambda s: True).prefills == [big]


def test_prefetch_window_and_abort():
    scheduler = Scheduler()
    seqs = [_seq(i, prefetch=2) for i in range(4)] + [_seq(4)]
    for seq in seqs:
        scheduler.add(seq)
    assert scheduler.to_prefetch() == seqs[:2]
    assert scheduler.abort(1) is seqs[1] and scheduler.abort(1) is None
    assert scheduler.to_prefetch() == [seqs[0], seqs[2]]


def test_cache_slots_bound_what_is_admitted_until_running_sequences_finish():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_kv_tokens=30))
    seqs = [_seq(i) for i in range(4)]  # each holds 10 prompt tokens + 4 new ones = 14 slots
    for seq in seqs:
        scheduler.add(seq)
    step = scheduler.schedule(lambda s: True)
    assert step.prefills == seqs[:2]  # 28 of 30 slots: a third would need 42
    _run(scheduler, step)
    step = scheduler.schedule(lambda s: True)
    assert step.prefills == [] and step.decodes == seqs[:2]  # the running ones still hold their slots
    seqs[0].finish("stop")
    _run(scheduler, step)
    step = scheduler.schedule(lambda s: True)
    assert step.decodes == seqs[1:2] and step.prefills == seqs[2:3]  # 14 freed: one more fits
    wide = _seq(9)
    wide.n = 2  # two answers hold two caches: 28 slots
    bounded = Scheduler(SchedulerConfig(max_kv_tokens=40))
    for seq in (_seq(8), wide):
        bounded.add(seq)
    assert len(bounded.schedule(lambda s: True).prefills) == 1


def test_none_limits_are_the_devices_defaults():
    scheduler = Scheduler(SchedulerConfig(max_prefill_tokens=100), SchedulerConfig(max_num_seqs=2, max_kv_tokens=50))
    assert scheduler.limit("max_num_seqs") == 2 and scheduler.limit("max_kv_tokens") == 50
    scheduler.config = SchedulerConfig(max_num_seqs=5)
    assert scheduler.limit("max_num_seqs") == 5 and scheduler.limit("max_prefill_tokens") == 16384
    cpu = Scheduler()  # a CPU: 16 sequences, no bound on slots
    assert cpu.limit("max_num_seqs") == 16 and cpu.limit("max_kv_tokens") is None
    assert DEVICE_DEFAULTS["cuda"].max_num_seqs == 256
    for _ in range(20):
        cpu.add(_seq(len(cpu.waiting), prompt_tokens=1000))
    assert len(cpu.schedule(lambda s: True).prefills) == 16


@pytest.mark.parametrize("field", ["max_num_seqs", "max_prefill_tokens", "max_kv_tokens"])
@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_bad_limits_are_refused(field, bad):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{field: bad})
    if field != "max_prefill_tokens":
        assert getattr(SchedulerConfig(**{field: None}), field) is None  # the device's default
    else:
        with pytest.raises(ValueError, match=field):
            SchedulerConfig(max_prefill_tokens=None)


def test_a_sequence_finishes_on_a_stop_token_or_the_length():
    stopped, capped = _seq(0), _seq(1)
    stopped.accept(5)
    stopped.accept(0)  # the stop id is not kept
    assert stopped.token_ids == [5] and stopped.finish_reason == "stop"
    for token in (1, 2, 3, 4):
        capped.accept(token)
    assert capped.finished and capped.finish_reason == "length" and len(capped.token_ids) == 4


def test_a_load_that_finishes_during_admission_is_not_skipped():
    scheduler = Scheduler()
    seqs = [_seq(i, prefetch=4) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    answers = iter([False, True, False] + [True] * 10)  # request 1 becomes ready between two looks
    step = scheduler.schedule(lambda s: next(answers))
    assert sorted(s.request_id for s in step.prefills) == [0, 1, 2]


def test_a_gpus_slots_are_a_share_of_its_free_memory():
    from fusionrag_llm.engine.model_runner import KV_MEMORY_SHARE, kv_budget

    assert kv_budget(80 << 30, 128 << 10, 256 * 8192) == int((80 << 30) * KV_MEMORY_SHARE) // (128 << 10)
    assert kv_budget(80 << 30, 1 << 10, 256 * 4096) == 256 * 4096  # a small model: what could ever be admitted
    assert kv_budget(10, 128 << 10, 256) == 1  # never none at all: a request too large is refused by name
