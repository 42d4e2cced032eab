"""The serving stage's kinds of study: a what-if study or a search whose base is an LLM or a DLRM
serving file runs its variants through these (see :class:`simgpu.variant.StudyKind`)."""

from __future__ import annotations

from ..config.loader import JobKind
from ..variant import StudyKind
from . import dlrm_study, study

KINDS: dict[JobKind, StudyKind] = {"llm_serving": study.KIND, "dlrm_serving": dlrm_study.KIND}
