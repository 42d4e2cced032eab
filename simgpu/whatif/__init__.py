"""What-if studies: variants of a workload and platform, simulated side by side (``python -m simgpu.whatif``)."""

from .runner import run_study, run_variant
from .study import Study, StudySpec, Variant, expand, load_study

__all__ = ["Study", "StudySpec", "Variant", "expand", "load_study", "run_study", "run_variant"]
