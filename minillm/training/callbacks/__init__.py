"""Lightning callbacks, one per module; the classes are re-exported here, so configs name them
``minillm.training.callbacks.<Class>``. Everything is measured from outside the model: its code holds no
instrumentation."""

from minillm.training.callbacks.checkpoint import Checkpoint
from minillm.training.callbacks.divergence import DivergenceGuard, params_finite
from minillm.training.callbacks.histograms import NormHistograms
from minillm.training.callbacks.perf import PerfMonitor
from minillm.training.callbacks.preemption import PreemptionCheckpoint
from minillm.training.callbacks.probe import (
    ActivationProbe,
    attention_stats,
    bn_sampling_null,
    bn_stat_distance,
    feature_kurtosis,
    max_attention_logit,
)
from minillm.training.callbacks.progress import LogProgress, RichBar, progress_bar
from minillm.training.callbacks.run_totals import RunTotals
from minillm.training.callbacks.sample import TextSample
from minillm.training.callbacks.spike import SpikeCapture
from minillm.training.callbacks.stability import LossSpikeDetector, StabilityMonitor, spike_scores
from minillm.training.callbacks.summary import RunSummary

__all__ = ["ActivationProbe", "Checkpoint", "DivergenceGuard", "LogProgress", "LossSpikeDetector", "NormHistograms",
           "PerfMonitor", "PreemptionCheckpoint", "RichBar", "RunSummary", "RunTotals", "SpikeCapture",
           "StabilityMonitor", "TextSample", "attention_stats", "bn_sampling_null", "bn_stat_distance",
           "feature_kurtosis", "max_attention_logit", "params_finite", "progress_bar", "spike_scores"]
