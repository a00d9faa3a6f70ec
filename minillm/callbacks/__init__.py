"""Lightning callbacks, one per module; the classes are re-exported here, so configs name them
``minillm.callbacks.<Class>``. Everything is measured from outside the model: its code holds no instrumentation."""

from minillm.callbacks.checkpoint import Checkpoint
from minillm.callbacks.divergence import DivergenceGuard, params_finite
from minillm.callbacks.histograms import NormHistograms
from minillm.callbacks.perf import PerfMonitor
from minillm.callbacks.preemption import PreemptionCheckpoint
from minillm.callbacks.probe import (
    ActivationProbe,
    attention_stats,
    bn_sampling_null,
    bn_stat_distance,
    feature_kurtosis,
    max_attention_logit,
)
from minillm.callbacks.progress import LogProgress, RichBar, progress_bar
from minillm.callbacks.run_totals import RunTotals
from minillm.callbacks.sample import TextSample
from minillm.callbacks.spike import SpikeCapture
from minillm.callbacks.stability import LossSpikeDetector, StabilityMonitor, spike_scores
from minillm.callbacks.summary import RunSummary

__all__ = ["ActivationProbe", "Checkpoint", "DivergenceGuard", "LogProgress", "LossSpikeDetector", "NormHistograms",
           "PerfMonitor", "PreemptionCheckpoint", "RichBar", "RunSummary", "RunTotals", "SpikeCapture",
           "StabilityMonitor", "TextSample", "attention_stats", "bn_sampling_null", "bn_stat_distance",
           "feature_kurtosis", "max_attention_logit", "params_finite", "progress_bar", "spike_scores"]
