"""minillm: a small LLaMA-style decoder for comparing normalization choices."""

from minillm.model import ModelConfig, Transformer
from minillm.norms import NORMS, build_norm
from minillm.version import __version__

__all__ = ["NORMS", "ModelConfig", "Transformer", "__version__", "build_norm"]
