"""The arithmetic cost of elementwise ops: the ``flops_per_element`` of an ``elementwise`` kernel.

An elementwise kernel's shape is its element count and the tensors it reads and writes per element;
what it computes on each element is its op, and ops differ a lot in arithmetic: a copy does none, a
GELU evaluates an erf polynomial and an exponential per element (on a CPU core it takes several
times an add's time). :data:`FLOPS_PER_ELEMENT` is that cost per op, in floating-point operations
per output element, counted as the FLOP/s peaks count them (a fused multiply-add is two), with
these costs of the functions the ops call:

- ``exp``: 15 (range reduction ``x log2(e)``, rounding and two FMAs for the remainder, a degree-5
  polynomial by Horner's rule, the scaling by ``2^n``), as in SLEEF's and ATen's vectorised expf;
- ``erf``: 34 (Abramowitz-Stegun 7.1.26, ATen's vectorised erf: ``|x|`` 1, ``t = 1 / (1 + p|x|)``
  3, a degree-4 polynomial in ``t`` 8, ``-x^2`` 2, ``exp`` 15, ``1 - t r e`` 4, the sign 1);
- ``sigmoid``: 17 (``exp``, an add and a division).

Measured ops (the harness's, :data:`simgpu.bench.cases.ELEMENTWISE`; the microbenchmark rows of a
platform take their cost from their ``op`` column when the models are fitted):

- ``copy``, ``zero``, ``cat``, ``transpose``: 0, they move data only;
- ``add``, ``mul``: 1; ``relu``: 1 (``max(x, 0)``); ``sum_rows``: 1 (an add per element read);
- ``relu_bwd``: 2 (``threshold_backward``: a compare and a select);
- ``gelu``: 38 (``0.5 x (1 + erf(x / sqrt 2))``: ``erf`` and 4);
- ``gelu_bwd``: 58 (``dy (Phi(x) + x phi(x))``: ``erf`` and 3 for ``Phi``, ``exp`` and 3 for
  ``phi``, 3 to combine).

Ops the builders emit that no harness measures (their cost is a feature the learned models have not
seen: they place it among the measured ones):

- ``cast``: 1 (a conversion); ``quantize``: 6 (FP8: ``|x|`` and the running amax 2, the scale 1,
  saturation 2, the conversion 1);
- ``gather``: 2 (the address of each element: an index times a stride plus a base);
  ``scatter_add``: 3 (the same and the add);
- ``fma``: 2 (``a b + c``, the DCN cross layer); ``fma_bwd``: 3 (its two products, one accumulated);
- ``bias_residual_add``: 2 (Megatron's fused bias and residual add); ``bias_dropout_add``: 22;
- ``dropout``: 20 (Philox 4x32-10: 10 rounds of two multiplies and four xors per four numbers, 15;
  to uniform 2, compare 1, mask and scale 2); ``dropout_bwd``: 2 (``dy * mask / (1 - p)``);
- ``rope``: 3 (``x cos + rot(x) sin``: a multiply and an FMA), also its backward;
- ``tanh``: 20 (``exp`` of ``2x``, ``(e - 1) / (e + 1)``, the sign);
- ``swiglu``: 19 (``silu(a) b``: ``sigmoid``, 2 multiplies); ``swiglu_bwd``: 25 (``sigmoid`` again,
  ``silu'`` 4, the two gradients 4);
- ``attention_merge``: 3 (two partial attention outputs rescaled by their log-sum-exp weights and
  summed: a multiply and an FMA);
- ``moe_combine``: 4 (gather 2 and the routing weight's FMA 2); ``moe_combine_bwd``: 5 (gather 2,
  the weighted gradient 1, the routing weight's gradient, an FMA 2);
- ``bce_logits``: 37 (fused sigmoid and binary cross entropy ``max(x, 0) - x y + log(1 + e^-|x|)``:
  ``exp`` and a log of 15 each, 7 others); ``bce_logits_bwd``: 20 (``(sigmoid(x) - y) dy / n``).

Kernels that give no op (NeuSight's imported measurements) have :data:`DEFAULT_FLOPS_PER_ELEMENT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

#: The cost of an elementwise kernel that names no op: one operation per element.
DEFAULT_FLOPS_PER_ELEMENT: Final = 1.0

#: Floating-point operations per output element of each elementwise op; see the module docstring.
FLOPS_PER_ELEMENT: Final[Mapping[str, float]] = MappingProxyType({
    # measured by the harness
    "copy": 0.0, "zero": 0.0, "cat": 0.0, "transpose": 0.0,
    "add": 1.0, "mul": 1.0, "relu": 1.0, "sum_rows": 1.0,
    "relu_bwd": 2.0,
    "gelu": 38.0, "gelu_bwd": 58.0,
    # emitted by the builders only
    "cast": 1.0, "quantize": 6.0,
    "gather": 2.0, "scatter_add": 3.0,
    "fma": 2.0, "fma_bwd": 3.0,
    "bias_residual_add": 2.0, "bias_dropout_add": 22.0,
    "dropout": 20.0, "dropout_bwd": 2.0,
    "rope": 3.0, "tanh": 20.0,
    "swiglu": 19.0, "swiglu_bwd": 25.0,
    "attention_merge": 3.0,
    "moe_combine": 4.0, "moe_combine_bwd": 5.0,
    "bce_logits": 37.0, "bce_logits_bwd": 20.0,
})


def flops_per_element(op: str) -> float:
    """The cost of elementwise op ``op`` (see :data:`FLOPS_PER_ELEMENT`); unknown ops raise."""
    try:
        return FLOPS_PER_ELEMENT[op]
    except KeyError:
        raise KeyError(f"no per-element cost for elementwise op {op!r}; known: "
                       f"{', '.join(sorted(FLOPS_PER_ELEMENT))}") from None
