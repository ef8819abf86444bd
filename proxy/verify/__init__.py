"""The pair verifier: is the cached answer of one chat request the answer to another?

An embedding cosine cannot tell a paraphrase from a near-miss ("LG Optimus" vs "LG Optimus G",
花呗 vs 借呗); a cross-encoder reading both requests, each with its context, can. The shipped
verifier is multilingual-e5-small with its top layers and a head fine-tuned on labelled pairs
(see ``weights/verifier.json`` and ``proxy.tools.verifier``), run by ONNX Runtime, returning
calibrated probabilities.

    verifier = load_verifier(threads=2)
    [p] = verifier.score([(PairSide("花呗怎么还款"), PairSide("花呗如何还款"))])

Importing this package loads nothing; the model is built on the first ``score`` (or ``warm``).
"""

from __future__ import annotations

from proxy.verify.cross_encoder import CrossEncoderVerifier, VerifierError, load_verifier
from proxy.verify.protocol import Verifier
from proxy.verify.sides import PairSide, side_text

__all__ = ["CrossEncoderVerifier", "PairSide", "Verifier", "VerifierError", "load_verifier", "side_text"]
