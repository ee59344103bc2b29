"""The MIG profile tables of the GPUs that offer MIG, kept as data, and the arithmetic over them (pure).

What a GPU in MIG mode offers is NVIDIA's, per product (the MIG user guide, "Supported MIG Profiles"): each
profile has a name (``1g.10gb``), a count of compute slices, its memory as NVML reports it
(``nvmlGpuInstanceProfileInfo_t.memorySizeMB``) and the placements a GPU instance of it may take, a first
memory slice and a size in memory slices (7-slice cards have 8 memory slices: ``7g`` takes ``{0, 8}``, ``3g``
takes ``{0, 4}`` or ``{4, 4}``). On a real node NVML answers these questions; the fake inventory and the tests
answer them from this table, so a profile, a placement or a refusal is the same in both.

* ``core`` (HAMi's percentage of the card) is ``ceil(100 × slices / the card's compute slices)``: the spec's
  A100-40GB example registers ``1g.5gb`` with core 15 (hami-protocol §11 row 5), ``7g`` is the whole card (100),
  and SXM/PCIe boards of one memory size share a table although their SM counts differ.
* The instance count is how many non-overlapping placements fit, which is what NVML's ``instanceCount`` says.
* Media-extension variants (``+me``) are not listed: HAMi names a profile by its compute and memory size, so
  ``1g.5gb+me`` would register as a second ``1g.5gb``.
* Names are derived from the memory (:func:`profile_name`), as HAMi names what NVML reports.
* Memory figures: A30, A100 and H100 are NVML's (``nvidia-smi mig -lgip``: 4.75 GiB = 4864 MiB, …). H20, H200
  and B200 are estimates, the H100 figures scaled by the boards' memory and nudged so the derived names are
  NVIDIA's (no published NVML listing was at hand); a real node registers NVML's own numbers, so these only
  shape the fake inventory.

``migProfileAllowlist`` entries (:class:`MigAllowlist`) restrict what a model registers; node agent and allocator
both go through :func:`allowed_mig_profiles`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common.annotations.registration import MigPlacement, MigProfile

__all__ = [
    "MIG_CARDS",
    "MigAllowlist",
    "MigCard",
    "ProfileSpec",
    "allowed_mig_profiles",
    "instance_count",
    "mig_card",
    "model_matches",
    "profile_core",
    "profile_name",
]

# NVML_GPU_INSTANCE_PROFILE_* (the `profile` argument of nvmlDeviceGetGpuInstanceProfileInfo)
GI_1_SLICE: Final = 0x0
GI_2_SLICE: Final = 0x1
GI_3_SLICE: Final = 0x2
GI_4_SLICE: Final = 0x3
GI_7_SLICE: Final = 0x4
GI_1_SLICE_REV2: Final = 0x9  # the 1-slice profile with two memory slices (1g.10gb on A100-40GB)


class MigAllowlist(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``migProfileAllowlist`` entry: the MIG profiles allowed on these GPU models."""

    models: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One row of a card's table."""

    name: str
    nvml_profile: int  # NVML_GPU_INSTANCE_PROFILE_*
    slices: int  # compute slices, NVML's sliceCount
    memory_mib: int  # NVML's memorySizeMB
    instances: int  # NVML's instanceCount (checked against the placements by the tests)
    starts: tuple[int, ...]
    size: int  # memory slices per instance

    @property
    def placements(self) -> tuple[MigPlacement, ...]:
        return tuple(MigPlacement(start=s, size=self.size) for s in self.starts)


@dataclass(frozen=True, slots=True)
class MigCard:
    """A MIG-capable product and its profiles, smallest first."""

    key: str  # e.g. "A100-80GB"
    models: tuple[str, ...]  # model words (NVML names or parts of them) that select this table
    compute_slices: int  # 7, or 4 on the A30
    profiles: tuple[ProfileSpec, ...]

    def hami_profiles(self) -> tuple[MigProfile, ...]:
        """The profiles as HAMi registers them (hami-protocol §2.2)."""
        return tuple(
            MigProfile(
                name=p.name,
                memory_mb=p.memory_mib,
                core=profile_core(p.slices, self.compute_slices),
                slice_count=p.slices,
                placements=p.placements,
            )
            for p in self.profiles
        )

    def spec(self, name: str) -> ProfileSpec | None:
        return next((p for p in self.profiles if p.name == name), None)


def profile_core(slices: int, card_slices: int) -> int:
    """HAMi's ``core`` of a profile: its share of the card's compute slices in percent, rounded up."""
    return -(-100 * slices // max(card_slices, 1))


def instance_count(placements: Iterable[MigPlacement]) -> int:
    """How many instances of one profile fit side by side: the most placements that do not overlap."""
    count, end = 0, -1
    for p in sorted(placements, key=lambda p: (p.start + p.size, p.start)):  # earliest end first is optimal
        if p.start >= end:
            count, end = count + 1, p.start + p.size
    return count


def profile_name(slices: int, memory_mib: int) -> str:
    """HAMi's name of a profile: compute slices and memory in GiB rounded up, ``1g.5gb`` for 4864 MiB. Derived
    from NVML's figures rather than NVML's own name, which is why the chart's allowlist lists the A100-80GB's
    whole-card profile (80896 MiB) as ``7g.79gb`` where ``nvidia-smi`` says ``7g.80gb``."""
    return f"{slices}g.{-(-memory_mib // 1024)}gb"


def _spec(nvml_profile: int, slices: int, mib: int, instances: int, starts: tuple[int, ...], size: int) -> ProfileSpec:
    return ProfileSpec(profile_name(slices, mib), nvml_profile, slices, mib, instances, starts, size)


def _card(key: str, models: tuple[str, ...], compute_slices: int, *profiles: ProfileSpec) -> MigCard:
    return MigCard(key=key, models=models, compute_slices=compute_slices, profiles=profiles)


def _seven_slice(key: str, models: tuple[str, ...], mib: tuple[int, int, int, int, int, int]) -> MigCard:
    """The A100/H100 layout every 7-compute-slice, 8-memory-slice card shares (MIG user guide, placements)."""
    one, one_double, two, three, four, seven = mib
    return _card(
        key,
        models,
        7,
        _spec(GI_1_SLICE, 1, one, 7, (0, 1, 2, 3, 4, 5, 6), 1),
        _spec(GI_1_SLICE_REV2, 1, one_double, 4, (0, 2, 4, 6), 2),
        _spec(GI_2_SLICE, 2, two, 3, (0, 2, 4), 2),
        _spec(GI_3_SLICE, 3, three, 2, (0, 4), 4),
        _spec(GI_4_SLICE, 4, four, 1, (0,), 4),
        _spec(GI_7_SLICE, 7, seven, 1, (0,), 8),
    )


# memorySizeMB per profile: 1g, 1g with two memory slices, 2g, 3g, 4g, 7g
MIG_CARDS: Final[tuple[MigCard, ...]] = (
    _card(
        "A30-24GB",
        ("A30",),
        4,
        _spec(GI_1_SLICE, 1, 5952, 4, (0, 1, 2, 3), 1),
        _spec(GI_2_SLICE, 2, 12160, 2, (0, 2), 2),
        _spec(GI_4_SLICE, 4, 24320, 1, (0,), 4),
    ),
    _seven_slice(
        "A100-40GB",
        ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB-PCIe", "A100 40GB"),
        (4864, 9856, 9856, 19968, 19968, 40192),
    ),
    _seven_slice(
        "A100-80GB",
        ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100-80GB-PCIe", "A100 80GB"),
        (9728, 19968, 19968, 40192, 40192, 80896),
    ),
    _seven_slice(
        "H100-80GB",
        ("H100 80GB HBM3", "H100 PCIe", "H100-SXM5-80GB", "H100-PCIE-80GB"),
        (9984, 20096, 20096, 40448, 40448, 81152),
    ),
    # estimates (see the module's docstring), chosen so the names are NVIDIA's
    _seven_slice("H20", ("H20",), (11904, 24064, 24064, 48512, 48512, 97536)),
    _seven_slice("H200-141GB", ("H200",), (17536, 35328, 35328, 71808, 71808, 143488)),
    _seven_slice("B200", ("B200",), (23040, 45568, 45568, 91392, 91392, 183552)),
)


def _words(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def model_matches(word: str, model: str) -> bool:
    """``word`` (``"A30"``, ``"H100-SXM5-80GB"``) names ``model`` (``"NVIDIA A30"``): it appears in it as whole
    words, spaces and hyphens alike, so ``H20`` does not select an ``H200``."""
    w, m = _words(word), _words(model)
    if not w:
        return False
    return re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", m) is not None


def mig_card(model: str) -> MigCard | None:
    """The table of the product ``model`` names (an NVML name or the card's key); None if it offers no MIG."""
    for card in MIG_CARDS:
        if model_matches(card.key, model) or any(model_matches(word, model) for word in card.models):
            return card
    return None


def allowed_mig_profiles(
    allowlist: Sequence[MigAllowlist], model: str, profiles: Sequence[MigProfile]
) -> tuple[MigProfile, ...]:
    """The profiles ``model`` may register: the first allowlist entry naming the model decides, in the GPU's
    order; a model no entry names keeps every profile (the allowlist restricts, it does not enable)."""
    entry = next((e for e in allowlist if any(model_matches(word, model) for word in e.models)), None)
    if entry is None:
        return tuple(profiles)
    allowed = set(entry.profiles)
    return tuple(p for p in profiles if p.name in allowed)
