"""Input builders and a naive dense oracle shared by the kernel tests (explicit masks, no tricks)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except Exception:  # noqa: BLE001
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable: launcher tests skipped")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@dataclass
class SparseCase:
    """One request: context KV with holes, a recompute set R (queries) and its page."""

    q: torch.Tensor            # [Hq, Nq, D]
    q_positions: torch.Tensor  # [Nq]
    k: torch.Tensor            # [Hkv, Nk, D]
    v: torch.Tensor
    k_positions: torch.Tensor  # [Nk]
    k_valid: torch.Tensor      # [Nk] bool
    page_k: torch.Tensor | None
    page_v: torch.Tensor | None
    page_positions: torch.Tensor | None

    def args(self):
        return (self.q, self.q_positions, self.k, self.v, self.k_positions, self.k_valid)

    def page(self):
        return (self.page_k, self.page_v, self.page_positions)


def make_case(nq, nk, hq, hkv, d, *, page=True, n_fresh=None, seed=0, dtype=torch.float32,
              device="cpu", hole_frac=0.15):
    """Context positions 0..nk-1 with random holes; R = n_fresh suffix tokens + reused tokens.

    Queries are R in shuffled order; the page holds R's fresh K/V in another shuffled order and the
    stale context entries of recomputed tokens are invalid. Without a page the queries are simply
    random positions (some before every valid key, to exercise all-masked rows).
    """
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    k, v = rnd(hkv, nk, d), rnd(hkv, nk, d)
    k_positions = torch.arange(nk)
    k_valid = torch.rand(nk, generator=g) >= hole_frac
    if page:
        n_fresh = min(nq, max(1, nq // 3)) if n_fresh is None else n_fresh
        n_fresh = max(n_fresh, nq - nk)  # cannot reuse more tokens than the context has
        reused = torch.randperm(nk, generator=g)[: nq - n_fresh]
        r_pos = torch.cat([reused, torch.arange(nk, nk + n_fresh)])
        k_valid[reused] = False
        q_positions = r_pos[torch.randperm(nq, generator=g)]
        page_positions = r_pos[torch.randperm(nq, generator=g)]
        pk, pv = rnd(hkv, nq, d), rnd(hkv, nq, d)
    else:
        q_positions = torch.randint(-2, nk + 3, (nq,), generator=g)
        page_positions = pk = pv = None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return SparseCase(rnd(hq, nq, d), q_positions.to(device), k, v, k_positions.to(device),
                      k_valid.to(device), pk, pv, to(page_positions))


def dense_attention(q, q_positions, k, v, k_positions, k_valid, scale=None, page_k=None, page_v=None,
                    page_positions=None, return_probs=False):
    """Naive oracle: concatenated keys, explicit [Nq, Nk+Np] mask, repeated KV heads, float64."""
    hq, nq, d = q.shape
    scale = d**-0.5 if scale is None else scale
    keys, vals, pos, ok = [k], [v], [k_positions], [k_valid]
    if page_k is not None:
        keys.append(page_k), vals.append(page_v), pos.append(page_positions)
        ok.append(torch.ones_like(page_positions, dtype=torch.bool))
    kk, vv = torch.cat(keys, 1).double(), torch.cat(vals, 1).double()
    kk = kk.repeat_interleave(hq // k.shape[0], 0)
    vv = vv.repeat_interleave(hq // k.shape[0], 0)
    mask = torch.cat(ok)[None, :] & (torch.cat(pos)[None, :] <= q_positions[:, None])  # [Nq, Nk+Np]
    s = (q.double() @ kk.transpose(1, 2)) * scale
    probs = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    if return_probs:
        return probs  # [Hq, Nq, Nk+Np]
    return (probs @ vv).to(q.dtype)
