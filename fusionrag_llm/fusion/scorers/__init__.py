"""One module per selection rule: ``scores(inp: ScoringInput) -> Tensor [len(inp.layout.reused_slots)]``.

A higher score means "recompute this reused token first"; ``fusion.selectors`` keeps the top ``k``.
"""
