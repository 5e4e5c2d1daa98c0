"""The benchmarks of ``fusionrag bench quality|ttft|decode|serve|gpu`` (one ``bench_*`` module each) and
what they share: their inputs (``bench_data``: questions from ``datasets`` or ``synthetic``, methods,
prompts), answer and fidelity ``metrics``, the ``baselines`` they time, and ``results`` (JSON,
tables, plots). The quality benchmark's resumable log is ``partial_log``, its report ``quality_report``.
"""
