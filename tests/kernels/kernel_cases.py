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
    """One request: context KV with holes and a recompute set R (queries)."""

    q: torch.Tensor            # [Hq, Nq, D]
    q_positions: torch.Tensor  # [Nq]
    k: torch.Tensor            # [Hkv, Nk, D]
    v: torch.Tensor
    k_positions: torch.Tensor  # [Nk]
    k_valid: torch.Tensor      # [Nk] bool

    def args(self):
        return (self.q, self.q_positions, self.k, self.v, self.k_positions, self.k_valid)


def make_case(nq, nk, hq, hkv, d, *, recompute=True, n_fresh=None, seed=0, dtype=torch.float32,
              device="cpu", hole_frac=0.15):
    """Context positions 0..nk-1 with random holes; R = n_fresh suffix tokens + reused tokens.

    Queries are R in shuffled order; R's fresh K/V follow the context (nk + nq keys) in another
    shuffled order, and the stale context entries of recomputed tokens are invalid, so the keys are
    not sorted by position. Without ``recompute`` the keys are the nk context entries and the queries
    simply random positions (some before every valid key, to exercise all-masked rows).
    """
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    k, v = rnd(hkv, nk, d), rnd(hkv, nk, d)
    k_positions = torch.arange(nk)
    k_valid = torch.rand(nk, generator=g) >= hole_frac
    if recompute:
        n_fresh = min(nq, max(1, nq // 3)) if n_fresh is None else n_fresh
        n_fresh = max(n_fresh, nq - nk)  # cannot reuse more tokens than the context has
        reused = torch.randperm(nk, generator=g)[: nq - n_fresh]
        r_pos = torch.cat([reused, torch.arange(nk, nk + n_fresh)])
        k_valid[reused] = False
        q_positions = r_pos[torch.randperm(nq, generator=g)]
        k_positions = torch.cat([k_positions, r_pos[torch.randperm(nq, generator=g)]])
        k, v = torch.cat([k, rnd(hkv, nq, d)], 1), torch.cat([v, rnd(hkv, nq, d)], 1)
        k_valid = torch.cat([k_valid, torch.ones(nq, dtype=torch.bool)])
    else:
        q_positions = torch.randint(-2, nk + 3, (nq,), generator=g)
    return SparseCase(rnd(hq, nq, d), q_positions.to(device), k, v, k_positions.to(device), k_valid.to(device))


def dense_attention(q, q_positions, k, v, k_positions, k_valid, scale=None, return_probs=False):
    """Naive oracle: explicit [Nq, Nk] mask, repeated KV heads, float64."""
    hq, nq, d = q.shape
    scale = d**-0.5 if scale is None else scale
    kk = k.double().repeat_interleave(hq // k.shape[0], 0)
    vv = v.double().repeat_interleave(hq // k.shape[0], 0)
    mask = k_valid[None, :] & (k_positions[None, :] <= q_positions[:, None])  # [Nq, Nk]
    s = (q.double() @ kk.transpose(1, 2)) * scale
    probs = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    if return_probs:
        return probs  # [Hq, Nq, Nk]
    return (probs @ vv).to(q.dtype)
