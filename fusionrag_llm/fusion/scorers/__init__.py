"""Selection rules the methods share: ``scores(inp: ScoringInput) -> Tensor [len(inp.layout.reused_slots)]``.

A higher score means "recompute this reused token first"; the method's ``pick`` keeps the top ``k``.
"""
