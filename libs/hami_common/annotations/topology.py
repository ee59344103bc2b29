"""Topology pair scores ``hami.io/node-nvidia-score`` (hami-protocol §2.3).

JSON array of ``{"uuid": <GPU>, "score": {<other GPU>: <int>}}``; decoded into a symmetric-looking
mapping ``uuid -> other uuid -> score`` without assuming symmetry (the writer reports asymmetric links).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from hami_common.annotations.keys import NODE_SCORE
from hami_common.errors import AnnotationError

__all__ = ["PairScores", "decode_pair_scores", "encode_pair_scores"]

PairScores = Mapping[str, Mapping[str, int]]


class _DeviceScores(msgspec.Struct, frozen=True):
    uuid: str
    score: dict[str, int] = {}


_DECODER: Final = msgspec.json.Decoder(list[_DeviceScores])
_ENCODER: Final = msgspec.json.Encoder()


def encode_pair_scores(scores: PairScores) -> str:
    return _ENCODER.encode([_DeviceScores(uuid=u, score=dict(s)) for u, s in scores.items()]).decode()


def decode_pair_scores(value: str, key: str = NODE_SCORE) -> dict[str, dict[str, int]]:
    try:
        entries = _DECODER.decode(value)
    except msgspec.DecodeError as err:
        raise AnnotationError(key, f"not a valid pair-score list: {err}") from err
    result: dict[str, dict[str, int]] = {}
    for entry in entries:
        if not entry.uuid:
            raise AnnotationError(key, "an entry has no uuid")
        if entry.uuid in result:
            raise AnnotationError(key, f"device {entry.uuid} is listed twice")
        result[entry.uuid] = dict(entry.score)
    return result
