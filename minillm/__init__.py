"""minillm: a small LLaMA-style decoder for comparing normalization choices."""

from minillm.model import ModelConfig, Transformer
from minillm.norms import NORMS, build_norm

__all__ = ["NORMS", "ModelConfig", "Transformer", "build_norm"]
__version__ = "0.1.0"
