"""What the server has served, for ``GET /metrics`` (Prometheus' text format) and one log line a request.

Server-wide totals only, with no label naming a tenant, a key or a prompt: whoever may call the
server may read them, as they may read ``/health``. Counted when a completion's last answer finishes
(a request that failed before its first token is counted by its status code only).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger("fusionrag_llm.server.requests")

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TOKENS = {  # counter -> (help, how a request's answers count it)
    "prompt_tokens": ("Prompt tokens of finished requests.", lambda stats: stats[0].prompt_tokens),
    "cached_tokens": ("Prompt tokens whose KV was reused (exact or approximated).",
                      lambda stats: stats[0].exact_tokens + stats[0].reused_tokens),
    "computed_tokens": ("Prompt tokens run through the model.", lambda stats: stats[0].computed_tokens),
    "generated_tokens": ("Tokens generated, every answer of n.", lambda stats: sum(s.generated_tokens for s in stats)),
}  # fmt: skip


class Metrics:
    """Counters the routes update (thread-safe) and their rendering."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}  # (endpoint, finish reason) -> finished requests
        self._responses: dict[int, int] = {}  # status code of refused or failed requests -> count
        self._tokens = dict.fromkeys(_TOKENS, 0)
        self._ttft = [0] * (len(TTFT_BUCKETS_S) + 1)  # per bucket, the last one +Inf
        self._ttft_sum = 0.0

    def finished(self, endpoint: str, request_id: str, stats: list[Any], reasons: list[str], seconds: float) -> None:
        """A completion whose answers all finished: count it and log its line."""
        first = stats[0]
        reason = reasons[0] if len(set(reasons)) == 1 else "mixed"
        with self._lock:
            self._requests[endpoint, reason] = self._requests.get((endpoint, reason), 0) + 1
            for name, (_, count) in _TOKENS.items():
                self._tokens[name] += int(count(stats))
            self._ttft[next((i for i, edge in enumerate(TTFT_BUCKETS_S) if first.ttft_s <= edge), -1)] += 1
            self._ttft_sum += first.ttft_s
        logger.info("%s %s method=%s r=%s prompt=%d cached=%d computed=%d generated=%d ttft_ms=%.0f total_ms=%.0f "
                    "finish=%s", request_id, endpoint, first.method, first.recompute_ratio, first.prompt_tokens,
                    first.exact_tokens + first.reused_tokens, first.computed_tokens,
                    sum(s.generated_tokens for s in stats), first.ttft_s * 1000, seconds * 1000, reason)  # fmt: skip

    def refused(self, status: int) -> None:
        with self._lock:
            self._responses[status] = self._responses.get(status, 0) + 1

    def render(self, running: int, waiting: int) -> str:
        """Every metric in Prometheus' text exposition format (version 0.0.4)."""
        with self._lock:
            requests, responses = dict(self._requests), dict(self._responses)
            tokens, ttft, ttft_sum = dict(self._tokens), list(self._ttft), self._ttft_sum
        lines = ["# HELP fusionrag_requests_total Completions whose answers all finished, by endpoint and finish reason.",
                 "# TYPE fusionrag_requests_total counter"]  # fmt: skip
        lines += [f'fusionrag_requests_total{{endpoint="{endpoint}",finish="{reason}"}} {count}'
                  for (endpoint, reason), count in sorted(requests.items())]  # fmt: skip
        lines += ["# HELP fusionrag_errors_total Requests answered with an error status.",
                  "# TYPE fusionrag_errors_total counter"]  # fmt: skip
        lines += [f'fusionrag_errors_total{{status="{status}"}} {count}' for status, count in sorted(responses.items())]
        for name, (help_text, _) in _TOKENS.items():
            lines += [f"# HELP fusionrag_{name}_total {help_text}", f"# TYPE fusionrag_{name}_total counter",
                      f"fusionrag_{name}_total {tokens[name]}"]  # fmt: skip
        lines += ["# HELP fusionrag_ttft_seconds Time to the first token of finished requests.",
                  "# TYPE fusionrag_ttft_seconds histogram"]  # fmt: skip
        total = 0
        for edge, count in zip([*map(str, TTFT_BUCKETS_S), "+Inf"], ttft):
            total += count
            lines.append(f'fusionrag_ttft_seconds_bucket{{le="{edge}"}} {total}')
        lines += [f"fusionrag_ttft_seconds_sum {ttft_sum}", f"fusionrag_ttft_seconds_count {total}"]
        for name, value, help_text in (("running", running, "Answers decoding now."),
                                       ("waiting", waiting, "Requests waiting for admission.")):  # fmt: skip
            lines += [f"# HELP fusionrag_requests_{name} {help_text}", f"# TYPE fusionrag_requests_{name} gauge",
                      f"fusionrag_requests_{name} {value}"]  # fmt: skip
        return "\n".join(lines) + "\n"
