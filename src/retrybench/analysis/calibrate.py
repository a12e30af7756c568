"""The calibration's stage count under the name the command line imports (calibration/stages.py holds
the stage plan): remove once it imports that."""

from __future__ import annotations

from retrybench.calibration.stages import STAGES

__all__ = ["STAGES"]
