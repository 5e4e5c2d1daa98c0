"""Other forms of ChunkShift tried on questions 1-30 of the shared 100 at r = 0.15 (analysis only).

Patches the engine's ChunkShift; records in forms_records.json. Env:
SH_FORM=mean|shrink|local|sim: each chunk's mean change (the engine's form); that mean times m / (m + SH_M0)
(m: the chunk's recomputed tokens); per shifted token, the chunk's recomputed tokens' changes weighted by
exp(-|position distance| / SH_L); or by a softmax of the cosine of the two tokens' reused values / SH_TAU.
SH_SHARE, SH_VFROM, SH_KFROM: the share and the first layer of the value and key shifts.

    SH_FORM=local SH_L=32 python shift_forms.py bench quality --methods fusionrag --ratios 0.15 ...
"""
import os
import torch
from fusionrag_llm.fusion import kv_shift
from fusionrag_llm.engine import llm_engine
from fusionrag_llm.cli.main import main

FORM = os.environ.get("SH_FORM", "mean")
M0 = float(os.environ.get("SH_M0", "2"))
L = float(os.environ.get("SH_L", "32"))
TAU = float(os.environ.get("SH_TAU", "0.1"))
SHARE = os.environ.get("SH_SHARE")
VFROM = os.environ.get("SH_VFROM")
KFROM = os.environ.get("SH_KFROM")
Base = kv_shift.ChunkShift


class Shift(Base):
    def __init__(self, model, layout, positions, recompute, selected, share, from_layer):
        share = float(SHARE) if SHARE else share
        vf = int(VFROM) if VFROM else from_layer
        kf = int(KFROM) if KFROM else from_layer
        super().__init__(model, layout, positions, recompute, selected, share, min(vf, kf))
        self.vfrom, self.kfrom = vf, kf
        if FORM == "shrink":
            m = self.counts  # clamped >= 1
            self.weight = (m / (m + M0)).view(1, -1, 1)
        if FORM == "local":  # per left token: weights over picked tokens of its chunk, exp(-|dp|/L)
            same = self.left_chunk[:, None] == self.picked_chunk[None, :]
            dist = (self.left_positions[:, None] - self.picked_positions[None, :]).abs().float()
            w = torch.exp(-dist / L) * same
            self.W = (w / w.sum(1, keepdim=True).clamp(min=1e-30))  # [left, picked]

    def _spread(self, change, basis=None):  # [heads, picked, d] -> [heads, left, d]
        if FORM == "sim":  # softmax over the chunk's picked tokens of cosine similarity of reused values
            b = torch.nn.functional.normalize(basis.float(), dim=-1)
            logits = torch.einsum("hld,hpd->hlp", b[:, self.left], b[:, self.picked]) / TAU
            same = self.left_chunk[:, None] == self.picked_chunk[None, :]
            w = torch.softmax(logits.masked_fill(~same, float("-inf")), dim=-1)
            return torch.einsum("hlp,hpd->hld", w, change)
        if FORM == "local":
            return torch.einsum("lp,hpd->hld", self.W, change)
        mean = self._chunk_mean(change)
        if FORM == "shrink":
            mean = mean * self.weight
        return mean[:, self.left_chunk]

    def __call__(self, layer, cache, keys, values):
        rows, basis = self.picked_rows, None
        if layer >= self.vfrom:
            basis = cache.values[layer].clone() if FORM == "sim" else None
            sv = self._spread((values[:, rows] - cache.values[layer][:, self.picked]).float(), basis)
            cache.values[layer][:, self.left] += self.share * sv.to(cache.values.dtype)
        if layer >= self.kfrom:
            change = keys[:, rows] - cache.keys[layer][:, self.picked]
            change = self.model.rotate(change, -self.picked_positions, self.unrotate).float()
            if FORM == "sim" and basis is None:
                basis = cache.values[layer].clone()
            moved = self._spread(change, basis).to(cache.keys.dtype).contiguous()
            cache.keys[layer][:, self.left] += self.share * self.model.rotate(moved, self.left_positions, self.rerotate)


llm_engine.ChunkShift = Shift
main()
