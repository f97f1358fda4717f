"""Training loops and the callbacks/outputs around them."""

from kerasdist.training.fit import RunResult, build_compiled_model, fit, summary_text

__all__ = ["RunResult", "build_compiled_model", "fit", "summary_text"]
