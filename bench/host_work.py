"""Host work of one long request before its prefill: splitting it into segments (tokenizing, finding the
stored chunks in a chat message) and planning its context (entry keys, path blocks), with no model run.

    python bench/host_work.py [--model smollm2-135m] [--dataset FILE|synthetic] [--tokens 32768] [--out DIR]

Passages of the dataset's questions, in order, until the request holds about ``tokens`` tokens, are
registered with ``add_chunks`` (plain entries only) and then asked about twice: as a ``RAGRequest``
(chunks and a question) and as one chat message holding the same passages as text (what the server
and the framework adapters send, where the chunks are found in the text). Each is split ``repeats``
times (median reported; the ``RAGRequest`` both with its texts new to the tokenizer's memory of
encoded texts and asked again), and the ``RAGRequest``'s segments are planned for ``full_reuse`` and
``fusionrag``. On a GPU this work is part of every time to the first token and does not get faster
with the card. Writes host_work.json and host_work.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.engine.plan import plan_context
from fusionrag_llm.eval.bench_data import dataset_label, load_examples
from fusionrag_llm.eval.results import machine_info, markdown_table, write_report
from fusionrag_llm.methods import make_plan
from fusionrag_llm.models.tokenizer import EncodedTexts

TINY_ARGS = ["--model", "tiny", "--dataset", "synthetic", "--tokens", "1500", "--repeats", "1"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default=None, help="a MuSiQue-format file, or synthetic (default: the shared file)")
    parser.add_argument("--tokens", type=int, default=32768, help="about this many tokens of passages")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="bench_results/host_work")
    return parser.parse_args(argv)


def passages_for(rag: FusionRAG, dataset: str, tokens: int) -> list[str]:
    """Passages in dataset order until they hold ``tokens`` tokens."""
    chosen, held = [], 0
    for example in load_examples(dataset, None, passages=10, seed=0):
        for passage in example.passages:
            if held >= tokens:
                return chosen
            chosen.append(passage.text)
            held += len(rag.tokenizer.encode(passage.text))
    return chosen


def median_ms(run, repeats: int, before=None) -> float:
    """Milliseconds of ``run``, the median of ``repeats`` (``before``, untimed, ahead of each)."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main(argv=None) -> None:
    args = parse_args(argv)
    dataset = dataset_label(args.dataset)
    rag = FusionRAG.from_pretrained(args.model, store=":memory:")
    passages = passages_for(rag, dataset, args.tokens)
    rag.add_chunks(passages, fuse=False)
    question = "Which of these passages answers the question first?"
    request = RAGRequest(chunks=passages, question=question)
    chat = [{"role": "user", "content": "Context:\n\n" + "\n\n".join(passages) + f"\n\nQuestion: {question}"}]
    segments = rag.segments(request)
    found = sum(segment.kind == "chunk" for segment in rag.segments(chat))
    tokens = sum(len(segment.token_ids) for segment in segments)
    def unseen(asked):  # the texts' ids not in the tokenizer's memory
        rag.tokenizer.encoded = EncodedTexts()
        return rag.segments(asked)

    shuffled = passages[1::2] + passages[::2]
    other = [{"role": "user", "content": "Context:\n\n" + "\n\n".join(shuffled) + "\n\nQuestion: And the second?"}]
    rows = [("segments, RAGRequest, texts not encoded before", median_ms(lambda: unseen(request), args.repeats)),
            ("segments, RAGRequest, asked again", median_ms(lambda: rag.segments(request), args.repeats)),
            (f"segments, chat message ({found} of {len(passages)} chunks found), texts not encoded before",
             median_ms(lambda: unseen(chat), args.repeats)),
            ("segments, chat message, asked again", median_ms(lambda: rag.segments(chat), args.repeats)),
            ("segments, chat message, the same passages in another order, another question",
             median_ms(lambda: rag.segments(other), args.repeats, before=lambda: unseen(chat)))]  # fmt: skip
    for method in ("full_reuse", "fusionrag"):
        plan = make_plan(method)
        rows.append((f"plan, {method}", median_ms(lambda: plan_context(segments, plan, rag.engine.keys, True),
                                                  args.repeats)))  # fmt: skip
    result = {"config": {**vars(args), "dataset": dataset}, "machine": machine_info(rag), "tokens": tokens,
              "passages": len(passages), "rows": [{"step": step, "ms": ms, "us_per_token": ms * 1e3 / tokens}
                                                  for step, ms in rows]}  # fmt: skip
    table = markdown_table(["step", "ms", "us per token"], [(step, f"{ms:.1f}", f"{ms * 1e3 / tokens:.2f}") for step, ms in rows])
    markdown = f"# Host work of one request, {tokens} tokens, {len(passages)} passages, {args.model}\n\n{table}\n"
    paths = write_report(Path(args.out), "host_work", result, markdown)
    print(markdown + "wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
